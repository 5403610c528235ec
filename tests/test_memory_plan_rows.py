"""The memory plan does not balloon as responses shrink or prompts grow: a micro-batch holds at most a
step's P x R rows, logits at response positions, a forward's rows halved until the plan fits; real
runs that the plan used to refuse train with the plan above their measured peak; the memory the plan
counts on can be capped ($ROLLPACKER_MEMORY_GIB)."""

from __future__ import annotations

import pytest

from rollpacker.core.errors import ConfigError
from rollpacker.train.config import RunConfig
from rollpacker.train.memory_plan import LOGITS_COPIES, ModelShape, fitted, plan_memory
from test_memory_plan import _PEAK_RSS, GIB, SMOLLM2_135M


# -- the plan does not balloon as responses shrink (a micro-batch holds at most a step's samples) --------

def _fitted_plan(prompt_tokens: int, max_tokens: int, prompts: int, samples: int, budget_gib: float, **sizes):
    """What plan_run_memory picks for the default model on the CPU (TorchTitan: every logit at once)."""
    from rollpacker.train.memory_plan import forward_row_choices, micro_batch_rows

    step_rows = prompts * samples
    common = dict(dtype="float32", engine_capacity=sizes.get("engine_capacity", 8), prompt_tokens=prompt_tokens,
                  max_tokens=max_tokens, micro_batch_tokens=256, logits_chunk_tokens=None, budget=int(budget_gib * GIB),
                  device="cpu", host_runtime=GIB // 2, step_rows=step_rows)
    rows = micro_batch_rows(256, max_tokens, step_rows)
    return fitted(plan_memory(ModelShape.from_config(SMOLLM2_135M), forward_rows=r, **common)
                  for r in forward_row_choices(rows))


def test_a_one_token_response_plans_the_rows_a_step_has_not_256():
    """--max-tokens 1 on the default model was refused needing 113 GiB: 256 rows of one response token,
    every logit of their prompts counted.  A step of `make train` (P x R) has 32."""
    default = RunConfig()
    plan = _fitted_plan(100, 1, default.prompts, default.samples, budget_gib=20, engine_capacity=default.engine_capacity)
    assert plan.forward_tokens == default.prompts * default.samples * 101
    assert plan.total < 8 * GIB, plan.line()
    plan.check()


def test_a_long_prompt_halves_a_forwards_rows_until_it_fits_not_refused():
    """A 3,000-token prompt (P=2, R=2, 16 tokens) was refused at 115.7 GiB: 16 rows of 3,016 tokens and
    every position's logits.  Now 4 rows at most (the step's), logits at the 16 response positions, and on
    a smaller machine fewer rows a forward (the trainer splits the micro-batch: the same gradient)."""
    roomy = _fitted_plan(3000, 16, 2, 2, budget_gib=64)
    assert roomy.forward_tokens == 4 * 3016 and roomy.items["logits"] == 4 * 16 * 49152 * 4 * LOGITS_COPIES
    tight = _fitted_plan(3000, 16, 2, 2, budget_gib=12)
    assert tight.forward_tokens < roomy.forward_tokens and tight.total <= 12 * GIB, tight.line()
    tight.check()
    assert _fitted_plan(3000, 16, 2, 2, budget_gib=4).forward_tokens == 3016  # one row: the least it can be


_LONG_PROMPT_ROWS = 3


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", ["one-token responses", "3000-token prompt"])
def test_the_plan_covers_the_measured_peak_of_a_run_that_used_to_balloon(tmp_path, case):
    """The two runs the plan refused (issue: --max-tokens 1, and a 3,000-token prompt at P=2, R=2, 16
    tokens), on a 4-layer tiny Llama: each trains, and its plan covers the process's measured peak."""
    import json
    import re
    import subprocess
    import sys

    from test_reference_train import ROOT, TRAIN

    from rollpacker.backends.models import tiny_random_llama

    model = tiny_random_llama(tmp_path / "model", num_layers=4, hidden_size=256, max_position_embeddings=4096)
    args = ["--preset", "tiny_debug", "--model", model, "--device", "cpu", "--steps", 1, "--out", tmp_path / "run"]
    if case == "one-token responses":
        args += ["--max-tokens", 1]
    else:
        rows = [{"question": "count the words: " + "word " * 3000, "answer": "3000"} for _ in range(_LONG_PROMPT_ROWS)]
        (tmp_path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        args += ["--dataset", tmp_path / "long.jsonl", "--prompt-key", "question", "--answer-key", "answer"]
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS, sys.executable, str(TRAIN), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = re.search(r"^memory plan \(cpu\): (.*); total ([0-9.]+) GiB", proc.stdout, re.M)
    peak = int(re.search(r"^peak_rss_kib (\d+)", proc.stdout, re.M).group(1)) * 1024
    print(f"{case}: {plan.group(0)}; measured peak {peak / GIB:.2f} GiB")
    assert float(plan.group(2)) * GIB >= peak, f"plan {plan.group(0)} below the measured peak {peak / GIB:.2f} GiB"


class _LongPrompts:
    """Two 3,000-token prompts (plan_run_memory reads only their lengths)."""

    def __len__(self) -> int:
        return 2

    def prompt_ids(self, index: int) -> tuple[int, ...]:
        return (7 + index,) * 3000


def test_the_memory_the_plan_counts_on_can_be_capped_to_check_a_smaller_device(monkeypatch):
    """$ROLLPACKER_MEMORY_GIB caps the device's memory in the run's plan (the pick of a smaller card,
    checked on a bigger one): a 3,000-token prompt's forward drops to fewer rows; a bad value is one
    line naming the variable."""
    from rollpacker.backends.models import default_model_dir
    from rollpacker.train.memory_plan import BUDGET_ENV
    from rollpacker.train.session import plan_run_memory

    config = RunConfig(trainer="titan", prompts=2, samples=2, max_tokens=16)
    plan = lambda: plan_run_memory(config, default_model_dir(), _LongPrompts(), "cpu")  # noqa: E731
    monkeypatch.setenv(BUDGET_ENV, "64")
    roomy = plan()
    monkeypatch.setenv(BUDGET_ENV, "6")
    small = plan()
    assert small.budget == 6 * GIB and "of 6.00 GiB" in small.line()
    assert small.forward_tokens == 3016 < roomy.forward_tokens, (small.line(), roomy.line())
    for bad in ("0", "lots", "inf"):
        monkeypatch.setenv(BUDGET_ENV, bad)
        with pytest.raises(ConfigError, match=f"\\${BUDGET_ENV} must be a number of GiB > 0, got '{bad}'"):
            plan()
