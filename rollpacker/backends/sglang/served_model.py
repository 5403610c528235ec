"""Whether a server serves the model a trainer will sync into it, asked before any weight moves.

A server is taken when its /model_info names the expected model (the same path, or the same final
component: a server on another node may mount it elsewhere), or when both configs can be read here
and agree on every shape the weights have (a checkpoint of the same model: the trainer's weights
replace the server's at the first sync).  Anything else is one line naming both models: a sync into
another model would fail half way (shape mismatch) and leave the server with partly overwritten
weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SHAPE_KEYS = ("architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "tie_word_embeddings")
"""config.json fields that decide the weights' names and shapes."""


def model_mismatch(expected: str, info: dict) -> str | None:
    """None when the server of `info` (its /model_info) serves `expected`; else why not, naming both."""
    reported = [str(info[key]) for key in ("model_path", "tokenizer_path") if info.get(key)]
    if any(_same_name(expected, r) for r in reported):
        return None
    ours = _config(expected)
    for path in reported:
        theirs = _config(path)
        if ours is not None and theirs is not None:
            differ = [k for k in SHAPE_KEYS if ours.get(k) != theirs.get(k)]
            if not differ:
                return None
            return (f"serves model {path!r}, not the expected {expected!r}: " +
                    ", ".join(f"{k} {theirs.get(k)!r} (expected {ours.get(k)!r})" for k in differ[:3]))
    return (f"serves model {info.get('model_path')!r}, not the expected {expected!r} (and its config.json cannot be "
            f"read here to compare the shapes): start the server with the expected model")


def _same_name(expected: str, reported: str) -> bool:
    norm = lambda p: os.path.normpath(p.rstrip("/"))  # noqa: E731
    return norm(expected) == norm(reported) or os.path.basename(norm(expected)) == os.path.basename(norm(reported))


def _config(directory: str) -> dict | None:
    try:
        return json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return None
