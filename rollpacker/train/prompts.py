"""The run's prompts: its rows rendered with the model's chat template, as `StepLoop` sees them
(`RowPrompts`), for the training set and the held-out one alike."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import RewardJob
from rollpacker.train.config import RunConfig


class RowPrompts:
    """The dataset as `StepLoop` sees it: `PromptRow`s (reasoning-gym problems or the --dataset file)
    with their prompts rendered by the chat template; a reward job carries the row's data_source,
    ground truth and extra_info to the scorer."""

    def __init__(self, rows, prompt_ids, tokenizer, deadline_s: float) -> None:
        self.rows = rows
        self.tokenizer = tokenizer
        self.deadline_s = deadline_s
        self._ids = prompt_ids

    def __len__(self) -> int:
        return len(self.rows)

    def prompt_ids(self, index: int) -> tuple[int, ...]:
        return self._ids[index]

    def reward_job(self, request_id: str, index: int, response_ids: Sequence[int]) -> RewardJob:
        row = self.rows[index]
        text = self.tokenizer.decode(list(response_ids), skip_special_tokens=True)
        entry = {"ground_truth": row.ground_truth, "extra_info": row.extra_info}
        return RewardJob(request_id, row.data_source, entry, text, self.deadline_s)


def question(row) -> str:
    """The text a row asks: what makes two problems the same."""
    return row.messages[0]["content"]


def without_held_out(rows: Sequence, held_out: Sequence) -> list:
    """`rows` less those asking a held-out question (the training set of a run with --eval-every)."""
    held = {question(row) for row in held_out}
    return [row for row in rows if question(row) not in held]


def load_prompts(config: RunConfig, model_dir: Path, held_out: Sequence = ()) -> RowPrompts:
    """The run's rows rendered with the model's tokenizer (loaded alone: the weights are not read
    yet), each checked against the context, less those asking a `held_out` question; prints what was
    read and anything skipped or left out."""
    from transformers import AutoTokenizer

    from rollpacker.backends.models import read_config_json
    from rollpacker.backends.data.rows import render_rows

    rows = config.load_rows()
    if held_out:
        trained = without_held_out(rows, held_out)
        print(f"held-out set: {len(held_out)} problems (the same for every --seed and --policy of these tasks); "
              f"{len(rows) - len(trained)} of the {len(rows)} training problems ask one of them and are left out",
              flush=True)
        rows = trained
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    context = read_config_json(model_dir).get("max_position_embeddings")
    kept, ids, skipped = render_rows(rows, tokenizer, context=context, max_tokens=config.max_tokens,
                                     skip_long=config.skip_long_rows)
    if config.dataset is not None:
        line = f"dataset {config.dataset}: {len(rows)} rows, reward {config.reward_name()}"
        if skipped:
            shown = ", ".join(w.rpartition(" row ")[2] for w in skipped[:10]) + (", ..." if len(skipped) > 10 else "")
            line += f"; {len(skipped)} skipped (prompt + --max-tokens {config.max_tokens} over the context of " \
                    f"{context}: rows {shown})"
        print(line, flush=True)
    if config.prompts > len(kept):
        raise ConfigError(f"--prompts ({config.prompts}) is larger than the {len(kept)} rows of --dataset "
                          f"{config.dataset} that fit the context")
    return RowPrompts(kept, ids, tokenizer, config.reward_deadline_s)
