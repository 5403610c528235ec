"""benchmarks/bias_real.py on a tiny random Llama (real engine, real trainer at lr 0, real reward
workers): every launched sample is accounted for, aborted ones are completed from the very tokens
they had, and the step record names each request's id and reward."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rollpacker.core.errors import ConfigError
from rollpacker.train.config import parse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bias_real  # noqa: E402

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def tiny_model():
    from rollpacker.backends.models import tiny_random_llama

    return tiny_random_llama()


def tiny_config(model) -> object:
    return parse(["--preset", "tiny_debug", "--model", str(model), "--trainer", "torch",
                  "--max-tokens", str(MAX_TOKENS), "--engine-capacity", "16"])


def test_lr_0_is_a_valid_rollout_only_run_and_a_negative_lr_is_not(tiny_model):
    config = tiny_config(tiny_model)
    config.lr = 0.0
    config.validate()
    config.lr = -1e-5
    with pytest.raises(ConfigError, match="--lr must be >= 0"):
        config.validate()


@pytest.mark.timeout(300)
def test_every_launched_sample_is_kept_or_completed_from_its_own_prefix(tiny_model, tmp_path):
    config = tiny_config(tiny_model)
    [sync] = bias_real.measure(config, ["sync"], steps=1, out=tmp_path)
    tail, sorted_ = bias_real.measure(config, ["tail", "sorted"], steps=2, out=tmp_path)
    assert sync.means(kept_only=True) == sync.means(kept_only=False)  # sync keeps everything it launches
    assert len(sync.samples) == sync.requests == 2 * 2 and not any(s.is_aborted for s in sync.samples)
    aborted = [s for r in (tail, sorted_) for s in r.samples if s.is_aborted]
    assert aborted, "the over-sampling policies aborted nothing: the test exercises no completion"
    for result in (sync, tail, sorted_):
        assert len(result.samples) == result.requests  # no partial rollout here: a request is a sample
        assert result.prefix_mismatches == ()
        for s in result.samples:
            assert not (s.is_kept and s.is_pending) and not (s.is_aborted and s.is_kept)
        for s in result.samples:
            assert 1 <= len(s.response_ids) <= MAX_TOKENS and 0.0 <= s.reward <= 1.0
            if s.is_aborted:
                assert len(s.response_ids) >= s.num_generated
            else:
                assert len(s.response_ids) == s.num_generated
    assert len(tail.samples) > sum(s.is_kept for s in tail.samples)  # tail over-launches and drops some
    recorded = {}  # the step records list (prompt, length, finish reason, request id, reward)
    for line in (tmp_path / "tail" / "metrics.jsonl").read_text().splitlines():
        for prompt, num_tokens, reason, rid, reward in json.loads(line)["requests"]:
            recorded[rid] = (prompt, num_tokens, reason, reward)
    assert set(recorded) == {s.request_id for s in tail.samples}
    for s in tail.samples:
        prompt, num_tokens, reason, reward = recorded[s.request_id]
        assert prompt == s.prompt and num_tokens == s.num_generated and (reason == "abort") == s.is_aborted
        # unscored (aborted, or a late answer) -> None; a carried group's reward may land in the next
        # step, then its own record says None too
        assert reward in (s.reward, None) and (reward is None or not s.is_aborted)
