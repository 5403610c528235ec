"""Workloads: built-in traces keep their marginals; bad JSONL files are refused naming the line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rollpacker.sim import BUILTIN, WorkloadError, load_workload, parse_jsonl


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
