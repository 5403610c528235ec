"""I/O backends: rollout engines, reward executors, models and tasks."""
