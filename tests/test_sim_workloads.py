"""Workloads: built-in traces keep their marginals; bad JSONL files are refused naming the line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollpacker.sim import WorkloadError, load_workload, parse_jsonl
from rollpacker.sim.workloads import TRACES as BUILTIN


def write(tmp_path, lines):
    path = tmp_path / "w.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = json.dumps({"prompt": "a", "lengths": [10, 20]})


@pytest.mark.parametrize("bad,message", [
    (json.dumps({"lengths": [1]}), "missing field 'prompt'"),
    (json.dumps({"prompt": "b"}), "missing field 'lengths'"),
    (json.dumps({"prompt": "b", "lengths": [5, -3]}), "length -3 is negative"),
    (json.dumps({"prompt": "b", "lengths": [5, 2.5]}), "length 2.5 is not an integer"),
    (json.dumps({"prompt": "b", "lengths": ["7"]}), "is not an integer"),
    (json.dumps({"prompt": "b", "lengths": []}), "non-empty list"),
    ("{not json", "not valid JSON"),
    (json.dumps({"prompt": "a", "lengths": [1]}), "already given on line 1"),
])
def test_bad_line_is_named(tmp_path, bad, message):
    path = write(tmp_path, [GOOD, bad])
    with pytest.raises(WorkloadError, match=message) as info:
        parse_jsonl(path)
    assert f"{path}:2:" in str(info.value)


def test_empty_file(tmp_path):
    path = write(tmp_path, [])
    with pytest.raises(WorkloadError, match="empty workload file"):
        parse_jsonl(path)


def test_jsonl_cycles_samples_and_truncates(tmp_path):
    path = write(tmp_path, [GOOD, json.dumps({"prompt": "b", "lengths": [5000]})])
    w = load_workload(str(path), num_prompts=2, seed=0, max_tokens=4096)
    assert sorted(w.sample(0, 0) for _ in range(4)) == [10, 10, 20, 20]
    assert w.sample(1, 0) == 4096


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_marginal_and_prompt_structure(name):
    w = load_workload(name, num_prompts=4000, seed=1)
    data = np.array([[w.sample(i, 0) for _ in range(2)] for i in range(4000)])
    stats = json.loads((w_path(name)).read_text())["output_summary"]
    assert abs(np.median(data) - stats["p50"]) <= 0.1 * stats["p50"] + 2
    ranks = np.argsort(np.argsort(data, axis=0), axis=0)
    assert np.corrcoef(ranks.T)[0, 1] > 0.75  # 90% of the variance between prompts


def test_between_zero_has_no_prompt_structure():
    w = load_workload("servegen-r1", num_prompts=3000, seed=2, between=0.0)
    data = np.array([[w.sample(i, 0) for _ in range(2)] for i in range(3000)])
    ranks = np.argsort(np.argsort(data, axis=0), axis=0)
    assert abs(np.corrcoef(ranks.T)[0, 1]) < 0.1


def test_growth_lengthens_later_steps():
    w = load_workload("servegen-r1", num_prompts=500, seed=3, growth=0.1)
    early = np.mean([w.sample(i, 0) for i in range(500)])
    late = np.mean([w.sample(i, 10) for i in range(500)])
    assert late > 2 * early


def w_path(name):
    from rollpacker.sim.workloads import DATA
    return DATA / name / "lengths.json"


def test_licences_ship_with_the_data():
    for name in BUILTIN:
        assert (w_path(name).parent / "LICENSE").is_file()


def test_per_step_lines_join_in_step_order_and_finish_reasons_are_checked(tmp_path):
    lines = [json.dumps({"step": 1, "prompt": "a", "lengths": [30], "finish_reasons": ["length"]}),
             json.dumps({"step": 0, "prompt": "a", "lengths": [10, 20], "finish_reasons": ["stop", "stop"]}),
             json.dumps({"step": 0, "prompt": "b", "lengths": [7]})]
    ids, lengths = parse_jsonl(write(tmp_path, lines))
    assert ids == ["a", "b"] and lengths == [[10, 20, 30], [7]]


@pytest.mark.parametrize("bad,message", [
    (json.dumps({"step": 0, "prompt": "a", "lengths": [1]}), "already given for step 0 on line 1"),
    (json.dumps({"step": -1, "prompt": "b", "lengths": [1]}), "\"step\" must be an integer >= 0"),
    (json.dumps({"step": 1, "prompt": "b", "lengths": [1, 2], "finish_reasons": ["stop"]}),
     "\"finish_reasons\" must be a list of 2 strings"),
])
def test_bad_per_step_line_is_named(tmp_path, bad, message):
    path = write(tmp_path, [json.dumps({"step": 0, "prompt": "a", "lengths": [5]}), bad])
    with pytest.raises(WorkloadError, match=message) as info:
        parse_jsonl(path)
    assert f"{path}:2:" in str(info.value)


def test_trace_export_round_trips_into_a_workload(tmp_path):
    from rollpacker.sim.workloads import export_trace, trace_lines

    records = [{"step": 0, "requests": [[3, 100, "stop"], [3, 512, "length"], [3, 40, "abort"], [5, 9, "abort"]]},
               {"step": 1, "requests": [[5, 60, "stop"], [3, 80, "stop"]]}]
    lines = trace_lines(records)
    assert lines == [
        {"step": 0, "prompt": "3", "lengths": [100, 512], "finish_reasons": ["stop", "length"], "aborted": 1},
        {"step": 1, "prompt": "3", "lengths": [80], "finish_reasons": ["stop"], "aborted": 0},
        {"step": 1, "prompt": "5", "lengths": [60], "finish_reasons": ["stop"], "aborted": 0},
    ]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "trace.jsonl"
    assert export_trace(metrics, out) == 3
    w = load_workload(str(out), num_prompts=2, seed=0, max_tokens=512)
    assert sorted(w.sample(0, 0) for _ in range(3)) == [80, 100, 512]


def test_trace_export_without_requests_is_refused(tmp_path):
    from rollpacker.sim.workloads import export_trace

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 0}) + "\n")
    with pytest.raises(WorkloadError, match="no step record holds \"requests\""):
        export_trace(metrics, tmp_path / "out.jsonl")


def test_synthetic_bimodal_has_hard_and_easy_prompts():
    w = load_workload("synthetic-bimodal", num_prompts=2000, seed=1, max_tokens=16384)
    means = np.array([np.mean([w.sample(i, 0) for _ in range(4)]) for i in range(2000)])
    assert 0.15 < np.mean(means > 4000) < 0.4   # the hard quarter (plus a few random long ones)
    assert np.median(means) < 2000
    assert max(w.sample(i, 0) for i in range(2000)) == 16384  # hard prompts reach the cap


@given(order=st.permutations(list(range(6)) * 3), name=st.sampled_from((*BUILTIN, "synthetic-bimodal")))
@settings(max_examples=25, deadline=None)
def test_a_prompts_kth_sample_does_not_depend_on_the_other_prompts_launched(order, name):
    """Each prompt draws from its own stream: any interleaving of launches gives every prompt the same
    lengths in the same order (so every policy, and a real engine replaying it, sees the same samples)."""
    def lengths(sequence):
        w = load_workload(name, num_prompts=6, seed=3, max_tokens=4096)
        drawn: dict[int, list[int]] = {}
        for prompt in sequence:
            drawn.setdefault(prompt, []).append(w.sample(prompt, 0))
        return drawn

    assert lengths(order) == lengths(sorted(order))


def test_scale_from_maps_that_many_trace_tokens_to_max_tokens():
    plain = load_workload("servegen-r1", num_prompts=3000, seed=4, max_tokens=None)
    scaled = load_workload("servegen-r1", num_prompts=3000, seed=4, max_tokens=256, scale_from=8192)
    a = np.array([plain.sample(i, 0) for i in range(3000)])
    b = np.array([scaled.sample(i, 0) for i in range(3000)])
    assert np.median(b) == pytest.approx(np.median(a) * 256 / 8192, abs=1)  # same draws, scaled
    assert b.max() == 256 and (b == np.clip(np.maximum(np.rint(a * 256 / 8192), 1), 1, 256)).mean() > 0.97
    with pytest.raises(WorkloadError, match="scale_from applies to the built-in traces"):
        load_workload("synthetic-bimodal", num_prompts=3, seed=0, max_tokens=256, scale_from=100)


def test_a_workload_file_may_give_each_prompts_tokens(tmp_path):
    """`prompt_tokens` (rollpacker advise writes it from a run's prompts): used, capped at MAX_PROMPT_TOKENS,
    the default 256 where a prompt has none; two values for one prompt are refused naming the line."""
    from rollpacker.sim.workloads import MAX_PROMPT_TOKENS

    lines = [json.dumps({"prompt": "a", "lengths": [10], "prompt_tokens": 40}),
             json.dumps({"prompt": "b", "lengths": [10], "prompt_tokens": 10 ** 6}), json.dumps({"prompt": "c", "lengths": [5]})]
    workload = load_workload(str(write(tmp_path, lines)), num_prompts=3, seed=0)
    assert [workload.prompt_tokens(i) for i in range(3)] == [40, MAX_PROMPT_TOKENS, 256]
    bad = write(tmp_path, [lines[0], json.dumps({"step": 1, "prompt": "a", "lengths": [3], "prompt_tokens": 41})])
    with pytest.raises(WorkloadError, match=r"w.jsonl:2: prompt 'a' has \"prompt_tokens\" 40"):
        parse_jsonl(bad)
