"""rollpacker: synchronous RL post-training scheduled around long-tail rollouts.

`rollpacker.core` is the pure scheduling core (no torch, no I/O); `rollpacker.driver` is the loop
that feeds it and executes its commands against a backend; `rollpacker.backends` holds the engines,
reward executors and trainers that do the work; `rollpacker.sim` is a simulated backend that replays
paper-scale runs.
"""

__version__ = "0.1.0"
