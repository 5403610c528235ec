"""Part 1 and the trainer of part 2 of benchmarks/sim_vs_real.py: time the engine on a grid and fit its profile,
time the trainer on a grid and fit its constants; the grids, and where each model and engine comes from."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import attrs

from sim_vs_real_report import profile_line

from rollpacker.sim.engine_profile import EngineProfile, Run, fit_abort, fit_profile, load_profile

GRIDS = {"quick": dict(rows=(1, 8, 32, 64), prompts=(32, 128), news=(16, 96), repeats=2,
                       trainer=dict(rows=(2, 8, 32), prompts=(32, 128), responses=(8, 64, 128), repeats=2)),
         "full": dict(rows=(1, 4, 16, 32, 64), prompts=(32, 256), news=(16, 64, 192), repeats=3,
                      trainer=dict(rows=(2, 8, 32), prompts=(32, 128), responses=(8, 64), repeats=2)),
         "gpu": dict(rows=(1, 16, 64, 128), prompts=(64, 512), news=(64, 512), repeats=2,
                     trainer=dict(rows=(4, 16), prompts=(64, 256), responses=(256, 1024), repeats=2)),
         "sglang": dict(rows=(1, 4, 8), prompts=(32, 128), news=(16, 64), repeats=2,
                        trainer=dict(rows=(2, 16), prompts=(32, 128), responses=(8, 64), repeats=2)),
         "default-model": dict(rows=(1, 4, 8, 16), prompts=(32, 128), news=(8, 32), repeats=2,
                               trainer=dict(rows=(1, 4), prompts=(32, 96), responses=(8, 32), repeats=1))}


# -- the engine and its profile --------------------------------------------------------------------

def model_dir(name: str) -> str:
    from rollpacker.backends.models import default_model_dir, tiny_random_llama

    return str(tiny_random_llama() if name == "tiny" else default_model_dir() if name == "default" else Path(name))


def calibrate(args, out: Path, urls: list[str] | None) -> EngineProfile:
    """Part 1: the engine's profile (an existing --profile is read instead)."""
    if args.profile:
        return load_profile(args.profile)
    from rollpacker.backends.calibration import Calibration
    from rollpacker.backends.models import load_model

    model, _ = load_model(model_dir(args.model), dtype=args.dtype, device=args.device)
    engine, capacity = calibration_engine(args, model, urls)
    grid = GRIDS[args.grid]
    print(f"calibrating {args.engine} ({args.model}): {len(grid['rows']) * len(grid['prompts']) * len(grid['news'])} "
          f"cells x {grid['repeats']}", flush=True)
    try:
        cal = Calibration(engine, vocab_size=model.config.vocab_size, seed=0)
        runs = cal.grid(grid["rows"], grid["prompts"], grid["news"], grid["repeats"])
        aborts = fit_abort(cal.aborts(new=args.max_tokens, after_s=abort_after(runs, args.max_tokens)))
        forwards = None if args.engine == "sglang" else timed_forwards(engine, capacity, grid["prompts"])
    finally:
        engine.close()
    fits = [fit_profile(runs, engine=engine_name(args), model=args.model, machine=machine(),
                        date=time.strftime("%Y-%m-%d"), max_running=capacity, kv_capacity=capacity * 8192,
                        admit_fraction=admit_fraction(args), shared_prefill=shared_prefill(args),
                        attention_columns=attention_columns(args), forwards=timed, **aborts)
            for timed in ([None, forwards] if forwards else [None])]
    profile = min(fits, key=lambda f: f.fit["median_abs_error"])  # (the one that explains the grid's runs better)
    if forwards:
        print("the grid's runs, median error: a line in rows {:.1%}, the decode steps timed alone {:.1%}".format(
            *(f.fit["median_abs_error"] for f in fits)), flush=True)
        other = {"forwards_not_used": forwards, "forwards_median_abs_error": fits[1].fit["median_abs_error"]} \
            if profile is fits[0] else {"line_median_abs_error": fits[0].fit["median_abs_error"]}
        profile = attrs.evolve(profile, fit={**profile.fit, **other})
    profile.save(out / "profile.json")
    print(f"profile: {profile_line(profile)}", flush=True)
    return profile


FORWARD_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
"""The rows counts whose decode steps the calibration times alone (those up to the engine's capacity, and it)."""


