"""Every number the simulator uses, with its source.  Override any of them with `attrs.evolve` or
from the command line (`rollpacker simulate --set train.mfu=0.4`); each field checks its range
(rollpacker.core.validators), so a NaN, an infinity or a value out of range is refused by name.

Sources are the ones each line cites (Vidur profiles, SGLang issues/PRs, FlashAttention-3 and the
model cards) unless a line says "assumption": those are round figures of ours, not
measurements, and the results that depend on them say so.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
from attrs import field, frozen

from rollpacker.core.cost_model import Hardware, ModelShape
from rollpacker.core.reward_scheduler import RewardConfig
from rollpacker.core.validators import fraction, non_negative, non_negative_number, positive, positive_number, probability

from .speculation import SpecConstants

GB = 1e9

# -- GPU ------------------------------------------------------------------------------------------
H100 = Hardware(
    name="H100/H800-80GB",
    memory_bytes=85.0 * GB,  # torch-reported size of an 80 GB card
    bw_weights=2.9e12,       # BW_w: Vidur H100 GEMM profiles, slope over TP (2.85-2.97 TB/s)
    bw_kv=1.8e12,            # BW_kv: FA3 paged decode on H100, flash-attention #1572
    flops=600e12,            # F: fitted to SGLang bs=128 (sglang #1008), 61% of 989 TF/s
    flops_attn=450e12,       # F_attn: assumption below FA3's 740 TF/s peak (arXiv 2407.08608)
    tau_layer=45e-6,         # tau_L: per layer with CUDA graph, fitted to sglang #1008
    tau_allreduce=9e-6,      # tau_AR: 8-10 us per all-reduce, sglang PR #2904
    tau_fixed=0.8e-3,        # tau_0: SGLang fixed cost per step, fit
    gpus_per_node=8,         # HGX/DGX H100/H800 node
    # GEMM speed-up / TP: Vidur H100 profiles give 1.89x/3.30x (7B) and 1.99x/3.76x (34B) at TP2/4;
    # we take the mean (0.97, 0.89); TP8 0.8 is an extrapolation (assumption).
    tp_efficiency=((1, 1.0), (2, 0.97), (4, 0.89), (8, 0.8)),
    # Large all-reduce bandwidth: ~460/360 GB/s at TP2/4 on H100 DGX (Vidur all_reduce.csv);
    # TP8 300 GB/s is an assumption.  (H800: NVLink 400 vs 900 GB/s, roughly half.)
    allreduce_bw=((2, 460e9), (4, 360e9), (8, 300e9)),
)

# -- models (shapes from the Hugging Face config.json files) -----------------
# heads / kv_heads (num_attention_heads / num_key_value_heads) also fix the valid TP sizes: a TP must
# divide both (core/tp_planner.py `valid_tps`).  Qwen2.5-7B 28 / 4 -> TP 1, 2, 4; Qwen2.5-14B and
# -32B 40 / 8 -> TP 1, 2, 4, 8; Llama-3.1-8B 32 / 8 -> TP 1, 2, 4, 8.
MODELS = {
    "qwen2.5-7b": ModelShape(name="Qwen2.5-7B", hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128,
                             weight_bytes=15.2 * GB, read_bytes=14.1 * GB),
    "llama3.1-8b": ModelShape(name="Llama-3.1-8B", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
                              weight_bytes=16.1 * GB, read_bytes=15.0 * GB),
    "qwen2.5-14b": ModelShape(name="Qwen2.5-14B", hidden=5120, layers=48, heads=40, kv_heads=8, head_dim=128,
                              weight_bytes=29.5 * GB, read_bytes=28.0 * GB),
    "qwen2.5-32b": ModelShape(name="Qwen2.5-32B", hidden=5120, layers=64, heads=40, kv_heads=8, head_dim=128,
                              weight_bytes=65.5 * GB, read_bytes=64.0 * GB),
}

# RollPacker's setting per max length (arXiv 2509.21009: Qwen2.5 7B/14B/32B at 8k/16k/32k); the GPU
# counts are the 16/32/64 of its rollout-time table.  TP: the smallest that leaves a KV pool large
# enough for the round (RollPacker's 7B config runs TP1; 14B/32B assumption: TP2/TP4).
PAPER_SETTINGS = {
    8192: {"model": "qwen2.5-7b", "gpus": 16, "tp": 1},
    16384: {"model": "qwen2.5-14b", "gpus": 32, "tp": 2},
    32768: {"model": "qwen2.5-32b", "gpus": 64, "tp": 4},
}


@frozen(kw_only=True)
class EngineConstants:
    section: ClassVar[str] = "engine"
    """Its field of SimConstants: errors name a constant as `--set` does (engine.NAME)."""

    mem_fraction: float = field(default=0.85, validator=fraction)
    """RollPacker's 7B config (gpu_memory_utilization 0.85); SGLang's default is 0.85 at TP4."""
    max_running: int = field(default=1024, validator=positive)
    """Most running sequences per instance: verl's max_num_seqs default (rollout.yaml)."""
    admit_watermark: float = field(default=0.01, validator=probability)
    """Share of the KV pool kept free when admitting: vLLM's watermark default (1%)."""
    oracle_placement: bool = False
    """Measurement only, not a mechanism (no router knows a request's length before it ends): place
    each launch on the instance with the fewest true tokens left to generate, the upper bound of any
    placement by predicted length.  Default: the instance with the fewest requests, the rule of
    SGLang's router and of our embedded engines' client."""
    oracle_isolate: int = field(default=0, validator=non_negative)
    """Measurement only, not a mechanism: each launch batch's M longest requests (true lengths, which
    no router knows) each get an instance to themselves, the upper bound of isolating the requests
    predicted longest.  0: off."""
    redispatch: bool = False
    """Re-dispatch, a router's mechanism (it knows each instance's request count; after Seer's divided
    rollout, at request granularity): while the busiest instance holds 2 or more requests more than the
    idlest, its newest request moves there (aborted, then resumed with its tokens prefilled again)."""
    tp_switch_s: float = field(default=10.0, validator=non_negative_number)
    """Assumption: re-sharding weights and restarting engines when TP changes between rounds.  Charged to
    the step that switches; the first round's TP is the one the engines start at, which is no switch.  `--tp-mode plan` does not weigh it when it chooses (`TpRule.switch_s` = 0):
    charged to the one round that switches, against that round's predicted gain, it kept every run at its
    starting TP (measured: ours-best at 32k, 64 x 7B, fell to the fixed-TP row, 1.35x instead of 2.08x
    the fastest sync), because the TP chosen then holds for many rounds that the greedy rule does not see."""


