"""Response lengths for the simulator: built-in traces (marginals) with a modelled per-prompt
structure, or a user's JSONL of per-prompt samples.

Built-in (rollpacker/data/<name>/lengths.json, made by benchmarks/prepare_workloads.py; licences
beside them): `servegen-r1` (ServeGen DeepSeek-R1, Apache-2.0), `azure-code`, `azure-conv` (Azure
LLM inference trace 2023, CC-BY-4.0).  They give one length distribution and no prompt identity, so
lengths are drawn through a Gaussian copula that keeps the marginal exactly:

    z = sqrt(rho) * a_prompt + sqrt(1 - rho) * e_sample,   a, e ~ N(0, 1) (seeded)
    length = Q(Phi(z)) * scale * (1 + growth) ** step,  truncated at max_tokens

Q is the trace's quantile function.  rho (`between`, default 0.9) is the share of the variance of
(normal-scored) log length that lies between prompts, as in public multi-sample data.  A prompt's effect is
fixed for the run; every launch draws new noise from the prompt's own seeded stream, so the k-th sample of
a prompt has the same length whatever other prompts were launched before it: every policy, and a real
engine replaying the workload (`rollpacker.backends.length_replay`), sees the same lengths.
`scale_from` = N maps N trace tokens to max_tokens (scale = max_tokens / N: the trace's shape at a shorter
cap, e.g. servegen-r1's 8k setting replayed at 256 tokens); None keeps the trace's tokens (scale 1).

Synthetic (`synthetic-bimodal`, no data file): a length structure unlike servegen's smooth
long tail.  A prompt is hard with probability `HARD_SHARE`; a hard prompt's samples are log-normal
around half of max_tokens (many reach the cap), an easy prompt's around 4% of it, and an easy
prompt's sample runs long (drawn as a hard one) with probability `RANDOM_LONG` (the random half of
the tail that no prediction sees).  `between` is unused.

User JSONL: one line per prompt, or per (step, prompt) as exported from a training run
(`export_trace`):

    {"prompt": "<id>", "lengths": [int, ...]}
    {"step": 3, "prompt": "<id>", "lengths": [int, ...], "finish_reasons": ["stop", "length", ...]}

An optional `"prompt_tokens": int` gives the prompt's length (default 256, at most MAX_PROMPT_TOKENS;
`rollpacker advise` writes it from a run's logs); a prompt's lines must agree on it.  A prompt's lengths (over its lines, in step order) are its successive samples, cycled (from a seeded
offset) when more are needed.  `finish_reasons`, when present, must match `lengths` one for one.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from pathlib import Path

import numpy as np
from attrs import frozen

from rollpacker.core import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = ("servegen-r1", "azure-code", "azure-conv")
SYNTHETIC = ("synthetic-bimodal",)
BUILTIN = TRACES + SYNTHETIC
HARD_SHARE = 0.25
"""synthetic-bimodal: share of hard prompts (assumption)."""
RANDOM_LONG = 0.05
"""synthetic-bimodal: chance that a sample of an easy prompt runs long (assumption)."""
MAX_PROMPT_TOKENS = 2048
"""Prompts are truncated here (RL recipes cap prompt length; verl's max_prompt_length is 512-2048)."""


class WorkloadError(ConfigError):
    """A workload name or file that cannot be used; the message names the file and line."""


@frozen
class Marginal:
    """A length distribution as a quantile function at `levels`."""

    levels: np.ndarray
    values: np.ndarray

    def quantile(self, u: np.ndarray | float) -> np.ndarray:
        return np.interp(u, self.levels, self.values)

    @property
    def mean(self) -> float:
        # trapezoid over the quantile function = E[X]
        return float(np.sum(np.diff(self.levels) * (self.values[1:] + self.values[:-1]) / 2))


class PromptStreams:
    """One seeded random stream per prompt: a prompt's k-th draw depends on (seed, salt, prompt, k) only."""

    def __init__(self, seed: int, salt: int) -> None:
        self.seed, self.salt = seed, salt
        self._streams: dict[int, np.random.Generator] = {}

    def __call__(self, prompt_index: int) -> np.random.Generator:
        stream = self._streams.get(prompt_index)
        if stream is None:
            stream = self._streams[prompt_index] = np.random.default_rng([self.seed, self.salt, prompt_index])
        return stream


class Workload:
    """Lengths of samples: `sample(prompt_index, step)` -> total response tokens (>= 1): the prompt's next
    sample, from its own stream (see the module doc)."""

    name: str
    num_prompts: int
    prompts: np.ndarray | None = None
    """Prompt tokens by prompt index, where the workload draws them."""

    def sample(self, prompt_index: int, step: int) -> int:
        raise NotImplementedError

    def prompt_tokens(self, prompt_index: int) -> int:
        return int(self.prompts[prompt_index])

    def set_prompt_tokens(self, tokens) -> None:
        """Use these prompt lengths (a real dataset's, as a replay on a real engine tokenized them)."""
        tokens = np.asarray(tokens, dtype=int)
        if len(tokens) < self.num_prompts or (tokens < 1).any():
            raise WorkloadError(f"{self.name}: {len(tokens)} prompt lengths for {self.num_prompts} prompts "
                                f"(each must be >= 1)")
        self.prompts = tokens

    def mean_length(self) -> float:
        raise NotImplementedError


class TraceWorkload(Workload):
    """`between` and `growth` are a SimConfig's (its fields check their ranges)."""

    def __init__(self, name: str, output: Marginal, input: Marginal, *, num_prompts: int, seed: int,
                 between: float = 0.9, growth: float = 0.0, max_tokens: int | None = None,
                 scale_from: int | None = None) -> None:
        self.name, self.output, self.num_prompts = name, output, num_prompts
        self.between, self.growth, self.max_tokens = between, growth, max_tokens
        self.scale = length_scale(max_tokens, scale_from)
        rng = np.random.default_rng([seed, 17])
        self.effect = rng.standard_normal(num_prompts)
        u_in = rng.random(num_prompts)
        self.prompts = np.clip(np.rint(input.quantile(u_in)), 1, MAX_PROMPT_TOKENS).astype(int)
        self.noise = PromptStreams(seed, 23)
        self._a, self._e = math.sqrt(between), math.sqrt(1.0 - between)

    def sample(self, prompt_index: int, step: int) -> int:
        z = self._a * self.effect[prompt_index] + self._e * float(self.noise(prompt_index).standard_normal())
        u = 0.5 * math.erfc(-z / math.sqrt(2.0))
        length = float(self.output.quantile(u)) * self.scale * (1.0 + self.growth) ** step
        length = max(1, int(round(length)))
        return min(length, self.max_tokens) if self.max_tokens else length

    def mean_length(self) -> float:
        return self.output.mean * self.scale


def length_scale(max_tokens: int | None, scale_from: int | None) -> float:
    """max_tokens / scale_from (1.0 without scale_from); scaling needs max_tokens."""
    if scale_from is None:
        return 1.0
    if not max_tokens or scale_from < 1:
        raise WorkloadError(f"scale_from {scale_from}: needs max_tokens and a value >= 1 (trace tokens that map to "
                            f"max_tokens)")
    return max_tokens / scale_from


class BimodalWorkload(Workload):
    """synthetic-bimodal: easy and hard prompts, and a random long tail (see the module doc)."""

    def __init__(self, *, num_prompts: int, seed: int, max_tokens: int | None = None, growth: float = 0.0) -> None:
        self.name, self.num_prompts, self.growth = "synthetic-bimodal", num_prompts, growth
        self.max_tokens = max_tokens or 16384
        rng = np.random.default_rng([seed, 31])
        self.hard = rng.random(num_prompts) < HARD_SHARE
        self.effect = rng.normal(0.0, 0.3, num_prompts)
        self.prompts = np.clip(np.rint(rng.lognormal(math.log(300), 0.6, num_prompts)), 1, MAX_PROMPT_TOKENS).astype(int)
        self.noise = PromptStreams(seed, 37)

    def sample(self, prompt_index: int, step: int) -> int:
        rng = self.noise(prompt_index)
        hard = self.hard[prompt_index] or rng.random() < RANDOM_LONG
        median = self.max_tokens * (0.5 if hard else 0.04)
        length = math.exp(math.log(median) + self.effect[prompt_index] + rng.normal(0.0, 0.5))
        length = max(1, int(round(length * (1.0 + self.growth) ** step)))
        return min(length, self.max_tokens)

    def mean_length(self) -> float:
        hard = HARD_SHARE + (1 - HARD_SHARE) * RANDOM_LONG
        return self.max_tokens * (0.5 * hard + 0.04 * (1 - hard)) * math.exp(0.5 * (0.3 ** 2 + 0.5 ** 2))


class JsonlWorkload(Workload):
    def __init__(self, path: Path, *, seed: int, num_prompts: int | None = None,
                 max_tokens: int | None = None, prompt_tokens: int = 256) -> None:
        self.name = str(path)
        self.ids, self.lengths, given = read_jsonl(path)
        self.num_prompts = len(self.ids) if num_prompts is None else num_prompts
        if self.num_prompts > len(self.ids):
            raise WorkloadError(f"{path}: {len(self.ids)} prompts, fewer than the {self.num_prompts} asked for")
        rng = np.random.default_rng([seed, 29])
        self.cursor = [int(rng.integers(len(ls))) for ls in self.lengths]
        self.max_tokens = max_tokens
        self.prompts = np.clip([given.get(p, prompt_tokens) for p in self.ids], 1, MAX_PROMPT_TOKENS).astype(int)

    def sample(self, prompt_index: int, step: int) -> int:
        lengths = self.lengths[prompt_index]
        k = self.cursor[prompt_index]
        self.cursor[prompt_index] = (k + 1) % len(lengths)
        length = max(1, lengths[k])
        return min(length, self.max_tokens) if self.max_tokens else length

    def mean_length(self) -> float:
        return float(np.mean([x for ls in self.lengths for x in ls]))


def parse_jsonl(path: Path) -> tuple[list[str], list[list[int]]]:
    """Read `{"prompt": id, "lengths": [int >= 0, ...]}` lines (optionally with "step",
    "finish_reasons" and "prompt_tokens"); any problem names the line.  A prompt's lines are joined in
    step order."""
    ids, lengths, _ = read_jsonl(path)
    return ids, lengths


def read_jsonl(path: Path) -> tuple[list[str], list[list[int]], dict[str, int]]:
    """`parse_jsonl`'s ids and lengths, and the prompt tokens of the prompts whose lines give them."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"workload {str(path)!r}: no such file, and not one of {', '.join(BUILTIN)}")
    rows: dict[str, dict[int, list[int]]] = {}
    seen: dict[tuple[str, int], int] = {}
    prompt_tokens: dict[str, int] = {}
    for lineno, line in text_lines(path):
        where = f"{path}:{lineno}"
        prompt, step, values, tokens = _parse_line(line, where)
        if tokens is not None and prompt_tokens.setdefault(prompt, tokens) != tokens:
            raise WorkloadError(f"{where}: prompt {prompt!r} has \"prompt_tokens\" {prompt_tokens[prompt]} on an "
                                f"earlier line, {tokens} here")
        if (prompt, step) in seen:
            at = f" for step {step}" if step >= 0 else ""
            raise WorkloadError(f"{where}: prompt {prompt!r} already given{at} on line {seen[prompt, step]}")
        seen[prompt, step] = lineno
        rows.setdefault(prompt, {})[step] = values
    if not rows:
        raise WorkloadError(f"{path}: empty workload file (expected one JSON object a line)")
    ids = list(rows)
    return ids, [[n for step in sorted(rows[p]) for n in rows[p][step]] for p in ids], prompt_tokens


def json_object(line: str, where: str, expected: str, error: type[ConfigError] = WorkloadError) -> dict:
    """One line's JSON object; bad JSON or another value is an `error` at `where` saying what was `expected`."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc.msg}); expected {expected}") from None
    if not isinstance(row, dict):
        raise error(f"{where}: expected {expected}")
    return row


def _parse_line(line: str, where: str) -> tuple[str, int, list[int], int | None]:
    """(prompt, step or -1, lengths, prompt tokens or None) of one workload line; a problem is a
    `WorkloadError` at `where`."""
    row = json_object(line, where, 'an object with "prompt" and "lengths"')
    for key in ("prompt", "lengths"):
        if key not in row:
            raise WorkloadError(f"{where}: missing field {key!r}")
    values = row["lengths"]
    if not isinstance(values, list) or not values:
        raise WorkloadError(f"{where}: \"lengths\" must be a non-empty list of integers")
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise WorkloadError(f"{where}: length {v!r} is not an integer")
        if v < 0:
            raise WorkloadError(f"{where}: length {v} is negative")
    _check_reasons(row, len(values), where)
    tokens = row.get("prompt_tokens")
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1):
        raise WorkloadError(f"{where}: \"prompt_tokens\" must be an integer >= 1, got {tokens!r}")
    return str(row["prompt"]), _step_of(row, where), values, tokens


