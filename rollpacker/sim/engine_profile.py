"""An engine profile: the simulator's instance latency model fitted to an engine we ran, in a file.

The simulator's instances cost a decode step `t0 + t1 * b + t2 * C` (b running requests, C tokens of
context they hold) and an admission `t0 + prefill_t1` a prompt token (one batched forward: its fixed cost
is a decode step's); `rollpacker.core.cost_model.CostModel` derives those from a GPU's datasheet figures.
A profile states them as measured instead:

    {"engine": "embedded", "model": "tiny-random-llama", "machine": "x86_64, 2 cores", "date": "2026-11-27",
     "t0": 0.004, "t1": 0.0002, "t2": 1e-08, "prefill_t1": 2e-05, "run_overhead_s": 0.003,
     "abort_s": 0.001, "max_running": 32, "kv_capacity": 1000000, "fit": {...}}

`rollpacker simulate --engine-profile FILE` runs the simulation on instances of that engine (TP fixed at
1, one instance per engine).  `fit_profile` makes one from timed runs (`Run`: b requests of p prompt
tokens each generating n tokens, submitted together, `seconds` from submission to the last result):

    seconds = run_overhead_s + prefill_t1 * b * p + (n + 1) * t0 + n * b * t1 + t2 * b * (n * p + n * (n - 1) / 2)

(the prefill is one forward more: n + 1 forwards' fixed cost; `run_overhead_s`, the submission and the last
answer's way back, is measured and left out of the simulation, as a live round pays it once, not per
admission).  On the live rollout path a decode step costs more than on the grid (the driver shares the
engine's interpreter and cores): `step_s`, fitted on a live run's rounds (`fit_live_terms`), is added to
each decode step's fixed cost.  An engine that prefills a prompt once for its samples admitted together
(`shared_prefill`, the embedded engine) is charged so; the grid's prompts are all distinct, so the fit's
`prefill_t1` is a prompt token's cost either way.

A run's seconds are linear in the five constants, so a least-squares fit (constants held >= 0) over a
grid of (b, p, n) finds them; `rollpacker.backends.calibration` times such runs on any rollout engine.

Where the engine's single forwards can be timed (the embedded engine: `backends.embedded.forward_timing`), the
decode step's cost is a table by rows (`decode_rows`) and the prefill's is measured the same way; the grid's
runs then fit only the run's fixed overhead, and their error checks the forwards (a decode forward's cost is
not linear in its rows on a CPU, where a line fitted on whole runs charges small and full batches wrongly).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import numpy as np
from attrs import field, frozen

from rollpacker.core.errors import ConfigError
from rollpacker.core.validators import non_negative_number, positive

TERMS = ("run_overhead_s", "prefill_t1", "t0", "t1", "t2")
"""The fitted constants, in the order of `Run.features`."""
NUMBERS = TERMS + ("loop_s", "abort_s", "abort_request_s", "launch_s", "return_s", "submit_s", "step_s", "event_s", "admit_fraction", "max_running",
                   "kv_capacity", "attention_columns")
"""A profile file's fields that must be finite numbers >= 0."""


class ProfileError(ConfigError):
    """An engine profile file that cannot be used; the message names the file and the field."""


@frozen
class Run:
    """One timed calibration run: `rows` requests of `prompt` tokens, each generating `new` tokens."""

    rows: int
    prompt: int
    new: int
    seconds: float

    def features(self) -> list[float]:
        b, p, n = self.rows, self.prompt, self.new
        return [1.0, b * p, n + 1, n * b, b * (n * p + n * (n - 1) / 2)]


