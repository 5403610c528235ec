"""A deferred prompt's long round drafts from the round that deferred it: the embedded engine keeps
the groups the driver names (`DraftKeepingEngine.keep_draft_groups`) as draft sources however many
other groups run in between, forgets a group once it is no longer named (memory stays bounded),
and the driver names, after each step, exactly the prompts drawn and not yet trained.
The real embedded engine (speculating on CPU) on the tiny model, and one real tail-batching step."""

from __future__ import annotations

import pytest
from test_colocate import Prompts
from test_embedded_speculation import run_all
from test_train_worker import ParityRewards

from rollpacker.backends.embedded.drafter import Drafter
from rollpacker.backends.embedded.engine import EmbeddedEngine
from rollpacker.backends.models import load_model, tiny_random_llama
from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig
from rollpacker.core import BatcherConfig, Scheduler, make_policy
from rollpacker.core.commands import sibling_group
from rollpacker.core.protocols import DraftKeepingEngine, GenerationRequest
from rollpacker.driver import StepLoop

PROMPT = (11, 523, 77, 3021, 905)
NEW = 24
CHURN = Drafter().max_groups + 44
"""More one-token groups than the drafter keeps idle: without `keep`, every earlier group is evicted."""


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_llama()


def accepted(engine: EmbeddedEngine, rid: str, group: str) -> tuple[int, tuple[int, ...]]:
    """(draft tokens accepted, tokens) of one greedy request of PROMPT in `group`, run alone."""
    before = engine.speculation_stats.num_accepted
    result = run_all(engine, [GenerationRequest(rid, PROMPT, NEW, temperature=0.0, group=group)])[rid]
    return engine.speculation_stats.num_accepted - before, result.token_ids


def churn(engine: EmbeddedEngine, tag: str) -> None:
    run_all(engine, [GenerationRequest(f"{tag}{i}", (5, i + 100), 1, temperature=0.0, group=f"{tag}{i}")
                     for i in range(CHURN)])


@pytest.mark.timeout(300)
def test_a_kept_group_drafts_after_any_churn_and_is_forgotten_once_dropped(tiny):
    model, _ = load_model(tiny)
    with EmbeddedEngine(model, capacity=64, stop_token_ids=(), spec_max_rows=4) as engine:
        assert isinstance(engine, DraftKeepingEngine)
        _, tokens = accepted(engine, "kept0", "kept")  # the short round that deferred it
        accepted(engine, "other0", "other")  # the same text, in a group nobody keeps
        engine.keep_draft_groups({"kept"})
        churn(engine, "a")  # the short rounds in between
        kept, kept_tokens = accepted(engine, "kept1", "kept")  # its long round
        cold, cold_tokens = accepted(engine, "other1", "other")
        assert kept_tokens == cold_tokens == tokens, "greedy: the same text whatever the drafts"
        assert kept > cold, f"the kept group's earlier text drafts for it ({kept} vs {cold} accepted)"
        assert kept >= NEW // 2, f"a greedy sibling's text is accepted nearly whole ({kept} of {NEW})"

        engine.keep_draft_groups(set())  # trained: no longer named, an idle group like any other
        churn(engine, "b")
        again, _ = accepted(engine, "kept2", "kept")
        assert again == cold, "a group no longer kept is evicted by the churn (the memory bound)"


@pytest.mark.timeout(600)
def test_the_driver_names_the_pending_prompts_groups_after_each_step(tiny):
    """Tail batching (P=2, R=2: 3 groups of 3) on an engine of 3 rows: the third group is aborted
    and deferred; after the step the engine is told to keep exactly the pending prompts' groups."""
    model, _ = load_model(tiny)
    engine = EmbeddedEngine(model, capacity=3, stop_token_ids=(), spec_max_rows=4)
    told: list[frozenset] = []
    keep = engine.keep_draft_groups

    def keep_watched(groups):  # the test notes what the driver named; the engine keeps them as ever
        told.append(frozenset(groups))
        keep(groups)

    engine.keep_draft_groups = keep_watched
    trainer = TorchTrainer(TorchTrainerConfig(model_dir=str(tiny), lr=1e-3, seed=0, device="cpu"))
    sched = Scheduler(make_policy("tail", prompts=2, samples=2, max_tokens=12), num_prompts=4,
                      batcher=BatcherConfig(token_budget=1))
    loop = StepLoop(sched, engine, ParityRewards(), trainer, Prompts())
    try:
        loop.run_step()
        pending = loop.pending_prompts()
    finally:
        loop.close()
        engine.close()
    trained = {i.prompt for i in loop.last_timeline if i.is_trained}
    deferred = {i.prompt for i in loop.last_timeline if i.outcome == "aborted"} - trained
    assert deferred, "the case under test: a prompt's requests were aborted and the prompt deferred"
    assert told == [frozenset(sibling_group(p) for p in pending)]
    assert deferred <= {p.index for p in pending}, "a deferred prompt is pending: its group is kept"
