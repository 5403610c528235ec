#!/usr/bin/env bash
# Build (once) the virtual environment that runs the real SGLang server on a CPU-only machine:
#   torch 2.14.1 + torchvision 0.29.1 (SGLang 0.5.23's pin), SGLang's requirements minus the CUDA-only
#   ones (requirements.txt), sglang 0.5.23 with --no-deps, and the sgl_kernel stand-in.
# Idempotent: a stamp holding the hash of its inputs; a finished build is checked (versions, imports)
# and left alone.  Where: $ROLLPACKER_SGLANG_VENV, else the user cache dir.  Prints the venv's python.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
SGLANG_VERSION=0.5.23
venv="${ROLLPACKER_SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rollpacker/sglang-$SGLANG_VERSION-cpu}"
py="$venv/bin/python"
inputs_hash=$(cat "$0" "$here/requirements.txt" "$here/sgl_kernel/__init__.py" | sha256sum | cut -c1-16)
stamp="$venv/.rollpacker-built-$inputs_hash"

check() {
  SGLANG_USE_CPU_ENGINE=1 "$py" - "$SGLANG_VERSION" <<'PY'
import sys, importlib.metadata as md
want = sys.argv[1]
assert md.version("sglang") == want, f"sglang {md.version('sglang')} != {want}"
assert md.version("torch").startswith("2.14.1"), f"torch {md.version('torch')}"
import sgl_kernel
assert getattr(sgl_kernel, "STAND_IN", False), "sgl_kernel is not the stand-in"
import sglang.srt.entrypoints.http_server  # noqa: F401  (the server's import chain)
PY
}

if [ -f "$stamp" ] && check >/dev/null 2>&1; then
  echo "$py"; exit 0
fi
start=$(date +%s)
echo "building the SGLang $SGLANG_VERSION CPU environment in $venv (~15 min, ~7 GB) ..." >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$py" -m pip install -q --upgrade pip >&2
echo "  [1/4] torch 2.14.1 + torchvision 0.29.1" >&2
"$py" -m pip install -q torch==2.14.1 torchvision==0.29.1 >&2
echo "  [2/4] SGLang's requirements (CPU subset)" >&2
constraints="$venv/constraints.txt"
printf 'torch==2.14.1\ntorchvision==0.29.1\n' > "$constraints"
"$py" -m pip install -q -r "$here/requirements.txt" -c "$constraints" >&2
echo "  [3/4] sglang $SGLANG_VERSION (--no-deps)" >&2
"$py" -m pip install -q --no-deps "sglang==$SGLANG_VERSION" >&2
echo "  [4/4] the sgl_kernel stand-in" >&2
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -r "$here/sgl_kernel" "$site/"
check >&2
touch "$stamp"
echo "built in $(( $(date +%s) - start )) s: $(du -sh "$venv" | cut -f1)" >&2
echo "$py"
