"""RollpackerGRPOTrainer on the tiny model on CPU: with prompt deferral (tail batching) and SortedRL's
loaded batches, every prompt TRL's sampler drew in an epoch is trained exactly once in that epoch's
steps, never dropped or repeated, and TRL trains (rewards) exactly the rows of the prompts the round
trained; the plain hook's response over-sampling keeps the first R of ceil(eta x R) responses."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.trl_helpers import RewardInputs, grpo_config, require_trl, sums_dataset, tiny_model_and_tokenizer


@pytest.fixture(scope="module")
def trl():
    return require_trl()


def train(tmp_path, settings, n=12, **config):
    from rollpacker.integrations.trl import RollpackerGRPOTrainer

    model, tokenizer = tiny_model_and_tokenizer()
    args = grpo_config(tmp_path, **config)
    reward = RewardInputs(args.num_generations)
    dataset = sums_dataset(n)
    trainer = RollpackerGRPOTrainer(model, reward, args, dataset, processing_class=tokenizer, rollout=settings)
    trainer.train()
    trainer.close_rollout()
    return trainer, reward, dataset


def check_exactly_once(trainer, reward, dataset, epochs):
    rollout, orders = trainer.rollpacker, trainer._feed.orders
    assert len(orders) == epochs
    steps_per_epoch = len(dataset) // 2  # 2 prompts a step
    for epoch, order in enumerate(orders):
        in_its_steps = rollout.trained[epoch * len(dataset):(epoch + 1) * len(dataset)]
        assert {k.epoch for k in in_its_steps} == {epoch}  # trained within the epoch's own steps
        assert Counter(k.index for k in in_its_steps) == Counter(order) == Counter(range(len(dataset)))
    assert len(rollout.trained) == len(set(rollout.trained)) == epochs * len(dataset)
    assert len(rollout.rounds) == trainer.state.global_step == epochs * steps_per_epoch
    # TRL scored (and trained) exactly the rows of the prompts each round trained, R rows each
    scored = [p[0]["content"] for call in reward.calls for p in call["prompts"]]
    assert scored == [dataset[k.index]["prompt"][0]["content"] for k in rollout.trained for _ in range(2)]


def test_tail_defers_and_trains_every_prompt_once_per_epoch(trl, tmp_path):
    from rollpacker.integrations.trl import RolloutSettings

    settings = RolloutSettings(policy="tail", knobs={"eta_prompts": 1.5})
    trainer, reward, dataset = train(tmp_path, settings, max_steps=-1, num_train_epochs=2)
    check_exactly_once(trainer, reward, dataset, epochs=2)
    rounds = trainer.rollpacker.rounds
    assert sum(r.report.deferred_prompts for r in rounds) >= 4 and any(r.kind == "long" for r in rounds)
    first = [k.index for k in trainer.rollpacker.trained[:6]]
    assert first != list(trainer._feed.orders[0][:6])  # deferral moved prompts to later steps
    assert trainer.state.log_history[0]["rollpacker/rollout_s"] > 0


def test_sorted_trains_every_prompt_once(trl, tmp_path):
    from rollpacker.integrations.trl import RolloutSettings

    trainer, reward, dataset = train(tmp_path, RolloutSettings(policy="sorted", knobs={"group_batches": 2}),
                                     max_steps=-1, num_train_epochs=1)
    check_exactly_once(trainer, reward, dataset, epochs=1)


def test_oversample_hook_keeps_first_r_of_eta_r(trl, tmp_path):
    from rollpacker.integrations.trl import RolloutSettings, TrlRollout

    model, tokenizer = tiny_model_and_tokenizer()
    args = grpo_config(tmp_path, max_steps=2)
    hook = TrlRollout(RolloutSettings(policy="oversample", knobs={"eta_responses": 1.5}))
    reward = RewardInputs(args.num_generations)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=sums_dataset(8),
                              processing_class=tokenizer, rollout_func=hook)
    trainer.train()
    hook.close()
    assert len(hook.rounds) == 2
    for played, call in zip(hook.rounds, reward.calls):
        assert played.report.launched_requests == 2 * 3 and played.report.deferred_prompts == 0
        assert [len(group) for _, group in played.groups] == [2, 2]
        assert [list(c.token_ids) for _, g in played.groups for c in g] == call["completion_ids"]
