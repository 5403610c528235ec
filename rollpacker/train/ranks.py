"""Several trainer processes under torchrun: rank 0 drives, the others follow.

Rank 0 runs the scheduler, the rollout engine and the reward workers; every trainer call it makes
(forward_backward, optimizer_step, export_weights, named_weights, save, load) is first broadcast to
the follower ranks, so all ranks enter TorchTitan's collectives together with the same arguments.
`named_weights` is a generator of per-parameter gathers: rank 0 consumes it (sending each tensor to
the servers), the followers run it to the end keeping nothing, then wait for the next command.
"""

from __future__ import annotations

from typing import Any

_STOP = "stop"
_DRAINED = ("named_weights",)  # generators: a follower runs their gathers to the end, keeping nothing


def _broadcast(message: Any) -> Any:
    import torch.distributed as dist

    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class LeaderTrainer:
    """Rank 0's view of a trainer spread over several processes (same Protocol)."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def _call(self, name: str, *args):
        _broadcast((name, args))
        return getattr(self.trainer, name)(*args)

    def forward_backward(self, batch):
        return self._call("forward_backward", batch)

    def optimizer_step(self, loss_normalizer):
        return self._call("optimizer_step", loss_normalizer)

    def export_weights(self):
        return self._call("export_weights")

    def named_weights(self):
        """Rank 0's generator; the caller must run it to the end (the followers run theirs)."""
        return self._call("named_weights")

    def save(self, path):
        return self._call("save", path)

    def load(self, path):
        return self._call("load", path)

    def stop(self) -> None:
        _broadcast((_STOP, ()))


def follow(trainer) -> None:
    """A follower rank: execute rank 0's trainer calls until it stops."""
    while True:
        name, args = _broadcast(None)
        if name == _STOP:
            return
        result = getattr(trainer, name)(*args)
        if name in _DRAINED:
            for _ in result:
                pass
