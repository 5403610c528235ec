"""What one simulation run is: workload, policy, scale and the hardware setting."""

from __future__ import annotations

import attrs
from attrs import field, frozen
from attrs.validators import ge, gt, in_, le, optional

from rollpacker.core import TP_MODES, make_policy
from rollpacker.core.validators import INTEGER, NUMBER, config_check, flag_name

from .constants import MODELS

# Each field named by its flag of `rollpacker simulate` (--dataset-prompts).
_positive = config_check("an integer >= 1", *INTEGER, ge(1), label=flag_name)
_seed = config_check("an integer >= 0", *INTEGER, ge(0), label=flag_name)
_share = config_check("a number in [0, 1]", *NUMBER, ge(0), le(1), label=flag_name)
_growth = config_check("a finite number > -1", *NUMBER, gt(-1), label=flag_name)


@frozen(kw_only=True)
class SimConfig:
    workload: str = "servegen-r1"
    """Built-in workload name or a JSONL path."""
    policy: str = "tail"
    knobs: dict = field(factory=dict)
    """Policy knobs (see rollpacker.core.policy_knobs)."""
    prompts: int = field(default=128, validator=_positive)
    samples: int = field(default=8, validator=_positive)
    max_tokens: int = field(default=8192, validator=_positive)
    steps: int = field(default=5, validator=_positive)
    """Steps run; with `epochs`, ignored (the run ends with the epochs)."""
    epochs: int | None = field(default=None, validator=optional(_positive))
    """Run until every prompt of this many epochs of the dataset is trained once and none is pending
    (the pool draws no further); None: `steps` steps over an endless dataset."""
    seed: int = field(default=0, validator=_seed)
    instances: int = field(default=16, validator=_positive)
    """Rollout instances at the starting TP (GPUs = instances x tp)."""
    tp: int = field(default=1, validator=_positive)
    tp_mode: str = field(default="fixed", validator=in_(TP_MODES))
    model: str = field(default="qwen2.5-7b", validator=in_(tuple(MODELS)))
    dataset_prompts: int | None = field(default=None, validator=optional(_positive))
    """Prompts in the dataset (default: 16 x prompts, at least the JSONL's count)."""
    between: float = field(default=0.9, validator=_share)
    """Share of log-length variance between prompts (built-in workloads)."""
    growth: float = field(default=0.0, validator=_growth)
    """Relative growth of lengths per step (built-in workloads)."""
    bubble_capacity: int | None = field(default=None, validator=optional(_positive))
    """Q of the bubble ratio (default prompts x samples: SortedRL's engine batch)."""
    scale_from: int | None = field(default=None, validator=optional(_positive))
    """Built-in traces: this many trace tokens map to max_tokens (lengths scaled by max_tokens / N before
    the cap); None: the trace's own lengths, cut at max_tokens."""
    engine_profile: str | None = None
    """A fitted engine profile (JSON, `sim/engine_profile.py`): instances are that engine (TP 1) instead of
    the GPU cost model of `model`."""

    def load_profile(self):
        """The engine profile (None without one); TP must then be fixed at 1."""
        if self.engine_profile is None:
            return None
        from .engine_profile import ProfileError, load_profile

        if self.tp != 1 or self.tp_mode != "fixed":
            raise ProfileError(f"--engine-profile {self.engine_profile}: a profile is one engine at its own "
                               f"parallelism: --tp 1 --tp-mode fixed (got --tp {self.tp} --tp-mode {self.tp_mode})")
        return load_profile(self.engine_profile)

    @property
    def gpus(self) -> int:
        return self.instances * self.tp

    def build_policy(self):
        return make_policy(self.policy, prompts=self.prompts, samples=self.samples,
                           max_tokens=self.max_tokens, **self.knobs)

    def to_dict(self) -> dict:
        return attrs.asdict(self) | {"gpus": self.gpus}
