"""Run in a fresh process: allocate what a colocated run allocates (the embedded engine's weights
and KV cache while it decodes, the trainer's state, and a worst-case padded micro-batch: one
full-length response beside many one-token ones), then print the memory plan's items and the
measured peak (CPU: the RSS high-water mark above the RSS after imports; CUDA: torch.cuda.max_memory_allocated)
as one JSON line; with `"probe": "graphs"`, what the engine's CUDA graphs keep instead (`graphs`).
Used by tests/test_memory_plan.py and tests/test_engine_graphs.py.

    python tests/memory_probe.py '{"model": DIR, "device": "cpu", "dtype": "float32", "capacity": 32,
                                   "prompt": 64, "max_tokens": 448, "micro_batch_tokens": 512}'
"""

from __future__ import annotations

import json
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _status_bytes(field: str) -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


class HostPeak:
    """The peak of this process's memory above what it holds at start, robust to a fresh environment
    (compiling bytecode at import peaks above what the runtime keeps: the RSS high-water mark is
    reset to the current RSS), to its parent (the high-water mark is /proc's VmHWM, not
    getrusage's ru_maxrss: that one keeps the peak of the process image exec replaced, so a probe
    started by a test session that holds 2 GB read 2 GB) and to memory pressure from other processes
    (the kernel may drop the libraries' clean pages, so anonymous memory is also sampled every 2 ms)."""

    def __init__(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # RSS high-water mark := current RSS
            self.rss0, self.anon0 = _status_bytes("VmRSS"), _status_bytes("RssAnon")
        except (OSError, StopIteration):  # not Linux: the peak so far
            self.rss0, self.anon0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, None
        self.anon_max, self._stop = self.anon0 or 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        if self.anon0 is not None:
            self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.anon_max = max(self.anon_max, _status_bytes("RssAnon"))

    def peak(self) -> int:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.anon0 is None:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.rss0
        return max(_status_bytes("VmHWM") - self.rss0, self.anon_max - self.anon0)


def graphs(spec: dict) -> dict:
    """CUDA: what the engine's decode graphs keep, as the first engine of a fresh process holds it (a
    process that already ran CUDA work holds part of it before the engine starts: the cuBLAS
    workspaces of the streams it ran on; measured 1,089 MiB alone against 760 MiB after other tests,
    on an H100, when each capture warmed up on a stream of its own): the KV cache, the graphs' logits
    buffers, and what the allocator and the device hold beyond the KV cache once the engine is built,
    against the plan."""
    import torch

    from rollpacker.backends.embedded.engine import EmbeddedEngine
    from rollpacker.backends.models import load_model, read_config_json
    from rollpacker.train.memory_plan import LOGITS_CHUNK_TOKENS, ModelShape, cuda_graph_bytes, plan_memory

    shape = ModelShape.from_config(read_config_json(spec["model"]))
    sizes = dict(engine_capacity=spec["capacity"], prompt_tokens=spec["prompt"], max_tokens=spec["max_tokens"])
    spec_rows, spec_tokens = spec["spec_max_rows"], spec["spec_tokens"]
    plan = plan_memory(shape, dtype="bfloat16", micro_batch_tokens=spec["micro_batch_tokens"], budget=2**50,
                       logits_chunk_tokens=LOGITS_CHUNK_TOKENS, device="cuda", spec_max_rows=spec_rows,
                       spec_tokens=spec_tokens, cuda_graphs=True, **sizes)
    model = load_model(spec["model"], dtype="bfloat16", device="cuda")[0]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved, free = torch.cuda.memory_reserved(), torch.cuda.mem_get_info()[0]
    engine = EmbeddedEngine(model, capacity=spec["capacity"], stop_token_ids=(), spec_max_rows=spec_rows,
                            spec_tokens=spec_tokens, kv_tokens_per_row=plan.kv_tokens_per_row)
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        runner = engine._runner
        kv = engine.memory_bytes()["kv_cache"]
        storages = {g.logits.untyped_storage().data_ptr(): g.logits.untyped_storage().nbytes()
                    for g in runner._graphs.values()}
        return {"kv": kv, "plan_kv": plan.items["kv_cache"], "graphs": len(runner._graphs),
                "keys_match": set(runner._graphs) == set(runner.graph_keys()),
                "logits_buffers": len(storages), "outputs": sum(storages.values()),
                "plan_outputs": cuda_graph_bytes(shape, 2, runner.graph_keys())[0],
                "pool": torch.cuda.memory_reserved() - reserved - kv,
                "device": free - torch.cuda.mem_get_info()[0] - kv, "plan_graphs": plan.items["cuda_graphs"]}
    finally:
        engine.close()


def main(spec: dict) -> dict:
    if spec.get("probe") == "graphs":
        return graphs(spec)
    import torch
    import transformers  # noqa: F401 - imports before the baseline: the runtime is not the plan's

    from rollpacker.backends.embedded.engine import EmbeddedEngine
    from rollpacker.backends.models import load_model, read_config_json
    from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig
    from rollpacker.core.protocols import GenerationRequest, MicroBatch, TrainSample
    from rollpacker.train.memory_plan import LOGITS_CHUNK_TOKENS, ModelShape, plan_memory

    device, cuda = spec["device"], spec["device"] == "cuda"
    prompt, max_tokens, mbt = spec["prompt"], spec["max_tokens"], spec["micro_batch_tokens"]
    plan = plan_memory(ModelShape.from_config(read_config_json(spec["model"])), dtype=spec["dtype"],
                       engine_capacity=spec["capacity"], prompt_tokens=prompt, max_tokens=max_tokens,
                       micro_batch_tokens=mbt, logits_chunk_tokens=LOGITS_CHUNK_TOKENS, budget=2**50, device=device,
                       cuda_graphs=cuda)
    host = None if cuda else HostPeak()
    phases: dict[str, dict] = {}

    def phase(name: str) -> None:  # CUDA: allocated after each phase and its own peak, to say where the peak is
        if cuda:
            torch.cuda.synchronize()
            phases[name] = {"allocated": torch.cuda.memory_allocated(), "peak": torch.cuda.max_memory_allocated()}
            torch.cuda.reset_peak_memory_stats()

    model, _ = load_model(spec["model"], dtype=spec["dtype"], device=device)
    engine = EmbeddedEngine(model, capacity=spec["capacity"], device=device, stop_token_ids=(),
                            kv_tokens_per_row=plan.kv_tokens_per_row, spec_max_rows=0)
    phase("engine built")
    engine.submit([GenerationRequest(f"r{i}", tuple(range(3, 3 + prompt)), max_tokens, temperature=0.0)
                   for i in range(spec["capacity"])])
    while len(engine._batch.scheduler.running) < spec["capacity"]:  # every row admitted: the KV cache is allocated
        time.sleep(0.05)
    engine.pause()  # held, not decoding: the trainer has the cores
    phase("rows admitted")
    trainer = TorchTrainer(TorchTrainerConfig(model_dir=spec["model"], dtype=spec["dtype"], device=device, lr=1e-5,
                                              max_forward_tokens=plan.forward_tokens))
    phase("trainer built")
    ids = tuple(range(5, 5 + prompt))
    rows = [TrainSample(ids, tuple(range(7, 7 + max_tokens)), 1.0, 1.0)]
    rows += [TrainSample(ids, (9,), -1.0, 1.0) for _ in range(mbt - max_tokens)]  # budgeted: mbt response tokens
    trainer.forward_backward(MicroBatch(tuple(rows)))
    phase("forward_backward")
    trainer.optimizer_step(float(mbt))
    phase("optimizer_step")
    engine.update_weights(trainer.export_weights(), 1)
    phase("weight sync")
    engine.abort([f"r{i}" for i in range(spec["capacity"])])
    engine.close()
    peak = max(p["peak"] for p in phases.values()) if cuda else host.peak()
    return {"plan": plan.items, "plan_total": plan.total, "forward_tokens": plan.forward_tokens,
            "kv_tokens_per_row": plan.kv_tokens_per_row, "peak": peak, "baseline": 0 if host is None else host.rss0,
            "phases": phases}


def run_probe(spec: dict) -> dict:
    """This file in a fresh process (its CUDA state or RSS is the run's, not the test session's): the JSON it prints."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "tests/memory_probe.py", json.dumps(spec)], cwd=root,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
