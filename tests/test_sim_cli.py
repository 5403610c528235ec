"""`rollpacker simulate` end to end, through the installed console script's module."""

from __future__ import annotations

import json
import subprocess
import sys

REQUIRED = ["rollout_s", "reward_s", "train_s", "step_s", "bubble_ratio", "lower_bound_rollout_s", "floor_s",
            "generated_tokens", "wasted_tokens", "trained_prompts", "pending_prompts", "lost_prompts",
            "duplicate_prompts", "offpolicy_tokens", "short_rounds", "long_rounds", "mean_kept_length",
            "mean_generated_length"]


def simulate(*args):
    return subprocess.run([sys.executable, "-c", "import sys; from rollpacker.cli import main; sys.exit(main())",
                           "simulate", *args], capture_output=True, text=True, timeout=120)


def test_simulate_writes_json_and_plot(tmp_path):
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    proc = simulate("--policy", "tail", "--eta-prompts", "1.5", "--prompts", "16", "--samples", "4",
                    "--steps", "5", "--instances", "4", "--json", str(out), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert set(result) >= {"config", "steps", "total"}
    assert len(result["steps"]) == 5
    for record in result["steps"] + [result["total"]]:
        missing = [k for k in REQUIRED if k not in record]
        assert not missing, missing
    assert result["config"]["knobs"] == {"eta_prompts": 1.5}
    assert result["total"]["short_rounds"] >= 1
    assert png.stat().st_size > 10_000
    assert (tmp_path / "out-summary.png").stat().st_size > 10_000  # step times, tokens/s, wasted share


def test_python_dash_m_and_jsonl_workload(tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt": f"p{i}", "lengths": [10 + i, 300 * (i % 5) + 1]}) + "\n"
                          for i in range(40)))
    proc = subprocess.run([sys.executable, "-m", "rollpacker.sim", "--workload", str(wl), "--policy", "sync",
                           "--prompts", "8", "--samples", "2", "--steps", "2", "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["total"]["trained_prompts"] == 16


def test_gzipped_workload_runs_like_the_plain_one_and_a_binary_one_is_one_line(tmp_path):
    import gzip

    text = "".join(json.dumps({"prompt": f"p{i}", "lengths": [10 + i, 40 * (i % 5) + 1]}) + "\n" for i in range(24))
    plain, packed = tmp_path / "w.jsonl", tmp_path / "w.jsonl.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    args = ["--policy", "sync", "--prompts", "8", "--samples", "2", "--steps", "2", "--instances", "2", "--no-progress"]
    results = []
    for path in (plain, packed):
        proc = simulate("--workload", str(path), *args)
        assert proc.returncode == 0, proc.stderr
        results.append(json.loads(proc.stdout)["steps"])
    assert results[0] == results[1]
    binary, truncated = tmp_path / "w.bin", tmp_path / "cut.jsonl.gz"
    binary.write_bytes(bytes(range(256)) * 64)  # no UTF-8 text
    truncated.write_bytes(packed.read_bytes()[:40])
    for path in (binary, truncated):
        proc = simulate("--workload", str(path), *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert str(path) in line and "JSONL text (plain or .gz)" in line, line


def test_bad_input_fails_before_work(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "lengths": [1]}\n{"prompt": "b", "lengths": [-1]}\n')
    cases = [
        (["--workload", str(bad)], f"{bad}:2: length -1 is negative"),
        (["--workload", "no-such"], "no such file"),
        (["--policy", "sync", "--eta-prompts", "2"], "--eta-prompts is not a knob of policy 'sync'"),
        (["--set", "engine.nope=1"], "engine has no 'nope'"),
        (["--json", str(tmp_path / "missing" / "x.json")], "does not exist"),
        (["--model", "qwen2.5-32b", "--tp", "1", "--max-tokens", "32768"], "raise --tp"),
        (["--tp", "8", "--instances", "2"], "--tp 8 is not a valid tensor-parallel size for Qwen2.5-7B "
                                            "(28 attention heads, 4 KV heads)"),
        (["--tp", "3", "--instances", "4"], "valid: 1, 2, 4"),
    ]
    for args, message in cases:
        proc = simulate(*args, "--no-progress")
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_spec_and_sibling_knob_flags(tmp_path):
    out = tmp_path / "out.json"
    proc = simulate("--policy", "tail", "--spec", "--defer-at", "0.8", "--longest-first", "on", "--prompts", "8",
                    "--samples", "4", "--steps", "3", "--instances", "2", "--json", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["config"]["knobs"] == {"defer_at": 0.8, "longest_first": True}
    assert result["constants"]["spec"]["enabled"] is True
    assert {"tail_s", "tokens_per_s", "kept_mean_length", "launched_mean_reward"} <= set(result["total"])
    bad = simulate("--policy", "tail", "--defer-at", "1.5", "--steps", "1")
    assert bad.returncode == 2 and "defer_at must be a number in (0, 1]" in bad.stderr
    bad = simulate("--policy", "tail", "--longest-first", "maybe", "--steps", "1")
    assert bad.returncode == 2 and "expected on or off" in bad.stderr
