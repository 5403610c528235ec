"""The simulated reward stage after a short round: tail batching ends its round when the P-th group
completes, so the last groups' samples reach the scorers at once, some of them hang or run long.
Hedging (a second execution on a free worker), burst workers for the samples the step waits for,
and complete groups first each shorten the wait after the round; none changes what is trained."""

from __future__ import annotations

import attrs
import pytest

from rollpacker.sim import SimConfig, SimConstants, Simulation

OFF = dict(workers=8, hedge_after=0.0, priority=False, burst_workers=0, hang_rate=0.02)
"""A pool too small for the burst, 2% of executions hang, no mechanism on."""


def run(policy: str, **reward) -> dict:
    c = SimConstants()
    constants = attrs.evolve(c, reward=attrs.evolve(c.reward, **{**OFF, **reward}))
    config = SimConfig(policy=policy, model="qwen2.5-7b", instances=8, tp=1, prompts=32, samples=8, max_tokens=8192,
                       steps=4, seed=0)
    return Simulation(config, constants).run()["total"]


def test_each_mechanism_shortens_the_tails_reward_wait_and_all_together_most():
    off = run("tail")
    hedged = run("tail", hedge_after=1.0, hedge_copies=3)
    burst = run("tail", burst_workers=8, priority=True)
    both = run("tail", hedge_after=1.0, hedge_copies=3, burst_workers=8, priority=True)
    assert hedged["reward_s"] < 0.8 * off["reward_s"], "hangs re-run on free workers, not waited out"
    assert burst["reward_s"] < 0.3 * off["reward_s"], "the step's samples get the burst workers"
    assert both["reward_s"] < 0.5 * min(hedged["reward_s"], burst["reward_s"])
    assert both["reward_timeouts"] < 0.5 * off["reward_timeouts"]
    for run_ in (hedged, burst, both):  # the rollout and what it trains are the reward stage's to keep
        assert run_["rollout_s"] == pytest.approx(off["rollout_s"]) and run_["trained_prompts"] == off["trained_prompts"]
        assert run_["lost_prompts"] == run_["duplicate_prompts"] == 0


def test_hedging_cuts_syncs_wait_for_a_hung_scorer():
    off, hedged = run("sync"), run("sync", hedge_after=1.0, hedge_copies=3)
    assert hedged["reward_s"] < 0.8 * off["reward_s"] and hedged["reward_timeouts"] < off["reward_timeouts"]
