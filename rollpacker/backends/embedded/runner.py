"""The torch half of the embedded engine: a KV cache indexed by slot, batched prefill and decode
(one token or a verified run of draft tokens per row) over an HF causal LM, and CUDA graphs for
decode on a GPU.  No threads and no request bookkeeping here (those are in `embedded.py`).

Theory of operation
    The cache is one pair of buffers per layer, `[slots, kv_heads, length, head_dim]`, allocated
    once for `capacity` slots.  Row i of the running batch lives in slot i, left-aligned: its
    tokens fill columns `[0, row_len[i])` and the rest of the slot is garbage that no query can
    see, because the attention mask lets the query at offset t of a forward attend only to columns
    `<= row_len[i] + t`.  A forward of T tokens per row writes its keys and values in place at
    columns `row_len[i] .. row_len[i] + T - 1` (prefill: a fresh slot from column 0), so no step
    copies the cache.  The engine keeps its live rows in slots `0 .. n-1`: new rows are prefilled
    straight into the next free slots (a prompt met twice in one prefill, a group's samples, is
    computed once and its slot copied), and a row that leaves is replaced by the last row, whose
    slot is copied (`move`: one row, not the cache).  A rejected speculative draft needs no undo:
    the row's length simply does not advance past the accepted tokens, and the next forward
    overwrites the stale columns.

    The attention itself is ours (registered as an HF attention implementation and switched on
    only for the runner's own forwards): the model's q/k/v projections, rotary embedding and MLP
    are untouched, the mask is the one above, and keys are read straight from the slot buffers
    (grouped-query heads by reshaping the queries, never by copying the cache per head).

    On CUDA a decode step is launch-bound for small models (one kernel launch is ~27 us and a
    30-layer step launches hundreds), so decode forwards replay CUDA graphs: one per (rows bucket,
    tokens per row, columns bucket), replayed with the inputs copied into static tensors.  Padding
    rows of a bucket sit in free slots at length 0.  Weight updates copy into the same parameter
    tensors, so graphs stay valid.  Every graph the cache's length allows (`graph_keys`) is captured
    together whenever the cache is allocated (`reserve`): with the length known up front
    (`cols_per_slot`) that is once, when the engine starts, on the thread that builds it and before
    any step, so no capture runs while a trainer uses the GPU from another thread and no capture
    time lands in a timed step.  A cache that grows captures again (with
    `capture_error_mode="thread_local"`, so another thread's CUDA calls stay legal meanwhile).  The
    capture's dummy forwards write only the last columns of each slot, past every live row.  A
    failed capture raises `GraphCaptureFailed` naming the bucket: never a silent eager fallback.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import time

import torch
from rollpacker.backends.embedded.attention import ATTENTION_NAME
from rollpacker.backends.embedded.buckets import COL_MULTIPLE, GraphKey, graph_keys, row_bucket
from rollpacker.backends.errors import GraphCaptureFailed

log = logging.getLogger(__name__)

_MAX_VERIFY_WIDTH = 64  # columns past the context a verify forward may write (drafts beyond the end)


class SlotCache:
    """Per-layer slot buffers and the plan of the forward in flight (which slots, which columns).
    HF decoder layers call `update(keys, values, layer)` and attend over what it returns."""

    def __init__(self, num_layers: int, slots: int, kv_heads: int, head_dim: int, length: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (slots, kv_heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lo = self.hi = self.read_len = 0
        self.rows: torch.Tensor | None = None  # [B, T] row index of each written token
        self.cols: torch.Tensor | None = None  # [B, T] column of each written token

    @property
    def length(self) -> int:
        return self.keys[0].shape[2]

    @property
    def num_slots(self) -> int:
        return self.keys[0].shape[0]

    def plan(self, lo: int, hi: int, cols: torch.Tensor, read_len: int) -> None:
        self.lo, self.hi, self.read_len, self.cols = lo, hi, read_len, cols
        self.rows = torch.arange(hi - lo, device=cols.device).view(-1, 1).expand_as(cols)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v = self._rows(self.keys[layer_idx]), self._rows(self.values[layer_idx])
        k[self.rows, :, self.cols] = key_states.transpose(1, 2)
        v[self.rows, :, self.cols] = value_states.transpose(1, 2)
        if self.read_len == self.length:
            return k, v
        return k[:, :, : self.read_len], v[:, :, : self.read_len]

    def _rows(self, buf: torch.Tensor) -> torch.Tensor:
        """Slots lo..hi of `buf`: the buffer itself when that is every slot (no slice op per layer)."""
        return buf if self.lo == 0 and self.hi == buf.shape[0] else buf[self.lo : self.hi]

    def grown(self, length: int) -> "SlotCache":
        """A copy with `length` columns per slot (the old columns kept)."""
        ref = self.keys[0]
        new = SlotCache(len(self.keys), ref.shape[0], ref.shape[1], ref.shape[3], length, ref.dtype, ref.device)
        for old, fresh in zip(self.keys + self.values, new.keys + new.values):
            fresh[:, :, : old.shape[2]] = old
        return new

    def move(self, src: int, dst: int, num_cols: int) -> None:
        for buf in self.keys + self.values:
            buf[dst, :, :num_cols] = buf[src, :, :num_cols]


def cache_kwarg(decoder) -> str:
    """The name under which `decoder.forward` takes its KV cache: `cache` in the transformers releases
    that renamed it (there `past_key_values` is deprecated, removed in 5.40, and warns with a
    FutureWarning at every call), `past_key_values` in the earlier ones."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


