"""rollpacker's rollout for one TRL GRPOTrainer: the engine, the weight sync, the rounds.

`TrlRollout` is a `rollout_func` (TRL calls it with the step's prompts, each repeated
`num_generations` times in a row, and the trainer).  Given to a plain `GRPOTrainer` it plays one
round of a policy that trains exactly the prompts it is given (sync, oversample) and answers for
them; inside `RollpackerGRPOTrainer` it plays the round the trainer's epoch feed asks for, and the
trainer hands TRL the rows of the prompts that round trained (`TrainerRounds`).

Before each round the trainer's weights go to the engine when TRL stepped since the last sync
(`driver.live.sync_weights`: pause, update, resume).  The engine is built on first use: the
embedded engine over a copy of the trainer's model, or `SGLangEngine` over the settings' URLs.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence

from rollpacker.core import PromptKey, SyncPolicy, TailPolicy
from rollpacker.core.errors import SchedulerMisuse
from rollpacker.core.planner import RoundPlanner
from rollpacker.core.policies.policy_base import over
from rollpacker.core.round_state import PlannerState
from rollpacker.driver.live import sync_weights

from .rounds import PlayedRound, RoundRunner, fed_state, initial_state
from .settings import RolloutSettings, Sampling, check_args


class ModelWeights:
    """TRL's model as the trainer `sync_weights` reads: its HF-named tensors."""

    def __init__(self, model) -> None:
        self.model = model

    def export_weights(self) -> dict:
        """One tensor per parameter: with tied embeddings the shared matrix once, as
        model.embed_tokens.weight (a safetensors file refuses two names for one storage)."""
        return {name: t.detach() for name, t in self.model.named_parameters()}

    def named_weights(self):
        yield from self.export_weights().items()


def round_requests(policy) -> int:
    """The most requests one round of `policy` launches at once."""
    if isinstance(policy, TailPolicy):
        most = over(policy.prompts, policy.eta_prompts) * over(policy.samples, policy.eta_responses)
    else:
        most = policy.prompts * policy.samples
    return min(most, policy.capacity) if policy.capacity else most


class TrlRollout:
    """The `rollout_func` of a GRPOTrainer (see the module's docstring)."""

    def __init__(self, settings: RolloutSettings | None = None) -> None:
        self.settings = settings or RolloutSettings(policy="sync")
        self.runner: RoundRunner | None = None
        self.synced_step: int | None = None
        self.rounds: list[PlayedRound] = []
        """Every training round played, in order."""
        self.trained: list[PromptKey] = []
        """Every prompt key trained, in order (a key is (TRL epoch, dataset row) inside
        RollpackerGRPOTrainer, (call, position) through the plain hook)."""
        self.pending: dict | None = None
        """RollpackerGRPOTrainer: the answer for the rows it hands TRL next."""
        self.checked = False
        """TRL's arguments were checked (RollpackerGRPOTrainer checks them before loading the model)."""
        self._calls = 0

    # -- rollout_func -----------------------------------------------------------------------------

    def __call__(self, prompts: list, trainer) -> dict:
        if self.pending is not None and trainer.model.training:
            answer, self.pending = self.pending, None
            if len(answer["prompt_ids"]) != len(prompts):
                raise SchedulerMisuse(f"rollout_func: TRL asked for {len(prompts)} rows, the round trained "
                                      f"{len(answer['prompt_ids'])}")
            return answer
        return self.hooked_round(prompts, trainer)

    def hooked_round(self, prompts: list, trainer) -> dict:
        """The plain hook (and evaluation): one round over exactly these prompts."""
        training = trainer.model.training
        if not self.checked:
            check_args(trainer.args, world_size=trainer.accelerator.num_processes, hooked=True,
                       settings=self.settings)
            self.checked = True
        g = trainer.num_generations if training else trainer.num_generations_eval
        unique = distinct_prompts(prompts, g)
        length = trainer.max_completion_length
        policy = (self.settings.build_policy(len(unique), g, length) if training
                  else SyncPolicy(prompts=len(unique), samples=g, max_tokens=length))
        ids = tokenize(trainer, unique)
        call, self._calls = self._calls, self._calls + 1
        keys = [PromptKey(call, i) for i in range(len(unique))]
        state = fed_state(initial_state(len(unique), trainer.args.seed), call, keys)
        _, played = self.play(trainer, RoundPlanner(policy), state, lambda k: ids[k.index], record=training)
        if sorted(k for k, _ in played.groups) != keys:
            raise SchedulerMisuse(f"policy {self.settings.policy!r} trained other prompts than the step's")
        by_key = dict(played.groups)
        return answer([(ids[k.index], by_key[k]) for k in keys])

    # -- rounds -----------------------------------------------------------------------------------

    def play(self, trainer, planner: RoundPlanner, state: PlannerState, prompt_ids: Callable[[PromptKey], Sequence[int]],
             *, record: bool = True) -> tuple[PlannerState, PlayedRound]:
        """One round on the engine (built and synced first); logged in TRL's metrics when `record`."""
        if self.runner is None:
            engine = build_engine(self.settings, trainer, round_requests(planner.policy))
            self.runner = RoundRunner(engine, Sampling.of(trainer), self.settings.poll_s)
        self.sync(trainer)
        state, played = self.runner.play(planner, state, prompt_ids)
        if record:
            self.rounds.append(played)
            self.trained.extend(k for k, _ in played.groups)
            log_round(trainer, played, state)
        return state, played

    def sync(self, trainer) -> None:
        """The trainer's weights to the engine, once per optimizer step (and before the first round)."""
        step = trainer.state.global_step
        if step != self.synced_step:
            model = trainer.accelerator.unwrap_model(trainer.model)
            sync_weights(self.runner.engine, ModelWeights(model), version=step)
            self.synced_step = step

    def close(self) -> None:
        if self.runner is not None:
            self.runner.engine.close()
            self.runner = None