_REWARD = attrs.fields(RewardConfig)


@frozen(kw_only=True)
class RewardConstants:
    section: ClassVar[str] = "reward"
    """Its field of SimConstants: errors name a constant as `--set` does (reward.NAME)."""

    workers: int = field(default=64, validator=positive)
    """Assumption: sandbox workers scoring samples concurrently."""
    median_s: float = field(default=0.5, validator=positive_number)
    """Assumption: median verifier / sandbox execution time."""
    sigma: float = field(default=1.0, validator=non_negative_number)
    """Assumption: log-normal spread of execution time (a few take tens of seconds)."""
    hang_rate: float = field(default=0.005, validator=probability)
    """Assumption: share of executions that never return (must be timed out)."""
    t_min: float = field(default=2.0, validator=positive_number)
    """RollPacker adaptive timeout: T = min(max(T_min, lambda * T_anchor), T_max)."""
    scale: float = field(default=1.5, validator=positive_number)
    t_max: float = field(default=30.0, validator=positive_number)
    # The reward setting: the core's RewardConfig defaults, which the reference trainer's flags default to
    # too (one setting for the simulator and the live path).  Chosen by measurement (benchmarks/RESULTS.md,
    # "One reward setting"): at the headline's setting hedging after 1 or 2 s with 1 or 3 copies gave the
    # same ratio (1.89-1.90x); 64 extra workers gave 2.04-2.07x, a resource a user must provide, so they are
    # not in the default (`--set reward.burst_workers=64` charges them to every policy).
    hedge_after: float = field(default=_REWARD.hedge_after.default, validator=non_negative_number)
    """A sample whose execution still runs after this many seconds gets another on a free worker
    (the first answer wins; RewardConfig.hedge_after); 0: never."""
    hedge_copies: int = field(default=_REWARD.hedge_copies.default, validator=positive)
    """Most hedges of one sample, each `hedge_after` after the previous (RewardConfig.hedge_copies)."""
    priority: bool = _REWARD.priority.default
    """Samples of complete groups are scored before open groups' (RewardConfig.priority)."""
    burst_workers: int = field(default=_REWARD.burst_workers.default, validator=non_negative)
    """Workers beyond `workers` for complete groups' samples and hedges (RewardConfig.burst_workers)."""

    def scheduler_config(self) -> RewardConfig:
        """The core's reward scheduler with these settings."""
        return RewardConfig(workers=self.workers, t_min=self.t_min, scale=self.scale, t_max=self.t_max,
                            hedge_after=self.hedge_after or None, hedge_copies=self.hedge_copies, priority=self.priority,
                            burst_workers=self.burst_workers)


@frozen(kw_only=True)
class TrainConstants:
    section: ClassVar[str] = "train"
    """Its field of SimConstants: errors name a constant as `--set` does (train.NAME)."""

    flops_per_token_factor: float = field(default=8.0, validator=positive_number)
    """Forward+backward (6 N) plus the old-policy log-prob forward (2 N) per response token."""
    peak_flops: float = field(default=989e12, validator=positive_number)
    """H100/H800 SXM dense BF16 peak (NVIDIA datasheet)."""
    mfu: float = field(default=0.35, validator=fraction)
    """Assumption: model FLOPs utilisation of FSDP training on H100 (typical 30-45%)."""
    micro_batch_overhead_s: float = field(default=0.05, validator=non_negative_number)
    """Assumption: launch, gather and synchronisation cost per micro-batch."""
    seconds_per_token: float = field(default=0.0, validator=non_negative_number)
    """When > 0, a trained response token's measured seconds (a calibrated trainer,
    `stages.fit_train`), in place of the FLOPs model above."""
    seconds_per_padded_token: float = field(default=0.0, validator=non_negative_number)
    """A calibrated trainer's seconds per token of its padded forward (rows x the longest prompt +
    response of the micro-batch: prompts are computed too); 0 in the FLOPs model (responses only)."""
    optimizer_s: float = field(default=1.0, validator=non_negative_number)
    """Assumption: optimizer step plus weight sync to the rollout engines."""
    stream: bool = True
    """The live driver's stream trainer, for every policy (sync too): a micro-batch trains as soon as
    its groups are complete and scored, while the round still generates; only the optimizer step
    waits for the round.  False: training waits for the round's end (veRL's colocated trainer)."""


@frozen(kw_only=True)
class SimConstants:
    engine: EngineConstants = field(factory=EngineConstants)
    reward: RewardConstants = field(factory=RewardConstants)
    train: TrainConstants = field(factory=TrainConstants)
    spec: SpecConstants = field(factory=SpecConstants)
    hardware: Hardware = H100
