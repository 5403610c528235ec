"""The memory plan's arithmetic against hand-computed sizes for SmolLM2-135M, its one-line error, and
--device resolution."""

from __future__ import annotations

import pytest

from rollpacker.core.errors import ConfigError
from rollpacker.train.config import RunConfig, resolve_device
from rollpacker.train.memory_plan import (LOGITS_CHUNK_TOKENS, LOGITS_COPIES, MICRO_BATCH_TOKENS, ModelShape, fitted,
                                          plan_memory)

SMOLLM2_135M = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
                "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True}
GIB = 2**30


def smollm2_plan(**overrides):
    sizes = dict(dtype="float32", engine_capacity=256, prompt_tokens=256, max_tokens=768, micro_batch_tokens=4096,
                 logits_chunk_tokens=LOGITS_CHUNK_TOKENS, budget=80 * GIB, device="cuda")
    return plan_memory(ModelShape.from_config(SMOLLM2_135M), **{**sizes, **overrides})


def test_parameter_count_is_smollm2_135m():
    # per layer: q,o 576*576*2 + k,v 576*192*2 + MLP 3*576*1536 + 2 norms of 576; tied embeddings 49152*576
    layer = 663_552 + 221_184 + 2_654_208 + 1_152
    assert ModelShape.from_config(SMOLLM2_135M).num_params == 49_152 * 576 + 30 * layer + 576 == 134_515_008


def test_one_shape_serves_the_memory_plan_and_the_cost_model():
    """The memory plan's shape is the core's (rollpacker.core.ModelShape): read from a config.json it
    carries the cost model's weight bytes, read bytes and KV bytes per token as well."""
    from rollpacker.core import CostModel, ModelShape as CoreShape
    from rollpacker.sim.constants import H100

    tied = ModelShape.from_config(SMOLLM2_135M, name="SmolLM2-135M")
    assert ModelShape is CoreShape and tied.name == "SmolLM2-135M"
    assert tied.weight_bytes == tied.read_bytes == 2 * 134_515_008  # tied: the LM head reads the embeddings
    assert tied.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 and tied.kv_dim == 192
    untied = ModelShape.from_config({**SMOLLM2_135M, "tie_word_embeddings": False})
    assert untied.weight_bytes - untied.read_bytes == 2 * 49_152 * 576  # the input embedding is not read per step
    cost = CostModel(model=tied, hardware=H100, tp=1, mem_fraction=0.9)
    assert cost.fits and cost.step_time(8, 8 * 512) > cost.step_time(1, 512) > 0


def test_each_item_matches_the_hand_computed_bytes():
    plan = smollm2_plan()
    params = 134_515_008
    assert plan.items["engine_weights"] == params * 4
    assert plan.items["trainer_state"] == params * (4 + 4 + 8)  # weights, grads, AdamW's two fp32 moments
    # capacity x (prompt + max tokens) x layers x K,V x kv_heads x head_dim x 4 bytes
    assert plan.items["kv_cache"] == 256 * 1024 * 30 * 2 * 3 * 64 * 4 == 11.25 * GIB
    # 4096 response tokens = 6 responses of 768 at full length, each padded to 1024 tokens
    assert plan.items["activations"] == 6 * 1024 * 30 * (6 * 576 + 2 * 192 + 4 * 1536) * 4
    assert plan.items["logits"] == LOGITS_CHUNK_TOKENS * 49152 * 4 * LOGITS_COPIES == LOGITS_CHUNK_TOKENS * 49152 * 24
    assert plan.total == sum(plan.items.values()) and plan.total < plan.budget
    plan.check()  # fits: no error


def test_bfloat16_halves_the_model_sized_items_and_titan_counts_every_logit():
    fp32, bf16 = smollm2_plan(), smollm2_plan(dtype="bfloat16")
    assert bf16.items["kv_cache"] * 2 == fp32.items["kv_cache"]
    assert bf16.items["engine_weights"] * 2 == fp32.items["engine_weights"]
    # float32 master weights, gradients and AdamW moments either way, plus autocast's bf16 weight copies
    assert bf16.items["trainer_state"] == 134_515_008 * (4 + 4 + 8 + 2) and bf16.forward_tokens == 6 * 1024
    # at response positions only: 6 rows x 768, not the 6 x 1024 padded tokens of the forward
    assert smollm2_plan(logits_chunk_tokens=None).items["logits"] == 6 * 768 * 49152 * 4 * LOGITS_COPIES


