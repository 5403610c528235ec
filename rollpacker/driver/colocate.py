"""Colocated mode (`LoopConfig.colocate`): the rollout engine and the trainer take turns on the same
GPUs, as in veRL's default and RollPacker's setup.

The trainer cannot run beside a round that generates on its GPU, so the step's micro-batches are
held (`hold`) until the round ends.  The round ends once every request has come back, its tail
aborted included (the core's `EndRound`), so the engine is idle then: `release` frees its weights
and KV cache and hands back the held micro-batches for the train worker (the later ones go straight
to it).  After the optimizer step, `resume` brings the engine back for the next round, in slime's
and veRL's order: the weights' memory, the weight sync into it, then the KV cache, so the sync's
buffers never sit beside a full KV cache.

Training after the round without the release (`LoopConfig.train_after_round`, `release=False`): the
micro-batches are held the same way, the engine keeps its memory and `resume` is the weight sync alone:
for a machine whose trainer would take the rollout's compute while it generates (a CPU, a GPU shared by
both) or an engine that cannot release its memory.
"""

from __future__ import annotations

from collections.abc import Callable

from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import MicroBatch, ReleasableEngine, RolloutEngine


class Colocation:
    def __init__(self, engine: RolloutEngine, release: bool = True) -> None:
        if release and not isinstance(engine, ReleasableEngine):
            raise ConfigError(f"colocated mode needs an engine that can release its memory (release_memory, "
                              f"resume_memory); {type(engine).__name__} cannot")
        self.engine = engine
        self.frees_memory = release
        """Whether the engine's memory is released while the trainer runs (else it is only waited for)."""
        self.is_released = False
        """The round has ended: micro-batches go straight to the trainer until `resume`."""
        self._held: list[tuple[int, MicroBatch]] = []

    def hold(self, index: int, batch: MicroBatch) -> bool:
        """Keep micro-batch `index` until the round ends; False once the engine is released (train it now)."""
        if self.is_released:
            return False
        self._held.append((index, batch))
        return True

    def release(self) -> list[tuple[int, MicroBatch]]:
        """The round ended (nothing in flight): free the engine's memory (`frees_memory`); the held
        micro-batches, in order."""
        if self.frees_memory:
            self.engine.release_memory(["weights", "kv_cache"])
        self.is_released = True
        held, self._held = self._held, []
        return held

    def resume(self, sync: Callable[[], None]) -> None:
        """Before the next round: the weights' memory, `sync()` (the trainer's weights into it), the KV cache
        (`sync()` alone when the memory was kept)."""
        if not self.frees_memory:
            sync()
        else:
            self.engine.resume_memory(["weights"])
            sync()
            self.engine.resume_memory(["kv_cache"])
        self.is_released = False
