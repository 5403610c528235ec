"""benchmarks/gpu_campaign.py on tiny sizes with --device cpu: every part runs for real and its
RESULTS.md section names the device, the torch version and each command (into a temp file)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.fixture(scope="module", autouse=True)
def campaign_call(tmp_path_factory):
    """One call of four parts (engine, trainer, compare, fidelity with --fidelity-steps 1) into a
    RESULTS.md that holds another section, started when the module starts: it runs beside the
    module's other tests (each part in its own child processes, as alone), and the two tests that
    read it, last in the module, wait for it (`campaign`)."""
    from rollpacker.backends.models import tiny_random_llama

    tmp = tmp_path_factory.mktemp("campaign")
    results = tmp / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Simulator\n\nkept as it is\n")
    real = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    cmd = [sys.executable, "benchmarks/gpu_campaign.py", "--device", "cpu", "--tiny", "--trainer", "torch",
           "--model", str(tiny_random_llama()), "--policies", "sync,tail", "--out", str(tmp / "runs"),
           "--results", str(results), "--part", "engine,trainer,compare,fidelity", "--fidelity-steps", "1"]
    with (tmp / "stdout").open("w") as out, (tmp / "stderr").open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True)
    try:
        yield {"proc": proc, "cmd": cmd, "tmp": tmp, "results": results, "logs": tmp / "runs" / "logs", "real": real}
    finally:
        if proc.poll() is None:  # (a module cut short, or -k without the tests that read it)
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def campaign(campaign_call) -> dict:
    """`campaign_call` once it has ended: its CompletedProcess beside its files."""
    call = campaign_call
    returncode = call["proc"].wait(timeout=600)
    proc = subprocess.CompletedProcess(call["cmd"], returncode, (call["tmp"] / "stdout").read_text(),
                                       (call["tmp"] / "stderr").read_text())
    return {**call, "proc": proc}


@pytest.mark.timeout(240)
def test_a_failing_part_keeps_its_stderr_and_the_other_parts(tmp_path):
    """compare fails (an unknown policy): its log holds the child's stderr and exit status, figures.jsonl
    its error, the exit status is 1, and the env part before it still wrote its figures and section;
    a second call appends to the same files.  (env, not engine, before it: the cheaper part; the
    engine part's figures and section are checked by the test above.)"""
    from rollpacker.backends.models import tiny_random_llama

    logs, results = tmp_path / "logs", tmp_path / "R.md"
    cmd = [sys.executable, "benchmarks/gpu_campaign.py", "--device", "cpu", "--tiny", "--trainer", "torch",
           "--model", str(tiny_random_llama()), "--out", str(tmp_path / "runs"), "--logs", str(logs),
           "--results", str(results)]
    proc = subprocess.run([*cmd, "--part", "env,compare", "--policies", "sync,nosuch"], cwd=ROOT,
                          capture_output=True, text=True, timeout=230)
    assert proc.returncode == 1, proc.stderr[-3000:]
    log = (logs / "compare.log").read_text()
    child_error = log.split("--- stderr\n")[1].split("\n--- exit status")[0]
    assert "nosuch" in child_error and "--- exit status " in log and "--- exit status 0" not in log
    assert "error: part compare failed: python reference/train.py" in proc.stderr and str(logs / "compare.log") in proc.stderr
    assert "--- stderr\n" in (logs / "env.log").read_text()
    figures = [json.loads(line) for line in (logs / "figures.jsonl").read_text().splitlines()]
    assert [f["part"] for f in figures] == ["env", "compare"]
    assert figures[0]["missing_required"] == [] and "nosuch" in figures[1]["error"]
    assert "### Environment" in results.read_text() and "### Reference trainer" not in results.read_text()
    proc = subprocess.run([*cmd, "--part", "env"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = [json.loads(line) for line in (logs / "figures.jsonl").read_text().splitlines()]
    assert [f["part"] for f in figures] == ["env", "compare", "env"] and figures[2]["missing_required"] == []
    assert (logs / "env.log").read_text().count("--- exit status 0") == 2  # the second call's run appended


@pytest.mark.timeout(240)
def test_deadline_skips_the_parts_that_no_longer_fit_and_names_them(tmp_path):
    """--deadline-s 60: env (15 s on an H100) runs; engine (260 s) does not fit in what is left, so it is
    skipped, said so, recorded in figures.jsonl and never started (no engine.log); the call succeeds."""
    logs = tmp_path / "logs"
    cmd = [sys.executable, "benchmarks/gpu_campaign.py", "--device", "cpu", "--tiny", "--trainer", "torch",
           "--out", str(tmp_path / "runs"), "--logs", str(logs), "--results", str(tmp_path / "R.md"),
           "--part", "env,engine", "--deadline-s", "60"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"== engine: skipped: \d+ s left of --deadline-s 60, and it needs ~260 s on an H100 ==", proc.stdout)
    assert "skipped for the deadline: engine" in proc.stdout
    figures = [json.loads(line) for line in (logs / "figures.jsonl").read_text().splitlines()]
    assert [f["part"] for f in figures] == ["env", "engine"] and "skipped" in figures[1] and "error" not in figures[1]
    assert (logs / "env.log").exists() and not (logs / "engine.log").exists()
    assert "### Environment" in (tmp_path / "R.md").read_text()


@pytest.mark.timeout(60)
def test_campaign_falls_back_to_the_torch_trainer_where_titan_cannot_import():
    """Where TorchTitan cannot import (simulated: one of its model packages fails to import)."""
    pytest.importorskip("torchtitan")
    from test_torch_trainer import _TITAN_CANNOT_IMPORT

    code = _TITAN_CANNOT_IMPORT + ("import sys; sys.path.insert(0, 'benchmarks'); import gpu_campaign as g; "
                                  "print(g.pick_trainer('auto')); g.pick_trainer('titan')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=50)
    picked, why = ast.literal_eval(proc.stdout.strip().splitlines()[0])
    assert picked == "torch" and why.startswith("TorchTitan unavailable (") and why.endswith("using --trainer torch")
    assert "torchtitan.models.llama3" in why
    assert proc.returncode == 1 and proc.stderr.strip().startswith("error: --trainer titan:")



@pytest.mark.timeout(60)
def test_campaign_picks_titan_on_torch_2_11():
    """As on the lent GPU machines (torch 2.11: simulated by removing the name TorchTitan 0.3.0 misses):
    titan.compat's stand-ins let TorchTitan import, so `auto` picks it."""
    pytest.importorskip("torchtitan")
    from test_torch_trainer import _WITHOUT_TITAN_NAME

    code = _WITHOUT_TITAN_NAME + ("import sys; sys.path.insert(0, 'benchmarks'); import gpu_campaign as g; "
                                  "print(g.pick_trainer('auto'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ast.literal_eval(proc.stdout.strip().splitlines()[0]) == ("titan", "TorchTitan imports")


def _test_files(lines) -> set[str]:
    """The test files named by pytest lines such as `tests/test_x.py::test_y[cuda]` or
    `SKIPPED [2] tests/test_x.py:40: needs a CUDA GPU`."""
    return {m.group(1) for line in lines if (m := re.search(r"(tests/test_\w+\.py)(::|:\d+)", line))}


@pytest.mark.timeout(400)
def test_the_tests_part_runs_every_gpu_marked_test_found_by_its_marker(tmp_path):
    """Every file holding a gpu-marked test (as pytest's own `-m gpu` collection finds them) is run by
    `--part tests`: a file missing from a list of files would be missing here.  On CPU each one is
    skipped, and -ra names it."""
    from rollpacker.backends.models import tiny_random_llama

    # pytest's own collection runs beside the campaign (two processes that mostly import: two cores)
    collecting = subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-o", "addopts=",
                                   "-p", "no:cacheprovider", "tests"], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
    try:
        logs = tmp_path / "logs"
        proc = subprocess.run([sys.executable, "benchmarks/gpu_campaign.py", "--device", "cpu", "--tiny", "--trainer",
                               "torch", "--model", str(tiny_random_llama()), "--out", str(tmp_path / "runs"), "--logs",
                               str(logs), "--results", str(tmp_path / "R.md"), "--part", "tests"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        collected, _ = collecting.communicate(timeout=300)
    finally:
        if collecting.poll() is None:
            collecting.kill()
            collecting.communicate()
    assert collecting.returncode == 0, collected[-3000:]
    marked = [line for line in collected.splitlines() if "::" in line]
    expected = _test_files(marked)
    assert {"tests/test_engine_graphs.py", "tests/test_colocate.py", "tests/test_weight_sync.py"} <= expected

    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped = [line for line in (logs / "tests.log").read_text().splitlines() if line.startswith("SKIPPED")]
    assert _test_files(skipped) == expected
    (figures,) = [json.loads(line) for line in (logs / "figures.jsonl").read_text().splitlines()]
    assert figures["skipped"] == len(marked) and not figures.get("passed")


def test_the_compare_ratio_is_the_median_over_seeds():
    """One seed's window is not a figure to quote (on an H200: 1.43x, 1.52x, 1.57x over three seeds)."""
    from gpu_campaign import median_ratios

    runs = [{"policies": ["sync", "tail", "sorted"], "step_time_ratio": {"tail": t, "sorted": s}}
            for t, s in ((1.43, 1.1), (1.85, 0.9), (1.52, 1.0))]
    assert median_ratios(runs) == {"tail": 1.52, "sorted": 1.0}


@pytest.mark.timeout(60)
def test_campaign_writes_every_section_with_device_and_commands(campaign):
    proc, results, logs = campaign["proc"], campaign["results"], campaign["logs"]
    assert proc.returncode == 0, proc.stderr[-3000:]

    text = results.read_text()
    assert "## Simulator\n\nkept as it is" in text
    section = text[text.index("## One-device campaign (cpu"):]
    for sub in ("### Embedded engine", "### Trainer", "### Reference trainer: sync vs tail"):
        assert section.count(sub) == 1
        assert f"torch {torch.__version__}, trainer torch (--trainer torch)" in section.split(sub)[1]
    assert "`python benchmarks/engine_throughput.py --device cpu --dtype float32" in section
    assert "`python benchmarks/gpu_campaign.py --device cpu --tiny --trainer torch" in section
    assert re.search(r"`python reference/train\.py --preset tiny_debug --steps 1 --compare sync,tail --seed 0 --device cpu "
                     r"--trainer torch", section)
    assert "`memory plan (cpu): engine weights" in section and "`TorchTrainer` forward+backward" in section
    rows = dict(re.findall(r"^\| 0 \| (sync|tail) \| ([0-9.]+) \|", section, re.M))
    assert set(rows) == {"sync", "tail"} and all(float(s) > 0 for s in rows.values())
    seed0 = re.search(r"^\| 0 \| tail \| [0-9.]+ \| ([0-9.]+)x \|", section, re.M).group(1)
    assert f"sync/policy step time, the median over seeds 0: tail {seed0}x." in section
    engine_tok_s = re.search(r"^\| rollpacker embedded engine \| ([0-9.]+) \|", section, re.M)
    assert engine_tok_s and float(engine_tok_s.group(1)) > 0
    cb_tok_s = re.search(r"^\| transformers continuous batching \| ([0-9.]+) \|", section, re.M)
    assert cb_tok_s and float(cb_tok_s.group(1)) > 0, "the engine part measures transformers' continuous batching too"
    assert re.search(r"against transformers' continuous batching: [0-9.]+x\.", section)
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == campaign["real"], "the test wrote the real RESULTS.md"
    figures = [json.loads(line) for line in (logs / "figures.jsonl").read_text().splitlines()]
    assert [f["part"] for f in figures] == ["engine", "trainer", "compare", "fidelity"]
    assert figures[0]["embedded_tok_s"] > 0
    assert "$ python reference/train.py --preset tiny_debug" in (logs / "compare.log").read_text()


@pytest.mark.timeout(60)
def test_fidelity_part_says_what_it_runs_and_runs_the_three_policies_through_benchmarks_fidelity(campaign):
    """The part is benchmarks/fidelity.py (one driver): its first line and its section say the sizes and
    steps; the three policies of the tiny setting train on seed 0 within one call and their table is in the section.
    (The fidelity part of the `campaign` call, after its other parts.)"""
    proc, results, logs = campaign["proc"], campaign["results"], campaign["logs"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    what = "3 policies (sync, tail, tail-unbiased) x seeds 0; 1 steps each: tiny_debug sizes (CI)"
    assert f"fidelity: {what}\n" in proc.stdout and f"fidelity: {what}: complete" in proc.stdout
    section = results.read_text().split("### Fidelity: reward curves")[1]
    assert f"What: {what}; complete." in section and "`python benchmarks/fidelity.py --setting tiny --seeds 0" in section
    assert re.findall(r"^\| (sync|tail|tail-unbiased) \| 0 \| 1 \|", section, re.M) == ["sync", "tail", "tail-unbiased"]
    assert (logs / "fidelity.png").stat().st_size > 0 and "$ " in (logs / "fidelity.log").read_text()
