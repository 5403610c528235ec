"""Memory plan of a run with the engine and the trainer on one device, checked before generation.

Pure arithmetic over the model's config.json and the run's sizes (no torch at module level): a run
that cannot fit fails in a second, naming the flag to lower, instead of an out-of-memory error after
everything has loaded.  The estimates (b = bytes per element of --dtype, T = tokens of the largest
micro-batch):

- engine weights: parameters x b (a second copy of the model, for rollout);
- trainer: float32 master weights and gradients (8 bytes per parameter) and AdamW's two float32
  moments (8 more) whatever --dtype says; under bfloat16 (autocast) also the bfloat16 copies of the
  weights that the forward casts and backward keeps (2 more);
- KV cache: capacity x (prompt + max_tokens + spec_tokens) x layers x 2 (K and V) x kv_heads x
  head_dim x b: the embedded engine allocates exactly these columns per row at once
  (`kv_tokens_per_row`; a verify forward may write spec_tokens past a row's end, so they are counted
  when the engine speculates: spec_max_rows > 0, by default on CUDA only), so it never grows;
  `cuda_peak_gib` in each step record on CUDA is the measured peak to compare with;
- prefill: the engine's largest prefill (its budget of `MAX_PREFILL_TOKENS` prompt tokens, or one
  longer prompt) holds about `PREFILL_COPIES` layers' activations (the formula below) while it runs;
- CUDA graphs (on CUDA, unless --no-cuda-graphs): the engine captures one decode graph per key of
  `buckets.graph_keys` (rows bucket x tokens per row x columns bucket of 256, verify widths
  included), the largest forward first; all write one float32 logits buffer as wide as the widest
  graph; the pool keeps the largest forward's transients (reused by the later captures) and the
  cuBLAS workspaces of the two streams the captures run on, and the driver holds a measured
  `BYTES_PER_GRAPH` for each graph: `cuda_graph_bytes`;
- cuBLAS workspace (on CUDA): the one cuBLAS keeps for the default stream, where the engine's
  prefills and the trainer run (`CUBLAS_WORKSPACE_BYTES`);
- activations saved for backward: T x layers x (6 x hidden + 2 x kv_heads x head_dim + 4 x ffn) x
  `ACTIVATION_BYTES` (norm inputs and outputs, q, the attention output and the residual stream make
  about 6 x hidden; k and v; the MLP's gate, up, activation and product make 4 x ffn; fused or
  memory-efficient attention saves no score matrix); under bfloat16 (autocast over float32 weights)
  more than 2 bytes an element, measured;  T = rows x (prompt + max_tokens), rows = ceil(micro_batch_tokens
  / max_tokens) but at most P x R (a step's samples: a micro-batch holds no more): the micro-batch's
  responses at full length, each with its prompt, padded; where that does not fit (long prompts), the
  rows of one forward are halved until it does (`forward_row_choices`).  T is also
  `forward_tokens`, the trainer's `max_forward_tokens`: a micro-batch is budgeted by response tokens,
  so many short responses beside a long one would pad to far more (rows x longest row); the trainer
  splits such a micro-batch into forwards of at most T padded tokens, so T is what one forward holds;
- logits: `LOGITS_COPIES` float32 tensors of logits size for the positions computed at once (the
  logits, their log-softmax, its exp, the entropy's product, and in backward their gradients:
  measured 5.5-5.8 on CPU, tests/test_memory_plan.py): one chunk of `LOGITS_CHUNK_TOKENS` for the
  torch trainer (it computes log-probs chunk by chunk), all of a forward's for TorchTitan's.  Both run
  the LM head at response positions only: rows x max_tokens positions, not T (with a 3,000-token
  prompt and 16-token responses T counted 189 times the logits there are).
- runtime (on the CPU, where the budget is the machine's RAM): what the process holds before any
  weights load (the interpreter, torch, transformers, TorchTitan, the tokenized dataset), measured
  when the plan is made (`resident_bytes`, about 0.46 GiB for `make train`), plus `RUNTIME_GROWTH`;
- state save (on the CPU): parameters x `STATE_SAVE_BYTES`, the buffers of the state save after each
  step, held in turn with the activations and logits, never beside them.
  Without these two `make train` printed 4.55 GiB against a measured peak of 6.46-6.77 GiB; the rest
  of that gap was memory the C allocator kept after it was freed (a forward's activations and
  logits, the checkpoint read while the trainer builds, the save's buffers), which the run now gives
  back (`rollpacker.backends.trainer.policy.give_back_freed_memory`).

The total is the peak.  Separate (the default), micro-batches train while the round still generates,
so every item is held at once: the sum.  Colocated (--colocate), the engine's weights and KV cache
are released before the trainer runs and allocated again after the optimizer step, so the peak is
the trainer state plus the larger of the engine's items and the training's (activations, logits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollpacker.backends.embedded.buckets import COL_MULTIPLE, GraphKey, graph_keys
from rollpacker.backends.embedded.scheduler import MAX_PREFILL_TOKENS
from rollpacker.core.cost_model import ModelShape
from rollpacker.core.errors import ConfigError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
ACTIVATION_BYTES = {"float32": 4.0, "bfloat16": 4.5}
"""Bytes per element of the activations formula.  Under bfloat16 the trainer runs autocast over float32
master weights: the residual stream, the RMS norms and the rotary outputs stay float32, autocast keeps a
bfloat16 copy of each matmul's input, and backward's transients grow with the forward too.  Measured on
an H200 (SmolLM2-135M, torch 2.11, the campaign's sizes at seed 0): the peak grew by 12.14 GiB from
--micro-batch-tokens 1024 to 8192 where 2 bytes an element counted 5.52 GiB: 4.4 bytes an element,
counted as 4.5 for margin; at 2 the plan was 12.83 GiB against a 19.62 GiB peak."""
LOGITS_CHUNK_TOKENS = 1024  # TorchTrainerConfig.logits_chunk_tokens' default
LOGITS_COPIES = 6  # float32 [positions, vocab] tensors alive at the log-prob's peak
RUNTIME_GROWTH = 256 * 2**20
"""What the runtime adds after the plan is made (the run's later imports, the kernels first used, the
reward workers' pipes): measured 0.1-0.2 GiB on the CPU with the tiny model (torch 2.13, 2 cores)."""
STATE_SAVE_BYTES = 24
"""Host bytes per parameter while the trainer's state is saved (torch.distributed.checkpoint stages and
serializes the float32 weights and AdamW's two moments: about two copies of their 12 bytes; measured
~3.1 GiB above the state at SmolLM2-135M on the CPU)."""
PREFILL_COPIES = 1.5
"""A prefill's transients in units of one layer's activations (the activations formula's per-token size
x the prefill's tokens): measured 1.1-1.4 beside the KV cache on the CPU (a 3,000-token prompt, the tiny
4-layer Llama and SmolLM2-135M, torch 2.13)."""
ENGINE_ITEMS = ("engine_weights", "kv_cache", "prefill", "cuda_graphs")
"""Freed while the trainer runs, colocated (the graphs are dropped with the weights)."""
TRAINING_ITEMS = ("activations", "logits")
"""Held only while the trainer runs."""
SAVE_ITEMS = ("state_save",)
"""Held only while the state is saved, after the optimizer step: in turn with the training's items."""
# the flag that shrinks each item, for the error message
FLAG_OF_ITEM = {"engine_weights": "--model (a smaller one)", "trainer_state": "--model (a smaller one)", "kv_cache": "--engine-capacity or --max-tokens",
                "prefill": "--engine-capacity (or shorter prompts)",
                "cuda_graphs": "--engine-capacity or --max-tokens (or pass --no-cuda-graphs)",
                "activations": "--micro-batch-tokens", "logits": "--micro-batch-tokens"}


@dataclass(frozen=True)
class MemoryPlan:
    items: dict[str, int]
    """Bytes per item, in the order printed."""
    budget: int
    """Bytes available on the device."""
    device: str
    dtype: str = "float32"
    kv_tokens_per_row: int = 0
    """KV cache columns per engine row the plan counts (the engine allocates these)."""
    micro_batch_tokens: int = 0
    """The --micro-batch-tokens the plan counts."""
    forward_tokens: int = 0
    """Padded tokens (rows x longest row) in one trainer forward the plan counts (the trainer's
    max_forward_tokens)."""
    colocated: bool = False
    """--colocate: the engine's items are freed while the trainer runs (the module docstring)."""

    @property
    def total(self) -> int:
        """The peak: every item at once, or colocated the engine's and the training's in turn."""
        return self.peak(self.colocated)

    def peak(self, colocated: bool) -> int:
        engine = sum(self.items.get(k, 0) for k in ENGINE_ITEMS)
        training = sum(self.items.get(k, 0) for k in TRAINING_ITEMS)
        save = sum(self.items.get(k, 0) for k in SAVE_ITEMS)
        resident = sum(b for k, b in self.items.items() if k not in ENGINE_ITEMS + TRAINING_ITEMS + SAVE_ITEMS)
        if colocated:  # the engine is back (weights synced) when the state is saved
            return resident + max(engine + save, training)
        return resident + engine + max(training, save)

    @property
    def biggest(self) -> str:
        """The largest item a flag can shrink (not the runtime)."""
        return max((k for k in self.items if k in FLAG_OF_ITEM), key=self.items.get)

    def line(self) -> str:
        parts = ", ".join(f"{name.replace('_', ' ')} {_gib(b)}" for name, b in self.items.items())
        mode = " (colocated: the engine's items and the training's in turn)" if self.colocated else \
            (" (the state save and the training's items in turn)" if "state_save" in self.items else "")
        return (f"memory plan ({self.device}): {parts}; total {_gib(self.total)}{mode} of {_gib(self.budget)}; "
                f"micro-batches of {self.micro_batch_tokens} response tokens, forwards of at most {self.forward_tokens} "
                f"padded tokens")

    def check(self) -> None:
        """ConfigError naming the biggest item and the flag to lower when the total exceeds the budget."""
        if self.total > self.budget:
            colocated = self.peak(colocated=True)
            raise ConfigError(f"the run needs {_gib(self.total)} on {self.device} but {_gib(self.budget)} is there; "
                              f"biggest: {self.biggest.replace('_', ' ')} {_gib(self.items[self.biggest])}: "
                              f"lower {FLAG_OF_ITEM[self.biggest]}"
                              + (" (or halve it with --dtype bfloat16)" if self.dtype == "float32" else "")
                              + (f"; or pass --colocate, which releases the engine's memory while the trainer "
                                 f"runs: {_gib(colocated)} then" if not self.colocated and colocated <= self.budget
                                 else ""))


def plan_memory(shape: ModelShape, *, dtype: str, engine_capacity: int, prompt_tokens: int, max_tokens: int,
                micro_batch_tokens: int, budget: int, device: str, logits_chunk_tokens: int | None = None,
                with_engine: bool = True, spec_max_rows: int = 0, spec_tokens: int = 0, cuda_graphs: bool = False,
                host_runtime: int = 0, colocate: bool = False, step_rows: int | None = None,
                forward_rows: int | None = None) -> MemoryPlan:
    """The plan's items in bytes (the module docstring gives each formula); `with_engine` False leaves
    out the engine's items (rollout on SGLang servers); `logits_chunk_tokens`: the trainer computes
    log-probs this many positions at a time (None: a whole forward's at once); spec_max_rows: the engine's speculation
    threshold as it resolves it (0: off), spec_tokens its drafts per row; cuda_graphs: the engine
    captures decode graphs (on CUDA); `colocate`: --colocate's peak; `step_rows`: the samples a step
    trains (P x R), the most a micro-batch can hold; `forward_rows`: fewer rows in one forward than a
    micro-batch holds (`forward_row_choices`)."""
    b = DTYPE_BYTES[dtype]
    params = shape.num_params
    sequence = prompt_tokens + max_tokens
    rows = micro_batch_rows(micro_batch_tokens, max_tokens, step_rows)
    rows = min(rows, forward_rows or rows)
    batch_tokens = rows * sequence
    per_token_layer = 6 * shape.hidden + 2 * shape.kv_dim + 4 * shape.ffn
    response_tokens = rows * max_tokens  # the LM head runs at response positions only
    logit_tokens = min(response_tokens, logits_chunk_tokens or response_tokens)
    kv_row = sequence + (spec_tokens if spec_max_rows > 0 else 0)
    items = {
        "engine_weights": params * b,
        "trainer_state": params * (16 + (b if b < 4 else 0)),
        "kv_cache": engine_capacity * kv_row * shape.layers * 2 * shape.kv_dim * b,
        "prefill": int(prefill_tokens(engine_capacity, prompt_tokens) * per_token_layer * b * PREFILL_COPIES),
        "activations": int(batch_tokens * shape.layers * per_token_layer * ACTIVATION_BYTES[dtype]),
        "logits": logit_tokens * shape.vocab * 4 * LOGITS_COPIES,
    }
    if cuda_graphs:
        keys = graph_keys(capacity=engine_capacity, length=kv_row, col_multiple=COL_MULTIPLE["cuda"],
                          verify_rows=spec_max_rows, verify_tokens=spec_tokens)
        items["cuda_graphs"] = sum(cuda_graph_bytes(shape, b, keys))
    if device.startswith("cuda"):
        items["cublas_workspace"] = CUBLAS_WORKSPACE_BYTES
    if host_runtime:
        items["runtime"] = host_runtime + RUNTIME_GROWTH
        items["state_save"] = params * STATE_SAVE_BYTES
    if not with_engine:
        for item in ENGINE_ITEMS:
            items.pop(item, None)
    return MemoryPlan(items=items, budget=budget, device=device, dtype=dtype,
                      kv_tokens_per_row=kv_row, micro_batch_tokens=micro_batch_tokens, forward_tokens=batch_tokens,
                      colocated=colocate)


def prefill_tokens(engine_capacity: int, prompt_tokens: int) -> int:
    """Prompt tokens of the engine's largest prefill: its budget, or one prompt longer than that."""
    return min(engine_capacity * prompt_tokens, max(MAX_PREFILL_TOKENS, prompt_tokens))


def micro_batch_rows(micro_batch_tokens: int, max_tokens: int, step_rows: int | None = None) -> int:
    """Rows of the largest micro-batch: its response tokens at full length, never more than a step's
    samples (with a short --max-tokens, 256 tokens would be 256 rows that no step has)."""
    rows = math.ceil(micro_batch_tokens / max_tokens)
    return min(rows, step_rows) if step_rows else rows


def forward_row_choices(rows: int) -> list[int]:
    """Rows of one forward, largest first, halving down to one: a micro-batch whose forward does not
    fit (long prompts) trains in several forwards of fewer rows (the gradient is the same sum)."""
    choices = [rows]
    while choices[-1] > 1:
        choices.append(math.ceil(choices[-1] / 2))
    return choices


MICRO_BATCH_TOKENS = {"cpu": (256,), "cuda": (8192, 4096, 2048, 1024, 512, 256)}
"""--micro-batch-tokens when it is not given: the first of these whose plan fits the device.  On CUDA a
forward is bound by kernel launches well past a thousand tokens at 135M parameters.  An H200 (SmolLM2-135M,
bfloat16, 16 x 8 responses of up to 512 tokens, seed 0) trained a sync step in 1.32 s at 8192 (4.5 forwards)
against 8.11 s at 1024 (25.5 forwards), medians."""


def fitted(plans) -> MemoryPlan:
    """The first plan that fits its budget, else the last (whose check() then names the flag)."""
    plan = None
    for plan in plans:
        if plan.total <= plan.budget:
            return plan
    return plan


CUBLAS_WORKSPACE_BYTES = 32 * 2**20
"""The workspace cuBLAS keeps for each CUDA stream it has run a matmul on, for the life of the
process (in torch's allocator): torch's default on Hopper and newer GPUs, less on older ones (where
the plan then over-counts).  On an H200 the engine's first prefill on the default stream grew the
allocated memory by 33.6 MB; the decode graphs' captures had walked through torch's pool of 32
streams, one a capture, and held 32 of them (about 1 GiB, now one: `EmbeddedRunner.capture_graphs`)."""

BYTES_PER_GRAPH = 4 * 2**20
"""What each captured decode graph takes on the device outside torch's allocator (the driver's
executable graph, and kernels loaded on first use, which this counts per graph too), measured with
torch 2.11+cu130 on an H100 (72 graphs of the 4-layer tiny model, first engine of its process):
1,365 MiB taken on the device against 1,089 MiB in the allocator, 3.8 MiB a graph."""


def cuda_graph_bytes(shape: ModelShape, b: int, keys: list[GraphKey]) -> tuple[int, int]:
    """(static outputs, pool) that the decode graphs of `keys` keep, b bytes per element.  Outputs:
    one float32 logits buffer `[rows x tokens, vocab]` of the widest graph, which every graph writes.
    Pool: the transients of the largest forward (rows x tokens x columns), captured first so that
    later captures reuse them: its attention scores in float32 (the product, the scaled and the
    masked copies), the logits in b before their float32 copy (below float32), the MLP's three
    ffn-wide tensors and a few hidden-wide ones; the cuBLAS workspaces of the two streams the
    captures run on (the warm-up's and the capture's); and `BYTES_PER_GRAPH` a graph."""
    outputs = max((rows * t for rows, t, _ in keys), default=0) * shape.vocab * 4
    logits_b = shape.vocab * b if b < 4 else 0
    largest = max((rows * t * (3 * shape.heads * cols * 4 + logits_b + (3 * shape.ffn + 4 * shape.hidden) * b)
                   for rows, t, cols in keys), default=0)
    workspaces = 2 * CUBLAS_WORKSPACE_BYTES if keys else 0
    return outputs, largest + workspaces + BYTES_PER_GRAPH * len(keys)


BUDGET_ENV = "ROLLPACKER_MEMORY_GIB"
"""Caps the memory the plan counts on (GiB): a smaller card's plan, checked on a bigger one; or room
left for other processes on a shared machine."""


def device_budget(device: str) -> int:
    """Bytes of the device: the GPU's total memory (torch.cuda.mem_get_info), else physical RAM; at
    most $ROLLPACKER_MEMORY_GIB when it is set."""
    import os

    if device.startswith("cuda"):
        import torch

        total = torch.cuda.mem_get_info(torch.device(device))[1]
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    raw = os.environ.get(BUDGET_ENV)
    if raw is None:
        return total
    try:
        cap = float(raw)
    except ValueError:
        cap = float("nan")
    if not cap > 0 or cap == float("inf"):
        raise ConfigError(f"${BUDGET_ENV} must be a number of GiB > 0, got {raw!r}")
    return min(total, int(cap * 2**30))


def resident_bytes() -> int:
    """This process's resident memory now (Linux: VmRSS; elsewhere 0, not counted)."""
    try:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0
    return int(line.split()[1]) * 1024


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"
