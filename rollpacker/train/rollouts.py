"""The built-in rollout engines of the reference trainer, as registry entries (rollpacker.train.registry):
`embedded` (the engine in this process) and `sglang` (running servers).  Each config holds the
engine's options, checks them by flag, and builds the engine."""

from __future__ import annotations

from attrs import field, frozen

from rollpacker.core.errors import ConfigError

from .flag_checks import at_least


@frozen(kw_only=True)
class EmbeddedRollout:
    """--rollout embedded: rollpacker's engine, in this process, on the trainer's device."""

    flat = True  # the options are the top-level flags --engine-capacity, --spec-max-rows, ...
    starts_with_the_model = True  # built from the trainer's initial weights: nothing to sync first
    engine_in_process = True  # (the memory plan) its weights, KV cache and graphs share the trainer's device
    engine_capacity: int = field(default=32, validator=at_least(1))
    """Embedded engine: most sequences decoded at once."""
    spec_max_rows: int | None = None
    """Embedded engine: speculative decoding (drafts from the request's own text and its sibling
    samples', verified losslessly) when at most this many rows run; 0 turns it off; default: 4 on
    CUDA, off on CPU (measured no faster there)."""
    spec_tokens: int = 4
    """Embedded engine: draft tokens per row and verify step."""
    cuda_graphs: bool = True
    """Embedded engine on CUDA: replay decode steps as CUDA graphs, every one captured when the engine
    starts (before the first step; the step records' graph_capture_s); --no-cuda-graphs decodes
    eagerly.  No effect on CPU."""

    def __attrs_post_init__(self) -> None:
        if (self.spec_max_rows or 0) < 0 or self.spec_tokens < 1:
            raise ConfigError(f"--spec-max-rows must be >= 0 and --spec-tokens >= 1, got "
                              f"{self.spec_max_rows} and {self.spec_tokens}")

    def engine_options(self, kv_tokens_per_row: int) -> dict:
        """The embedded engine's keyword arguments (the model, seed and device aside)."""
        return dict(capacity=self.engine_capacity, spec_max_rows=self.spec_max_rows, spec_tokens=self.spec_tokens,
                    kv_tokens_per_row=kv_tokens_per_row or None, cuda_graphs=None if self.cuda_graphs else False)

    def build(self, context):
        from rollpacker.backends.embedded.engine import EmbeddedEngine

        return EmbeddedEngine(context.model, seed=context.run.seed, device=context.device,
                              **self.engine_options(context.memory_plan.kv_tokens_per_row))


def _urls(instance, attribute, value) -> None:
    if not value:
        raise ConfigError("--rollout sglang needs --sglang-urls URL [URL ...]")
    for url in value:
        _check_url(url)


def _weight_sync(instance, attribute, mode) -> None:
    if mode is not None and mode != "nccl" and not (mode.startswith("disk:") and mode[len("disk:"):]):
        raise ConfigError(f"--weight-sync must be nccl or disk:DIR (a directory every server can read), "
                          f"got {mode!r}")


@frozen(kw_only=True)
class SGLangRollout:
    """--rollout sglang: running SGLang (or `rollpacker serve`) servers, weights sent each step."""

    flat = True  # the options are the top-level flags --sglang-urls, --weight-sync, ...
    starts_with_the_model = False  # the servers hold whatever they were given last (another run's weights)
    engine_in_process = False  # (the memory plan) the servers hold their own memory
    sglang_urls: tuple[str, ...] = field(default=(), validator=_urls)
    """URLs of running SGLang (or `rollpacker serve`) servers, for --rollout sglang."""
    weight_sync: str | None = field(default=None, validator=_weight_sync)
    """--rollout sglang: how each step's weights reach the servers.  nccl: broadcast from trainer rank 0
    in buckets over SGLang's /update_weights_from_distributed (gloo when the trainer is on CPU, which
    rollpacker serve and real SGLang 0.5.23 on a CPU accept); disk:DIR: safetensors written under DIR, a directory every server
    can read (a shared filesystem across nodes), then /update_weights_from_disk; DIR keeps the newest
    step's copy only (one model's weights; a restarted server can load it).  Default: disk through a
    temporary folder on this machine, refused when a server is on another host."""
    weight_sync_bucket_mb: int = field(default=512, validator=at_least(1))
    """--weight-sync nccl: most megabytes per bucket (one /update_weights_from_distributed call; the
    trainer holds one bucket on its device beyond its shard, each server one beyond its weights)."""

    def __attrs_post_init__(self) -> None:
        remote = [u for u in self.sglang_urls if not _is_this_machine(u)]
        if self.weight_sync is None and remote:
            raise ConfigError(f"--sglang-urls {remote[0]} is not on this machine, so it cannot read weights "
                              f"from a temporary folder here: pass --weight-sync nccl, or --weight-sync disk:DIR "
                              f"with a directory every server can read")

    @property
    def weights_dir(self) -> str | None:
        """The directory of --weight-sync disk:DIR (None otherwise)."""
        mode = self.weight_sync or ""
        return mode[len("disk:"):] if mode.startswith("disk:") else None

    def check_weights_dir(self) -> None:
        """disk:DIR can be written (made when missing, but not its parent: a DIR on a shared filesystem
        that is not mounted must not land on the local disk): one line naming the flag otherwise."""
        from pathlib import Path

        from .outputs import writable_dir

        if self.weights_dir is not None:
            writable_dir(Path(self.weights_dir), f"--weight-sync {self.weight_sync}", parents=False)

    def build(self, context):
        from rollpacker.backends.sglang.client import SGLangEngine

        if self.weights_dir is not None:
            print(f"--weight-sync {self.weight_sync}: each step's weights are written there as safetensors; "
                  f"only the newest copy is kept (one model's weights)", flush=True)
        engine = SGLangEngine(list(self.sglang_urls), model_config_dir=context.model_dir, weights_dir=self.weights_dir,
                              expected_model=str(context.model_dir))  # another model: one line, no weight moved
        if self.weight_sync == "nccl":
            import torch

            engine.use_distributed_sync(backend="nccl" if context.device == "cuda" else "gloo",
                                        bucket_bytes=self.weight_sync_bucket_mb * 2**20,
                                        dtype=getattr(torch, context.run.dtype))
        return engine


def _is_this_machine(url: str) -> bool:
    """A loopback address or this host's own name (no DNS lookup: validation must not hang)."""
    import socket
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1", socket.gethostname().lower()) or host.startswith("127.")


def _check_url(url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--sglang-urls: {url!r} is not a server URL like http://127.0.0.1:30000")
