"""Token counts of decoded text (tier 1 dumps hold text, EOS stripped): a tokenizer the user names
(`--tokenizer`: a local directory, or a name already in the local Hugging Face cache; nothing is
downloaded), else the default model's (SmolLM2-135M-Instruct, rollpacker/backends/models.py).
transformers is imported here only, when a dump holds text."""

from __future__ import annotations

from pathlib import Path

from .records import AdviseError

CHUNK = 256


def load_tokenizer(name: str | None):
    """(tokenizer, its name for the report)."""
    from transformers import AutoTokenizer

    from rollpacker.backends.models import ModelError, default_gguf_path, default_model_path, is_converted

    if name is None:
        local = default_model_path()
        try:
            if is_converted(local):
                return AutoTokenizer.from_pretrained(local), f"{local.name} (the default; --tokenizer for your model's)"
            gguf = default_gguf_path()
            return (AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name),
                    "SmolLM2-135M-Instruct (the default; --tokenizer for your model's)")
        except ModelError as exc:
            raise AdviseError(f"the log holds text and no tokenizer was named: pass --tokenizer DIR (your model's "
                              f"tokenizer directory); the default's failed: {exc}") from None
    where = Path(name).expanduser()
    try:
        if where.is_dir():
            return AutoTokenizer.from_pretrained(where), name
        return AutoTokenizer.from_pretrained(name, local_files_only=True), name
    except (OSError, ValueError, TypeError) as exc:
        raise AdviseError(f"--tokenizer {name!r}: cannot load a tokenizer ({str(exc).splitlines()[0][:120]}); "
                          f"pass a local directory holding tokenizer.json or tokenizer_config.json (nothing is "
                          f"downloaded)") from None


def count_tokens(tokenizer, texts: list[str], progress=None) -> list[int]:
    """Tokens of each text, without special tokens (batched)."""
    counts: list[int] = []
    for start in range(0, len(texts), CHUNK):
        chunk = texts[start:start + CHUNK]
        counts.extend(len(ids) for ids in tokenizer(chunk, add_special_tokens=False)["input_ids"])
        if progress is not None:
            progress.update(len(chunk))
    return counts
