"""The reward component of the reference trainer: which function scores, in how many worker
processes, under what deadline; checked by flag, built into the scoring pool and the core's
reward scheduler settings."""

from __future__ import annotations

import attrs
from attrs import field, frozen

from rollpacker.core.reward_scheduler import RewardConfig

from .flag_checks import at_least, non_negative_finite, positive_finite


_CORE = attrs.fields(RewardConfig)
"""The reward setting's defaults are the core's (the simulator's are too: one setting)."""


@frozen(kw_only=True)
class RewardsConfig:
    """The scoring component: its options are the top-level flags --reward, --reward-workers,
    --reward-deadline-s, --reward-burst-workers, --reward-hedge-after-s and --reward-hedge-copies.  RunConfig.rewards_options() passes `reward` resolved for the data source,
    so check() and build() always see a function's name."""

    flat = True
    reward: str | None = None
    """math (math-verify against the ground truth), reasoning-gym (the task's scorer), or your function
    as module:function or path/file.py:function with veRL's signature compute_score(data_source,
    solution_str, ground_truth, extra_info) -> float | dict (default: reasoning-gym for --tasks, math for
    --dataset)."""
    reward_workers: int = field(default=2, validator=at_least(1))
    """Scoring worker processes."""
    reward_deadline_s: float = field(default=10.0, validator=positive_finite)
    """Upper bound of the per-sample scoring deadline, which is RollPacker's adaptive timeout
    min(max(2 s, 1.5 x the slowest correct scoring so far), this); until a correct (positive-reward)
    answer is seen, this.  A scorer past its deadline is killed and the sample gets reward 0.  At 2 s
    or less the deadline is fixed at this."""
    reward_burst_workers: int = field(default=_CORE.burst_workers.default, validator=at_least(0))
    """Worker processes beyond --reward-workers, used only for samples of complete groups (the ones
    the step waits for) and for hedges: a pool sized to the burst of scoring at the round's end."""
    reward_hedge_after_s: float = field(default=_CORE.hedge_after.default, validator=non_negative_finite)
    """A scoring still running after this many seconds gets a second copy on a free worker (the first
    answer is the sample's reward, the other copies are killed): a stuck or slow scorer costs about this
    plus a fresh scoring instead of its deadline.  0: off."""
    reward_hedge_copies: int = field(default=_CORE.hedge_copies.default, validator=at_least(1))
    """Most copies of one scoring besides the first, each --reward-hedge-after-s after the one before,
    while none has answered."""

    def scheduler_config(self) -> RewardConfig:
        """The core's reward scheduler: --reward-workers at once, deadlines bounded by --reward-deadline-s."""
        bound = self.reward_deadline_s
        floor = attrs.fields(RewardConfig).t_min.default
        return RewardConfig(workers=self.reward_workers, t_min=min(floor, bound), t_max=bound,
                            hedge_after=self.reward_hedge_after_s or None, hedge_copies=self.reward_hedge_copies,
                            burst_workers=self.reward_burst_workers)

    def check(self) -> None:
        """The function exists and loads (one line naming --reward otherwise)."""
        from rollpacker.backends.rewards.functions import check_reward

        check_reward(self.reward)

    def build(self):
        """The scoring pool: worker processes running the reward function."""
        from rollpacker.backends.rewards import functions as reward_fns
        from rollpacker.backends.rewards.pool import ProcessRewardExecutor

        return ProcessRewardExecutor(self.reward_workers + self.reward_burst_workers, scorer=reward_fns.scorer(self.reward),
                                     warmup=reward_fns.warmup(self.reward))
