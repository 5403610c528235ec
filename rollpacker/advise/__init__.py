"""rollpacker.advise: what tail batching would save on a user's own run (`rollpacker advise LOG`).

Importers read veRL, TRL, W&B and rollpacker logs into the simulator's workload (formats.py); tier 1
(per-sample dumps) keeps the run's own lengths and groups, tier 2 (step scalars) fits a distribution per
step and ranges over the prompt structure it cannot see (fit.py); search.py runs sync and each policy on
it at the run's scale, calibrate.py fits the engine's speed to the log's generation time, report.py
prints the table and the flags and draws the plot.
"""
