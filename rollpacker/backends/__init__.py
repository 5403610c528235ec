"""I/O backends, one package per family: `embedded` (the in-process rollout engine), `sglang` (client
and SGLang-compatible server), `titan` (TorchTitan trainer), `trainer` (what both trainers share, and
the plain PyTorch one), `rewards` (scoring worker pool and reward functions), `data` (tasks and
dataset files); `models` loads the default model; `errors` is the one error family of them all
(`BackendError`: catch it for every backend failure)."""