def timed_forwards(engine, capacity: int, prompts) -> dict:
    """The embedded engine's single forwards (`EngineProfile.decode_rows`, `forward_terms`): decode steps at each
    rows count of `FORWARD_ROWS` up to `capacity` at 32 tokens a row and at the grid's longest prompt, prefills of
    16 tokens and of each grid prompt length."""
    rows = sorted({r for r in FORWARD_ROWS if r < capacity} | {capacity})
    times = engine.time_forwards(rows=rows, context=32, long_context=max(prompts), prompts=(16, *prompts))
    print(f"decode steps timed alone: {', '.join(f'{s * 1e3:.1f} ms at {b}' for b, s in times.decode)} rows",
          flush=True)
    return {"context": times.context, "long_context": times.long_context, "decode": [list(d) for d in times.decode],
            "decode_long": [list(d) for d in times.decode_long], "prefill": [list(p) for p in times.prefill]}


def abort_after(runs: list[Run], new: int) -> float:
    """Seconds the abort calibration lets its requests run before the abort: a quarter of what the grid predicts
    for the quickest of them (one request of 32 prompt tokens generating `new`), at most 0.2 s, so that the abort
    still catches them running on a faster engine (a fixed 0.2 s let a fast CPU finish 128 tokens first)."""
    grid = fit_profile(runs, engine="grid", model="", machine="", date="", max_running=1, kv_capacity=1)
    return min(0.2, grid.predict(Run(1, 32, new, 0.0)) / 4)


def calibration_engine(args, model, urls):
    """(one engine instance as the runs use it, its running-request limit)."""
    if args.engine == "sglang":
        from rollpacker.backends.sglang.client import SGLangEngine

        return SGLangEngine(urls[:1], model_config_dir=model_dir(args.model)), args.capacity // len(urls)
    from rollpacker.backends.embedded.engine import EmbeddedEngine

    columns = max(GRIDS[args.grid]["prompts"]) + max(max(GRIDS[args.grid]["news"]), args.max_tokens)
    return EmbeddedEngine(model, capacity=args.capacity, kv_tokens_per_row=columns), args.capacity


def admit_fraction(args) -> float:
    """The engine's admission rule (`EngineProfile.admit_fraction`): the embedded engine's default; SGLang
    admits at every scheduling step (0)."""
    import inspect

    from rollpacker.backends.embedded.engine import EmbeddedEngine

    return 0.0 if args.engine == "sglang" else inspect.signature(EmbeddedEngine).parameters["admit_fraction"].default


def shared_prefill(args) -> bool:
    """Whether the engine prefills a prompt once for the requests of one admission
    (`EngineProfile.shared_prefill`): the embedded engine does (`Runner.prefill`); SGLang's default
    first-come schedule does not."""
    return args.engine != "sglang"


def attention_columns(args) -> int:
    """The columns a decode step's rows attend (`EngineProfile.attention_columns`): the embedded engine attends
    every row over the longest row's context, rounded up to its device's column multiple; SGLang's paged
    attention, each row its own (0)."""
    from rollpacker.backends.embedded.buckets import COL_MULTIPLE

    return 0 if args.engine == "sglang" else COL_MULTIPLE["cuda" if args.device == "cuda" else "cpu"]


def engine_name(args) -> str:
    if args.engine == "sglang":
        return "SGLang 0.5.23 (CPU, torch_native, float32)"
    return f"embedded ({device_name(args.device)}, {args.dtype})"


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "CPU"


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores"


def calibrate_trainer(args, micro_batch_tokens: int) -> dict:
    """Part 2: the reference trainer's micro-batch seconds fitted on a grid of (rows, prompt, response)
    (`rollpacker.sim.stages.fit_train`), and its optimizer step."""
    from rollpacker.backends.calibration import time_trainer
    from rollpacker.sim.stages import fit_train
    from rollpacker.train.config import parse
    from rollpacker.train.session import build_trainer

    config = parse(["--model", model_dir(args.model), "--trainer", "torch", "--max-tokens", str(args.max_tokens),
                    "--micro-batch-tokens", str(micro_batch_tokens), "--device", args.device, "--dtype", args.dtype])
    trainer = build_trainer(config, Path(model_dir(args.model)))
    grid = GRIDS[args.grid]["trainer"]
    timings = time_trainer(trainer, vocab_size=trainer.vocab_size, **grid)
    fitted = fit_train(timings[:-1])
    print(f"trainer: {fitted}, optimizer step {timings[-1][3]:.3f} s", flush=True)
    return fitted | {"optimizer_s": timings[-1][3]}
