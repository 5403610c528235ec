"""rollpacker.core: the pure, backend-agnostic scheduling core.

No torch, no I/O: state machines over frozen attrs state, `(state, event) -> (state, commands)`.
A driver feeds events (events.py) from a backend and executes the commands (commands.py).
"""

from .advantages import advantages
from .commands import (
    AbortRequest,
    Command,
    GroupCompleted,
    LaunchRequest,
    OptimizerStep,
    RoundEnded,
    RoundReport,
    ScoreSample,
    TrainMicroBatch,
    TrainSampleRef,
)
from .errors import ConfigError, RollpackerError, SchedulerMisuse
from .events import Event, RequestAborted, RequestFinished, RewardScored, TokensGenerated
from .metrics import EpochLedger, Occupancy, bubble_ratio, step_record
from .length_history import LengthPrediction
from .planner import Policy, RoundPlanner
from .policies import POLICIES, PartialPolicy, SortedPolicy, SyncPolicy, TailPolicy, make_policy, policy_knobs
from .prompt_pool import PromptPool
from .records import PromptKey, Sample, Segment, request_id, request_number
from .round_state import PlannerState
from .scheduler import Scheduler
from .stream_batcher import BatcherConfig, StreamBatcher

__all__ = [
    "AbortRequest", "BatcherConfig", "Command", "ConfigError", "EpochLedger", "Event", "GroupCompleted",
    "LaunchRequest", "LengthPrediction", "Occupancy", "OptimizerStep", "POLICIES", "PartialPolicy",
    "PlannerState", "Policy", "PromptKey", "PromptPool", "RequestAborted", "RequestFinished",
    "RewardScored", "RollpackerError", "RoundEnded", "RoundPlanner", "RoundReport", "Sample",
    "SchedulerMisuse", "Scheduler", "ScoreSample", "Segment",
    "SortedPolicy", "StreamBatcher", "SyncPolicy", "TailPolicy", "TokensGenerated",
    "TrainMicroBatch", "TrainSampleRef", "advantages", "bubble_ratio", "make_policy", "policy_knobs",
    "request_id", "request_number", "step_record",
]
