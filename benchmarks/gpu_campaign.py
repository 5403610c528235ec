"""The one-device campaign, in parts that each end well inside an 8-minute call: the engine, speculation,
the gpu-marked tests, the trainer, the reference trainer's policies and their reward curves, all on one
device, written to RESULTS.md.

    python benchmarks/gpu_campaign.py --part all              # on a GPU: every part, one after another
    python benchmarks/gpu_campaign.py --device cpu --tiny --model DIR --results /tmp/R.md   # CPU smoke run

Parts (`--part`, comma-separated; each runs its work in child processes, so one's memory is free
before the next, and a crash in one keeps the others):

  env       device, versions, and every module the campaign imports: required ones fail the part,
            optional ones are named with what they are for;
  engine    benchmarks/engine_throughput.py: the embedded engine vs static `generate`, decode-step
            profile on CUDA;
  spec      benchmarks/spec_decode.py: speculation on and off at 1, 4 and 16 running rows;
  trainer   forward+backward tokens/s of the trainer `--trainer` picks (TorchTitan's when it imports,
            else the plain-PyTorch trainer; torch 2.11 imports it through titan.compat);
  tests     `pytest -m gpu -o addopts=-ra tests`: every gpu-marked test, found by its marker;
  compare   `reference/train.py --compare sync,tail` (P=16, R=8, 512 tokens) from the same weights and
            seed, once for each of --seeds (0, 1, 2): the median over seeds of the step-time ratio
            sync/policy is the speed-up;
  replay    benchmarks/sim_vs_real.py: servegen-r1 (32k scaled to 4,096 tokens) replayed through the embedded
            engine, sync and tail, 5 steps, beside the simulator's prediction with a profile fitted here;
  fidelity  benchmarks/fidelity.py's `gpu-tost` setting: sync and tail of seeds 0, 1, 2, 3 in turn (the
            pre-registered equivalence test's paired seeds, the CPU setting's flags), as many as fit the
            call (--budget-s; its first line says the sizes and steps); a run cut at the budget resumes
            at the next call on the same machine; then its plot and table.

Every part appends the full log of each child process it runs (the command, its stdout and stderr, its
exit status) to `<--logs>/<part>.log`, and one JSON line of its figures (or its error) to
`<--logs>/figures.jsonl`; it writes its `###` subsection of `## One-device campaign (<device>)` in
--results.  A part that fails says so in one line naming its log, and the exit status is 1.

On a lent GPU machine with the project on PYTHONPATH and its wheels staged (nothing is pip-installed
there), one device call per part, keeping the files in /tmp between calls of the warm machine and
copying them out each time:

    C="python3 benchmarks/gpu_campaign.py --results /tmp/campaign/RESULTS.md --logs /tmp/campaign/logs"
    $C --part env,engine; cp -r /tmp/campaign $OUT/      # ~5 min
    $C --part spec; cp -r /tmp/campaign $OUT/            # ~3 min
    $C --part tests; cp -r /tmp/campaign $OUT/           # ~4 min
    $C --part compare; cp -r /tmp/campaign $OUT/         # ~9 min: 3 seeds (--seeds), alone in its call
    $C --part fidelity; cp -r /tmp/campaign $OUT/        # ~7 min; "fidelity: complete" (else call it again)

With little device time, one call runs what fits: `--part env,engine,trainer,spec,tests,compare
--deadline-s 540 --logs $OUT/logs --results $OUT/RESULTS.md` (logs straight into $OUT, so a call cut
short still returns what finished); a part that no longer fits is skipped and named.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_campaign_report import (  # noqa: E402
    engine_body, env_body, fidelity_body, policies_body, spec_body, tests_body, trainer_body)
from results_md import RESULTS, write_section  # noqa: E402

PARTS = ("env", "engine", "spec", "trainer", "tests", "compare", "fidelity", "replay")
# (full, tiny) sizes of each part
# full: sized for an 80 GB GPU and SmolLM2-135M; the engine part measures transformers' continuous
# batching beside the embedded engine and static `generate` (same requests, same rows)
ENGINE_SIZES = {"full": ["--requests", "256", "--cap", "1024", "--batch", "128", "--repeats", "1"],
                "tiny": ["--requests", "4", "--cap", "8", "--batch", "4", "--repeats", "1"]}
SPEC_SIZES = {"full": ["--rows", "1,4,16", "--repeats", "1"],
              "tiny": ["--rows", "1", "--max-tokens", "8", "--group", "2", "--repeats", "1"]}
TRAINER_SIZES = {"full": dict(batch=8, prompt=256, response=768, iters=5), "tiny": dict(batch=2, prompt=8, response=8, iters=2)}
# the replay part: benchmarks/sim_vs_real.py on the embedded engine, servegen-r1's 32k setting scaled to 4k
REPLAY_SIZES = {"full": ["--model", "default", "--max-tokens", "4096", "--scale-from", "32768", "--prompts", "16",
                         "--samples", "8", "--capacity", "128", "--steps", "5", "--fit-steps", "3", "--policies",
                         "sync,tail", "--seeds", "0", "--grid", "gpu"],
                "tiny": ["--quick", "--steps", "3", "--fit-steps", "2"]}
TRAIN_SIZES = {"full": ["--steps", "6", "--prompts", "16", "--samples", "8", "--max-tokens", "512",
                        "--engine-capacity", "160", "--dataset-size", "512",
                        "--reward-workers", "8"],
               "tiny": ["--preset", "tiny_debug", "--steps", "1"]}
# seconds each part took on a lent H100 (2026-11-26, full sizes; compare: a seed; fidelity: its one-call budget): --deadline-s
# skips a part that no longer fits, so one device call runs what fits in the time left
PART_SECONDS = {"env": 15, "engine": 260, "trainer": 20, "spec": 45, "tests": 125, "compare": 180, "fidelity": 480,
                "replay": 480}  # (replay: an estimate, never run on a GPU yet; engine: 170 s measured without
# transformers' continuous batching, 260 an estimate with it)
# what the campaign imports: required, and optional with what needs it
REQUIRED_MODULES = ("torch", "transformers", "safetensors", "attrs", "immutables", "numpy", "aiohttp", "tyro",
                    "tqdm", "matplotlib", "gguf", "reasoning_gym")
OPTIONAL_MODULES = {"torchtitan": "--trainer titan (the campaign falls back to --trainer torch)",
                    "math_verify": "--reward math only", "datasets": "--dataset FILE only",
                    "tensorboard": "the tensorboard/ event files only",
                    "pytest_timeout": "per-test timeouts in the tests part", "pytest_benchmark": "pyproject's addopts "
                    "(the tests part passes -o addopts=-ra instead)"}


class PartFailed(Exception):
    """A part's child process failed or timed out; the message names its log."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="all", help=f"comma-separated parts of {', '.join(PARTS)}, or all")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: cuda when available")
    ap.add_argument("--trainer", default="auto", choices=("auto", "titan", "torch"),
                    help="auto: titan when TorchTitan imports, else torch (said so in the output)")
    ap.add_argument("--model", default=None, help="HF model directory (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"), help="default: bfloat16 on cuda, else float32")
    ap.add_argument("--policies", default="sync,tail", help="the compare part's --compare list; the first is the baseline")
    ap.add_argument("--seeds", default=None,
                    help="the compare part's seeds, comma-separated, one run of every policy each; its step-time ratio "
                         "is their median (default: 0,1,2; --tiny: 0)")
    ap.add_argument("--fidelity-steps", type=int, default=None,
                    help="steps of each fidelity run (default: benchmarks/fidelity.py's gpu-tost setting; tiny: 2)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="seconds a part may run (its child is stopped at the limit; fidelity resumes next call)")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="seconds this call may take in all: a part is skipped (and said so) when less time is left "
                         "than it needs on an H100 (PART_SECONDS: measured, or estimated where never run), and no part "
                         "runs past the deadline")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes: a CPU smoke run of every part")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_campaign", help="run directory")
    ap.add_argument("--logs", type=Path, default=None, help="each part's <part>.log and figures.jsonl (default: OUT/logs)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="RESULTS.md to write the section into")
    args = ap.parse_args(argv)
    args.parts = PARTS if args.part == "all" else tuple(p.strip() for p in args.part.split(","))
    bad = [p for p in args.parts if p not in PARTS]
    if bad:
        ap.error(f"--part: unknown part(s) {', '.join(bad)}; choose from {', '.join(PARTS)} or all")
    args.logs = args.logs or args.out / "logs"
    try:
        args.seed_list = [int(x) for x in (args.seeds or ("0" if args.tiny else "0,1,2")).split(",")]
    except ValueError:
        ap.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    return args


def run_logged(cmd: list[str], args: argparse.Namespace, part: str, timeout: float | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run `cmd`, appending its command, stdout, stderr and exit status to <logs>/<part>.log; PartFailed
    (naming the log and stderr's last line) when it fails or passes `timeout` (default: --budget-s)."""
    log = args.logs / f"{part}.log"
    args.logs.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout or args.budget_s)
        out, err, status = proc.stdout, proc.stderr, f"exit status {proc.returncode}"
    except subprocess.TimeoutExpired as exc:
        proc = None
        out, err = (_text(exc.stdout), _text(exc.stderr))
        status = f"stopped after {exc.timeout:.0f} s"
    with log.open("a") as f:
        f.write(f"$ {_shown(cmd)}\n--- stdout\n{out}\n--- stderr\n{err}\n--- {status}\n\n")
    if proc is None or (check and proc.returncode != 0):
        last = next((line for line in reversed(err.splitlines()) if line.strip()), "")
        raise PartFailed(f"{_shown(cmd)}: {status} ({last.strip()[:300]}); full log: {log}")
    return proc


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def append_figures(args: argparse.Namespace, part: str, figures: dict) -> None:
    args.logs.mkdir(parents=True, exist_ok=True)
    with (args.logs / "figures.jsonl").open("a") as f:
        f.write(json.dumps({"part": part, "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **figures}) + "\n")


def pick_trainer(wanted: str) -> tuple[str, str]:
    """(trainer, why) for --trainer; auto falls back to the torch trainer when TorchTitan cannot import."""
    from rollpacker.backends.titan.trainer import titan_import_error

    problem = titan_import_error()
    if wanted == "titan" and problem is not None:
        raise SystemExit(f"error: --trainer titan: {problem}")
    if wanted != "auto":
        return wanted, f"--trainer {wanted}"
    if problem is None:
        return "titan", "TorchTitan imports"
    return "torch", f"TorchTitan unavailable ({problem}): using --trainer torch"


def run_env(args: argparse.Namespace, size: str) -> dict:
    """Versions and the import of every module on the campaign's path, in a child process."""
    code = ("import importlib, json, sys\nfound = {}\nfor m in sys.argv[1:]:\n    try:\n"
            "        importlib.import_module(m); found[m] = 'ok'\n    except Exception as e:\n"
            "        found[m] = f'{type(e).__name__}: {e}'; print(m, found[m], file=sys.stderr)\n"
            "import torch, transformers\nprint(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__, "
            "'cuda': torch.version.cuda, 'transformers': transformers.__version__, 'gpu': torch.cuda.get_device_name() "
            "if torch.cuda.is_available() else None, 'modules': found}))")
    proc = run_logged([sys.executable, "-c", code, *REQUIRED_MODULES, *OPTIONAL_MODULES], args, "env")
    env = json.loads(proc.stdout.strip().splitlines()[-1])
    env["missing_required"] = [m for m in REQUIRED_MODULES if env["modules"][m] != "ok"]
    env["missing_optional"] = {m: why for m, why in OPTIONAL_MODULES.items() if env["modules"][m] != "ok"}
    if env["missing_required"]:
        raise PartFailed(f"required modules do not import: {', '.join(env['missing_required'])} (stage them; "
                         f"nothing may be pip-installed on the machine); full log: {args.logs / 'env.log'}")
    return env


def run_engine(args: argparse.Namespace, size: str) -> dict:
    cmd = [sys.executable, "benchmarks/engine_throughput.py", "--device", args.device, "--dtype", args.dtype,
           *(["--model", args.model] if args.model else []), *ENGINE_SIZES[size]]
    proc = run_logged(cmd, args, "engine")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "command": _shown(cmd)}


def run_spec(args: argparse.Namespace, size: str) -> dict:
    cmd = [sys.executable, "benchmarks/spec_decode.py", "--device", args.device, "--dtype", args.dtype,
           *(["--model", args.model] if args.model else []), *SPEC_SIZES[size]]
    proc = run_logged(cmd, args, "spec")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {"rows": lines, "command": _shown(cmd)}


def run_tests(args: argparse.Namespace, size: str) -> dict:
    """Every gpu-marked test under tests/, selected by the marker (no list of files to fall behind);
    `-o addopts=-ra`: pyproject's addopts need pytest-benchmark; `-v`: a call cut short still shows
    each finished test's outcome in the log."""
    import importlib.util

    timeout = ["--timeout", "240"] if importlib.util.find_spec("pytest_timeout") else []
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-o", "addopts=-ra", "-p", "no:cacheprovider", "-v",
           "--durations=8", *timeout, "tests"]
    proc = run_logged(cmd, args, "tests", check=False)
    summary = next((line for line in reversed(proc.stdout.splitlines())
                    if __import__("re").search(r"\d+ (passed|failed|skipped|deselected|error).* in ", line)), "")
    counts = {k: int(n) for n, k in __import__("re").findall(r"(\d+) (passed|failed|skipped|deselected|error)", summary)}
    if proc.returncode not in (0, 5) or counts.get("failed") or counts.get("error"):  # 5: none collected
        raise PartFailed(f"gpu tests: {summary.strip('= ') or f'exit status {proc.returncode}'}; full log: "
                         f"{args.logs / 'tests.log'}")
    return {**counts, "summary": summary.strip("= "), "command": _shown(cmd)}


def run_policies(args: argparse.Namespace, size: str) -> dict:
    """`reference/train.py --compare` once per seed (same sizes); each seed's summary, and the median
    over seeds of each policy's step-time ratio to the first."""
    runs = {seed: _compare_one_seed(args, size, seed) for seed in args.seed_list}
    first = runs[args.seed_list[0]]
    peaks = [r["cuda_peak_gib"] for r in runs.values() if r["cuda_peak_gib"] is not None]
    return {"policies": first["policies"], "seeds": args.seed_list, "runs": runs, "memory_plan": first["memory_plan"],
            "command": first["command"], "cuda_peak_gib": max(peaks, default=None),
            "median_step_time_ratio": median_ratios(list(runs.values()))}


def median_ratios(runs: list[dict]) -> dict[str, float]:
    """Each non-baseline policy's step-time ratio, the median over the runs (seeds)."""
    return {p: statistics.median(r["step_time_ratio"][p] for r in runs) for p in runs[0]["policies"][1:]}


def _compare_one_seed(args: argparse.Namespace, size: str, seed: int) -> dict:
    out = args.out / "compare" / f"seed{seed}"
    shutil.rmtree(out, ignore_errors=True)  # --compare writes fresh runs
    cmd = [sys.executable, "reference/train.py", *TRAIN_SIZES[size], "--compare", args.policies, "--seed", str(seed),
           "--device", args.device, "--trainer", args.trainer, "--dtype", args.dtype, "--out", str(out),
           *(["--model", args.model] if args.model else [])]
    proc = run_logged(cmd, args, "compare")
    plan = next((line for line in proc.stdout.splitlines() if line.startswith("memory plan")), "")
    peaks = [json.loads(line).get("cuda_peak_gib") for p in args.policies.split(",")
             for line in (out / p.strip() / "metrics.jsonl").read_text().splitlines()]
    peak = max((x for x in peaks if x is not None), default=None)
    return {**json.loads((out / "compare.json").read_text()), "command": _shown(cmd), "memory_plan": plan,
            "cuda_peak_gib": peak}


def run_trainer(args: argparse.Namespace, size: str) -> dict:
    """Forward+backward of the run's trainer in a child process (its memory is freed on exit)."""
    sizes = TRAINER_SIZES[size]
    cmd = [sys.executable, "benchmarks/trainer_worker.py", json.dumps(
        dict(sizes, model=args.model, trainer=args.trainer, device=args.device, dtype=args.dtype))]
    proc = run_logged(cmd, args, "trainer")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_fidelity(args: argparse.Namespace, size: str) -> dict:
    """benchmarks/fidelity.py (setting gpu-tost: sync and tail of seeds 0, 1, 2, 3 in turn, the pre-registered
    equivalence test's design; or tiny, seed 0) within --budget-s; the runs stay in OUT/fidelity, so a later
    call on the same machine resumes a cut one."""
    import fidelity
    from fidelity_report import report

    flags = ["--setting", "tiny" if size == "tiny" else "gpu-tost", "--seeds", "0" if size == "tiny" else "0,1,2,3",
             "--device", args.device,
             "--trainer", args.trainer, "--budget-s", str(args.budget_s), "--state", str(args.out / "fidelity"),
             "--metrics", str(args.logs / "fidelity"), "--plot", str(args.logs / "fidelity.png"),
             "--log", str(args.logs / "fidelity.log"), *(["--model", args.model] if args.model else []),
             *(["--steps", str(args.fidelity_steps)] if args.fidelity_steps else [])]
    fargs = fidelity.parse_args(flags)
    what = (f"{len(fargs.policy_list)} policies ({', '.join(fargs.policy_list)}) x seeds {fargs.seeds}; {fargs.steps} steps each: "
            f"{fidelity.SETTINGS[fargs.setting].what}")
    print(f"fidelity: {what}", flush=True)
    outcomes = fidelity.advance_all(fargs)
    failed = {name: outcome for name, outcome in outcomes.items() if outcome.startswith("failed")}
    if failed:
        raise PartFailed("; ".join(f"{name} {outcome}" for name, outcome in failed.items()))
    summary = report(fargs.metrics, fargs.plot, None, fidelity.runs_of(fargs), fargs.steps)
    return {"complete": summary["complete"], "what": what, "outcomes": outcomes, "plot": str(fargs.plot),
            "command": _shown([sys.executable, "benchmarks/fidelity.py", *flags]), "text": summary["text"],
            "rows": summary["rows"]}


def run_replay(args: argparse.Namespace, size: str) -> dict:
    """benchmarks/sim_vs_real.py: servegen-r1 replayed through the embedded engine, sync and tail, beside the
    simulator's prediction with the engine's profile fitted on this device."""
    import sim_vs_real

    out = args.out / "replay"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "benchmarks/sim_vs_real.py", *REPLAY_SIZES[size], "--device", args.device, "--out", str(out)]
    proc = run_logged(cmd, args, "replay")
    result = json.loads((out / "result.json").read_text())
    return {"text": sim_vs_real.report(result), "headline": proc.stdout.strip().splitlines()[-1],
            "profile": result["profile"], "command": _shown(cmd)}


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()}, {__import__('os').cpu_count()} cores)"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import torch

    from rollpacker.core.errors import ConfigError
    from rollpacker.train.config import resolve_device

    try:
        args.device = resolve_device(args.device)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.trainer, why = pick_trainer(args.trainer)
    size = "tiny" if args.tiny else "full"
    name = device_name(args.device)
    command = _shown([sys.executable, "benchmarks/gpu_campaign.py", *argv])
    header = f"On {name}, torch {torch.__version__}, trainer {args.trainer} ({why}), {args.dtype}."
    print(f"campaign on {name}: trainer {args.trainer} ({why}); parts {','.join(args.parts)}; results into "
          f"{args.results}, logs into {args.logs}", flush=True)
    title = f"One-device campaign ({name})"
    parts = {"env": ("Environment", run_env, env_body),
             "engine": ("Embedded engine", run_engine, engine_body),
             "spec": ("Speculation in the tail", run_spec, spec_body),
             "trainer": ("Trainer", run_trainer, lambda r, h: trainer_body(r, h, command)),
             "tests": ("GPU tests", run_tests, tests_body),
             "compare": (f"Reference trainer: {args.policies.replace(',', ' vs ')}", run_policies, policies_body),
             "fidelity": ("Fidelity: reward curves", run_fidelity, fidelity_body),
             "replay": ("Simulator against the engine: a length trace replayed", run_replay,
                        lambda r, h: f"{h}\n\n{r['text']}\n{r['headline']}\n")}
    failed, skipped, began, budget = [], [], time.monotonic(), args.budget_s
    for part in args.parts:
        subsection, run, body_of = parts[part]
        if args.deadline_s is not None:
            left = args.deadline_s - (time.monotonic() - began)
            needs = PART_SECONDS[part] * (len(args.seed_list) if part == "compare" else 1)
            if left < needs:
                print(f"== {part}: skipped: {left:.0f} s left of --deadline-s {args.deadline_s:.0f}, and it needs "
                      f"~{needs} s on an H100 ==", flush=True)
                append_figures(args, part, {"skipped": f"{left:.0f} s left, needs ~{needs} s"})
                skipped.append(part)
                continue
            args.budget_s = min(budget, left)
        print(f"== {part}: {subsection} ==", flush=True)
        start = time.monotonic()
        try:
            figures = run(args, size)
        except (PartFailed, OSError, ValueError, KeyError) as exc:  # a crash here keeps the other parts
            append_figures(args, part, {"error": str(exc), "seconds": round(time.monotonic() - start, 1)})
            print(f"error: part {part} failed: {exc}", file=sys.stderr, flush=True)
            failed.append(part)
            continue
        append_figures(args, part, {**figures, "seconds": round(time.monotonic() - start, 1), "header": header})
        body = body_of(figures, header)
        write_section(title, body, subsection=subsection, path=args.results)
        print(body, flush=True)
        if part == "fidelity":
            print(f"fidelity: {figures['what']}: {'complete' if figures['complete'] else 'incomplete, call again'}",
                  flush=True)
    if skipped:
        print(f"skipped for the deadline: {', '.join(skipped)} (run them in another call)", flush=True)
    return 1 if failed else 0


def _shown(cmd: list[str]) -> str:
    """A command as a reader would type it: the interpreter as `python`."""
    return " ".join(["python", *cmd[1:]] if cmd and cmd[0] == sys.executable else cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
