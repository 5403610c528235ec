"""The embedded rollout engine: `engine.EmbeddedEngine` (thread and protocol), `scheduler` (waiting
and running rows, admission, slots; no torch), `batch` (one step's torch work over the scheduler's
rows), `runner` (forwards, slot cache, CUDA graphs), `sampling`, `drafter` and `speculation`
(lossless speculative decoding in the tail), `weights` (weight updates)."""
