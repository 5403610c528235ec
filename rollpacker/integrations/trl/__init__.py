"""TRL's GRPOTrainer with rollpacker's scheduling (`pip install 'rollpacker[trl]'`, trl 1.16).

    from rollpacker.integrations.trl import RollpackerGRPOTrainer, RolloutSettings
    trainer = RollpackerGRPOTrainer(model, reward_funcs, args=GRPOConfig(...), train_dataset=ds,
                                    rollout=RolloutSettings(policy="tail"))

or, for the policies that train exactly the step's prompts (sync, oversample), TRL's own trainer
with our rollout function: `GRPOTrainer(..., rollout_func=TrlRollout(RolloutSettings(policy="sync")))`.
The modules: `settings` (policies, the checks of TRL's arguments, sampling), `rounds` (a planner
round on an engine, fed TRL's order), `rollout` (the rollout_func, engine and weight sync),
`trainer` (the GRPOTrainer subclass).
"""

from __future__ import annotations

from rollpacker.extras import missing_package_line

try:
    import trl  # noqa: F401
except ModuleNotFoundError as exc:  # one line naming the extra
    raise ModuleNotFoundError(missing_package_line(exc, "trl") or str(exc), name=exc.name) from None

from .rollout import TrlRollout
from .rounds import Completion, PlayedRound
from .settings import POLICIES, RolloutSettings, TrlUnsupported, check_args
from .trainer import RollpackerGRPOTrainer

__all__ = ["RollpackerGRPOTrainer", "RolloutSettings", "TrlRollout", "TrlUnsupported", "POLICIES", "check_args",
           "Completion", "PlayedRound"]
