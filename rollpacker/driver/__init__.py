"""rollpacker.driver: the loop that runs the core against a backend.

    clock    the time the core sees: WallClock (real backends), VirtualClock (the simulator)
    loop     Driver (feed the core, execute its commands), the Backend it drives and the Observer it tells
    step_log a live step's record: each request's Interval on the timeline, the StepLog
    live     LiveBackend (a real engine, reward executor and trainer) and StepLoop, the driver over it
    train_worker  TrainWorker: the trainer on a thread of its own (the loop never waits on training)
    colocate Colocation: --colocate, the engine's memory released while the trainer runs

The simulator (`rollpacker.sim.Simulation`) is another Backend of the same Driver.
"""

from .clock import Clock, VirtualClock, WallClock
from .live import LiveBackend, LoopConfig, PromptSource, StepLoop, StepTimeout, sync_weights
from .loop import Backend, DeadlinePassed, Driver, HedgeDue, Input, Notice, Observer, ScorerAnswered, StepBegun
from .step_log import Interval, StepLog
from .train_worker import TrainerRan, TrainWorker

__all__ = ["Driver", "Backend", "Observer", "Notice", "StepBegun", "Input", "ScorerAnswered", "DeadlinePassed", "HedgeDue",
           "Clock", "WallClock", "VirtualClock", "LiveBackend", "StepLoop", "LoopConfig", "Interval", "StepLog", "PromptSource", "StepTimeout",
           "sync_weights", "TrainWorker", "TrainerRan"]
