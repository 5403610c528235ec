"""rollpacker.core: the pure, backend-agnostic scheduling core.

No torch, no I/O: state machines over frozen attrs state, `(state, event) -> (state, commands)`.
A driver feeds events (events.py) from a backend and executes the commands (commands.py).

The components, one concept per module:

    prompt_pool          the epoch's prompts, each trained exactly once (PromptPool)
    length_history       per-prompt response lengths and the length prediction
    planner, policies/   rounds: sync (veRL), tail (RollPacker), sorted (SortedRL), partial (APRIL)
    stream_batcher       rewarded groups into micro-batches and one optimizer step
    advantages           GRPO / Dr. GRPO / RLOO group advantages
    reward_scheduler     per-sample scoring with RollPacker's adaptive timeouts
    tp_planner           the rollout tensor-parallel size per round, from the cost model
    scheduler            the planner, the stream batcher and the reward scheduler behind one handle
    metrics              bubble ratio, occupancy, the per-step record
    states               the states of the state machines above and their one transition table

`__all__` is what a driver, a backend or a new policy uses: the components, their configs, events,
commands and records.  The planner's own machinery (RoundPlanner, PlannerState, request ids, the TP
planner's search) stays in its modules.
"""

from .advantages import advantages
from .commands import (
    AbortRequest,
    CloseGroup,
    Command,
    EndRound,
    LaunchRequest,
    RoundReport,
    ScoreSample,
    SetTensorParallel,
    StartScoring,
    StepOptimizer,
    TrainMicroBatch,
    TrainSampleRef,
)
from .cost_model import CostModel, Hardware, ModelShape
from .errors import ConfigError, RollpackerError, SchedulerMisuse
from .events import Event, RequestAborted, RequestFinished, RewardScored, TokensGenerated
from .length_history import LengthPrediction
from .metrics import EpochLedger, Occupancy, StepTimes, bubble_ratio, step_record
from .policy import Policy
from .policies import (
    Knob,
    POLICIES,
    PartialPolicy,
    SortedPolicy,
    SyncPolicy,
    TailPolicy,
    knob_specs,
    make_policy,
    policy_knobs,
)
from .prompt_pool import PromptPool
from .records import PromptKey, Sample, Segment
from .reward_scheduler import RewardConfig, RewardScheduler
from .scheduler import Scheduler
from .stream_batcher import BatcherConfig, StreamBatcher
from .tp_planner import TP_MODES, TpRule

__all__ = [
    # driving the core
    "Scheduler", "Event", "RequestFinished", "RequestAborted", "TokensGenerated", "RewardScored",
    "Command", "LaunchRequest", "AbortRequest", "ScoreSample", "StartScoring", "CloseGroup", "TrainMicroBatch",
    "TrainSampleRef", "StepOptimizer", "EndRound", "RoundReport",
    # prompts and lengths
    "PromptPool", "PromptKey", "LengthPrediction", "Sample", "Segment",
    # round planning and its policies
    "Policy", "POLICIES", "make_policy", "policy_knobs", "knob_specs", "Knob",
    "SyncPolicy", "TailPolicy", "SortedPolicy", "PartialPolicy",
    # training batches
    "StreamBatcher", "BatcherConfig", "advantages",
    # rewards
    "RewardScheduler", "RewardConfig",
    # tensor parallelism
    "TpRule", "TP_MODES", "SetTensorParallel", "CostModel", "ModelShape", "Hardware",
    # metrics
    "EpochLedger", "Occupancy", "StepTimes", "bubble_ratio", "step_record",
    # errors
    "RollpackerError", "ConfigError", "SchedulerMisuse",
]
