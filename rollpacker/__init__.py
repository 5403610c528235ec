"""rollpacker: synchronous RL post-training scheduled around long-tail rollouts.

`rollpacker.core` is the pure scheduling core (no torch, no I/O); `rollpacker.backends` holds the
engines and trainers that execute its commands; `rollpacker.sim` replays paper-scale runs.
"""

__version__ = "0.1.0"
