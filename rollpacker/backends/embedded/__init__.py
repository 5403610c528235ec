"""The embedded rollout engine: `engine.EmbeddedEngine` (thread and protocol), `batch` (the running
batch), `runner` (forwards, slot cache, CUDA graphs), `sampling`, `drafter` and `speculation`
(lossless speculative decoding in the tail), `weights` (weight updates)."""
