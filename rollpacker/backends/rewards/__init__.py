"""Rewards: `pool` (scoring worker processes with deadlines) and `functions` (built-in and user
reward functions)."""