JSONL_SHAPE = 'JSONL text (plain or .gz), one {"prompt": id, "lengths": [int, ...]} a line'


def text_lines(path: Path, shape: str = JSONL_SHAPE, error: type[ConfigError] = WorkloadError):
    """(line number, line) of each non-blank line of a UTF-8 text file, gunzipped when it starts
    with gzip's magic bytes; binary data is an `error` naming the file and the format (`shape`)."""
    with open(path, "rb") as raw:
        is_gzip = raw.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if is_gzip else open(path, encoding="utf-8")) as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield lineno, line
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text (a binary file?); expected {shape}") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:  # a corrupt or truncated gzip stream
        raise error(f"{path}: not a readable gzip file ({exc}); expected {shape}") from None


def _step_of(row: dict, where: str) -> int:
    step = row.get("step", -1)
    if "step" in row and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise WorkloadError(f"{where}: \"step\" must be an integer >= 0, got {step!r}")
    return step


def _check_reasons(row: dict, count: int, where: str) -> None:
    reasons = row.get("finish_reasons")
    if reasons is None:
        return
    if not isinstance(reasons, list) or len(reasons) != count or not all(isinstance(r, str) for r in reasons):
        raise WorkloadError(f"{where}: \"finish_reasons\" must be a list of {count} strings, one per length")