@pytest.mark.parametrize("micro_batch_tokens, longest_prompt, measured_peak_gib",
                         [(1024, 195, 7.479), (8192, 195, 19.616), (8192, 198, 19.670)])
def test_the_bfloat16_plan_covers_the_peaks_an_h200_measured(micro_batch_tokens, longest_prompt, measured_peak_gib):
    """benchmarks/gpu/h200-2026-11-27-b: `reference/train.py --compare sync,tail` with the default model
    in bfloat16 on CUDA (capacity 160, 512 tokens, speculation's 4 columns, decode graphs), seeds 0 and 1;
    the highest `cuda_peak_gib` of a step.  The runs printed these plans with 2 bytes an activation:
    7.30 and 12.83 GiB (seed 0), 12.86 GiB (seed 1), under the peaks by up to 6.8 GiB.  A plan at most 15%
    over the peak: it is not padded past use."""
    plan = smollm2_plan(dtype="bfloat16", engine_capacity=160, prompt_tokens=longest_prompt, max_tokens=512,
                        micro_batch_tokens=micro_batch_tokens, budget=140 * GIB, spec_tokens=4, spec_max_rows=4,
                        cuda_graphs=True)
    assert measured_peak_gib * GIB <= plan.total <= 1.15 * measured_peak_gib * GIB, plan.line()


def test_rollout_on_servers_counts_only_the_trainer():
    assert set(smollm2_plan(with_engine=False, device="cpu").items) == {"trainer_state", "activations", "logits"}
    # on CUDA also the cuBLAS workspace of the default stream, which the trainer's matmuls run on
    cuda = smollm2_plan(with_engine=False)
    assert set(cuda.items) == {"trainer_state", "activations", "logits", "cublas_workspace"}
    assert cuda.items["cublas_workspace"] == 32 * 2**20


def test_over_budget_names_the_biggest_item_and_its_flag():
    plan = smollm2_plan(engine_capacity=4096, budget=8 * GIB, device="cpu")
    assert plan.biggest == "kv_cache"
    with pytest.raises(ConfigError) as info:
        plan.check()
    message = str(info.value)
    assert "--engine-capacity" in message and "kv cache 180.00 GiB" in message and "8.00 GiB" in message
    assert message.endswith("(or halve it with --dtype bfloat16)") and "\n" not in message
    with pytest.raises(ConfigError) as info:
        smollm2_plan(dtype="bfloat16", engine_capacity=8192, budget=8 * GIB).check()
    assert "--engine-capacity" in str(info.value) and "--dtype" not in str(info.value)
    with pytest.raises(ConfigError, match="--micro-batch-tokens"):
        smollm2_plan(micro_batch_tokens=10**6, budget=8 * GIB).check()


def test_line_lists_every_item_and_the_total():
    line = smollm2_plan().line()
    assert line.startswith("memory plan (cuda): engine weights 0.50 GiB, trainer state 2.00 GiB, kv cache 11.25 GiB")
    assert line.endswith("of 80.00 GiB; micro-batches of 4096 response tokens, forwards of at most 6144 padded tokens")
    assert "\n" not in line


def test_an_unset_micro_batch_size_is_the_largest_that_fits_the_device():
    """--micro-batch-tokens unset: 8192 on a GPU with room, halved until the plan fits, and where
    nothing fits the smallest, whose check names the flag."""
    def pick(budget_gib, device="cuda"):
        return fitted(smollm2_plan(dtype="bfloat16", micro_batch_tokens=t, budget=budget_gib * GIB, device=device)
                      for t in MICRO_BATCH_TOKENS[device])

    assert MICRO_BATCH_TOKENS["cpu"] == (256,) and pick(80).micro_batch_tokens == 8192
    roomy, tight = pick(80), pick(18)
    assert tight.micro_batch_tokens in MICRO_BATCH_TOKENS["cuda"][1:-1] and tight.total <= tight.budget
    assert smollm2_plan(dtype="bfloat16", micro_batch_tokens=2 * tight.micro_batch_tokens, budget=18 * GIB).total > 18 * GIB
    assert roomy.items["activations"] > tight.items["activations"] and "micro-batches of 8192" in roomy.line()
    none_fits = pick(4)
    assert none_fits.micro_batch_tokens == 256
    with pytest.raises(ConfigError, match="--micro-batch-tokens|--engine-capacity"):
        none_fits.check()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU-only refusal")
