"""Parity of TRL + rollpacker (`sync`) with TRL's own generation, on the tiny model on CPU.

Greedy decoding makes both paths produce the same completions, so one step of each must give the
reward functions the same inputs and train the same loss to the same weights; with sampling (a fixed
seed) the completions differ but their count per prompt, the prompts and the columns the reward
functions get are the same, and the engine's log-probs equal TRL's own recomputation."""

from __future__ import annotations

import pytest
import torch

from tests.trl_helpers import RewardInputs, grpo_config, require_trl, sums_dataset, tiny_model_and_tokenizer


@pytest.fixture(scope="module")
def trl():
    return require_trl()


def one_step(trl, tmp_path, rollout, **config):
    from rollpacker.integrations.trl import TrlRollout

    model, tokenizer = tiny_model_and_tokenizer()
    args = grpo_config(tmp_path, **config)
    reward = RewardInputs(args.num_generations)
    hook = TrlRollout(rollout) if rollout is not None else None
    trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=sums_dataset(8),
                              processing_class=tokenizer, rollout_func=hook)
    trainer.train()
    if hook is not None:
        hook.close()
    return trainer, reward


def test_greedy_sync_step_matches_trl_generation(trl, tmp_path):
    from rollpacker.integrations.trl import RolloutSettings

    greedy = {"generation_kwargs": {"do_sample": False}}
    ours, ours_in = one_step(trl, tmp_path / "ours", RolloutSettings(policy="sync"), **greedy)
    theirs, theirs_in = one_step(trl, tmp_path / "theirs", None, **greedy)
    (a,), (b,) = ours_in.calls, theirs_in.calls
    assert a == b  # prompts, completions, completion ids, columns: the same inputs to the reward functions
    assert len(a["completion_ids"]) == 4 and all(a["prompts"][i] == a["prompts"][i - i % 2] for i in range(4))
    log_a, log_b = ours.state.log_history[0], theirs.state.log_history[0]
    assert log_a["loss"] == pytest.approx(log_b["loss"], rel=1e-5, abs=1e-7)
    assert log_a["grad_norm"] > 0 and log_a["grad_norm"] == pytest.approx(log_b["grad_norm"], rel=1e-4)
    for (name, p), q in zip(ours.model.named_parameters(), theirs.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_sampled_sync_step_same_reward_inputs_and_logprobs(trl, tmp_path):
    from rollpacker.integrations.trl import RolloutSettings

    ours, ours_in = one_step(trl, tmp_path / "ours", RolloutSettings(policy="sync"), learning_rate=0.0)
    theirs, theirs_in = one_step(trl, tmp_path / "theirs", None, learning_rate=0.0)
    (a,), (b,) = ours_in.calls, theirs_in.calls
    assert a["prompts"] == b["prompts"] and a["answer"] == b["answer"] and a["keys"] == b["keys"]
    assert len(a["completion_ids"]) == len(b["completion_ids"]) == 4  # num_generations per prompt
    tokenizer = ours.processing_class
    assert [c[0]["content"] for c in a["completions"]] == tokenizer.batch_decode(a["completion_ids"],
                                                                                skip_special_tokens=True)
    (played,) = ours.rollout_func.rounds
    rows = [(c.token_ids, c.logprobs) for _, group in played.groups for c in group]
    assert [list(ids) for ids, _ in rows] == a["completion_ids"]
    prompt_ids = ours._tokenize_prompts(a["prompts"])[0]
    for prompt, (ids, engine_logps) in zip(prompt_ids, rows):  # learning_rate 0: the weights that sampled
        full = torch.tensor([list(prompt) + list(ids)])
        recomputed = ours._get_per_token_logps_and_entropies(ours.model, full, torch.ones_like(full), len(ids))[0]
        torch.testing.assert_close(torch.tensor(engine_logps), recomputed[0], rtol=1e-5, atol=1e-5)
