"""RollpackerGRPOTrainer generating on a server by URL (`rollpacker serve` on 127.0.0.1, SGLang's HTTP API,
the tiny model): tail batching trains every prompt once, TRL's weights reach the server before every
round; a server that serves another model is refused before any weight moves."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.sglang_helpers import launch
from tests.trl_helpers import RewardInputs, grpo_config, require_trl, sums_dataset, tiny_model_and_tokenizer


@pytest.fixture(scope="module")
def server():
    require_trl()
    model, _ = tiny_model_and_tokenizer()
    with launch("rollpacker", model, 1) as group:
        yield group.urls[0]


def weight_version(url: str) -> str:
    with urllib.request.urlopen(url + "/model_info", timeout=30) as resp:
        return str(json.loads(resp.read())["weight_version"])


def trainer_on(url: str, tmp_path, model: str, tokenizer, policy: str, **config):
    from rollpacker.integrations.trl import RollpackerGRPOTrainer, RolloutSettings

    args = grpo_config(tmp_path, **config)
    settings = RolloutSettings(policy=policy, sglang_urls=(url,), knobs={"eta_prompts": 1.5} if policy == "tail" else {})
    return RollpackerGRPOTrainer(model, RewardInputs(args.num_generations), args, sums_dataset(8),
                                 processing_class=tokenizer, rollout=settings)


@pytest.mark.timeout(300)
def test_tail_on_a_server_by_url_trains_every_prompt_once_with_the_weights_synced_each_round(server, tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    trainer = trainer_on(server, tmp_path, model, tokenizer, "tail", max_steps=-1, num_train_epochs=1)
    trainer.train()
    trainer.close_rollout()
    rollout = trainer.rollpacker
    assert len(rollout.trained) == len(set(rollout.trained)) == 8  # one epoch: each prompt once
    assert len(rollout.rounds) == trainer.state.global_step == 4
    assert weight_version(server) == "3"  # TRL's weights before each of the 4 rounds (versions 0..3)


@pytest.mark.timeout(300)
def test_a_server_serving_another_model_is_refused_before_any_weight_moves(server, tmp_path):
    from transformers import AutoTokenizer

    from rollpacker.backends.errors import ServerRejected
    from rollpacker.backends.models import tiny_random_llama

    before = weight_version(server)
    other = tiny_random_llama(tmp_path / "other", hidden_size=32)
    trainer = trainer_on(server, tmp_path, str(other), AutoTokenizer.from_pretrained(other), "sync")
    with pytest.raises(ServerRejected, match=r"serves model .*, not the expected .*other.*: hidden_size 64 \(expected 32\)"):
        trainer.train()
    trainer.close_rollout()
    assert weight_version(server) == before
