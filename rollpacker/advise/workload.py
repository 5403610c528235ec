"""From an imported log to the simulator's workload: the steps simulated (a window spread over the run),
tier 1's groups from per-sample lengths (re-tokenized where the dump holds text), P and R, and the
workload file (rollpacker/sim/workloads.py's format, which `rollpacker simulate --workload` reads too)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
from attrs import frozen

from .records import AdviseError, Group, ImportedLog, Sample

OVER_CAP = 0.02
"""A re-tokenized response up to 2% over the cap is taken as capped (decode and encode do not round-trip
exactly); more is a cap lower than the lengths."""


@frozen
class Batch:
    """The workload simulated: its groups and the run's shape."""

    groups: tuple[Group, ...]
    prompts: int
    samples: int
    notes: tuple[str, ...] = ()

    def write(self, path: Path) -> Path:
        path.write_text("".join(json.dumps(g.line()) + "\n" for g in self.groups))
        return path


def choose_steps(steps: list[int], window: int) -> list[int]:
    """`window` steps spread evenly over the run, first and last included (all when fewer)."""
    if len(steps) < 2:
        raise AdviseError(f"the log holds {len(steps)} step{'s' * (len(steps) != 1)} ({', '.join(map(str, steps))}): "
                          f"advise needs at least 2 (log more steps: the whole rollout_data_dir or completions folder)")
    if len(steps) <= window:
        return steps
    picks = np.unique(np.rint(np.linspace(0, len(steps) - 1, window)).astype(int))
    return [steps[i] for i in picks]


def sample_lengths(samples: list[Sample], cap: int, tokenizer=None, progress=None) -> list[tuple[int, str]]:
    """(length, finish reason) of each sample: its token count as logged, or its text re-tokenized plus the
    stripped EOS (a response at the cap has none: finish reason "length")."""
    from .tokens import count_tokens

    texts = [s.output for s in samples if s.tokens is None]
    counted = iter(count_tokens(tokenizer, texts, progress) if texts else [])
    out, over = [], []
    for s in samples:
        if s.tokens is not None:
            n = s.tokens
            reason = s.reason or ("length" if n >= cap else "stop")
        else:
            n = next(counted)
            reason = "length" if n >= cap else "stop"
            n = n if n >= cap else n + 1  # the EOS the dump stripped
        if n > cap:
            over.append(n)
        out.append((min(n, cap), reason if n < cap else "length"))
    too_long = [n for n in over if n > cap * (1 + OVER_CAP)]
    if too_long:
        raise AdviseError(f"--max-tokens {cap} is lower than {len(too_long)} response{'s' * (len(too_long) > 1)} "
                          f"(longest {max(too_long)} tokens): pass the run's response cap (veRL "
                          f"data.max_response_length, TRL max_completion_length), or its tokenizer with --tokenizer")
    return out


def tier1_batch(log: ImportedLog, steps: list[int], cap: int, tokenizer=None, progress=None) -> Batch:
    """The chosen steps' groups; R is the most common group size (a group of k x R is k prompts, as when
    one prompt comes twice in a row), P the median of groups per step."""
    chosen = set(steps)
    samples = [s for s in log.samples if s.step in chosen]
    lengths = sample_lengths(samples, cap, tokenizer, progress)
    prompt_tokens = _prompt_tokens(samples, tokenizer)
    by_group: dict[str, list] = {}
    for s, (n, reason) in zip(samples, lengths):
        by_group.setdefault(s.group, []).append((n, reason, s))
    sizes = Counter(len(v) for v in by_group.values())
    r = sizes.most_common(1)[0][0]
    if r < 2:
        raise AdviseError("every prompt has one sample: its siblings could not be grouped (veRL: a 'uid' "
                          "<prompt-uid>_<session>_<index> or an 'input'; TRL: consecutive rows of one prompt)")
    groups, odd = [], 0
    for key, members in by_group.items():
        chunks = [members[i:i + r] for i in range(0, len(members), r)] if len(members) % r == 0 else [members]
        odd += len(members) % r != 0
        for i, chunk in enumerate(chunks):
            first = chunk[0][2]
            groups.append(Group(step=first.step, prompt=f"{key}#{i}" if len(chunks) > 1 else key,
                                lengths=tuple(n for n, _, _ in chunk), reasons=tuple(x for _, x, _ in chunk),
                                prompt_tokens=prompt_tokens.get(first.prompt, first.prompt_tokens)))
    per_step = Counter(g.step for g in groups)
    p = int(np.median(list(per_step.values())))
    notes = [f"{odd} of {len(groups)} groups are not {r} samples (kept as they are)"] if odd else []
    if len(set(per_step.values())) > 1:
        notes.append(f"groups per step vary ({min(per_step.values())}-{max(per_step.values())}): P = {p}, the median")
    return Batch(tuple(groups), p, r, tuple(notes))


def _prompt_tokens(samples: list[Sample], tokenizer) -> dict[str, int]:
    """Token counts of the prompts' texts (one per distinct prompt), where a tokenizer is loaded."""
    if tokenizer is None:
        return {}
    from .tokens import count_tokens

    texts = sorted({s.prompt for s in samples if s.prompt})
    return dict(zip(texts, (max(1, n) for n in count_tokens(tokenizer, texts))))
