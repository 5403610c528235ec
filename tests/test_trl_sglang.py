"""RollpackerGRPOTrainer generating on servers by URL (the session's shared `rollpacker serve` pair on
127.0.0.1, SGLang's HTTP API; the tiny model): tail batching trains every prompt once, TRL's weights
reach the servers before every round; servers that serve another model are refused before any weight
moves.  (The model check and the weight syncs against real SGLang: test_sglang_train.py, test_sglang_engine.py.)"""

from __future__ import annotations


import pytest

from tests.sglang_helpers import weight_versions
from tests.trl_helpers import RewardInputs, grpo_config, require_trl, sums_dataset, tiny_model_and_tokenizer


@pytest.fixture(scope="module")
def servers(shared_servers):
    require_trl()
    model, _ = tiny_model_and_tokenizer()
    yield from shared_servers.module_pair("rollpacker", model)


def trainer_on(servers, tmp_path, model: str, tokenizer, policy: str, **config):
    from rollpacker.integrations.trl import RollpackerGRPOTrainer, RolloutSettings

    args = grpo_config(tmp_path, **config)
    knobs = {"eta_prompts": 1.5} if policy == "tail" else {}
    settings = RolloutSettings(policy=policy, sglang_urls=tuple(servers.urls), knobs=knobs)
    return RollpackerGRPOTrainer(model, RewardInputs(args.num_generations), args, sums_dataset(8),
                                 processing_class=tokenizer, rollout=settings)


@pytest.mark.timeout(300)
def test_tail_on_servers_by_url_trains_every_prompt_once_with_the_weights_synced_each_round(servers, tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    trainer = trainer_on(servers, tmp_path, model, tokenizer, "tail", max_steps=-1, num_train_epochs=1)
    trainer.train()
    trainer.close_rollout()
    rollout = trainer.rollpacker
    assert len(rollout.trained) == len(set(rollout.trained)) == 8  # one epoch: each prompt once
    assert len(rollout.rounds) == trainer.state.global_step == 4
    assert weight_versions(servers) == ["3", "3"]  # TRL's weights before each of the 4 rounds (versions 0..3)


@pytest.mark.timeout(300)
def test_servers_serving_another_model_are_refused_before_any_weight_moves(servers, tmp_path):
    from transformers import AutoTokenizer

    from rollpacker.backends.errors import ServerRejected
    from rollpacker.backends.models import tiny_random_llama

    before = weight_versions(servers)
    other = tiny_random_llama(tmp_path / "other", hidden_size=32)
    trainer = trainer_on(servers, tmp_path, str(other), AutoTokenizer.from_pretrained(other), "sync")
    with pytest.raises(ServerRejected, match=r"serves model .*, not the expected .*other.*: hidden_size 64 \(expected 32\)"):
        trainer.train()
    trainer.close_rollout()
    assert weight_versions(servers) == before
