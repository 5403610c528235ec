"""The end of a run over several ranks: rank 0's stop reaches the followers, and every rank then ends its
process group itself (a gloo group left to the interpreter's exit once aborted a follower, "terminate called
without an active exception", and torchrun on the other node waited 300 s for it)."""

from __future__ import annotations

import multiprocessing
import socket

import pytest


class Echo:
    """A trainer whose one call returns its argument."""

    def forward_backward(self, batch):
        return batch


def rank_main(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    from rollpacker.train.ranks import LeaderTrainer, follow

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if rank == 0:
        leader = LeaderTrainer(Echo())
        answer = leader.forward_backward(7)
        leader.stop()
        leader.stop()  # a second stop (the session's close after an error path's) does nothing
    else:
        answer = follow(Echo())
    out.put((rank, answer, dist.is_initialized()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_after_the_stop_every_rank_has_ended_its_process_group():
    ctx = multiprocessing.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=rank_main, args=(rank, port, out)) for rank in (0, 1)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert results == [(0, 7, False), (1, None, False)]
