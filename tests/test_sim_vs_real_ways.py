"""An answer's way back and a request's way in on SGLang, as its servers time them (`--enable-metrics`; the step
records' `ways_back` and `ways_in`): the fit takes the way back measured, not fitted, and the joint fits measured
so stay within what they met."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import sim_vs_real  # noqa: E402
from sim_vs_real_fit import after_warmup, fit_runs, measured_way_back  # noqa: E402
from test_sim_vs_real import assert_within  # noqa: E402

MEASURED = ROOT / "benchmarks" / "sim_vs_real"
BOUNDS = {
    "sglang-tiny-mixedfit-5.json": ({"sync": 0.154, "tail": 0.221, "sorted": 0.178}, {"tail": 0.116, "sorted": 0.127}),
    "sglang-tiny-mixedfit-6.json": ({"sync": 0.191, "tail": 0.277, "sorted": 0.200}, {"tail": 0.089, "sorted": 0.015}),
}
"""The joint fit (5 seeds, this machine) measured twice with the way back the servers timed (3.4 and 3.5 ms, the
median answer): the fifth missed both ratios (sync/tail +11.5%, sync/SortedRL +12.6%) and its rounds (sync
11.2-15.3%, tail 15.9-22.0%, SortedRL 14.3-17.7%); the sixth met both ratios (-8.8%, -1.4%) and missed its rounds
(6.3-19.0%, 8.9-27.6%, 4.4-19.9%): regression bounds."""


def test_the_way_back_is_the_median_of_the_finished_answers_the_servers_timed():
    rounds = [{"requests": [[0, 5, "stop"], [0, 3, "abort"], [1, 5, "length"]], "ways_back": [0.004, 0.5, 0.002]},
              {"requests": [[2, 5, "stop"]], "ways_back": [None]},  # a server that did not say
              {"requests": [[3, 5, "stop"]]},  # a round measured before `ways_back` was recorded
              {"requests": [[0, 5, "stop"], [1, 7, "stop"]], "ways_back": [0.006, 0.010]}]
    assert measured_way_back(rounds) == {"median_s": 0.005, "p90_s": 0.010, "answers": 4}, "aborted answers left out"
    assert measured_way_back(rounds[1:3]) is None


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_a_joint_fit_measured_with_its_servers_way_back_takes_it_and_stays_within_what_it_met(tmp_path, name):
    """Through the live path: the fit runs' rounds kept the ways back the servers timed, and the profile's way back
    is their median, a few milliseconds (the 20-100 ms the earlier joint fits took from the rounds' tokens stood
    for something else); refitted, the same; predicted again, within its bounds."""
    result = json.loads((MEASURED / name).read_text())
    args = argparse.Namespace(**result["args"])
    rounds = after_warmup(fit_runs(args, result["fit_rounds"]))
    back = measured_way_back(rounds)
    kept = result["profile"]["fit"]["ways_back"]
    assert back["answers"] == kept["answers"] > 300 and back["median_s"] == kept["median_s"]
    assert result["profile"]["return_s"] == back["median_s"] < 0.01
    ways_in = [w for r in rounds for w in r.get("ways_in", []) if w is not None]
    assert ways_in or name.endswith("-5.json"), "(the fifth was measured before the ways in were recorded)"
    assert not ways_in or statistics.median(ways_in) > 3 * back["median_s"], "the way in is the longer one"
    assert sim_vs_real.refit(result, tmp_path)["profile"]["return_s"] == back["median_s"]
    assert_within(sim_vs_real.repredict(result, tmp_path), *BOUNDS[name])
