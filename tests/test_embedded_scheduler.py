"""The embedded engine's scheduler, without torch: admission, aborts, finishes and compaction over
random sequences (hypothesis), checked against a model of the KV cache's slots."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollpacker.backends.embedded.scheduler import Row, RowScheduler, RowStatus
from rollpacker.core.protocols import GenerationRequest


def make_row(rid: str, num_prompt: int) -> Row:
    prompt = tuple(range(1, num_prompt + 1))
    return Row(GenerationRequest(rid, prompt, 8), list(prompt), num_prompt, 8, 0)


def test_scheduler_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import rollpacker.backends.embedded.scheduler, rollpacker.backends.requests\n"
            "assert sys.modules['torch'] is None\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_admission_keeps_the_prefill_token_budget():
    sched = RowScheduler(capacity=8, admit_fraction=0.5, max_prefill_tokens=10)
    sched.add([make_row(f"r{i}", 4) for i in range(3)] + [make_row("big", 30)])
    first = sched.admit()
    assert first.first_slot == 0 and [r.rid for r in first.rows] == ["r0", "r1"]  # a third: 12 > 10 tokens
    second = sched.admit()
    assert second.first_slot == 2 and [r.rid for r in second.rows] == ["r2"]  # "big" passes the budget
    third = sched.admit()
    assert third.first_slot == 3 and [r.rid for r in third.rows] == ["big"]  # alone, over budget: still admitted
    assert [r.status for r in sched.running] == [RowStatus.RUNNING] * 4 and not sched.waiting


def test_admission_holds_back_fewer_rows_than_the_share_while_more_wait():
    sched = RowScheduler(capacity=6, admit_fraction=1.0, max_prefill_tokens=100)
    sched.add([make_row(f"r{i}", 2) for i in range(4)])
    assert len(sched.admit().rows) == 4
    sched.add([make_row(f"w{i}", 2) for i in range(3)])
    assert sched.admit() is None  # two free slots for four running rows, and more waiting: wait
    assert [r.rid for r in sched.waiting] == ["w0", "w1", "w2"] and len(sched.running) == 4
    sched.finish(sched.running[1])
    assert [(m.src, m.dst) for m in sched.compact()] == [(3, 1)]
    assert [r.rid for r in sched.running] == ["r0", "r3", "r2"]
    admitted = sched.admit()
    assert admitted.first_slot == 3 and [r.rid for r in admitted.rows] == ["w0", "w1", "w2"]  # all that wait
    assert sched.preemptions == 0


class SchedulerMachine(RuleBasedStateMachine):
    """Random add / admit / step / finish / abort / compact sequences.  `slots` models the runner's
    cache (slot -> row whose tokens it holds), updated only by admissions and the scheduler's moves."""

    def __init__(self):
        super().__init__()
        self.sched = RowScheduler(capacity=4, admit_fraction=0.5, max_prefill_tokens=12)
        self.rows: list[Row] = []
        self.slots: dict[int, Row] = {}
        self.admitted: set[str] = set()
        self.reported: list[str] = []

    @rule(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=3))
    def add(self, sizes):
        new = [make_row(f"r{len(self.rows) + i}", n) for i, n in enumerate(sizes)]
        self.rows += new
        self.sched.add(new)

    @rule()
    def admit(self):
        num_running = len(self.sched.running)
        front = list(self.sched.waiting)
        admission = self.sched.admit()
        if admission is None:
            return
        assert admission.first_slot == num_running
        assert admission.rows == front[: len(admission.rows)]  # first come, first admitted
        assert len(admission.rows) == 1 or sum(len(r.tokens) for r in admission.rows) <= 12
        for k, row in enumerate(admission.rows):
            assert row.rid not in self.admitted, f"{row.rid} admitted twice"
            self.admitted.add(row.rid)
            self.slots[admission.first_slot + k] = row

    @rule()
    def step(self):
        for row in self.sched.running:
            if not row.is_finished:
                row.tokens.append(7)

    @precondition(lambda self: any(not r.is_finished for r in self.sched.running))
    @rule(data=st.data())
    def finish(self, data):
        row = data.draw(st.sampled_from([r for r in self.sched.running if not r.is_finished]))
        self.sched.finish(row)
        self.reported.append(row.rid)

    @rule(data=st.data())
    def abort(self, data):
        ids = data.draw(st.lists(st.sampled_from([r.rid for r in self.rows] + ["never"]), max_size=4)) \
            if self.rows else ["never"]
        self.reported += [r.rid for r in self.sched.abort(ids)]

    @rule()
    def compact(self):
        for move in self.sched.compact():
            assert move.cache_len == self.slots[move.src].cache_len
            self.slots[move.dst] = self.slots.pop(move.src)
        assert all(r.status is RowStatus.RUNNING for r in self.sched.running)
        for i, row in enumerate(self.sched.running):
            assert self.slots[i] is row  # contiguous: row i's tokens are in slot i
        for slot in [s for s in self.slots if s >= len(self.sched.running)]:
            del self.slots[slot]  # freed: the next admission overwrites it

    @precondition(lambda self: len(self.rows) > 6)
    @rule()
    def abort_all(self):
        self.reported += [r.rid for r in self.sched.abort_all()]
        assert not self.sched.has_work
        self.slots.clear()

    @invariant()
    def nothing_lost_or_reported_twice(self):
        sched = self.sched
        assert len(sched.running) <= sched.capacity and sched.preemptions == 0
        assert len(self.reported) == len(set(self.reported))
        reported = set(self.reported)
        waiting, running = [r.rid for r in sched.waiting], [r.rid for r in sched.running]
        assert len(set(waiting + running)) == len(waiting) + len(running)  # in one place at a time
        for row in self.rows:
            if row.rid in waiting:
                assert row.status is RowStatus.WAITING and row.rid not in reported
            elif row.rid in running:
                assert (row.rid in reported) == row.is_finished
            else:
                assert row.rid in reported and row.is_finished  # left: reported once


SchedulerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
test_scheduler_sequences = SchedulerMachine.TestCase


def test_a_finished_row_cannot_finish_again():
    sched = RowScheduler(capacity=2, admit_fraction=0.0, max_prefill_tokens=10)
    sched.add([make_row("a", 2)])
    sched.admit()
    sched.finish(sched.running[0])
    with pytest.raises(RuntimeError, match="'a': finished while finished"):
        sched.finish(sched.running[0])
    assert sched.abort(["a"]) == []  # finished already: a normal race, not reported again
