"""The finished-sibling share the simulator reads the measured acceptance at (sim/siblings.py): a
capped count of complete sibling texts, this round's and, with `spec.carry_drafts`, a pending
prompt's from earlier rounds (forgotten once it is trained; aborted partial texts never count); and
a deferred prompt's long round that drafts from the short round that deferred it is faster."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_invariants import CheckedSimulation, check_run
from test_sim_speculation import with_spec

from rollpacker.core.records import PromptKey
from rollpacker.sim import SimConfig, SimConstants
from rollpacker.sim.cli import constants_from
from rollpacker.sim.siblings import SiblingTexts
from rollpacker.sim.speculation import SpecConstants

PROMPTS = [PromptKey(0, i) for i in range(3)]
OPS = st.lists(st.tuples(st.sampled_from(["launch", "finish", "abort", "round"]), st.integers(0, 2),
                         st.frozensets(st.integers(0, 2))), max_size=60)


class Reference:
    """The module docstring's definition, counted directly."""

    def __init__(self, samples: int, carry: bool) -> None:
        self.samples, self.carry = samples, carry
        self.launched, self.finished, self.earlier = {}, {}, {}

    def share(self, prompt) -> float:
        texts = self.finished.get(prompt, 0) + (self.earlier.get(prompt, 0) if self.carry else 0)
        return min(1.0, texts / max(max(self.launched[prompt], self.samples) - 1, 1))

    def end_round(self, trained) -> None:
        for prompt, n in self.finished.items():
            self.earlier[prompt] = self.earlier.get(prompt, 0) + n
        for prompt in trained:
            self.earlier.pop(prompt, None)
        self.launched, self.finished = {}, {}


@settings(max_examples=150, deadline=None)
@given(OPS, st.integers(1, 8))
def test_share_counts_complete_texts_capped_and_carried_until_trained(ops, samples):
    sims = {carry: SiblingTexts(samples, carry) for carry in (False, True)}
    refs = {carry: Reference(samples, carry) for carry in (False, True)}
    live: dict[str, PromptKey] = {}
    for n, (op, index, trained) in enumerate(ops):
        prompt = PROMPTS[index]
        mine = [rid for rid, p in live.items() if p == prompt]
        if op == "launch":
            live[f"r{n}"] = prompt
            for carry in sims:
                sims[carry].launched(f"r{n}", prompt)
                refs[carry].launched[prompt] = refs[carry].launched.get(prompt, 0) + 1
        elif op in ("finish", "abort") and mine:
            del live[mine[0]]
            for carry in sims:
                assert sims[carry].ended(mine[0], op == "finish") == {r for r in mine[1:]}
                if op == "finish":
                    refs[carry].finished[prompt] = refs[carry].finished.get(prompt, 0) + 1
        elif op == "round":  # every live request is aborted at a round's end
            for rid in live:
                for carry in sims:
                    sims[carry].ended(rid, finished=False)
            live = {}
            for carry in sims:
                sims[carry].end_round(PROMPTS[i] for i in trained)
                refs[carry].end_round(PROMPTS[i] for i in trained)
        for rid, p in live.items():
            off, on = sims[False].share(rid), sims[True].share(rid)
            assert off == pytest.approx(refs[False].share(p)) and on == pytest.approx(refs[True].share(p))
            assert 0.0 <= off <= on <= 1.0


def test_spec_carry_drafts_is_on_by_default_and_set_off_by_name():
    assert SpecConstants().carry_drafts is True and SimConstants().spec.carry_drafts is True
    assert constants_from(["spec.carry_drafts=off"]).spec.carry_drafts is False


def long_rounds_s(carry: bool) -> list[float]:
    config = SimConfig(policy="tail", prompts=8, samples=4, max_tokens=8192, steps=10, instances=2, seed=1)
    sim = CheckedSimulation(config, with_spec(SimConstants(), carry_drafts=carry))
    result = sim.run()
    check_run(result, sim)
    return [s["rollout_s"] for s in result["steps"] if s["round"] == "long"]


def test_a_deferred_prompts_long_round_drafts_from_the_round_that_deferred_it():
    """Tail batching defers a prompt whose short round finished some of its samples: with their
    texts carried, its long round's requests speculate at a higher share from their first token."""
    off, on = long_rounds_s(False), long_rounds_s(True)
    assert on and len(on) == len(off)
    assert sum(on) < sum(off), f"long rounds with carried drafts {on} vs without {off}"
