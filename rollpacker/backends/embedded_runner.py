"""The torch half of the embedded engine: a padded KV cache whose rows come and go, batched prefill
and decode over an HF causal LM, and per-row sampling.  No threads and no request bookkeeping here
(those are in `embedded.py`).

Theory of operation
    The running batch is one tensor per layer, `[rows, kv_heads, cap, head_dim]`, with every row
    right-aligned: row i's real tokens fill the last `row_len[i]` of the first `length` columns and
    the columns before them are padding, masked out by a 2-D attention mask.  A decode step appends
    one column for all rows, written in place into preallocated room (`cap` grows by doubling), so
    a step costs no copy of the cache.  Rows that finish stay in the batch as dead rows until the
    next `rebuild`, which copies the live rows and the freshly prefilled new rows into a new buffer,
    right-aligned again and trimmed to the longest row.  Rebuilding is the only full copy; the
    engine batches it (admissions and removals together) so it happens every few steps, not every
    step.  Positions are per row (`row_len`), so padding never shifts a row's rotary positions and a
    row's logits match an unpadded run of the same tokens up to float rounding.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

_HEADROOM = 64


class _KVLayer(DynamicLayer):
    """One layer's keys and values in a buffer with room to grow; `update` writes in place."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None, length: int = 0,
                 reserve: int = _HEADROOM):
        super().__init__()
        self.buf_k, self.buf_v, self.length, self.reserve = keys, values, length, reserve
        if keys is not None:
            self._set_views()

    def _set_views(self) -> None:
        self.is_initialized = True
        self.dtype, self.device = self.buf_k.dtype, self.buf_k.device
        self.keys = self.buf_k[:, :, : self.length]
        self.values = self.buf_v[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        need = self.length + key_states.shape[-2]
        if self.buf_k is None:
            b, h, _, d = key_states.shape
            shape = (b, h, need + self.reserve, d)
            self.buf_k = key_states.new_zeros(shape)
            self.buf_v = value_states.new_zeros(shape)
        elif need > self.buf_k.shape[2]:
            grow = max(self.buf_k.shape[2], _HEADROOM)
            pad = self.buf_k.new_zeros(*self.buf_k.shape[:2], grow, self.buf_k.shape[3])
            self.buf_k = torch.cat([self.buf_k, pad], dim=2)
            self.buf_v = torch.cat([self.buf_v, pad], dim=2)
        self.buf_k[:, :, self.length : need] = key_states
        self.buf_v[:, :, self.length : need] = value_states
        self.length = need
        self._set_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


def _cache(layers: list[_KVLayer]) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = layers
    cache.layer_class_to_replicate = None
    return cache


class Batch:
    """The running rows' KV cache, attention mask and positions (torch state only)."""

    def __init__(self, layers: list[_KVLayer], mask: torch.Tensor, row_len: torch.Tensor):
        self.layers = layers
        self.mask = mask  # [rows, >= length] int64, 1 on real tokens
        self.row_len = row_len  # [rows] int64, real tokens in the cache per row

    @property
    def num_rows(self) -> int:
        return int(self.row_len.shape[0])

    @property
    def length(self) -> int:
        return self.layers[0].length


class Runner:
    """Prefill, decode and sampling for one HF causal LM."""

    def __init__(self, model, pad_token_id: int):
        self.model = model
        self.device = next(model.parameters()).device
        self.num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
        self.pad_token_id = pad_token_id

    # -- forward passes ---------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], reserve: int = _HEADROOM) -> tuple[Batch, torch.Tensor]:
        """Left-padded batched prefill of `prompts`; returns the new rows' batch and the logits of
        their next token, `[rows, vocab]` float32."""
        longest = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, longest - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, longest - len(p) :] = 1
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        layers = [_KVLayer(reserve=reserve) for _ in range(self.num_layers)]
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=_cache(layers),
            use_cache=True,
            logits_to_keep=1,
        )
        row_len = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=self.device)
        return Batch(layers, mask.to(self.device), row_len), out.logits[:, -1, :].float()

    @torch.inference_mode()
    def decode(self, batch: Batch, last_tokens: torch.Tensor) -> torch.Tensor:
        """One step for every row: feed `last_tokens` `[rows]`, return next-token logits."""
        length = batch.length
        if batch.mask.shape[1] < length + 1:
            grow = max(batch.mask.shape[1], _HEADROOM)
            batch.mask = torch.cat([batch.mask, batch.mask.new_zeros(batch.num_rows, grow)], dim=1)
        batch.mask[:, length] = 1
        out = self.model(
            input_ids=last_tokens.view(-1, 1).to(self.device),
            attention_mask=batch.mask[:, : length + 1],
            position_ids=batch.row_len.view(-1, 1),
            past_key_values=_cache(batch.layers),
            use_cache=True,
            logits_to_keep=1,
        )
        batch.row_len += 1
        return out.logits[:, -1, :].float()

    @staticmethod
    def rebuild(old: Batch | None, keep: list[int], new: Batch | None, reserve: int = _HEADROOM) -> Batch:
        """A batch of `old`'s rows `keep` (in that order) followed by all rows of `new`,
        right-aligned and trimmed to the longest row."""
        parts = []
        if old is not None and keep:
            idx = torch.tensor(keep, dtype=torch.long, device=old.row_len.device)
            parts.append((old, idx, int(old.row_len[idx].max())))
        if new is not None:
            parts.append((new, None, int(new.row_len.max())))
        assert parts, "rebuild needs at least one row"
        width = max(span for _, _, span in parts)
        rows = sum(int(i.shape[0]) if i is not None else b.num_rows for b, i, _ in parts)
        ref = parts[0][0].layers
        layers = []
        for li in range(len(ref)):
            k0 = ref[li].buf_k
            shape = (rows, k0.shape[1], width + reserve, k0.shape[3])
            buf_k, buf_v = k0.new_zeros(shape), k0.new_zeros(shape)
            start = 0
            for b, idx, span in parts:
                src = b.layers[li]
                sk = src.buf_k[:, :, src.length - span : src.length]
                sv = src.buf_v[:, :, src.length - span : src.length]
                if idx is not None:
                    sk, sv = sk.index_select(0, idx), sv.index_select(0, idx)
                n = sk.shape[0]
                buf_k[start : start + n, :, width - span : width] = sk
                buf_v[start : start + n, :, width - span : width] = sv
                start += n
            layers.append(_KVLayer(buf_k, buf_v, width, reserve))
        mask = torch.zeros((rows, width + reserve), dtype=torch.long, device=ref[0].buf_k.device)
        lens, start = [], 0
        for b, idx, span in parts:
            m = b.mask[:, b.length - span : b.length]
            rl = b.row_len
            if idx is not None:
                m, rl = m.index_select(0, idx), rl.index_select(0, idx)
            mask[start : start + m.shape[0], width - span : width] = m
            lens.append(rl)
            start += m.shape[0]
        return Batch(layers, mask, torch.cat(lens))