def distinct_prompts(prompts: list, g: int) -> list:
    """The step's prompts once each: TRL repeats each `g` times in a row."""
    if len(prompts) % g:
        raise SchedulerMisuse(f"rollout_func got {len(prompts)} rows, not a multiple of num_generations={g}")
    unique = prompts[::g]
    if any(prompts[i] != unique[i // g] for i in range(len(prompts))):
        raise SchedulerMisuse(f"rollout_func: the rows are not each prompt repeated num_generations={g} times in a row")
    return unique


def tokenize(trainer, prompts: list) -> list[list[int]]:
    """Prompt token ids exactly as TRL's own generation makes them (chat template and all)."""
    return [list(ids) for ids in trainer._tokenize_prompts(prompts)[0]]


def answer(groups: Sequence[tuple[Sequence[int], Sequence]]) -> dict:
    """The rollout_func answer: a row per response, each prompt's R responses in a row."""
    rows = [(list(prompt), c) for prompt, completions in groups for c in completions]
    return {"prompt_ids": [p for p, _ in rows], "completion_ids": [list(c.token_ids) for _, c in rows],
            "logprobs": [list(c.logprobs) for _, c in rows]}


def log_round(trainer, played: PlayedRound, state: PlannerState) -> None:
    """The round's accounting among TRL's logged metrics (averaged over the logging steps)."""
    metrics = trainer._metrics["train"]
    report = played.report
    for name, value in (("long_round", float(played.kind == "long")), ("rollout_s", played.seconds),
                        ("deferred_prompts", report.deferred_prompts), ("long_queue", len(state.pool.deferred)),
                        ("wasted_tokens", report.wasted_tokens), ("mean_kept_length", report.mean_kept_length),
                        ("mean_generated_length", report.mean_generated_length)):
        metrics[f"rollpacker/{name}"].append(float(value))


def build_engine(settings: RolloutSettings, trainer, requests: int):
    """SGLang servers at the settings' URLs, or the embedded engine over a copy of the model."""
    if settings.sglang_urls:
        from rollpacker.backends.sglang.client import SGLangEngine

        # the model's own directory: the servers must serve it (checked before any weight moves), and
        # real SGLang reloads a whole directory (config files beside the synced tensors)
        source = str(getattr(trainer.accelerator.unwrap_model(trainer.model).config, "_name_or_path", "") or "")
        local = source if source and os.path.isfile(os.path.join(source, "config.json")) else None
        return SGLangEngine(list(settings.sglang_urls), expected_model=local, model_config_dir=local)
    from rollpacker.backends.embedded.engine import EmbeddedEngine

    model = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).eval()
    return EmbeddedEngine(model, capacity=settings.engine_capacity or requests, seed=trainer.args.seed,
                          device=str(next(model.parameters()).device))
