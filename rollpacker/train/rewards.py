"""The reward component of the reference trainer: which function scores, in how many worker
processes, under what deadline; checked by flag, built into the scoring pool and the core's
reward scheduler settings."""

from __future__ import annotations

import attrs
from attrs import field, frozen

from rollpacker.core.reward_scheduler import RewardConfig

from .flag_checks import at_least, positive_finite


@frozen(kw_only=True)
class RewardsConfig:
    reward: str
    """The reward function's name (math, reasoning-gym, module:function, path.py:function)."""
    reward_workers: int = field(default=2, validator=at_least(1))
    reward_deadline_s: float = field(default=10.0, validator=positive_finite)

    def scheduler_config(self) -> RewardConfig:
        """The core's reward scheduler: --reward-workers at once, deadlines bounded by --reward-deadline-s."""
        bound = self.reward_deadline_s
        floor = attrs.fields(RewardConfig).t_min.default
        return RewardConfig(workers=self.reward_workers, t_min=min(floor, bound), t_max=bound)

    def check(self) -> None:
        """The function exists and loads (one line naming --reward otherwise)."""
        from rollpacker.backends.rewards.functions import check_reward

        check_reward(self.reward)

    def build(self):
        """The scoring pool: worker processes running the reward function."""
        from rollpacker.backends.rewards import functions as reward_fns
        from rollpacker.backends.rewards.pool import ProcessRewardExecutor

        return ProcessRewardExecutor(self.reward_workers, scorer=reward_fns.scorer(self.reward),
                                     warmup=reward_fns.warmup(self.reward))
