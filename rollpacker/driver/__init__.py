"""rollpacker.driver: the loop that runs the core against a backend.

    clock    the time the core sees: WallClock (real backends), VirtualClock (the simulator)
    loop     Driver (feed the core, execute its commands), the Backend it drives
    observer the Notices the driver tells its Observer; NoticeObserver routes each to a method by type
    watchdog StepWatch: the step's time limit (StepTimeout) and a stalled backend (StepStalled)
    live     LiveBackend (a real engine, reward executor and trainer) and StepLoop, the driver over it
    token_store    the live backend's tokens and log-probs, what is kept for carried requests
    reward_staging the live backend's reward jobs, hedges, expiries and its executor's start grace
    step_log a live step's record: each request's Interval on the timeline, the StepLog
    train_worker  TrainWorker: the trainer on a thread of its own (the loop never waits on training)
    colocate Colocation: --colocate, the engine's memory released while the trainer runs

The simulator (`rollpacker.sim.Simulation`) is another Backend of the same Driver.
"""

from .clock import Clock, VirtualClock, WallClock
from .live import LiveBackend, LoopConfig, PromptSource, StepLoop, sync_weights
from .loop import Backend, DeadlinePassed, Driver, HedgeDue, Input, ScorerAnswered, StartGrace
from .observer import Notice, NoticeObserver, Observer, StepBegun
from .step_log import Interval, StepLog
from .train_worker import TrainerRan, TrainWorker
from .watchdog import StepStalled, StepTimeout, StepWatch

__all__ = ["Driver", "Backend", "Observer", "NoticeObserver", "Notice", "StepWatch", "StepStalled", "StepBegun", "Input", "ScorerAnswered", "DeadlinePassed", "HedgeDue",
           "StartGrace", "Clock", "WallClock", "VirtualClock", "LiveBackend", "StepLoop", "LoopConfig", "Interval", "StepLog", "PromptSource", "StepTimeout",
           "sync_weights", "TrainWorker", "TrainerRan"]
