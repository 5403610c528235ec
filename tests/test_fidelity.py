"""benchmarks/fidelity.py on the tiny model (real engine, trainer and reward workers): a run trains with
held-out evaluations, a second call resumes it where the first stopped, a run whose state is gone is
refused rather than restarted (--restart-lost trains it again from step 0, a chunk at a time: a fresh
turn, then a turn that resumes it), and the plot and the RESULTS.md section come from the committed metrics
alone (the run directories deleted).  The held-out set itself: test_held_out.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(600)
def test_runs_resume_across_calls_and_the_report_needs_only_the_metrics(tmp_path):
    from fidelity import KEPT_FIELDS

    from rollpacker.backends.models import tiny_random_llama

    state, metrics, plot, results = tmp_path / "state", tmp_path / "metrics", tmp_path / "f.png", tmp_path / "R.md"
    results.write_text("# Benchmark results\n\n## Simulator\n\nkept as it is\n")
    base = [sys.executable, "benchmarks/fidelity.py", "--setting", "tiny", "--seeds", "0", "--policies", "sync",
            "--model", str(tiny_random_llama()), "--trainer", "torch", "--state", str(state), "--metrics",
            str(metrics), "--plot", str(plot), "--results", str(results)]

    def call(*more: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([*base, *more], cwd=ROOT, capture_output=True, text=True, timeout=280)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return proc

    call("--steps", "1")
    sync = metrics / "sync" / "seed0"
    assert [r["step"] for r in lines(sync / "metrics.jsonl")] == [0]
    assert [e["step"] for e in lines(sync / "eval.jsonl")] == [0, 1]  # before the first step, and after it
    assert set(lines(sync / "metrics.jsonl")[0]) <= set(KEPT_FIELDS)  # the per-request lists are not committed
    assert "partial" not in results.read_text()  # 1 of 1 steps: complete

    proc = call("--steps", "2", "--chunk", "1")  # a second call continues the same run: resumed
    assert (state / "train.log").read_text().count("resumed") == 1
    assert re.findall(r"sync/seed0: (\w+) at step (\d)", proc.stdout) == [("complete", "2")]
    assert [r["step"] for r in lines(sync / "metrics.jsonl")] == [0, 1]
    evals = lines(sync / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 1, 2] and all(e["eval_prompts"] == 2 for e in evals)
    assert all(e["eval_samples"] == 2 and 0 <= e["eval_sampled_reward"] <= 1 and e["eval_sampled_length"] > 0
               for e in evals)  # the tiny setting's --eval-samples 2: sampled as trained, beside greedy

    shutil.rmtree(state)  # a fresh machine: the committed metrics are all that is left of the run
    plot.unlink()
    proc = call("--steps", "3")
    assert re.search(r"sync/seed0: its state is gone .* stop at step 2: it cannot continue; --restart-lost", proc.stdout)
    assert [r["step"] for r in lines(sync / "metrics.jsonl")] == [0, 1]  # kept, not replaced
    assert plot.stat().st_size > 0
    text = results.read_text()
    assert "## Simulator\n\nkept as it is" in text
    section = text[text.index("## Fidelity: reward curves of sync, tail and unbiased tail (tiny)"):]
    rows = re.findall(r"^\| (sync) \| 0 \| (\d+)( \(partial, of 3\))? \|", section, re.M)
    assert "held-out reward, sampled (2 a prompt)" in section
    assert rows == [("sync", "2", " (partial, of 3)")] and "**Partial**" in section
    plot.unlink()
    call("--steps", "3", "--report")  # no training at all: the plot again
    assert plot.stat().st_size > 0
    # from step 0 again, a chunk at a time within the call: a fresh run to step 2, then a turn that resumes it
    proc = call("--steps", "3", "--chunk", "2", "--restart-lost")
    assert re.findall(r"sync/seed0: (\w+) at step (\d)", proc.stdout) == [("advanced", "2"), ("complete", "3")]
    assert (state / "train.log").read_text().count("resumed") == 1
    assert [r["step"] for r in lines(sync / "metrics.jsonl")] == [0, 1, 2]

    other = subprocess.run([*base, "--setting", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and f"error: {metrics / 'setting.json'} holds runs made with another flags" in other.stderr


def test_eval_every_is_checked_before_any_model_loads(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    for flags, line in ((["--dataset", data, "--prompt-key", "prompt", "--answer-key", "answer", "--eval-every", "2"],
                         "error: --eval-every draws its held-out set from --tasks: it does not apply to --dataset"),
                        (["--eval-every", "-1"], "error: --eval-every and --eval-samples must be >= 0 and --eval-prompts "
                                                 ">= 1, got -1, 0 and 64"),
                        (["--eval-every", "2", "--eval-samples", "-2"], "--eval-prompts >= 1, got 2, -2 and 64"),
                        (["--eval-every", "2", "--eval-prompts", "0"], "--eval-prompts >= 1, got 2, 0 and 0")):
        proc = subprocess.run([sys.executable, "reference/train.py", *map(str, flags), "--out", str(tmp_path / "run")],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and line in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_partial_runs_are_compared_over_the_steps_every_run_reached():
    from fidelity_report import Curve, at_common_steps, table_lines

    def curve(policy: str, seed: int, steps: int) -> Curve:
        return Curve(policy, seed, [{"step": i, "step_s": 1.0} for i in range(steps)],
                     [{"step": k, "eval_reward": k / 100} for k in range(0, steps + 1, 4)])

    cut = at_common_steps([curve("sync", 0, 11), curve("tail", 0, 6), curve("sync", 1, 9)])
    assert [(c.policy, c.seed, len(c.steps), [e["step"] for e in c.evals]) for c in cut] == [
        ("sync", 0, 6, [0, 4]), ("tail", 0, 6, [0, 4]), ("sync", 1, 6, [0, 4])]
    row = {"policy": "sync", "seed": 0, "steps": 11, "compared_steps": 6, "eval_start": 0.2, "eval_final": 0.3,
           "final_evals": 1, "time_to_level": None, "step_s": 1.0, "train_s": 6.0,
           **dict.fromkeys(("train_reward_first", "train_reward_last", "kept_first", "kept_last", "launched_first",
                            "launched_last", "eval_length_first", "eval_length_last"))}
    assert "| sync | 0 | 11 (partial, of 60; compared over its first 6) |" in "\n".join(table_lines([row], 60, None))


def test_sampled_evaluations_draw_alike_at_every_step_and_each_reply_its_own_seed():
    from rollpacker.train.algorithm import SamplingOptions
    from rollpacker.train.evaluation import eval_requests

    prompts, sampling = [(1, 2), (3,), (4, 5, 6)], SamplingOptions(temperature=0.7, top_p=0.9)
    greedy, sampled = eval_requests(prompts, 4, 2, sampling, 32)
    assert [(r.prompt_ids, r.temperature) for r in greedy] == [(p, 0.0) for p in prompts]
    assert [r.prompt_ids for r in sampled] == prompts * 2
    assert all((r.temperature, r.top_p, r.max_new_tokens) == (0.7, 0.9, 32) for r in sampled)
    seeds = [r.seed for r in sampled]
    assert len(set(seeds)) == 6 and 0 not in seeds  # each reply its own draw, none the greedy one's
    later = eval_requests(prompts, 8, 2, sampling, 32)[1]
    assert [r.seed for r in later] == seeds  # the same draws at another step (another run): paired
    assert not {r.request_id for r in later} & {r.request_id for r in sampled + greedy}
    assert eval_requests(prompts, 0, 0, sampling, 32)[1] == []


def test_the_time_to_a_reward_level_reads_the_sampled_reward_where_every_run_has_it():
    from fidelity_report import Curve, level_key, reward_level, run_row

    def curve(policy: str, sampled: list[float] | None) -> Curve:
        evals = [{"step": 4 * k, "eval_reward": 0.3, "eval_length": 9.0, "eval_prompts": 8,
                  **({"eval_sampled_reward": v} if sampled else {})} for k, v in enumerate(sampled or [0.0] * 4)]
        steps = [{"step": i, "step_s": 2.0, "mean_reward": 0.1, "mean_kept_length": 9.0, "mean_generated_length": 9.0}
                 for i in range(12)]
        return Curve(policy, 0, steps, evals)

    sync, tail = curve("sync", [0.1, 0.2, 0.3, 0.5]), curve("tail", [0.1, 0.1, 0.3, 0.4])
    assert level_key([sync, tail]) == "eval_sampled_reward"
    # halfway from 0.1 before training to the lower final (tail's: the mean of its trained evaluations, 0.267)
    assert reward_level([sync, tail], "eval_sampled_reward") == 0.183
    assert reward_level([sync, tail]) is None  # the greedy reward never rose: no level to reach
    row = run_row(tail, 0.183, "eval_sampled_reward")
    assert (row["step_to_level"], row["time_to_level"], round(row["sampled_final"], 3)) == (8, 16.0, 0.267)
    assert level_key([sync, curve("tail", None)]) == "eval_reward"  # a run without sampled evaluations


def test_policies_are_compared_seed_by_seed_against_the_spread_of_their_gains():
    """Each seed has its own held-out set, so its own starting level: tail's lead over sync in both seeds
    (+0.06, +0.05) is beyond the seeds' spread of gains (0.01), though the finals of sync alone range 0.15."""
    from fidelity_report import policy_rows, reading

    def row(policy: str, seed: int, start: float, final: float) -> dict:
        return {"policy": policy, "seed": seed, "eval_start": start, "eval_final": final, "sampled_start": None,
                "sampled_final": None, "step_s": 2.0, "eval_prompts": 48}

    rows = [row("sync", 0, 0.20, 0.30), row("tail", 0, 0.20, 0.36), row("sync", 1, 0.35, 0.45), row("tail", 1, 0.35, 0.50)]
    per_policy = policy_rows(rows)
    assert round(per_policy["sync"]["final_range"], 3) == 0.15 and round(per_policy["tail"]["spread"], 3) == 0.01
    line = next(x for x in reading(per_policy, rows) if x.startswith("tail - sync"))
    assert "+0.055 (seed 0 +0.060, seed 1 +0.050: the same sign in every seed; beyond the larger seed spread, 0.010; 2 seed(s): a description, not a test)" in line
    rows[3] = row("tail", 1, 0.35, 0.40)  # seed 1: tail behind
    line = next(x for x in reading(policy_rows(rows), rows) if x.startswith("tail - sync"))
    assert "(seed 0 +0.060, seed 1 -0.050: the seeds disagree; within the larger seed spread, 0.110; 2 seed(s)" in line
