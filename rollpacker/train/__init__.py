"""The pieces of the reference trainer: typed run config with presets, the run directory (metrics,
TensorBoard, plots, checkpoints, resumable state), and the builders that wire backends together.
`reference/train.py` reads top to bottom on top of these."""
