"""rollpacker.driver: the loop that runs the core against a backend.

    clock    the time the core sees: WallClock (real backends), VirtualClock (the simulator)
    loop     Driver (feed the core, execute its commands) and the Backend protocol it drives
    live     LiveBackend (a real engine, reward executor and trainer) and StepLoop, the driver over it

The simulator (`rollpacker.sim.Simulation`) is another Backend of the same Driver.
"""

from .clock import Clock, VirtualClock, WallClock
from .live import Interval, LiveBackend, LoopConfig, PromptSource, StepLoop, StepTimeout, sync_weights
from .loop import Backend, DeadlinePassed, Driver, Input, ScorerAnswered

__all__ = ["Driver", "Backend", "Input", "ScorerAnswered", "DeadlinePassed", "Clock", "WallClock", "VirtualClock",
           "LiveBackend", "StepLoop", "LoopConfig", "Interval", "PromptSource", "StepTimeout",
           "sync_weights"]