@frozen(kw_only=True)
class EngineProfile:
    engine: str
    model: str
    machine: str
    date: str
    t0: float = field(validator=non_negative_number)
    """Seconds of a forward whatever its rows (launches, weights read, scheduling): a decode step's and a prefill's
    (with `decode_rows`, a prefill's alone: the table holds the decode steps' whole cost)."""
    t1: float = field(validator=non_negative_number)
    """Seconds a running request adds to a decode step."""
    t2: float = field(validator=non_negative_number)
    """Seconds a token of context adds to a decode step."""
    prefill_t1: float = field(validator=non_negative_number)
    """Seconds a prompt token adds to a prefill."""
    run_overhead_s: float = field(validator=non_negative_number)
    """Seconds a calibration run pays once whatever its size: the submission reaching the engine and
    the last answer coming back (measured; not simulated)."""
    abort_s: float = field(default=0.0, validator=non_negative_number)
    """Seconds from an abort to its result (measured), plus `abort_request_s` for each request the one abort
    call catches on the instance: the simulator delivers each abort's result that long after it (the round
    that aborts its tail ends no sooner)."""
    abort_request_s: float = field(default=0.0, validator=non_negative_number)
    """Seconds the abort latency grows by for each request one abort catches (measured: `fit_abort`)."""
    launch_s: float = field(default=0.0, validator=non_negative_number)
    """Seconds from a launch to the engine having the request, on the live rollout path: the submission's way
    in (HTTP, the server's front end and queue) and, as a live round pays it once, the last answer's way back;
    fitted with `step_s` on a run of the whole rollout path (`fit_live_terms`), 0 from the grid alone.  The
    simulator queues a launched request on its instance that long after the launch."""
    return_s: float = field(default=0.0, validator=non_negative_number)
    """Seconds from the engine finishing a request to the driver having its answer, on the live rollout path
    (the answer's way back: the server's detokenizer and front end, HTTP): the engine's row is free at once,
    the round's decisions (a group complete, the tail's abort, a refill) wait for it while the other requests
    decode on.  Fitted on a run's wasted tokens (`fit_return_s`), 0 from the grid alone."""
    submit_s: float = field(default=0.0, validator=non_negative_number)
    """Engine seconds each launched request costs its instance once it reaches it, on the live rollout path (its
    submission handled on cores the engine shares: the HTTP call, the server's front end and tokenizer); fitted
    with the other live terms where the fit rounds differ in their launches, 0 from the grid alone."""
    step_s: float = field(default=0.0, validator=non_negative_number)
    """Engine seconds each decode step loses on the live rollout path beyond the calibration grid's: the
    driver's thread (the core's events, the token store, reward staging) sharing the engine's interpreter
    and cores (on SGLang here, the trainer too); fitted on a run of the whole rollout path (`fit_live_terms`),
    0 from the grid alone.  A decode step's fixed cost in the simulation is t0 + step_s; an admission's
    prefill is part of the same engine step and pays t0 only."""
    event_s: float = field(default=0.0, validator=non_negative_number)
    """Engine seconds lost to each request that finishes (aborts are not charged): fitted (`fit_event_s`)
    instead of `step_s` where the trainer trains beside the rollout on the engine's cores (its micro-batches
    follow the finished requests); where training waits for the round's end, fitted with `launch_s` and
    `step_s` when the fit run's rounds differ in their finished requests (a tail fit run: on SGLang here, the
    finished request's way back, its reward job and its queued successor's admission, all on shared cores),
    else 0."""
    max_running: int = field(validator=positive)
    """Requests the engine decodes at once."""
    admit_fraction: float = field(default=0.0, validator=non_negative_number)
    """While requests run, waiting ones start only once this share of the running count can start
    together, or all of them (one batched prefill; the embedded engine's `admit_fraction`, a setting,
    not a measurement); 0: each as soon as a slot frees."""
    kv_capacity: int = field(validator=positive)
    """Tokens of KV cache (beyond it the simulator preempts)."""
    shared_prefill: bool = field(default=False, validator=attrs.validators.instance_of(bool))
    """The requests of one admission that share a prompt (a group's samples) prefill it once, its KV cache
    copied to the siblings (the embedded engine); False: each request its own (SGLang here: its default
    first-come schedule computes a batch's equal prompts each, its radix cache filled after the prefill).
    A property of the engine, not a measurement: the calibration grid's prompts are all distinct."""
    decode_rows: list = field(factory=list)
    """[rows, seconds] of a decode step timed alone at each of several rows counts, each row holding
    `decode_context` tokens (the embedded engine: `forward_timing`); a step at b rows then costs the table's
    seconds at b (linear between its points) + `loop_s` + t1 x b + `step_s` + t2 x (its context - b x
    decode_context).
    Empty: t0 + t1 x b + t2 x context (fitted on whole runs: SGLang here, whose forwards are not timed)."""
    decode_context: int = field(default=0, validator=non_negative_number)
    """The tokens of context each row held where `decode_rows` was timed."""
    loop_s: float = field(default=0.0, validator=non_negative_number)
    """With `decode_rows`: seconds a decode step costs beyond its forward timed alone (the engine loop's own
    work), fitted on the grid's runs with t1 a row (the loop's work a row) and the run's fixed overhead."""
    attention_columns: int = field(default=0, validator=non_negative_number)
    """0: a decode step's context term (t2) counts each running request's own context (paged attention: SGLang);
    m > 0: every row attends as many columns as the longest running row, rounded up to a multiple of m (the
    embedded engine: `buckets.COL_MULTIPLE` of its device), so rows of unequal context cost rows x the longest.
    A property of the engine, not a measurement: the calibration grid's rows are all equal, where both agree."""
    fit: dict = field(factory=dict)
    """How the constants were found: runs, residuals."""

    def cost(self) -> ProfileCost:
        line_t0, line_t1 = decode_line(self.decode_rows) if self.decode_rows else (self.t0, 0.0)
        return ProfileCost(t0=line_t0 + self.loop_s + self.step_s, t1=line_t1 + self.t1, t2=self.t2,
                           prefill_t1=self.prefill_t1,
                           decode_rows=tuple(map(tuple, self.decode_rows)), decode_context=self.decode_context,
                           step_s=self.loop_s + self.step_s, row_s=self.t1,
                           prefill_batch_s=self.t0, kv_capacity=self.kv_capacity, event_s=self.event_s,
                           admit_fraction=self.admit_fraction, shared_prefill=self.shared_prefill,
                           abort_s=self.abort_s, abort_request_s=self.abort_request_s, launch_s=self.launch_s,
                           return_s=self.return_s, submit_s=self.submit_s,
                           attention_columns=self.attention_columns)

    def predict(self, run: Run) -> float:
        """A calibration run's seconds under this profile."""
        if not self.decode_rows:
            return float(np.dot([getattr(self, t) for t in TERMS], run.features()))
        b, p, n = run.rows, run.prompt, run.new
        step = rows_seconds(self.decode_rows, b) + self.loop_s + self.t1 * b
        return (self.run_overhead_s + self.t0 + self.prefill_t1 * b * p + n * step
                + self.t2 * b * (n * p + n * (n - 1) / 2 - n * self.decode_context))

    def to_dict(self) -> dict:
        return attrs.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


