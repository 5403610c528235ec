"""TorchTitan: `trainer.TitanTrainer`, `model` (HF checkpoint <-> TorchTitan model), `config`,
`cpu` (the CPU / gloo workarounds).  Importing this package imports nothing from TorchTitan."""
