"""Colocated mode for the embedded engine: its weights and its KV cache give their memory back while
the trainer runs on the same device, and take it again before the next round (the embedded side of
SGLang's /release_memory_occupation and /resume_memory_occupation, with the same tags).

Released weights lose their contents (the trainer holds the policy; the next weight sync brings it
back): each parameter's storage is swapped for an empty one and, on resume, for a fresh one of its
shape, which holds nothing until `update_weights` has loaded every parameter again (`stale`).  The
KV cache is dropped with the runner's `release`.  On CUDA both moves invalidate the decode graphs
(they replay fixed addresses), so they are dropped with either and captured again on resume, once
the weights and the cache are back (the cache is allocated at its planned size then, as at start).

Everything here runs on the engine's loop thread, between decode steps, while nothing is in flight.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rollpacker.backends.embedded.runner import Runner
from rollpacker.backends.errors import BackendMisuse
from rollpacker.core.protocols import MEMORY_TAGS


class EngineMemory:
    """The releasable memory of one engine's model and runner."""

    def __init__(self, model, runner: Runner) -> None:
        self.model = model
        self.runner = runner
        self.released: set[str] = set()
        """Tags released and not resumed yet (set by the caller's thread as soon as it asks)."""
        self.stale: set[str] = set()
        """Parameters allocated again after a release and not loaded since (canonical names)."""
        self._canonical = {}
        params = {}
        for name, p in model.named_parameters(remove_duplicate=False):  # tied weights: one canonical name
            self._canonical[name] = params.setdefault(id(p), name)
        self._shapes: dict[str, torch.Size] = {}

    def refusal(self) -> str | None:
        """Why the engine cannot generate now (None: it can)."""
        if self.stale:
            return (f"the engine's weights were released and {len(self.stale)} tensor(s) are not loaded again "
                    f"(e.g. {sorted(self.stale)[0]}): update_weights before generating")
        if self.released:
            return (f"the engine's memory is released ({', '.join(t for t in MEMORY_TAGS if t in self.released)}): "
                    f"resume_memory, then update_weights, before generating")
        return None

    def free(self, tags: Iterable[str]) -> None:
        tags = set(tags)
        if "kv_cache" in tags:
            self.runner.release()
        if "weights" in tags:
            self.runner.drop_graphs()
            for name, p in self.model.named_parameters():
                if p.numel():
                    self._shapes[name] = p.shape
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            self.stale.clear()
        if self.runner.is_cuda:
            torch.cuda.empty_cache()

    def allocate(self, tags: Iterable[str]) -> None:
        tags = set(tags) & self.released
        if "kv_cache" in tags and "weights" in self.released - tags:
            raise BackendMisuse("resume_memory: the KV cache needs the weights back first: resume 'weights' "
                                "(and update_weights) before 'kv_cache', or both at once")
        if "weights" in tags:
            for name, p in self.model.named_parameters():
                p.data = torch.empty(self._shapes[name], dtype=p.dtype, device=p.device)
            self.stale = set(self._shapes)
            self.released.discard("weights")
        if "kv_cache" in tags:
            self.released.discard("kv_cache")
        if not self.released:
            self.runner.restore()

    def loaded(self, names: Iterable[str]) -> None:
        """`update_weights` copied these tensors into the model."""
        self.stale -= {self._canonical.get(n, n) for n in names}

    def nbytes(self) -> dict[str, int]:
        """Bytes the model's parameters and the KV cache hold now."""
        weights = sum(p.untyped_storage().nbytes() for p in self.model.parameters())
        cache = self.runner.cache
        kv = 0 if cache is None else sum(t.untyped_storage().nbytes() for t in cache.keys + cache.values)
        return {"weights": weights, "kv_cache": kv}