@frozen(kw_only=True)
class ProfileCost:
    """A profile's constants behind `CostModel`'s interface (what `sim.engine.Instance` calls)."""

    t0: float
    t1: float
    t2: float
    prefill_t1: float
    prefill_batch_s: float
    kv_capacity: int
    event_s: float = 0.0
    admit_fraction: float = 0.0
    shared_prefill: bool = False
    abort_s: float = 0.0
    abort_request_s: float = 0.0
    launch_s: float = 0.0
    return_s: float = 0.0
    submit_s: float = 0.0
    attention_columns: int = 0
    decode_rows: tuple = ()
    decode_context: int = 0
    step_s: float = 0.0
    row_s: float = 0.0
    tp: int = 1

    def step_time(self, batch: float, context: float) -> float:
        if self.decode_rows:
            return (rows_seconds(self.decode_rows, batch) + self.step_s + self.row_s * batch
                    + self.t2 * (context - batch * self.decode_context))
        return self.t0 + self.t1 * batch + self.t2 * context

    def prefill_time(self, tokens: float, cached: float = 0.0) -> float:
        return self.prefill_t1 * tokens if tokens > 0 else 0.0

    def abort_latency(self, caught: int) -> float:
        """Seconds from one abort call that catches `caught` requests here to their results."""
        return self.abort_s + self.abort_request_s * caught

    def peak_tokens_per_s(self, batch: float) -> float:
        return batch / self.step_time(batch, batch * self.decode_context)


def rows_seconds(table, rows: float) -> float:
    """A decode step's seconds at `rows` from a `decode_rows` table: linear between its points, its end points'
    beyond them."""
    points = sorted(table)
    return float(np.interp(rows, [r for r, _ in points], [s for _, s in points]))


def decode_line(table) -> tuple[float, float]:
    """(t0, t1) of the line that fits a `decode_rows` table best (least squares, both >= 0): where the simulator
    wants a step's cost as a line (its floors' and speculation's estimates)."""
    line = fit_linear([[1.0, r] for r, _ in table], [s for _, s in table], ("t0", "t1"))
    return line["t0"], line["t1"]


