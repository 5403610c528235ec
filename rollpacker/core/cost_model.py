"""Decode/prefill cost model of one rollout instance (an engine on `tp` GPUs): formulas only.

A roofline model of one decode / prefill step, shared by the TP planner (core) and the simulator:

    step(b, C, n_pf) = t0 + t1 * (b + n_pf) + t2 * C + t_attn_pf
    t0 = W_read / (TP * BW_w) + L * tau_L + 2L * tau_AR * [TP > 1] + tau_0
    t1 = 2 * P_read / (TP * F * eff(TP)) + [TP > 1] * 2L * h * dtype / BW_AR(TP)
    t2 = kv_bytes_per_token / (TP * BW_kv)
    t_attn_pf = 2 * n_pf * (c0 + n_pf / 2) * H * d * L / (TP * F_attn)
    KV capacity (tokens) = (mem_fraction * M * TP - W) / kv_bytes_per_token

b decoding sequences, C the sum of their context lengths, n_pf prefill tokens, c0 tokens already
cached.  The t1 refinement (GEMM efficiency eff(TP) < 1 and all-reduce traffic of 2L all-reduces
of h values per token) applies the prefill corrections to every token: without it,
TP would look free and the largest TP would always win.  The numbers (and where each comes from) live in rollpacker/sim/constants.py; this file
holds no constant of its own, so no number is stated twice.
"""

from __future__ import annotations

from attrs import field, frozen

from .validators import non_negative, positive, positive_number


@frozen(kw_only=True)
class ModelShape:
    """A model's shape: what the cost model needs (bf16 weights unless dtype_bytes says otherwise) and,
    read from an HF config.json (`from_config`), what the reference trainer's memory plan needs too."""

    name: str
    layers: int = field(validator=positive_number)
    heads: int = field(validator=positive_number)
    """Query heads (prefill attention FLOPs)."""
    kv_heads: int = field(validator=positive_number)
    head_dim: int = field(validator=positive_number)
    weight_bytes: float = field(validator=positive_number)
    """W: all weights, as resident in GPU memory."""
    read_bytes: float = field(validator=positive_number)
    """W_read: weights read per decode step (no input embedding, untied lm_head included)."""
    hidden: int = field(validator=positive_number)
    dtype_bytes: int = field(default=2, validator=positive)
    ffn: int = field(default=0, validator=non_negative)
    """The MLP's inner width (0: not given; the memory plan needs it, the cost model does not)."""
    vocab: int = field(default=0, validator=non_negative)
    tied_embeddings: bool = False

    @classmethod
    def from_config(cls, config: dict, name: str = "", dtype_bytes: int = 2) -> ModelShape:
        """The shape of an HF config.json (Llama / Qwen family)."""
        heads = config["num_attention_heads"]
        dims = dict(layers=config["num_hidden_layers"], hidden=config["hidden_size"], heads=heads,
                    kv_heads=config.get("num_key_value_heads") or heads,
                    head_dim=config.get("head_dim") or config["hidden_size"] // heads, ffn=config["intermediate_size"],
                    vocab=config["vocab_size"], tied_embeddings=bool(config.get("tie_word_embeddings", False)))
        params = _params(**dims)
        read = params - (0 if dims["tied_embeddings"] else dims["vocab"] * dims["hidden"])
        return cls(name=name or config.get("_name_or_path", ""), weight_bytes=params * dtype_bytes,
                   read_bytes=read * dtype_bytes, dtype_bytes=dtype_bytes, **dims)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_dim * self.dtype_bytes

    @property
    def params(self) -> float:
        """Parameters multiplied per token (P_read)."""
        return self.read_bytes / self.dtype_bytes

    @property
    def num_params(self) -> int:
        """All parameters, counted from the shape (`from_config`'s shapes): embeddings (and an untied LM
        head), per layer q/k/v/o, the gated MLP and two norms, and the final norm."""
        return _params(self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn, self.vocab,
                       self.tied_embeddings)


def _params(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, vocab: int,
            tied_embeddings: bool) -> int:
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    layer = attention + 3 * hidden * ffn + 2 * hidden
    return vocab * hidden * (1 if tied_embeddings else 2) + layers * layer + hidden


@frozen(kw_only=True)
class Hardware:
    """One GPU type and the engine's fixed costs."""

    name: str
    memory_bytes: float = field(validator=positive_number)
    bw_weights: float = field(validator=positive_number)
    bw_kv: float = field(validator=positive_number)
    flops: float = field(validator=positive_number)
    flops_attn: float = field(validator=positive_number)
    tau_layer: float = field(validator=positive_number)
    tau_allreduce: float = field(validator=positive_number)
    tau_fixed: float = field(validator=positive_number)
    gpus_per_node: int = field(validator=positive_number)
    tp_efficiency: tuple[tuple[int, float], ...] = ((1, 1.0),)
    """(TP, GEMM speed-up / TP); TPs not listed use the largest listed TP below them."""
    allreduce_bw: tuple[tuple[int, float], ...] = ()
    """(TP, bytes/s of a large all-reduce); TPs not listed use the largest listed TP below them."""


