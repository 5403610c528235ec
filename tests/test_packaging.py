"""What each command imports is declared in pyproject.toml's extras, and an install of the built
wheel into a clean virtual environment runs the commands its extras promise (rollpacker.extras).

`test_wheel_core_then_sim_extra_in_a_clean_venv` builds the wheel, installs it into a fresh venv
(no system site-packages) from a wheelhouse of the declared requirements, offline; the wheelhouse
(~/.cache/rollpacker/wheelhouse) is filled with `pip download` only when an offline install finds
a wheel missing.  The train and serve extras pull torch (GBs), so for them the test is static:
every third-party module in the import closure of reference/train.py (lazy imports in functions
included) and of `rollpacker serve` is declared in the extra that command names in its error line.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
WHEELHOUSE = Path(os.environ.get("ROLLPACKER_WHEELHOUSE", Path.home() / ".cache" / "rollpacker" / "wheelhouse"))


def requirement_names(extras: tuple[str, ...]) -> set[str]:
    """Normalised distribution names of the core dependencies and of `extras`."""
    reqs = list(PYPROJECT["dependencies"]) + [r for e in extras for r in PYPROJECT["optional-dependencies"][e]]
    return {normalise(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in reqs}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- static: the import closure of each command against its extra ---------------------------------


def _module_file(name: str, beside: Path) -> Path | None:
    """The repository file of module `name` (ours, or a script's sibling like results_md), else None."""
    for root in (ROOT, beside):
        path = root.joinpath(*name.split("."))
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _imports(path: Path):
    """Every module name an import statement of `path` names (`from a import b` gives a and a.b)."""
    package = path.relative_to(ROOT).parent.parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join(base + ((node.module,) if node.module else ()))
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def third_party_imports(entries: list[Path], skip: str | None = None) -> dict[str, Path]:
    """Top-level third-party module -> a file that imports it, over the import closure of `entries`
    (our modules and their parent packages followed, except those under `skip`)."""
    found: dict[str, Path] = {}
    seen: set[Path] = set()
    todo = list(entries)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            parts = name.split(".")
            if _module_file(name, path.parent) is not None or _module_file(parts[0], path.parent) is not None:
                if skip is None or not name.startswith(skip):
                    todo.extend(f for i in range(1, len(parts) + 1)
                                if (f := _module_file(".".join(parts[:i]), path.parent)) is not None)
            elif parts[0] not in sys.stdlib_module_names and parts[0] != "__future__":
                found.setdefault(parts[0], path)
    return found


COMMANDS = {
    "rollpacker simulate": ([ROOT / "rollpacker/sim/cli.py"], None, ("sim",)),
    "rollpacker serve": ([ROOT / "rollpacker/backends/sglang/serve.py"], None, ("serve",)),
    # advise reads the default tokenizer's location from rollpacker.backends.models, whose model loaders
    # (torch) it never calls: the walk stops there, transformers is seen in rollpacker/advise/tokens.py
    "rollpacker advise": ([ROOT / "rollpacker/advise/cli.py"], "rollpacker.backends", ("advise",)),
    "reference/train.py": ([ROOT / "reference/train.py"], "rollpacker.backends.titan", ("train",)),
    "--trainer titan": (sorted((ROOT / "rollpacker/backends/titan").glob("*.py")), None, ("train", "titan")),
    "rollpacker.integrations.trl": (sorted((ROOT / "rollpacker/integrations/trl").glob("*.py")), None, ("trl",)),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_module_a_command_imports_is_declared_in_its_extra(command):
    entries, skip, extras = COMMANDS[command]
    modules = third_party_imports(entries, skip)
    assert "tqdm" in modules or command != "reference/train.py", modules  # the walk sees lazy imports
    distributions = importlib.metadata.packages_distributions()
    declared = requirement_names(extras)
    missing = {module: str(path.relative_to(ROOT)) for module, path in modules.items()
               if not {normalise(d) for d in distributions.get(module, [module])} & declared}
    assert not missing, f"{command}: imported but not in {extras} (nor the core dependencies): {missing}"


# -- dynamic: a wheel in a clean venv ------------------------------------------------------------


def _pip(venv_python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(venv_python), *args],
                          capture_output=True, text=True, timeout=600)


def _install_offline(venv_python: Path, dist: Path, spec: str, extras: tuple[str, ...]) -> None:
    """pip install `spec` from the wheelhouse only; a wheel missing there is downloaded once."""
    offline = ("install", "-q", "--no-index", "--find-links", str(WHEELHOUSE), "--find-links", str(dist), spec)
    proc = _pip(venv_python, *offline)
    if proc.returncode != 0:
        reqs = list(PYPROJECT["dependencies"]) + [r for e in extras for r in PYPROJECT["optional-dependencies"][e]]
        download = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:",
                                   "-d", str(WHEELHOUSE), *reqs], capture_output=True, text=True, timeout=600)
        if download.returncode != 0:
            pytest.skip(f"no wheelhouse and no package index: {download.stderr[-500:]}")
        proc = _pip(venv_python, *offline)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`rollpacker ARGS` of the venv, or the command ARGS when it starts with a path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    command = list(args) if args[0].startswith("/") else [str(venv / "bin" / "rollpacker"), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _assert_one_line(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert needle in line, line


SIMULATE = ["simulate", "--policy", "tail", "--prompts", "8", "--samples", "2", "--steps", "2", "--instances", "2",
            "--max-tokens", "4096"]


@pytest.mark.timeout(900)
def test_wheel_core_then_sim_extra_in_a_clean_venv(tmp_path):
    src, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    shutil.copytree(ROOT / "rollpacker", src / "rollpacker", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(dist), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("rollpacker-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    train = [str(python), str(ROOT / "reference" / "train.py"), "--help"]
    _assert_one_line(_run(venv, tmp_path, *train), "pip install -e '.[train]'")  # rollpacker not installed

    _install_offline(python, dist, str(wheel), ())
    installed = {normalise(d["name"]) for d in json.loads(_pip(python, "list", "--format", "json").stdout)}
    installed -= {"pip", "setuptools", "wheel"}
    assert installed == {"rollpacker", "attrs", "numpy", "immutables"}, installed  # the core only: clean
    out = tmp_path / "out.json"
    proc = _run(venv, tmp_path, *SIMULATE, "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text().count('"rollout_s"') >= 2  # both steps simulated (the built-in trace ships)
    for args, extra in ((SIMULATE + ["--plot", str(tmp_path / "t.png")], "sim"), (["serve"], "serve"), (train, "train")):
        _assert_one_line(_run(venv, tmp_path, *args), f"pip install 'rollpacker[{extra}]'")
    assert not (tmp_path / "t.png").exists()

    _install_offline(python, dist, f"rollpacker[sim] @ {wheel.as_uri()}", ("sim",))
    proc = _run(venv, tmp_path, *SIMULATE, "--json", str(out), "--plot", str(tmp_path / "t.png"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "t.png").stat().st_size > 10_000 and (tmp_path / "t-summary.png").stat().st_size > 10_000
    assert "simulate tail" in proc.stderr  # tqdm's bar, named by the policy


def test_make_env_installs_the_no_deps_packages_last_so_a_good_install_prints_no_error():
    """pip checks the whole environment after an install that resolves dependencies: after a --no-deps
    install of torchtitan (wandb, einops left out), every later one printed "ERROR: pip's dependency
    resolver ..." on a good `make env`.  The --no-deps installs go last."""
    recipe = (ROOT / "Makefile").read_text().split("$(STAMP): pyproject.toml Makefile\n")[1].split("\n\n")[0]
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    first_no_deps = next(i for i, line in enumerate(installs) if "--no-deps" in line)
    assert all("--no-deps" in line for line in installs[first_no_deps:]), installs
