"""What does not work through TRL's hook is a clear error where a user would hit it: each GRPOConfig
argument rollpacker's rollout cannot honour is a `TrlUnsupported` naming it, raised by
RollpackerGRPOTrainer before the model loads (the model path here does not exist), and by the plain
hook at its first call, before any engine starts."""

from __future__ import annotations

import pytest

from tests.trl_helpers import grpo_config, require_trl, sums_dataset, tiny_model_and_tokenizer


@pytest.fixture(scope="module")
def trl():
    return require_trl()


@pytest.mark.parametrize("config, named", [
    ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps=2"),
    ({"generation_batch_size": 8}, "generation_batch_size=8"),
    ({"steps_per_generation": 2}, "generation_batch_size=8 (steps_per_generation=2)"),
    ({"num_iterations": 2}, "num_iterations=2"),
    ({"use_vllm": True}, "use_vllm=True"),
    ({"repetition_penalty": 1.1}, "repetition_penalty=1.1"),
    ({"generation_kwargs": {"num_beams": 2}}, "generation_kwargs keys ['num_beams']"),
])
def test_unsupported_argument_named_before_the_model_loads(trl, tmp_path, config, named):
    from rollpacker.integrations.trl import RollpackerGRPOTrainer, TrlUnsupported

    with pytest.raises(TrlUnsupported, match=named.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        RollpackerGRPOTrainer(str(tmp_path / "no-such-model"), lambda **kw: [0.0], grpo_config(tmp_path, **config),
                              sums_dataset(8))


def test_several_processes_refused(trl, tmp_path):
    from rollpacker.integrations.trl import RolloutSettings, TrlUnsupported, check_args

    with pytest.raises(TrlUnsupported, match="2 processes"):
        check_args(grpo_config(tmp_path), world_size=2, hooked=False, settings=RolloutSettings())


def test_policies_refused(trl, tmp_path):
    from rollpacker.integrations.trl import RollpackerGRPOTrainer, RolloutSettings, TrlUnsupported

    with pytest.raises(TrlUnsupported, match="off-policy"):
        RolloutSettings(policy="partial")
    with pytest.raises(TrlUnsupported, match="mode='on_policy'"):
        RolloutSettings(policy="sorted", knobs={"mode": "partial"})
    with pytest.raises(TrlUnsupported, match="rollout_func is not supported"):
        RollpackerGRPOTrainer("x", None, grpo_config(tmp_path), sums_dataset(8), rollout_func=print)
    with pytest.raises(TrlUnsupported, match="IterableDataset"):
        RollpackerGRPOTrainer("x", None, grpo_config(tmp_path), sums_dataset(8).to_iterable_dataset())


def test_plain_hook_refuses_deferral_at_its_first_call(trl, tmp_path):
    from rollpacker.integrations.trl import RolloutSettings, TrlRollout, TrlUnsupported

    model, tokenizer = tiny_model_and_tokenizer()
    hook = TrlRollout(RolloutSettings(policy="tail"))
    trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=grpo_config(tmp_path), train_dataset=sums_dataset(8), processing_class=tokenizer,
                              rollout_func=hook)
    with pytest.raises(TrlUnsupported, match="use RollpackerGRPOTrainer"):
        trainer.train()
    assert hook.runner is None  # no engine was started