def test_device_cuda_without_a_gpu_is_refused_naming_the_flag():
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    config = RunConfig(device="cuda", trainer="torch")
    with pytest.raises(ConfigError, match="--device cuda .*use --device cpu"):
        config.validate()
    config = RunConfig(trainer="torch")
    config.validate()
    assert config.device == "cpu"  # resolved once, in validate


@pytest.mark.timeout(150)
def test_train_prints_the_plan_and_refuses_a_run_that_cannot_fit(tmp_path):
    """On the CPU the budget is the machine's RAM: a KV cache for a billion rows cannot fit."""
    from test_reference_train import run_train

    from rollpacker.backends.models import tiny_random_llama

    proc = run_train("--preset", "tiny_debug", "--model", tiny_random_llama(), "--trainer", "torch", "--device", "cpu",
                     "--engine-capacity", 10**9, "--out", tmp_path / "run", check=False, timeout=140)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "memory plan (cpu): engine weights" in proc.stdout
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("error: the run needs") and "biggest: kv cache" in error and "--engine-capacity" in error
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "metrics.jsonl").exists()


def _probe(device: str, dtype: str, **sizes) -> dict:
    """tests/memory_probe.py in a fresh process: what a colocated run allocates, with a worst-case
    padded micro-batch (one full-length response beside one-token ones), against the plan."""
    from memory_probe import run_probe

    from rollpacker.backends.models import tiny_random_llama

    return run_probe({"model": str(tiny_random_llama(num_layers=4, hidden_size=256)), "device": device, "dtype": dtype,
                      **sizes})


@pytest.mark.timeout(300)
def test_plan_covers_the_measured_host_peak_of_a_worst_case_padded_micro_batch():
    """CPU: the peak resident memory above the runtime's (the RSS high-water mark after the imports)
    while the engine holds its KV cache and the trainer takes one step on 64 one-token responses beside
    one of 192 tokens.  Padded as one forward that is 65 x 256 tokens (about 1 GiB of activations more
    than planned); the trainer's forwards of at most `forward_tokens` keep it inside the plan.  Measured
    here: 0.76-0.78 GB peak for a 0.95 GB plan, alone and when started by a process holding 3 GB (the
    probe once read getrusage's ru_maxrss, which keeps the parent's peak across exec: 1.27-1.43 GB inside
    `make test`); without the split the peak is 8.8 GB."""
    r = _probe("cpu", "float32", capacity=16, prompt=64, max_tokens=192, micro_batch_tokens=256)
    assert r["forward_tokens"] == 2 * 256 and r["kv_tokens_per_row"] == 256
    assert r["plan_total"] / 4 <= r["peak"] <= r["plan_total"], r


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_plan_covers_torch_cuda_max_memory_allocated():
    """CUDA, bfloat16 (autocast over float32 master weights), the campaign's sizes on the tiny model."""
    r = _probe("cuda", "bfloat16", capacity=128, prompt=128, max_tokens=512, micro_batch_tokens=1024)
    mb = lambda n: f"{n / 1e6:.1f}"  # noqa: E731
    where = "; ".join(f"{name}: peak {mb(p['peak'])}, then {mb(p['allocated'])}" for name, p in r["phases"].items())
    assert r["plan_total"] / 4 <= r["peak"] <= r["plan_total"], (
        f"peak {mb(r['peak'])} MB vs plan {mb(r['plan_total'])} MB "
        f"({', '.join(f'{k} {mb(v)}' for k, v in r['plan'].items())}); by phase, MB: {where}")


# -- the embedded engine's items: speculation's columns and the CUDA graphs -------------------------


