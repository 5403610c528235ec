"""Several trainer processes under torchrun: rank 0 drives, the others follow.

Rank 0 runs the scheduler, the rollout engine and the reward workers; every trainer call it makes
(forward_backward, optimizer_step, export_weights, named_weights, save, load) is first broadcast to
the follower ranks, so all ranks enter TorchTitan's collectives together with the same arguments.
`named_weights` is a generator of per-parameter gathers: rank 0 consumes it (sending each tensor to
the servers), the followers run it to the end keeping nothing, then wait for the next command.
Paths are sent absolute (a node may start in another directory).  Checks that only rank 0 makes
(`on_rank0`: the run lock, the saved state) reach every rank, so their one line stops every node.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rollpacker.core.errors import RollpackerError

_STOP = "stop"
_DRAINED = ("named_weights",)  # generators: a follower runs their gathers to the end, keeping nothing
_OWN_ERRORS = ("save", "load")  # rank 0's run directory names their failures (a full disk, a damaged state)


class RankFailed(RollpackerError):
    """A trainer call failed on this rank, or a rank was lost (its process ended, its node died);
    names the rank, the call and the error, in one line."""


def _failed(exc: RuntimeError, what: str) -> RankFailed:
    import torch.distributed as dist

    return RankFailed(f"trainer rank {dist.get_rank()} {what} ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:200]}); when a rank died, its node's output says why; --resume "
                      f"continues from the last saved step")


def end_group() -> None:
    """Every rank, after rank 0's stop has reached it: wait for the others, then end the process group.  Left to
    the interpreter's exit, a gloo group's transport thread can be destroyed unjoined and abort its rank
    ("terminate called without an active exception"), and torchrun's agent on the other node then waits 300 s
    in its exit barrier for the lost one."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def broadcast(message: Any) -> Any:
    """Rank 0's `message` on every rank (the others pass None)."""
    import torch.distributed as dist

    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_rank0(check: Callable[[], Any]) -> Any:
    """`check()` on rank 0 alone, its outcome on every rank: its (picklable) value, or its
    RollpackerError raised on each, rather than one rank failing while the others wait for it in
    a collective.  Without torchrun, just `check()`."""
    if int(os.environ.get("WORLD_SIZE", 1)) == 1:
        return check()
    import torch.distributed as dist

    outcome = None
    if dist.get_rank() == 0:
        try:
            outcome = (check(), None)
        except RollpackerError as exc:
            outcome = (None, exc)
    value, error = broadcast(outcome)
    if error is not None:
        raise error
    return value


class LeaderTrainer:
    """Rank 0's view of a trainer spread over several processes (same Protocol)."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def _call(self, name: str, *args):
        try:
            broadcast((name, args))
        except RuntimeError as exc:  # gloo/NCCL: a follower's connection closed, or the timeout
            raise _failed(exc, f"lost a follower rank while sending it {name}") from None
        if name in _OWN_ERRORS:
            return getattr(self.trainer, name)(*args)
        try:
            return getattr(self.trainer, name)(*args)
        except RuntimeError as exc:  # e.g. a collective whose peer died: one line, as the followers'
            raise _failed(exc, f"failed in {name}") from exc

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
        return self._call("save", os.path.abspath(path))

    def load(self, path):
        return self._call("load", os.path.abspath(path))

    def stop(self) -> None:
        """Release the followers (on the way out, after an error too: one already gone needs nothing), then,
        once they all have it, end the process group (`end_group`); a second call does nothing."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        try:
            broadcast((_STOP, ()))
        except RuntimeError:
            return
        end_group()


def follow(trainer) -> None:
    """A follower rank: execute rank 0's trainer calls until it stops."""
    while True:
        try:
            name, args = broadcast(None)
        except RuntimeError as exc:  # gloo/NCCL: rank 0's connection closed (it ended or died), or the timeout
            raise _failed(exc, "lost rank 0, which drives the run, while waiting for its next call") from None
        if name == _STOP:
            end_group()
            return
        try:
            result = getattr(trainer, name)(*args)
            if name in _DRAINED:
                for _ in result:
                    pass
        except RuntimeError as exc:  # e.g. a collective whose peer died: one line, as rank 0's
            raise _failed(exc, f"failed in {name}") from exc
