"""`RollpackerGRPOTrainer`: TRL's GRPOTrainer whose steps train what rollpacker's rounds trained.

The `rollout_func` hook must answer for exactly the rows it is given, so a policy that trains a
prompt in a later step than TRL's sampler drew it (tail batching's deferral, SortedRL's loaded
batches) needs two overrides, and nothing else of TRL changes:

- `_get_train_sampler` wraps TRL's own sampler: when an epoch starts, the order it drew is recorded
  (`EpochFeed`), and that order, not the core's, is what the rounds walk (`rounds.fed_state`);
- `_generate_and_score_completions` plays the step's round first and hands TRL the rows of the
  prompts it trained (dataset rows, as TRL's dataloader gives them) instead of the sampler's batch;
  TRL then scores, computes advantages and the loss as for its own generation, and its rollout_func
  call gets the round's completions.

A round trains P = per_device_train_batch_size / num_generations prompts whatever the policy, and an
epoch's keys run out exactly at its last step (tail batching plays its long queue once the epoch's
last fresh prompts are drawn), so every prompt TRL's sampler drew in an epoch is trained exactly
once in that epoch's steps: in the step that drew it, or later (`rollout.trained` lists them).
Evaluation goes through the plain hook: a sync round over the eval batch.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.data import Sampler
from trl import GRPOTrainer

from rollpacker.core import PromptKey
from rollpacker.core.planner import RoundPlanner
from rollpacker.core.round_state import PlannerState

from .rollout import TrlRollout, answer, distinct_prompts, tokenize
from .rounds import fed_state, initial_state
from .settings import RolloutSettings, TrlUnsupported, check_args


class EpochFeed:
    """TRL's epochs as its sampler drew them: each epoch's dataset rows once, in order."""

    def __init__(self, num_generations: int) -> None:
        self.num_generations = num_generations
        self.orders: list[tuple[int, ...]] = []
        self.dataset = None
        """The dataset TRL's dataloader reads (its unused columns removed as TRL removes them)."""
        self.fed = 0

    def record(self, dataset, indices: list[int]) -> None:
        self.dataset = dataset
        self.orders.append(tuple(distinct_prompts(indices, self.num_generations)))

    def feed(self, state: PlannerState) -> PlannerState:
        """`state` with the next epoch's keys fed once the previous epoch's are all trained."""
        pool = state.pool
        drained = not (pool.in_flight or pool.deferred or pool.returned or state.loaded)
        if drained and self.fed < len(self.orders):
            keys = [PromptKey(self.fed, i) for i in self.orders[self.fed]]
            state, self.fed = fed_state(state, self.fed, keys), self.fed + 1
        return state


class RecordingSampler(Sampler):
    """TRL's sampler, unchanged, telling `on_epoch` each epoch's whole order when the epoch begins."""

    def __init__(self, inner: Sampler, on_epoch: Callable[[list[int]], None]) -> None:
        self.inner = inner
        self.on_epoch = on_epoch

    def __iter__(self):
        order = list(self.inner)
        self.on_epoch(order)
        return iter(order)

    def __len__(self) -> int:
        return len(self.inner)


class RollpackerGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with rollpacker's scheduling: `rollout=RolloutSettings(policy="tail", ...)`.

    Every other argument is GRPOTrainer's; `args` is required and checked (`settings.check_args`)
    before the model loads.  `self.rollpacker` is the rollout (its `rounds` and `trained` keys)."""

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, *,
                 rollout: RolloutSettings | None = None, **kwargs) -> None:
        settings = rollout if rollout is not None else RolloutSettings()
        check_trainer(args, train_dataset, kwargs, settings)
        self.rollpacker = TrlRollout(settings)
        self.rollpacker.checked = True
        self._feed = EpochFeed(args.num_generations)
        self._planner: RoundPlanner | None = None
        self._round_state: PlannerState | None = None
        self._prompt_cache: dict[int, list[int]] = {}
        super().__init__(model, reward_funcs, args, train_dataset, rollout_func=self.rollpacker, **kwargs)

    def _get_train_sampler(self, dataset=None) -> Sampler:
        dataset = self.train_dataset if dataset is None else dataset
        return RecordingSampler(super()._get_train_sampler(dataset), lambda order: self._feed.record(dataset, order))

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        return super()._generate_and_score_completions(self._play_step())

    def _play_step(self) -> list[dict]:
        """Play this step's round; the dataset rows of the prompts it trained, each repeated R times."""
        if self._planner is None:
            prompts = self.args.per_device_train_batch_size // self.num_generations
            policy = self.rollpacker.settings.build_policy(prompts, self.num_generations, self.max_completion_length)
            self._planner = RoundPlanner(policy)
            self._round_state = initial_state(len(self._feed.dataset), self.args.seed)
        state = self._feed.feed(self._round_state)
        self._round_state, played = self.rollpacker.play(self, self._planner, state, self._prompt_ids)
        self.rollpacker.pending = answer([(self._prompt_ids(key), group) for key, group in played.groups])
        return [self._feed.dataset[key.index] for key, group in played.groups for _ in group]

    def _prompt_ids(self, key: PromptKey) -> list[int]:
        ids = self._prompt_cache.get(key.index)
        if ids is None:
            ids = self._prompt_cache[key.index] = tokenize(self, [self._feed.dataset[key.index]["prompt"]])[0]
        return ids

    def close_rollout(self) -> None:
        """Stop the rollout engine (the embedded engine's thread; SGLang servers are the caller's)."""
        self.rollpacker.close()


def check_trainer(args, train_dataset, kwargs: dict, settings: RolloutSettings) -> None:
    """What RollpackerGRPOTrainer cannot do, refused before TRL loads anything."""
    if args is None:
        raise TrlUnsupported("RollpackerGRPOTrainer needs args=GRPOConfig(...) (its batch sizes are checked first)")
    for name, why in (("rollout_func", "the trainer's rollout is rollpacker's"),
                      ("tools", "tool calls run inside TRL's own generation"),
                      ("environment_factory", "environments run inside TRL's own generation"),
                      ("peft_config", "the engine takes full model weights, not an adapter")):
        if kwargs.get(name) is not None:
            raise TrlUnsupported(f"RollpackerGRPOTrainer: {name} is not supported ({why})")
    if train_dataset is None or not hasattr(train_dataset, "__getitem__") or not hasattr(train_dataset, "__len__"):
        raise TrlUnsupported("RollpackerGRPOTrainer needs a map-style train_dataset (a datasets.Dataset): deferred "
                             "prompts are read back by index; an IterableDataset cannot be")
    columns = set(getattr(train_dataset, "column_names", None) or ())
    if columns & {"image", "images"}:
        raise TrlUnsupported("RollpackerGRPOTrainer: image columns are not supported (text prompts only)")
    check_args(args, world_size=args.world_size, hooked=False, settings=settings)