def test_cuda_graphs_are_one_float32_logits_buffer_plus_the_largest_forward():
    """Capacity 256 (14 rows buckets), 1024 + 4 columns (buckets 256 .. 1024, 1028), speculation at up to
    4 rows (buckets 1, 2, 4) with 4 drafts (2 .. 5 tokens per row): every graph writes one logits buffer
    as wide as the widest graph (256 rows x 1 token; a verify is at most 4 x 5)."""
    plan = smollm2_plan(spec_max_rows=4, spec_tokens=4, cuda_graphs=True)
    assert plan.kv_tokens_per_row == 1028 and plan.items["kv_cache"] == 256 * 1028 * 30 * 2 * 3 * 64 * 4
    # the logits buffer, the cuBLAS workspaces of the warm-up and capture streams, and what the driver
    # holds for each graph (measured)
    outputs = 256 * 49152 * 4 + 2 * 32 * 2**20 + 4 * 2**20 * (14 * 5 + 3 * 4 * 5)
    # the largest forward: 256 rows x 1 token over 1028 columns: 3 float32 score copies (9 heads), the MLP
    workspace = 256 * (3 * 9 * 1028 * 4 + (3 * 1536 + 4 * 576) * 4)
    assert plan.items["cuda_graphs"] == outputs + workspace
    # bfloat16: the largest forward's logits in bfloat16 too, before their float32 copy
    bf16 = smollm2_plan(dtype="bfloat16", spec_max_rows=4, spec_tokens=4, cuda_graphs=True)
    assert bf16.items["cuda_graphs"] == outputs + 256 * (3 * 9 * 1028 * 4 + 49152 * 2 + (3 * 1536 + 4 * 576) * 2)
    # no speculation: no drafts' columns, no verify graphs
    assert smollm2_plan(spec_tokens=4, cuda_graphs=True).items["cuda_graphs"] == \
        256 * 49152 * 4 + 2 * 32 * 2**20 + 4 * 2**20 * 14 * 4 + 256 * (3 * 9 * 1024 * 4 + (3 * 1536 + 4 * 576) * 4)
    # colocated, the graphs go with the engine's weights
    colocated = smollm2_plan(spec_max_rows=4, spec_tokens=4, cuda_graphs=True, colocate=True)
    engine = sum(plan.items[k] for k in ("engine_weights", "kv_cache", "prefill", "cuda_graphs"))
    assert colocated.total == plan.items["trainer_state"] + plan.items["cublas_workspace"] + max(
        engine, plan.items["activations"] + plan.items["logits"])
    assert "cuda_graphs" not in smollm2_plan().items
    assert "cuda_graphs" not in smollm2_plan(with_engine=False, cuda_graphs=True).items


