"""The built-in trainers of the reference trainer, as registry entries (rollpacker.train.registry):
`titan` (TorchTitan: FSDP2 and tensor parallelism) and `torch` (plain PyTorch on the HF model).
Each config holds the trainer's own options, checks them by flag, and builds the trainer; what
every trainer takes (lr, dtype, seed, device, the memory plan's forward size) comes from the run."""

from __future__ import annotations

from attrs import frozen

from rollpacker.core.errors import ConfigError
from rollpacker.train.memory_plan import LOGITS_CHUNK_TOKENS


def common_options(context) -> dict:
    """The fields of rollpacker.backends.trainer.config.TrainerConfig that every trainer takes from the run
    (its loss: --clip-eps, --kl-coef, --max-grad-norm, LossOptions)."""
    from rollpacker.train.algorithm import LossOptions

    plan, run = context.memory_plan, context.run
    return dict(model_dir=str(context.model_dir), lr=run.lr, dtype=run.dtype, seed=run.seed, device=context.device,
                max_forward_tokens=plan.forward_tokens if plan is not None else None,
                **run.options(LossOptions).trainer_fields())


@frozen(kw_only=True)
class TitanTrainerOptions:
    """--trainer titan: TorchTitan's model and parallelism (torch >= 2.11: 2.11 through titan.compat)."""

    flat = True  # the options are the top-level flags --dp-shard and --tp
    logits_chunk_tokens = None  # (the memory plan) log-probs of a whole forward at once
    dp_shard: int = -1
    """FSDP2 shard degree (-1: what the world size leaves after tp)."""
    tp: int = 1
    """Tensor-parallel degree of the trainer."""

    def check(self, run) -> None:
        from rollpacker.backends.titan.trainer import titan_import_error

        problem = titan_import_error()  # e.g. torch 2.11: fail now, not after the model loads
        if problem is not None:
            raise ConfigError(problem)

    def build(self, context):
        from rollpacker.backends.titan.trainer import TitanConfig, TitanTrainer

        return TitanTrainer(TitanConfig(**common_options(context), dp_shard=self.dp_shard, tp=self.tp))


@frozen(kw_only=True)
class TorchTrainerOptions:
    """--trainer torch: plain PyTorch on the HF model, FSDP2 over every rank under --nproc."""

    flat = True  # no options of its own
    logits_chunk_tokens = LOGITS_CHUNK_TOKENS  # (the memory plan) log-probs chunk by chunk

    def check(self, run) -> None:
        if run.tp != 1 or run.dp_shard not in (-1, run.nproc):
            raise ConfigError(f"--trainer torch shards over all --nproc ranks with FSDP2 only; got --tp {run.tp} "
                              f"--dp-shard {run.dp_shard} (use --trainer titan for tensor parallelism)")

    def build(self, context):
        from rollpacker.backends.trainer.pytorch import TorchTrainer, TorchTrainerConfig

        return TorchTrainer(TorchTrainerConfig(**common_options(context)))