def load_marginals(name: str) -> tuple[Marginal, Marginal]:
    data = json.loads((DATA / name / "lengths.json").read_text())
    levels = np.asarray(data["levels"], dtype=float)
    return (Marginal(levels, np.asarray(data["output"], dtype=float)),
            Marginal(levels, np.asarray(data["input"], dtype=float)))


def load_workload(spec: str, *, num_prompts: int, seed: int, max_tokens: int | None = None,
                  between: float = 0.9, growth: float = 0.0, scale_from: int | None = None) -> Workload:
    """A built-in name or a JSONL path; `scale_from` (built-in traces only) maps that many trace tokens
    to max_tokens."""
    if scale_from is not None and spec not in TRACES:
        raise WorkloadError(f"scale_from applies to the built-in traces ({', '.join(TRACES)}), not to {spec!r}")
    if spec in SYNTHETIC:
        return BimodalWorkload(num_prompts=num_prompts, seed=seed, max_tokens=max_tokens, growth=growth)
    if spec in TRACES:
        output, inp = load_marginals(spec)
        return TraceWorkload(spec, output, inp, num_prompts=num_prompts, seed=seed, between=between,
                             growth=growth, max_tokens=max_tokens, scale_from=scale_from)
    workload = JsonlWorkload(Path(spec), seed=seed, num_prompts=None, max_tokens=max_tokens)
    return workload


