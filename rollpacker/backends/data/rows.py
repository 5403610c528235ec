"""PromptRow: one training prompt, whatever it came from (a reasoning-gym task or the user's file).

A row is what veRL's RL data holds per example: chat `messages`, a `data_source` naming where it
came from, the `ground_truth` the reward compares against and free-form `extra_info`.  The reward
workers get the last three; the engine gets the messages rendered by the model's chat template.
`where` says where the row came from ("data.parquet row 7") so an error about it can name it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attrs import frozen

from rollpacker.core.errors import ConfigError


@frozen
class PromptRow:
    messages: tuple[Mapping[str, str], ...]
    """The prompt as chat messages ({"role": ..., "content": ...}), rendered by the chat template."""
    data_source: str
    """Where the example comes from (veRL's `data_source`; the task name for reasoning-gym)."""
    ground_truth: Any
    """What the reward compares the response against (veRL's `reward_model.ground_truth`)."""
    extra_info: Mapping[str, Any]
    """Anything else the reward function may use (veRL's `extra_info`)."""
    where: str
    """File and row (or task and index), for error messages."""


def chat_ids(tokenizer, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Prompt token ids: `messages` in the model's chat template, ready for the assistant's turn."""
    ids = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding regardless
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def render_rows(rows: Sequence[PromptRow], tokenizer, *, context: int | None, max_tokens: int,
                skip_long: bool) -> tuple[list[PromptRow], list[tuple[int, ...]], list[str]]:
    """(kept rows, their prompt ids, where each skipped row was).  A prompt whose tokens plus
    `max_tokens` do not fit `context` is an error naming its row, or skipped when `skip_long`."""
    kept, ids, skipped = [], [], []
    for row in rows:
        tokens = tuple(chat_ids(tokenizer, row.messages))
        if context is not None and len(tokens) + max_tokens > context:
            if not skip_long:
                raise ConfigError(f"{row.where}: key prompt is {len(tokens)} tokens, which with --max-tokens "
                                  f"{max_tokens} exceeds the model's context of {context}; shorten it, lower "
                                  f"--max-tokens, or pass --skip-long-rows")
            skipped.append(row.where)
            continue
        kept.append(row)
        ids.append(tokens)
    return kept, ids, skipped