class _Graph:
    """One captured decode forward with its static inputs and output."""

    def __init__(self, graph, ids, base, logits):
        self.graph, self.ids, self.base, self.logits = graph, ids, base, logits


class Runner:
    """Prefill, decode and verify forwards over one HF causal LM and its slot cache.

    attention: "matmul" (our grouped matmul kernel, graph-friendly) or "sdpa" (torch's fused
    kernels) for decode; prefill always uses SDPA.  use_graphs: capture decode in CUDA graphs
    (None: on CUDA only; True elsewhere is an error).  col_multiple: the columns a decode attends
    to are rounded up to this, or to the cache's length (a graph is reused for every length in its
    bucket).  cols_per_slot: allocate this many columns per slot at once (prompt + max new tokens:
    the cache then never grows, and holds exactly what a memory plan counts); None grows by
    doubling.  verify_rows, verify_tokens: speculative verify forwards run at most this many rows
    with up to this many draft tokens each (graphs are captured for those widths too).
    """

    def __init__(self, model, pad_token_id: int, capacity: int, *, attention: str = "matmul",
                 use_graphs: bool | None = None, col_multiple: int | None = None,
                 cols_per_slot: int | None = None, verify_rows: int = 0, verify_tokens: int = 0) -> None:
        if attention not in ("matmul", "sdpa"):
            raise ValueError(f"attention must be 'matmul' or 'sdpa', got {attention!r}")
        self.model = model
        self.decoder = model.get_decoder()
        self.cache_kwarg = cache_kwarg(self.decoder)
        self.lm_head = model.get_output_embeddings()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        config = model.config.get_text_config(decoder=True)
        self.num_layers = config.num_hidden_layers
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.pad_token_id = pad_token_id
        self.capacity = capacity
        self.max_cols = int(getattr(config, "max_position_embeddings", 0) or 1 << 20) + _MAX_VERIFY_WIDTH
        self.cols_per_slot = cols_per_slot
        self.attention = attention
        self.is_cuda = self.device.type == "cuda"
        self.use_graphs = self.is_cuda if use_graphs is None else use_graphs
        if self.use_graphs and not self.is_cuda:
            raise ValueError(f"CUDA graphs need the model on CUDA; it is on {self.device}")
        self.verify_rows, self.verify_tokens = min(verify_rows, capacity), verify_tokens
        self.col_multiple = col_multiple or COL_MULTIPLE["cuda" if self.is_cuda else "cpu"]
        for module in model.modules():  # read only by our attention function
            if hasattr(module, "layer_idx"):
                module._rollpacker_sdpa = attention == "sdpa"
        self.cache: SlotCache | None = None
        self._graphs: dict[GraphKey, _Graph] = {}
        self._pool = None
        self._out: torch.Tensor | None = None
        """The float32 logits every graph writes, `[rows x tokens, vocab]` of the widest: one buffer for all
        (a replay's logits are read before the next replay), not one per graph."""
        self.capture_s = 0.0
        """Seconds spent capturing CUDA graphs so far (apart from any decode step's time)."""
        self.decode_keys: set[GraphKey] = set()
        """The (rows bucket, tokens per row, columns) of every decode so far, graphs or not."""

    # -- memory ------------------------------------------------------------------------------------

    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.kv_heads * self.head_dim * torch.tensor([], dtype=self.dtype).element_size()

    @torch.inference_mode()
    def reserve(self, num_cols: int) -> None:
        """Make every slot hold at least `num_cols` columns (drops graphs).  With `cols_per_slot`
        the cache is allocated once at exactly that size, and a row needing more is an error;
        without, it grows by doubling, never past the model's context plus a verify's width."""
        if self.cache is not None and self.cache.length >= num_cols:
            return
        if self.cols_per_slot is not None:  # the memory plan's size: allocated once, never grown
            if num_cols > self.cols_per_slot:
                raise ValueError(f"a row needs {num_cols} KV cache columns but the cache holds {self.cols_per_slot} "
                                 f"per row (kv_tokens_per_row: the longest prompt plus max new tokens)")
            self.cache = SlotCache(self.num_layers, self.capacity, self.kv_heads, self.head_dim, self.cols_per_slot,
                                   self.dtype, self.device)
        else:
            step = 64
            length = max(num_cols, 2 * self.cache.length if self.cache is not None else 0)
            length = max(num_cols, min(length, self.max_cols))
            length = -(-length // step) * step
            if self.cache is None:
                self.cache = SlotCache(self.num_layers, self.capacity, self.kv_heads, self.head_dim, length,
                                       self.dtype, self.device)
            else:
                self.cache = self.cache.grown(length)
                if self.use_graphs:  # no planned size was given: every graph again
                    log.warning("KV cache grew to %d columns per slot; capturing its CUDA graphs again", length)
        self._graphs.clear()
        if self.use_graphs:
            self.capture_graphs()

    def release(self) -> None:
        """Give the cache's memory back (the engine is idle)."""
        self.cache = None
        self.drop_graphs()

    def drop_graphs(self) -> None:
        """Forget every captured graph and its memory pool (the tensors they replay are moving)."""
        self._graphs.clear()
        self._pool = None
        self._out = None

    def restore(self) -> None:
        """After a release (colocated mode): with graphs, allocate the cache at its planned size and
        capture every graph again, as at start (they replay the new addresses of the weights and the
        cache); without, the next prefill allocates the cache."""
        if not self.use_graphs:
            return
        if self.cache is None and self.cols_per_slot is not None:
            self.reserve(self.cols_per_slot)
        elif self.cache is not None and not self._graphs:
            self.capture_graphs()

    @torch.inference_mode()
    def move(self, src: int, dst: int, num_cols: int) -> None:
        self.cache.move(src, dst, num_cols)

    # -- forwards ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, first_slot: int, prompts: list[list[int]]) -> torch.Tensor:
        """Write `prompts` into slots `first_slot ..` from column 0; the logits of each prompt's next
        token, `[rows, vocab]` float32.  Each distinct prompt is computed once, into slot first_slot + k
        (k: its order of first appearance, so k <= i for row i), then copied to its other rows' slots
        from the last row down, so a slot is overwritten only once no later copy reads it."""
        distinct: dict[tuple[int, ...], int] = {}
        which = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        logits = self._prefill_distinct(first_slot, [list(p) for p in distinct])
        for i in reversed(range(len(prompts))):
            if which[i] != i:
                self.move(first_slot + which[i], first_slot + i, len(prompts[i]))
        return logits[torch.tensor(which, device=logits.device)]

    def _prefill_distinct(self, first_slot: int, prompts: list[list[int]]) -> torch.Tensor:
        longest = max(len(p) for p in prompts)
        self.reserve(longest)
        ids = torch.full((len(prompts), longest), self.pad_token_id, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        base = torch.zeros(len(prompts), dtype=torch.long, device=self.device)
        hidden = self._hidden(first_slot, ids.to(self.device), base, longest)
        last = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        picked = hidden[torch.arange(len(prompts), device=self.device), last]
        return self.lm_head(picked).float()

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, row_len: list[int]) -> torch.Tensor:
        """One forward of `tokens` [n, T] for the rows in slots 0..n-1, whose caches hold
        `row_len` tokens; returns next-token logits `[n, T, vocab]` float32."""
        n, t = tokens.shape
        need = max(row_len) + t
        self.reserve(need)
        read_len = self._read_len(need)
        self.decode_keys.add((self._bucket(n), t, read_len))
        base = torch.tensor(row_len, dtype=torch.long, device=self.device)
        tokens = tokens.to(self.device)
        if self.use_graphs:
            return self._replay(tokens, base, read_len)
        return self._logits(0, tokens, base, read_len)

    def _read_len(self, need: int) -> int:
        """Columns a forward that must see `need` of them attends to: `need` rounded up to the
        column bucket, never past the cache (so a cache sized up front never grows for rounding)."""
        m = self.col_multiple
        return min(-(-need // m) * m, self.cache.length)

    def _logits(self, lo: int, ids: torch.Tensor, base: torch.Tensor, read_len: int) -> torch.Tensor:
        return self.lm_head(self._hidden(lo, ids, base, read_len)).float()

    def _hidden(self, lo: int, ids: torch.Tensor, base: torch.Tensor, read_len: int) -> torch.Tensor:
        """Hidden states of `ids` [B, T] for slots lo..lo+B-1 whose caches hold `base` tokens."""
        b, t = ids.shape
        offsets = torch.arange(t, device=ids.device)
        positions = base.view(-1, 1) + offsets
        cols = torch.arange(read_len, device=ids.device)
        mask = (cols.view(1, 1, -1) <= positions.view(b, t, 1)).view(b, 1, t, read_len)
        self.cache.plan(lo, lo + b, positions, read_len)
        with self._own_attention():
            out = self.decoder(input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=True, **{self.cache_kwarg: self.cache})
        return out.last_hidden_state

    @contextlib.contextmanager
    def _own_attention(self):
        """Our attention for this forward only (the model may be used elsewhere too)."""
        config = self.model.config
        before = config._attn_implementation
        config._attn_implementation = ATTENTION_NAME
        try:
            yield
        finally:
            config._attn_implementation = before

    # -- CUDA graphs -------------------------------------------------------------------------------

    def _bucket(self, n: int) -> int:
        return row_bucket(n, self.capacity)

    def graph_keys(self, length: int | None = None) -> list[GraphKey]:
        """Every (rows bucket, tokens per row, columns) a decode can use with a cache of `length`
        columns per slot (default: the cache's): `buckets.graph_keys` for this runner."""
        length = self.cache.length if length is None else length
        return graph_keys(capacity=self.capacity, length=length, col_multiple=self.col_multiple,
                          verify_rows=self.verify_rows, verify_tokens=self.verify_tokens)

    def capture_graphs(self) -> None:
        """Capture the graph of every key in `graph_keys` (dropping older ones), the largest forward
        first so that the later ones reuse its transients in the shared pool; adds the time to
        `capture_s`.  Raises `GraphCaptureFailed` naming the first bucket that fails.

        Python's cyclic garbage collector is run before and held off during the captures: a dead
        cycle that still holds an old graph, collected by an allocation inside a capture, would
        reset that graph mid-capture, which invalidates the capture (seen on an H200).

        Every capture warms up on one side stream: cuBLAS keeps a workspace (32 MiB on Hopper) per
        stream it has run on, so a stream per capture held ~1 GiB (torch's pool has 32 streams)."""
        start = time.perf_counter()
        self._graphs.clear()
        gc.collect()
        torch.cuda.synchronize(self.device)
        self._pool = torch.cuda.graph_pool_handle()  # a fresh pool: the old one went with the old graphs
        keys = self.graph_keys()
        widest = max(rows * t for rows, t, _ in keys)
        self._out = torch.empty(widest, self.lm_head.weight.shape[0], dtype=torch.float32, device=self.device)
        warmup = torch.cuda.Stream(self.device)
        collecting = gc.isenabled()
        gc.disable()
        try:
            for key in keys:
                self._graphs[key] = self._capture(*key, warmup)
        finally:
            if collecting:
                gc.enable()
        torch.cuda.synchronize(self.device)
        self.capture_s += time.perf_counter() - start
        log.info("captured %d CUDA graphs of decode in %.1f s", len(self._graphs), time.perf_counter() - start)

    def _replay(self, tokens: torch.Tensor, base: torch.Tensor, read_len: int) -> torch.Tensor:
        n, t = tokens.shape
        key = (self._bucket(n), t, read_len)
        graph = self._graphs.get(key)
        if graph is None:  # graph_keys missed a shape the engine uses: a bug, never a silent eager step
            raise GraphCaptureFailed(f"no CUDA graph was captured for {_describe(key)} (captured: "
                                     f"{len(self._graphs)} graphs for {self.cache.length} columns)")
        graph.ids[:n].copy_(tokens)
        graph.ids[n:].fill_(self.pad_token_id)
        graph.base[:n].copy_(base)
        graph.base[n:].zero_()
        graph.graph.replay()
        return graph.logits[:n]

    @torch.inference_mode()
    def _capture(self, rows: int, t: int, read_len: int, warmup: torch.cuda.Stream) -> _Graph:
        """Capture one decode forward of `rows` x `t` tokens over `read_len` columns, after a warm-up
        run on the `warmup` stream.  Its dummy inputs write the last `t` columns of each slot: the
        cache was just allocated, or grown to at least 64 columns past its longest row, so no live
        row reaches them."""
        ids = torch.full((rows, t), self.pad_token_id, dtype=torch.long, device=self.device)
        static_base = torch.full((rows,), self.cache.length - t, dtype=torch.long, device=self.device)
        try:
            warmup.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(warmup):  # warm-up outside the graph (lazy inits, autotuning)
                self._logits(0, ids, static_base, read_len)
            torch.cuda.current_stream(self.device).wait_stream(warmup)
            graph = torch.cuda.CUDAGraph()
            logits = self._out[: rows * t].view(rows, t, -1)
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                logits.copy_(self.lm_head(self._hidden(0, ids, static_base, read_len)))
        except Exception as exc:
            raise GraphCaptureFailed(f"capturing the CUDA graph of {_describe((rows, t, read_len))} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
        return _Graph(graph, ids, static_base, logits)


def _describe(key: GraphKey) -> str:
    rows, t, cols = key
    return f"decode bucket rows={rows} tokens_per_row={t} columns={cols}"