def trace_lines(records) -> list[dict]:
    """Workload lines from a training run's step records (metrics.jsonl): one per (step, prompt)
    with the lengths and finish reasons of its samples that ended on their own ("stop" or
    "length"); aborted requests are left out (their full length is unknown: censored) but counted."""
    lines = []
    for record in records:
        by_prompt: dict[int, list] = {}
        for prompt, num_tokens, reason, *_ in record.get("requests", ()):  # then request id and reward
            by_prompt.setdefault(int(prompt), []).append((int(num_tokens), str(reason)))
        for prompt, samples in sorted(by_prompt.items()):
            done = [(n, r) for n, r in samples if r != "abort"]
            if done:
                lines.append({"step": int(record["step"]), "prompt": str(prompt), "lengths": [n for n, _ in done],
                              "finish_reasons": [r for _, r in done], "aborted": len(samples) - len(done)})
    return lines


def export_trace(metrics_path: Path, out_path: Path) -> int:
    """Write `trace_lines` of a run's metrics.jsonl to `out_path` (JSONL); returns the line count."""
    metrics_path = Path(metrics_path)
    if not metrics_path.is_file():
        raise WorkloadError(f"{metrics_path}: no such metrics file (a run's RUN_DIR/metrics.jsonl)")
    with open(metrics_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    lines = trace_lines(records)
    if not lines:
        raise WorkloadError(f"{metrics_path}: no step record holds \"requests\" (written by rollpacker.driver)")
    Path(out_path).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return len(lines)