@pytest.mark.timeout(200)
@pytest.mark.parametrize("spec_max_rows", [None, 2])
def test_the_plan_is_what_the_engine_allocates_speculation_included(spec_max_rows):
    """The run's own wiring (plan_run_memory, then the engine options it gives): the engine's KV cache
    holds exactly the plan's bytes, prompt + max tokens columns per row plus the drafts' columns only
    when the engine speculates (by default not on CPU); and the decode graphs a runner captures on
    CUDA for the cache the plan sizes there (graphs and speculation on by default) are the plan's."""
    from test_colocate import Prompts

    from rollpacker.backends.embedded.buckets import COL_MULTIPLE
    from rollpacker.backends.embedded.engine import EmbeddedEngine
    from rollpacker.backends.embedded.runner import Runner
    from rollpacker.backends.embedded.speculation import speculation_rows
    from rollpacker.backends.models import load_model, read_config_json, tiny_random_llama
    from rollpacker.core.protocols import GenerationRequest, GenerationResult
    from rollpacker.train.memory_plan import cuda_graph_bytes
    from rollpacker.train.session import plan_run_memory

    model_dir = tiny_random_llama()
    config = RunConfig(trainer="torch", device="cpu", engine_capacity=3, max_tokens=20, spec_tokens=3,
                       spec_max_rows=spec_max_rows)
    plan = plan_run_memory(config, model_dir, Prompts(), "cpu")
    assert plan.kv_tokens_per_row == 3 + 20 + (3 if spec_max_rows else 0) and "cuda_graphs" not in plan.items
    model = load_model(model_dir)[0]
    with EmbeddedEngine(model, stop_token_ids=(), **config.rollout_options().engine_options(plan.kv_tokens_per_row)) as engine:
        engine.submit([GenerationRequest(f"r{i}", Prompts().prompt_ids(i % 4), 20 - 7 * (i % 2), temperature=0.0,
                                         group=str(i % 4)) for i in range(6)])
        done = 0
        while done < 6:
            done += sum(isinstance(e, GenerationResult) for e in engine.poll(5.0))
        assert engine.memory_bytes()["kv_cache"] == plan.items["kv_cache"]
        assert engine._runner.cache.length == plan.kv_tokens_per_row
        assert (engine.speculation_stats.num_verify_steps > 0) == bool(spec_max_rows)

    rows = speculation_rows(spec_max_rows, on_cuda=True)  # on CUDA: 4 by default
    shape = ModelShape.from_config(read_config_json(model_dir))
    on_cuda = plan_memory(shape, dtype="float32", engine_capacity=3, prompt_tokens=3, max_tokens=20,
                          micro_batch_tokens=256, logits_chunk_tokens=LOGITS_CHUNK_TOKENS, budget=2**40, device="cuda",
                          spec_max_rows=rows, spec_tokens=3, cuda_graphs=True)
    runner = Runner(model, 0, capacity=3, col_multiple=COL_MULTIPLE["cuda"], verify_rows=rows, verify_tokens=3)
    keys = runner.graph_keys(length=on_cuda.kv_tokens_per_row)
    assert on_cuda.kv_tokens_per_row == 26 and any(t == 4 for _, t, _ in keys)
    assert on_cuda.items["cuda_graphs"] == sum(cuda_graph_bytes(shape, 4, keys))


