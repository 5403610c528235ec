"""Configuration of the TorchTitan trainer (no torch import: the driver can build and check it)."""

from __future__ import annotations

from attrs import field, frozen

from rollpacker.backends.trainer.config import TrainerConfig
from rollpacker.core.errors import ConfigError


def _degree(instance, attribute, value) -> None:
    if not isinstance(value, int) or (value < 1 and not (attribute.name == "dp_shard" and value == -1)):
        raise ConfigError(f"TitanConfig.{attribute.name} must be an int >= 1 (dp_shard may be -1), got {value!r}")


@frozen(kw_only=True)
class TitanConfig(TrainerConfig):
    """Everything the TorchTitan trainer needs; one instance per rank, identical on all ranks.
    The optimizer, loss, dtype, seed and device fields are TrainerConfig's."""

    dp_shard: int = field(default=-1, validator=_degree)
    """FSDP2 shard degree; -1 takes whatever the world size leaves after tp."""
    tp: int = field(default=1, validator=_degree)
    """Tensor-parallel degree; must divide the number of attention and key/value heads."""
    sequence_parallel: bool = True
    """With tp > 1, shard activations along the sequence between TP regions (sequences are
    padded to a multiple of tp)."""
    max_seq_len: int | None = None
    """RoPE cache length; None: the checkpoint's max_position_embeddings."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise ConfigError(f"TitanConfig.max_seq_len must be >= 1, got {self.max_seq_len!r}")