@torch.inference_mode()
def sample(
    logits: torch.Tensor,
    temperature: list[float],
    top_p: list[float],
    generators: list[torch.Generator | None],
) -> tuple[list[int], list[float]]:
    """Next token and its log-prob for each row.  Temperature 0 is greedy (argmax; log-prob under the
    unscaled distribution).  Otherwise the token is drawn from softmax(logits / T) restricted to the
    top-p nucleus with the row's own generator, and its log-prob is under softmax(logits / T) (the
    policy at that temperature, before the nucleus cut, as a trainer recomputes it)."""
    temps = torch.tensor([t if t > 0 else 1.0 for t in temperature], dtype=logits.dtype, device=logits.device)
    logp = torch.log_softmax(logits / temps.view(-1, 1), dim=-1)
    tokens = logits.argmax(dim=-1).tolist()
    sampled = [i for i, t in enumerate(temperature) if t > 0]
    if sampled:
        probs = logp[sampled].exp()
        cut = [j for j, i in enumerate(sampled) if top_p[i] < 1.0]
        if cut:
            sub = probs[cut]
            sorted_p, order = sub.sort(dim=-1, descending=True)
            limits = torch.tensor([top_p[sampled[j]] for j in cut], dtype=sub.dtype, device=sub.device)
            # keep a token if the mass strictly before it is below top_p (the first always stays)
            drop = (sorted_p.cumsum(-1) - sorted_p) >= limits.view(-1, 1)
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs[cut] = torch.zeros_like(sub).scatter(-1, order, sorted_p)
        # Inverse-CDF sampling: one uniform draw per row from the row's own generator, then a
        # batched cumsum + searchsorted (torch.multinomial per row cost ~30x more here).
        cdf = probs.cumsum(dim=-1)
        u = torch.stack([torch.rand((), generator=generators[i], device=cdf.device) for i in sampled])
        u = u.to(cdf.dtype) * cdf[:, -1]
        picked = torch.searchsorted(cdf, u.view(-1, 1), right=True).clamp_(max=cdf.shape[1] - 1)
        for j, i in enumerate(sampled):
            tokens[i] = int(picked[j])
    rows = torch.arange(len(tokens), device=logits.device)
    chosen = logp[rows, torch.tensor(tokens, device=logits.device)].tolist()
    return tokens, chosen
