"""The simulator as a driver backend: the core's commands run against simulated instances, reward
workers and trainer, which report the events they produce, exactly as a real backend does; the
same `rollpacker.driver.Driver` runs it, on a `VirtualClock` that only the simulator moves.

    sim = Simulation(SimConfig(policy="tail", max_tokens=32768, instances=16, tp=4, model="qwen2.5-32b"))
    result = sim.run()        # {"config": {...}, "steps": [...], "total": {...}}

Event sources, all on one heap keyed by time: instance wake-ups (a request reaches its length, or the
KV pool fills), launches reaching their instance and answers on their way back (an engine profile's latencies),
scorer answers and reward deadlines.  Answers that happen "now" go through an inbox drained before
the clock moves.  Training is a single resource whose busy time is computed as micro-batches arrive;
it holds the optimizer step.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Sequence

from rollpacker.core import BatcherConfig, EpochLedger, Scheduler, TpRule, commands, events
from rollpacker.core.cost_model import CostModel
from rollpacker.core.errors import ConfigError
from rollpacker.core.records import PromptKey
from rollpacker.core.tp_planner import check_tp
from rollpacker.driver import DeadlinePassed, Driver, HedgeDue, Input, NoticeObserver, ScorerAnswered, StepBegun, VirtualClock

from .config import SimConfig
from .constants import MODELS, SimConstants
from .engine import Instance, SimRequest, redispatch
from .floor import engine_floor, profile_floor
from .metrics import StepMeter, epoch_step_cap, epoch_totals, totals
from .siblings import SiblingTexts
from .stages import RewardModel, TrainModel
from .workloads import MAX_PROMPT_TOKENS, Workload, load_workload

WAKE, SCORED, DEADLINE, HEDGE, ANSWERED, ARRIVED = range(6)


class Simulation(NoticeObserver):
    def __init__(self, config: SimConfig, constants: SimConstants | None = None,
                 record_timeline: bool = False, workload: Workload | None = None,
                 batcher: BatcherConfig | None = None) -> None:
        """`workload` (default: the config's, loaded) and `batcher` (default: the core's defaults) let a
        caller simulate exactly what a real run replayed (benchmarks/sim_vs_real.py)."""
        self.config = config
        self.constants = c = constants or SimConstants()
        self.model = MODELS[config.model]
        self.profile = config.load_profile()
        if self.profile is None:
            check_tp(self.model, c.hardware, config.gpus, config.tp, name="--tp")
        self.policy = config.build_policy()
        dataset = config.dataset_prompts or 16 * config.prompts
        self.workload = workload or load_workload(
            config.workload, num_prompts=dataset, seed=config.seed, max_tokens=config.max_tokens,
            between=config.between, growth=config.growth, scale_from=config.scale_from)
        dataset = max(dataset, self.workload.num_prompts) if config.dataset_prompts is None else dataset
        self.workload.num_prompts = min(self.workload.num_prompts, dataset)
        self.max_context = MAX_PROMPT_TOKENS + config.max_tokens
        self.tp_rule = None if self.profile else TpRule(
            mode=config.tp_mode, tp=config.tp, model=self.model, hardware=c.hardware, gpus=config.gpus,
            mem_fraction=c.engine.mem_fraction, max_context=self.max_context,
            prompt_tokens=tuple(self.workload.prompt_tokens(i) for i in range(self.workload.num_prompts)),
            unseen_length=self.workload.mean_length())
        self.sched = Scheduler(self.policy, num_prompts=self.workload.num_prompts, seed=config.seed,
                               batcher=batcher or BatcherConfig(),
                               rewards=c.reward.scheduler_config(),
                               tp=self.tp_rule, epochs=config.epochs)
        self.reward_model = RewardModel(c.reward, config.seed)
        self.train_model = TrainModel(c.train, self.model, config.gpus, c.train.peak_flops)
        self.max_running = self.profile.max_running if self.profile else c.engine.max_running
        self.floor = profile_floor(self.profile, config.instances) if self.profile else engine_floor(
            self.model, c.hardware, config.gpus, c.engine.mem_fraction, self.max_context, c.engine.max_running, c.spec)
        self.record_timeline = record_timeline
        self._build_instances(config.tp)
        self.clock = VirtualClock()
        self.driver = Driver(self.sched, self, self.clock)
        self.heap, self.seq = [], 0  # (time, seq, kind, payload): the event sources of the module doc
        self.inbox: deque = deque()
        self.where: dict[str, Instance] = {}
        self.live: dict[str, SimRequest] = {}
        self.totals: dict[str, int] = {}  # a sample's trace length, by its first request id (`root`)
        self.root: dict[str, str] = {}
        self.launched_keys: set = set()
        self.trainer_free, self.held_batches = 0.0, []  # (the held TrainMicroBatch commands)
        self.scoring: dict[str, int | bool] = {}
        """A kept sample's prompt index, then (once its scorer ran) whether its answer is correct."""
        self.timelines: dict[int, dict] = {}
        self.siblings = SiblingTexts(config.samples, c.spec.carry_drafts)
        """The round's groups and, with spec.carry_drafts, a pending prompt's texts from earlier rounds."""
        self.step_start = 0.0

    @property
    def now(self) -> float:
        return self.clock.now()

    @property
    def ledger(self) -> EpochLedger:
        return self.driver.ledger

    # -- instances and TP -------------------------------------------------------------------------

    def _build_instances(self, tp: int) -> None:
        e = self.constants.engine
        cost = self.profile.cost() if self.profile else CostModel(
            model=self.model, hardware=self.constants.hardware, tp=tp, mem_fraction=e.mem_fraction)
        if self.profile is None and cost.kv_capacity <= self.max_context:
            raise ConfigError(
                f"{self.model.name} at TP{tp} leaves a KV pool of {max(cost.kv_capacity, 0)} tokens per "
                f"instance, less than one request ({self.max_context} tokens of prompt + --max-tokens); "
                f"raise --tp (feasible here: {self.tp_rule.feasible() or 'none'})"
            )
        self.tp = tp
        self.cost = cost
        self.instances = [Instance(i, cost, self.max_running, e.admit_watermark, spec=self.constants.spec)
                          for i in range(self.config.gpus // tp)]

    # -- the loop ---------------------------------------------------------------------------------

    def _push(self, at: float, kind: int, payload) -> None:
        heapq.heappush(self.heap, (at, self.seq, kind, payload))
        self.seq += 1

    def run_step(self) -> dict:
        """One simulated step, driven by the same Driver as a real run."""
        return self.driver.run_step()

    # (the driver's notices come to the methods NoticeObserver names; a closed group needs nothing:
    # the simulated trainer needs only the micro-batches)

    def begin_step(self, notice: StepBegun) -> None:
        self.step_start = self.now
        self._start_meter(switch=0.0)

    def set_tensor_parallel(self, command: commands.SetTensorParallel) -> None:
        """Rebuild the instances at the new TP before the round's launches; the switch costs `tp_switch_s`,
        except before the run's first launch: the engines start at the first round's TP (starting an
        engine costs the same at any TP, so that is no switch)."""
        self._build_instances(command.tp)
        switch = self.constants.engine.tp_switch_s if self.launched_keys else 0.0
        self.clock.advance_to(self.now + switch)
        self._start_meter(switch)

    def _start_meter(self, switch: float) -> None:
        for inst in self.instances:
            inst.time = max(inst.time, self.now)
            inst.preemptions = inst.busy_s = inst.peak_running = 0
            inst.intervals = [] if self.record_timeline else None
        self.meter = StepMeter(self.now, self.config.bubble_capacity or self.config.prompts * self.config.samples)
        self.meter.tp, self.meter.switch_s = self.tp, switch
        self.dirty: set[int] = set()

    def wait(self) -> list[Input]:
        """Admit work on changed instances; then the next answer due now, or the next heap event's.
        Nothing (the clock where it was) once nothing is left to happen: the driver's `StepStalled`."""
        while True:
            self._settle()
            if self.inbox:
                return [self.inbox.popleft()]
            if not self.heap:
                return []
            at, _, kind, payload = heapq.heappop(self.heap)
            self.clock.advance_to(at)
            inputs = self._fire(kind, payload)
            if inputs:
                return inputs

    def finish_step(self, ledger: EpochLedger, pending: frozenset[PromptKey]) -> dict:
        """The trainer finishes its micro-batches, then steps the optimizer."""
        optimizer_start = max(self.now, self.trainer_free)
        end = optimizer_start + self.constants.train.optimizer_s
        self.trainer_free = end
        record = self.meter.finish(self, self.step_start, optimizer_start, end, ledger, pending)
        self.sched.observe_preemptions(record["preemptions"])
        self.clock.advance_to(end)
        return record

    def _fire(self, kind: int, payload) -> list[Input]:
        if kind == SCORED:
            rid, reward, seconds = payload
            return [ScorerAnswered(rid, reward, seconds=seconds)]
        if kind == DEADLINE:
            return [DeadlinePassed()]
        if kind == HEDGE:
            return [HedgeDue()]
        if kind == ANSWERED:
            return [payload]
        if kind == ARRIVED:  # a launch reached its instance (`cost.launch_s` after it)
            payload.arrive(self.now)
            self.dirty.add(payload.index)
            return []
        inst, version = payload
        if version == inst.version:
            for req in inst.wake(self.now):
                self._ended(req.rid, finished=True)
                self.meter.finished(self.now)
                back = self.now + inst.cost.return_s  # (the engine's row is free now, the driver knows then)
                self._answer(back, events.RequestFinished(req.rid, req.target, req.reason, back))
            self.dirty.add(inst.index)
        return []  # the finished requests are answered from the inbox, one per wait

    def _settle(self) -> None:
        """Admit waiting work on changed instances and schedule their next wake-up."""
        while self.constants.engine.redispatch and self.dirty and (move := redispatch(self.instances)):
            self._move(*move)
        for index in self.dirty:
            inst = self.instances[index]
            inst.advance_to(self.now)
            inst.admit()
            inst.spec_share = self._finished_share(inst)
            inst.version += 1
            at = inst.next_event_time()
            if at is not None:
                self._push(at, WAKE, (inst, inst.version))
        if self.dirty:
            self.meter.occupancy(self.now, sum(i.batch for i in self.instances), self.instances)
        self.dirty = set()

    def _finished_share(self, inst: Instance) -> float:
        """Mean share of finished siblings over the instance's running requests, when it may speculate."""
        spec = self.constants.spec
        if not spec.enabled or not 0 < inst.batch <= spec.max_rows:
            return 0.0
        return sum(self.siblings.share(rid) for rid in inst.running) / inst.batch

    def _ended(self, rid: str, finished: bool) -> None:
        inst = self.where.pop(rid)
        req = self.live.pop(rid)
        self.meter.request_ended(req)
        for sibling in self.siblings.ended(rid, finished):  # their drafter has more to copy from: a new segment
            where = self.where[sibling]
            if where is not inst and where.batch <= self.constants.spec.max_rows:
                self.dirty.add(where.index)

    # -- commands ---------------------------------------------------------------------------------

    def launch(self, launches: Sequence[commands.LaunchRequest]) -> None:
        for cmd in launches:
            self._launch(cmd)
        self._isolate_longest([cmd.request_id for cmd in launches])

    def _isolate_longest(self, rids: list[str]) -> None:
        """`engine.oracle_isolate` = M (measurement only): the batch's M longest requests by true length
        each get one of the first M instances to themselves; the batch's others there move to the rest."""
        m = self.constants.engine.oracle_isolate
        if not m or len(rids) <= len(self.instances) or m >= len(self.instances):
            return
        top = sorted(rids, key=lambda rid: -self.live[rid].target)[:m]
        reserved, others = self.instances[:m], self.instances[m:]
        for rid, inst in [(rid, self.where[rid]) for rid in rids if rid not in top and self.where[rid] in reserved]:
            self._move(rid, inst, min(others, key=self._placement_key))
        for rid, inst in zip(top, reserved):
            for other in [r.rid for r in (*inst.running.values(), *inst.waiting) if r.rid != rid]:
                self._move(other, inst, min(others, key=self._placement_key))
            self._move(rid, self.where[rid], inst)

    def _move(self, rid: str, source: Instance, to: Instance) -> None:
        """Take `rid` off `source` and queue it on `to` (its generated tokens are prefilled there again)."""
        if source is to:
            return
        req = source.remove(rid, self.now)
        to.submit(req, self.now)
        self.where[rid] = to
        self.dirty |= {source.index, to.index}

    def abort(self, request_ids: Sequence[str]) -> None:
        caught = Counter(self.where[rid].index for rid in request_ids if rid in self.where)  # per instance
        for rid in request_ids:
            self._abort(rid, caught)

    def keep(self, notice: commands.ScoreSample) -> None:
        self.scoring[notice.sample.request_id] = notice.sample.prompt.index

    def start_scoring(self, command: commands.StartScoring) -> None:
        """Run the scorer for its `time_limit`: it answers by the core's deadline, or the deadline
        passes first.  A hedge (copy 1) runs the same answer again: a fresh time, the same correctness."""
        rid = command.request_id
        if command.copy:
            seconds, correct = self.reward_model.execution_s(), self.scoring[rid]
        else:
            seconds, correct = self.reward_model.draw(self.scoring[rid])
            self.scoring[rid] = correct
        if seconds <= command.time_limit:
            self._push(self.now + seconds, SCORED, (rid, float(correct), seconds))
        else:
            self._push(command.deadline, DEADLINE, None)
        if command.hedge_at is not None and command.hedge_at < self.now + seconds:
            self._push(command.hedge_at, HEDGE, None)

    def scored(self, notice: events.RewardScored) -> None:
        self.scoring.pop(notice.request_id, None)
        self.meter.reward(notice)

    def train(self, cmd: commands.TrainMicroBatch) -> None:
        self.meter.kept_lengths.extend(ref.sample.num_tokens for ref in cmd.samples)
        self.meter.kept_segments.extend(ref.sample.segments for ref in cmd.samples)
        if self.constants.train.stream or self.meter.rollout_end is not None:
            self._train(cmd)
        else:
            self.held_batches.append(cmd)

    def step_optimizer(self, command: commands.StepOptimizer) -> None:
        self.meter.optimizer(command, self.now)

    def _launch(self, cmd: commands.LaunchRequest) -> None:
        prefix = sum(s.num_tokens for s in cmd.resume)
        if cmd.resume:
            root = self.root[cmd.resume[0].request_id]
        else:
            root = cmd.request_id
            self.totals[root] = self.workload.sample(cmd.prompt.index, self.sched.state.step)
            self.meter.launched_lengths.append(min(self.totals[root], self.config.max_tokens))
        self.root[cmd.request_id] = root
        total = self.totals[root]
        new = max(1, min(cmd.max_new_tokens, total - prefix))
        reason = "length" if prefix + new >= self.config.max_tokens else "stop"
        prompt = self.workload.prompt_tokens(cmd.prompt.index) + prefix
        req = SimRequest(cmd.request_id, prompt, new, reason, group=None if cmd.resume else cmd.prompt)
        inst = min(self.instances, key=self._placement_key)
        inst.submit(req, self.now, arrives=self.now + inst.cost.launch_s)
        if inst.cost.launch_s > 0:
            self._push(self.now + inst.cost.launch_s, ARRIVED, inst)
        self.where[cmd.request_id] = inst
        self.live[cmd.request_id] = req
        self.launched_keys.add(cmd.prompt)
        self.dirty.add(inst.index)
        self.siblings.launched(cmd.request_id, cmd.prompt)

    def _placement_key(self, inst: Instance) -> tuple:
        """Where a launch goes: the fewest requests (or, `engine.oracle_placement`, true tokens left)."""
        if self.constants.engine.oracle_placement:
            return sum(r.target - r.tokens(inst.step) for r in (*inst.running.values(), *inst.waiting)), inst.index
        return len(inst.running) + len(inst.waiting) + len(inst.arriving), inst.index

    def _abort(self, rid: str, caught: Counter) -> None:
        inst = self.where.get(rid)
        if inst is None:
            return  # it finished; its RequestFinished is already on the way
        req = inst.remove(rid, self.now)
        self._ended(rid, finished=req.generated >= req.target)
        self.dirty.add(inst.index)
        if req.generated >= req.target:
            self.inbox.append(events.RequestFinished(rid, req.target, req.reason, self.now))
        else:
            self.meter.aborted(inst.index, self.now, req.generated)
            at = self.now + inst.cost.abort_latency(caught[inst.index])  # (growing with the requests one call catches)
            self._answer(at, events.RequestAborted(rid, req.generated, at))

    def _answer(self, at: float, event) -> None:
        """`event` (a request's end) reaches the driver at `at`, an engine profile's latency after it: through the
        inbox where that is now."""
        self.inbox.append(event) if at <= self.now else self._push(at, ANSWERED, event)

    def _train(self, cmd: commands.TrainMicroBatch) -> None:
        width = max(self.workload.prompt_tokens(ref.sample.prompt.index) + ref.sample.num_tokens for ref in cmd.samples)
        seconds = self.train_model.micro_batch_s(cmd.num_tokens, padded=len(cmd.samples) * width)
        start = max(self.trainer_free, self.now)
        self.trainer_free = start + seconds
        self.meter.trained(start, seconds)

    def end_round(self, cmd: commands.EndRound) -> None:
        # A prefill an instance started just before the round closed still runs to its end: the
        # rollout is over when every instance is idle, not at the abort.
        self.meter.round_ended(cmd, max([self.now] + [inst.time for inst in self.instances]))
        keep = set(cmd.carried_requests)
        self.siblings.end_round(cmd.trained)  # a new round's groups (spec.carry_drafts: earlier texts kept)
        self.root = {r: v for r, v in self.root.items() if r in keep}
        self.totals = {r: v for r, v in self.totals.items() if r in keep or r in self.root.values()}
        for batch in self.held_batches:
            self._train(batch)
        self.held_batches = []

    # -- a whole run ------------------------------------------------------------------------------

    def run(self, progress=None) -> dict:
        steps = []
        while not self._done(len(steps)):
            steps.append(self.run_step())
            if progress is not None:
                progress.update(1)
        pending = self.driver.pending_prompts()
        total = totals(steps)
        total["pending_prompts"] = len(pending)
        total["lost_prompts"] = self.ledger.lost(self.launched_keys, pending)
        total["duplicate_prompts"] = self.ledger.duplicates
        total.update(epoch_totals(total, self.config.prompts, self.workload.num_prompts * (self.config.epochs or 0),
                                  len(self.ledger.trained)))
        return {"config": self.config.to_dict(), "steps": steps, "total": total}

    def _done(self, steps: int) -> bool:
        """`steps` steps run; with `epochs`, the pool drawn to its end and nothing pending (refused past a cap)."""
        if self.config.epochs is None:
            return steps >= self.config.steps
        if self.sched.state.pool.exhausted and not self.driver.pending_prompts():
            return True
        cap = epoch_step_cap(self.config, self.workload.num_prompts)
        if steps >= cap:
            raise ConfigError(f"--epochs {self.config.epochs}: not done after {cap} steps (the cap; "
                              f"{len(self.driver.pending_prompts())} prompts pending): the policy does not drain")
        return False