_PEAK_RSS = """import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(proc.stderr)
print(proc.stdout)
print("peak_rss_kib", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(proc.returncode)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_host_plan_covers_the_peak_resident_memory_of_a_real_run(tmp_path):
    """A real 2-step run of the reference trainer on the CPU, sized so that every planned item is near
    what the run holds (one response per forward), measured as `/usr/bin/time -v` does (the
    process's peak resident set, ru_maxrss): the plan's total covers it.  The runtime item (what the
    process holds before any weights load: the interpreter, torch, transformers, the tokenized
    dataset) is measured when the plan is made, plus RUNTIME_GROWTH; without them the plan was 0.50 GiB
    against a measured peak of 1.10-1.14 GiB here."""
    import re
    import subprocess
    import sys

    from test_reference_train import ROOT, TRAIN

    from rollpacker.backends.models import tiny_random_llama

    model = tiny_random_llama(num_layers=4, hidden_size=256)
    args = ["--preset", "tiny_debug", "--model", model, "--device", "cpu", "--steps", 2,
            "--max-tokens", 48, "--micro-batch-tokens", 48, "--out", tmp_path / "run"]
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS, sys.executable, str(TRAIN), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = re.search(r"^memory plan \(cpu\): (.*); total ([0-9.]+) GiB", proc.stdout, re.M)
    assert plan and "runtime " in plan.group(1), proc.stdout[-2000:]
    peak = int(re.search(r"^peak_rss_kib (\d+)", proc.stdout, re.M).group(1)) * 1024
    print(f"{plan.group(0)}; measured peak {peak / GIB:.2f} GiB")
    assert float(plan.group(2)) * GIB >= peak, f"plan {plan.group(0)} below the measured peak {peak / GIB:.2f} GiB"


def test_host_items_runtime_and_the_state_save_in_turn_with_the_training():
    """On the CPU: the measured runtime plus RUNTIME_GROWTH, and the state save's buffers (held after the
    optimizer step, so in turn with the activations and logits: with the engine's items, colocated)."""
    from rollpacker.train.memory_plan import RUNTIME_GROWTH, STATE_SAVE_BYTES

    plan = smollm2_plan(device="cpu", host_runtime=GIB // 2)
    items = plan.items
    assert items["runtime"] == GIB // 2 + RUNTIME_GROWTH and items["state_save"] == 134_515_008 * STATE_SAVE_BYTES
    engine = items["engine_weights"] + items["kv_cache"] + items["prefill"]
    training = items["activations"] + items["logits"]
    resident = items["trainer_state"] + items["runtime"]
    assert plan.total == resident + engine + max(training, items["state_save"]) < sum(items.values())
    colocated = smollm2_plan(device="cpu", host_runtime=GIB // 2, colocate=True)
    assert colocated.total == resident + max(engine + items["state_save"], training)
    assert "state save" in plan.line() and "in turn" in plan.line() and plan.biggest == "kv_cache"
    assert "runtime" not in smollm2_plan().items and "state_save" not in smollm2_plan().items


def test_each_component_answers_the_plan_for_itself():
    """The run's rollout and trainer say what they hold (no switch on their names): SGLang servers
    keep their own memory, so the plan counts no engine item; the torch trainer computes log-probs
    chunk by chunk, TorchTitan's a whole forward at once."""
    from test_colocate import Prompts

    from rollpacker.backends.models import tiny_random_llama
    from rollpacker.train.session import plan_run_memory

    model_dir = tiny_random_llama()
    sizes = dict(max_tokens=400, micro_batch_tokens=2048, device="cpu")
    embedded = plan_run_memory(RunConfig(trainer="torch", **sizes), model_dir, Prompts(), "cpu")
    served = plan_run_memory(RunConfig(trainer="torch", rollout="sglang", sglang_urls=("http://127.0.0.1:1",),
                                       **sizes), model_dir, Prompts(), "cpu")
    titan = plan_run_memory(RunConfig(trainer="titan", **sizes), model_dir, Prompts(), "cpu")
    assert {"engine_weights", "kv_cache"} <= set(embedded.items) and not {"engine_weights", "kv_cache"} & set(served.items)
    assert titan.forward_tokens == embedded.forward_tokens > LOGITS_CHUNK_TOKENS
    responses = titan.forward_tokens // (3 + 400) * 400  # the LM head runs at response positions only
    assert titan.items["logits"] * LOGITS_CHUNK_TOKENS == embedded.items["logits"] * responses


def test_an_unset_micro_batch_size_is_the_cpus_256_in_the_runs_plan():
    from test_colocate import Prompts

    from rollpacker.backends.models import tiny_random_llama
    from rollpacker.train.session import plan_run_memory

    plan = plan_run_memory(RunConfig(trainer="torch", max_tokens=400), tiny_random_llama(), Prompts(), "cpu")
    assert plan.micro_batch_tokens == 256 and plan.forward_tokens == 1 * (3 + 400)  # one row: 256 < 400 tokens


@pytest.mark.gpu
def test_an_unset_micro_batch_size_on_a_gpu_is_8192_where_it_fits_and_a_given_one_is_kept():
    from test_colocate import Prompts

    from rollpacker.backends.models import tiny_random_llama
    from rollpacker.train.session import plan_run_memory

    def plan(**sizes):
        return plan_run_memory(RunConfig(trainer="torch", device="cuda", dtype="bfloat16", **sizes),
                               tiny_random_llama(), Prompts(), "cuda")

    assert plan().micro_batch_tokens == 8192 and plan(micro_batch_tokens=512).micro_batch_tokens == 512


_PARENT_THEN_PROBE = """import subprocess, sys
held = bytearray(1 << 30)
held[::4096] = b"x" * len(held[::4096])
child = "from memory_probe import HostPeak; h = HostPeak(); b = bytearray(64 << 20); b[::4096] = b'y' * len(b[::4096]); print(h.peak())"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)
"""


def test_the_host_peak_is_the_probes_own_not_its_parents():
    """A probe started by a process that holds 1 GiB reads the 64 MiB it allocated itself (getrusage's
    ru_maxrss would read the parent's 1 GiB: exec keeps the replaced image's peak)."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    proc = subprocess.run([sys.executable, "-c", _PARENT_THEN_PROBE], cwd=tests, capture_output=True, text=True,
                          timeout=60, env={**__import__("os").environ, "PYTHONPATH": str(tests)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 64 << 20 <= int(proc.stdout.split()[-1]) < 256 << 20, proc.stdout