def forward_terms(forwards: dict) -> dict:
    """The profile's decode and prefill constants from single forwards timed alone (`forward_timing`: "decode" and
    "decode_long" [rows, seconds] at "context" and "long_context" tokens a row, "prefill" [prompt tokens, seconds]):
    the prefill's fixed cost (t0) and its cost a token by least squares, the decode steps as a table, t2 the longer
    context's extra seconds by least squares on its extra tokens (>= 0: the full batches' weigh most), t1 0."""
    prefill = fit_linear([[1.0, p] for p, _ in forwards["prefill"]], [s for _, s in forwards["prefill"]],
                         ("t0", "prefill_t1"))
    extra = forwards["long_context"] - forwards["context"]
    context = fit_linear([[b * extra] for b, _ in forwards["decode"]],
                         [long - short for (_, short), (_, long) in zip(forwards["decode"], forwards["decode_long"])],
                         ("t2",), relative=False)
    return {**prefill, "t1": 0.0, **context,
            "decode_rows": [[b, round(s, 5)] for b, s in forwards["decode"]], "decode_context": forwards["context"]}


def load_profile(path: str | Path) -> EngineProfile:
    """Read a profile file; anything wrong is one `ProfileError` naming the file and the field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"--engine-profile {path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"--engine-profile {path}: not a JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"--engine-profile {path}: expected a JSON object of the profile's fields")
    names = {f.name for f in attrs.fields(EngineProfile)}
    missing = [f.name for f in attrs.fields(EngineProfile) if f.default is attrs.NOTHING and f.name not in data]
    unknown = sorted(set(data) - names)
    if missing or unknown:
        what = f"missing {', '.join(missing)}" if missing else f"unknown field {unknown[0]!r}"
        raise ProfileError(f"--engine-profile {path}: {what} (fields: {', '.join(sorted(names))})")
    for name in NUMBERS:
        value = data.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ProfileError(f"--engine-profile {path}: {name} must be a finite number >= 0, got {value!r}")
    if not isinstance(data.get("attention_columns", 0), int):
        raise ProfileError(f"--engine-profile {path}: attention_columns must be a whole number of columns, got "
                           f"{data['attention_columns']!r}")
    check_decode_rows(path, data.get("decode_rows", []))
    if not isinstance(data.get("shared_prefill", False), bool):
        raise ProfileError(f"--engine-profile {path}: shared_prefill must be true or false, got {data['shared_prefill']!r}")
    try:
        return EngineProfile(**data)
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"--engine-profile {path}: {exc}") from None


def check_decode_rows(path: Path, table) -> None:
    """`decode_rows` must be a list of [rows >= 1, seconds >= 0] with each rows count once."""
    good = isinstance(table, list) and all(
        isinstance(point, list) and len(point) == 2 and isinstance(point[0], int) and not isinstance(point[0], bool)
        and point[0] >= 1 and isinstance(point[1], (int, float)) and not isinstance(point[1], bool)
        and math.isfinite(point[1]) and point[1] >= 0 for point in table)
    if not good or len({point[0] for point in table}) != len(table):
        raise ProfileError(f"--engine-profile {path}: decode_rows must be a list of [rows >= 1, seconds >= 0], each "
                           f"rows count once, got {str(table)[:80]}")


def fit_linear(features: list[list[float]], seconds: list[float], names: tuple[str, ...],
               relative: bool = True) -> dict[str, float]:
    """Least squares of `seconds` on `features` (one column per name), relative error weighted (or not), every
    constant >= 0 (a term whose unconstrained fit is negative is held at 0 and the rest refitted)."""
    if len(seconds) < len(names):
        raise ConfigError(f"fitting {len(names)} constants needs at least {len(names)} timings, got {len(seconds)}")
    x = np.array(features, dtype=float)
    y = np.array(seconds, dtype=float)
    weights = 1.0 / y if relative else np.ones_like(y)  # relative: a short run counts as much as a long one
    free = list(range(len(names)))
    while free:
        coef, *_ = np.linalg.lstsq(x[:, free] * weights[:, None], y * weights, rcond=None)
        if (coef >= 0).all():
            break
        free.pop(int(np.argmin(coef)))
    values = dict.fromkeys(names, 0.0)
    values.update({names[i]: float(c) for i, c in zip(free, coef)})
    return values


def fit_profile(runs: list[Run], *, engine: str, model: str, machine: str, date: str, max_running: int,
                kv_capacity: int, abort_s: float = 0.0, abort_request_s: float = 0.0, admit_fraction: float = 0.0,
                shared_prefill: bool = False, aborts: list | None = None, attention_columns: int = 0,
                forwards: dict | None = None) -> EngineProfile:
    """The profile whose constants fit `runs`; `fit` records each run and the median relative error.  Given
    `forwards` (single forwards timed alone: `forward_terms`), the decode and prefill constants are theirs and
    the runs fit only what the forwards leave out: the run's fixed overhead and the engine loop's work a decode
    step (`loop_s`) and a row (t1), least squares of their unexplained seconds."""
    if forwards is None:
        values = fit_linear([r.features() for r in runs], [r.seconds for r in runs], TERMS)
    else:
        values = {**forward_terms(forwards), "run_overhead_s": 0.0}
    profile = EngineProfile(engine=engine, model=model, machine=machine, date=date, abort_s=abort_s,
                            abort_request_s=abort_request_s,
                            max_running=max_running, kv_capacity=kv_capacity, admit_fraction=admit_fraction,
                            shared_prefill=shared_prefill, attention_columns=attention_columns, **values)
    if forwards is not None:
        loop = fit_linear([[1.0, r.new, r.new * r.rows] for r in runs], [r.seconds - profile.predict(r) for r in runs],
                          ("run_overhead_s", "loop_s", "t1"), relative=False)
        profile = attrs.evolve(profile, **loop)
    errors = [profile.predict(r) / r.seconds - 1 for r in runs]
    fit = {"runs": [[r.rows, r.prompt, r.new, round(r.seconds, 4)] for r in runs],
           "median_abs_error": float(np.median(np.abs(errors))), "max_abs_error": float(np.max(np.abs(errors)))}
    if forwards is not None:
        fit["forwards"] = forwards
    if aborts:
        fit["aborts"] = [[rows, round(seconds, 4)] for rows, seconds in aborts]
    return attrs.evolve(profile, fit=fit)


def fit_abort(aborts: list[tuple[int, float]]) -> dict:
    """`abort_s` and `abort_request_s` from (requests one abort caught, seconds to their last result) at several
    counts (`Calibration.aborts`); the points themselves as `aborts` (kept in the profile's `fit`)."""
    values = fit_linear([[1.0, rows] for rows, _ in aborts], [seconds for _, seconds in aborts],
                        ("abort_s", "abort_request_s"))
    return {**values, "aborts": list(aborts)}


def fit_live_terms(measured: list[float], without: list[float], launches: list[float], steps: list[float],
                   events: list[float] | None = None, submits: list[float] | None = None) -> dict:
    """`EngineProfile.launch_s` and `step_s` (and `event_s`, given `events`; `submit_s`, given `submits`) from
    rounds of a run of the whole rollout path: their measured rollout seconds, the seconds predicted without any,
    and what a second more of each adds to each predicted round (`launches`: its launch waits on the round's
    path, 1 where every launch is at the round's start; `steps`: its decode steps; `events`: its finished
    requests on the round's path; `submits`: its launched requests on that path); the least squares of the
    rounds' unexplained seconds, all >= 0.  `events` only where the fit rounds differ in their finished requests,
    `submits` in their launched ones: where every round finishes (launches) as many, its cost is a launch's."""
    optional = {"event_s": events, "submit_s": submits}
    names = ("launch_s", "step_s") + tuple(name for name, column in optional.items() if column is not None)
    columns = [launches, steps] + [column for column in optional.values() if column is not None]
    return fit_linear([list(row) for row in zip(*columns)], [m - w for m, w in zip(measured, without)], names,
                      relative=False)


def fit_event_s(measured: list[tuple[float, int]], predicted: list[float]) -> float:
    """`EngineProfile.event_s` from rounds of a run of the whole rollout path: (measured rollout seconds,
    requests that finished) beside the rollout seconds predicted without it; the median of the rounds'
    unexplained seconds per finished request, >= 0."""
    per_request = [(seconds - guess) / ended for (seconds, ended), guess in zip(measured, predicted) if ended]
    return max(0.0, float(np.median(per_request))) if per_request else 0.0


def fit_return_s(measured: list[int], predicted: dict[float, list[int]]) -> float:
    """`EngineProfile.return_s` from rounds of a run of the whole rollout path: their measured generated tokens
    beside those predicted with each candidate (candidate -> the rounds' tokens); the candidate of the least
    squared difference, the smallest of equals (0 where the tokens never tell: every request runs to its end)."""
    return min(sorted(predicted), key=lambda c: sum((m - p) ** 2 for m, p in zip(measured, predicted[c])))
