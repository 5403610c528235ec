"""--replay-lengths: run the reference trainer's real rollout path with every response ending at the
length a trace gives it (`rollpacker.backends.length_replay`), to measure a schedule on a real engine
against the simulator's prediction of the same workload (benchmarks/sim_vs_real.py)."""

from __future__ import annotations

from pathlib import Path

from attrs import field, frozen
from attrs.validators import optional

from rollpacker.core.errors import ConfigError

from .flag_checks import at_least


@frozen(kw_only=True)
class ReplayOptions:
    """Length replay: its options are the top-level flags --replay-lengths and --replay-scale-from."""

    flat = True
    replay_lengths: str | None = None
    """Replay response lengths on the real engine: each sample decodes real tokens, its end-of-sequence
    ignored, until the length a workload gives its (prompt, sample): a built-in trace (servegen-r1,
    azure-code, azure-conv, with the simulator's modelled prompt structure) or a simulator JSONL of
    per-prompt lengths.  The policy never sees them.  For measuring a schedule against `rollpacker
    simulate` on the same workload; the rewards score whatever the model wrote."""
    replay_scale_from: int | None = field(default=None, validator=optional(at_least(1)))
    """--replay-lengths with a built-in trace: this many trace tokens map to --max-tokens (the trace's
    shape at a shorter cap); default: the trace's own lengths, cut at --max-tokens."""

    def __attrs_post_init__(self) -> None:
        from rollpacker.sim.workloads import BUILTIN, TRACES

        name = self.replay_lengths
        if name is not None and name not in BUILTIN and not Path(name).is_file():
            raise ConfigError(f"--replay-lengths {name!r}: no such file, and not one of {', '.join(BUILTIN)}")
        if self.replay_scale_from is not None and name not in TRACES:
            raise ConfigError(f"--replay-scale-from applies to --replay-lengths with a built-in trace "
                              f"({', '.join(TRACES)}), got {name!r}")

    def wrap(self, engine, *, num_prompts: int, prompt_tokens, seed: int, max_tokens: int):
        """`engine` replaying the workload (itself without --replay-lengths)."""
        if self.replay_lengths is None:
            return engine
        from rollpacker.backends.length_replay import LengthReplay

        return LengthReplay(engine, self.workload(num_prompts, prompt_tokens, seed, max_tokens), max_tokens)

    def workload(self, num_prompts: int, prompt_tokens, seed: int, max_tokens: int):
        """The simulator's workload of these flags, with the dataset's own prompt lengths."""
        from rollpacker.sim.workloads import load_workload

        workload = load_workload(self.replay_lengths, num_prompts=num_prompts, seed=seed, max_tokens=max_tokens,
                                 scale_from=self.replay_scale_from)
        workload.num_prompts = num_prompts
        workload.set_prompt_tokens(prompt_tokens)
        return workload
