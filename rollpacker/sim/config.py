"""What one simulation run is: workload, policy, scale and the hardware setting."""

from __future__ import annotations

import attrs
from attrs import field, frozen
from attrs.validators import in_

from rollpacker.core import TP_MODES, ConfigError, make_policy

from .constants import MODELS


def _positive(instance, attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"--{attribute.name.replace('_', '-')} must be an integer >= 1, got {value!r}")


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
    seed: int = 0
    instances: int = field(default=16, validator=_positive)
    """Rollout instances at the starting TP (GPUs = instances x tp)."""
    tp: int = field(default=1, validator=_positive)
    tp_mode: str = field(default="fixed", validator=in_(TP_MODES))
    model: str = field(default="qwen2.5-7b", validator=in_(tuple(MODELS)))
    dataset_prompts: int | None = None
    """Prompts in the dataset (default: 16 x prompts, at least the JSONL's count)."""
    between: float = 0.9
    """Share of log-length variance between prompts (built-in workloads)."""
    growth: float = 0.0
    """Relative growth of lengths per step (built-in workloads)."""
    bubble_capacity: int | None = None
    """Q of the bubble ratio (default prompts x samples: SortedRL's engine batch)."""

    @property
    def gpus(self) -> int:
        return self.instances * self.tp

    def build_policy(self):
        return make_policy(self.policy, prompts=self.prompts, samples=self.samples,
                           max_tokens=self.max_tokens, **self.knobs)

    def to_dict(self) -> dict:
        return attrs.asdict(self) | {"gpus": self.gpus}