def _lookup(table: tuple[tuple[int, float], ...], tp: int, default: float) -> float:
    value = default
    for key, v in sorted(table):
        if key <= tp:
            value = v
    return value


@frozen(kw_only=True)
class CostModel:
    """Step time and KV capacity of one instance of `model` on `tp` GPUs of `hardware`."""

    model: ModelShape
    hardware: Hardware
    tp: int = field(validator=positive_number)
    mem_fraction: float = field(validator=positive_number)
    """Share of GPU memory for weights + KV cache (SGLang mem_fraction_static, vLLM
    gpu_memory_utilization)."""

    @property
    def t0(self) -> float:
        m, h, tp = self.model, self.hardware, self.tp
        comm = 2 * m.layers * h.tau_allreduce if tp > 1 else 0.0
        return m.read_bytes / (tp * h.bw_weights) + m.layers * h.tau_layer + comm + h.tau_fixed

    @property
    def t1(self) -> float:
        m, h, tp = self.model, self.hardware, self.tp
        gemm = 2 * m.params / (tp * h.flops * _lookup(h.tp_efficiency, tp, 1.0))
        if tp == 1:
            return gemm
        bw = _lookup(h.allreduce_bw, tp, 0.0)
        return gemm + (2 * m.layers * m.hidden * m.dtype_bytes / bw if bw > 0 else 0.0)

    @property
    def t2(self) -> float:
        return self.model.kv_bytes_per_token / (self.tp * self.hardware.bw_kv)

    @property
    def kv_capacity(self) -> int:
        """KV-cache tokens the instance holds; <= 0 means the model does not fit at this TP."""
        free = self.mem_fraction * self.hardware.memory_bytes * self.tp - self.model.weight_bytes
        return int(free // self.model.kv_bytes_per_token)

    @property
    def fits(self) -> bool:
        return self.kv_capacity > 0

    def step_time(self, batch: float, context: float) -> float:
        """One decode step of `batch` sequences holding `context` tokens in all."""
        return self.t0 + self.t1 * batch + self.t2 * context

    @property
    def prefill_batch_s(self) -> float:
        """Fixed seconds of one admission's batched prefill: none here (a GPU's launches are in t1 per
        token); an engine profile fitted to a real engine states its own."""
        return 0.0

    @property
    def admit_fraction(self) -> float:
        """Waiting requests start as soon as a slot frees (an engine profile may state a batching rule)."""
        return 0.0

    def abort_latency(self, caught: int) -> float:
        """Seconds from an abort call catching `caught` requests to their results: none (an assumption: an engine
        answers an abort within a step, small beside a 16k-32k round); an engine profile states its measured one."""
        return 0.0

    @property
    def launch_s(self) -> float:
        """Seconds from a launch to the engine having the request: none (an assumption: a submission takes
        milliseconds beside a 16k-32k round); an engine profile states what a live run measured."""
        return 0.0

    @property
    def return_s(self) -> float:
        """Seconds from a request finishing on the engine to the driver having its answer: none (an assumption:
        milliseconds beside a 16k-32k round); an engine profile states what a live run measured."""
        return 0.0

    @property
    def submit_s(self) -> float:
        """Engine seconds a launched request costs on its way in: none (an assumption: an engine's front end
        runs beside it on a GPU host's CPU); an engine profile states what a live run measured."""
        return 0.0

    @property
    def attention_columns(self) -> int:
        """0: a decode step attends each row over its own context (paged attention, vLLM and SGLang); an engine
        profile of an engine whose decode attends every row over the longest row's, rounded up to a multiple of
        this many columns, says so (the embedded engine)."""
        return 0

    @property
    def shared_prefill(self) -> bool:
        """Each request prefills its own prompt, its siblings' too (an assumption: an engine whose prefix
        cache or batched prefill shares a group's prompt prefills less; at 16k-32k responses a small share
        of a round); an engine profile states what its engine does."""
        return False

    @property
    def event_s(self) -> float:
        """Engine seconds lost to each request that ends: none here (the driver runs on other cores than
        the GPU's engine); an engine profile fitted to a real engine states its own."""
        return 0.0

    def prefill_time(self, tokens: float, cached: float = 0.0) -> float:
        """Prefill of `tokens` new tokens after `cached` ones (GEMMs plus attention)."""
        if tokens <= 0:
            return 0.0
        m = self.model
        attn = 2 * tokens * (cached + tokens / 2) * m.heads * m.head_dim * m.layers / (self.tp * self.hardware.flops_attn)
        return self.t1 * tokens + attn

    def peak_tokens_per_s(self, batch: float) -> float:
        """Decode throughput at `batch` sequences with no context cost: an upper bound."""
        return batch / (self.t0 + self.t1 * batch)
