"""The simulator's driver: a discrete-event loop that executes the core's commands against the
simulated instances, reward workers and trainer, and feeds the core the events they produce, exactly
as a real driver does with real engines.

    sim = Simulation(SimConfig(policy="tail", max_tokens=32768, instances=16, tp=4, model="qwen2.5-32b"))
    result = sim.run()        # {"config": {...}, "steps": [...], "total": {...}}

Event sources, all on one heap keyed by time: instance wake-ups (a request reaches its length, or the
KV pool fills), scorer answers and reward deadlines.  Answers that happen "now" (an abort's reply)
go through an inbox that is drained before the clock moves.  Training is a single resource whose
busy time is computed as micro-batches arrive; it holds the optimizer step.
"""

from __future__ import annotations

import heapq
from collections import deque

from rollpacker.core import (
    AbortRequest,
    BatcherConfig,
    EpochLedger,
    LaunchRequest,
    OptimizerStep,
    RequestAborted,
    RequestFinished,
    RewardScored,
    RoundEnded,
    Scheduler,
    ScoreSample,
    TrainMicroBatch,
    step_record,
)
from rollpacker.core.cost_model import CostModel
from rollpacker.core.errors import ConfigError
from rollpacker.core.reward_scheduler import RewardConfig, StartScoring
from rollpacker.core.tp_planner import OnlineTP, feasible_tps, plan_tp

from .config import SimConfig
from .constants import MODELS, SimConstants
from .engine import Instance, SimRequest
from .metrics import StepMeter, totals
from .stages import RewardModel, TrainModel
from .workloads import MAX_PROMPT_TOKENS, load_workload

WAKE, SCORED, DEADLINE = 0, 1, 2


class Simulation:
    def __init__(self, config: SimConfig, constants: SimConstants | None = None,
                 record_timeline: bool = False) -> None:
        self.config = config
        self.constants = c = constants or SimConstants()
        self.model = MODELS[config.model]
        self.policy = config.build_policy()
        dataset = config.dataset_prompts or 16 * config.prompts
        self.workload = load_workload(config.workload, num_prompts=dataset, seed=config.seed,
                                      max_tokens=config.max_tokens, between=config.between, growth=config.growth)
        dataset = max(dataset, self.workload.num_prompts) if config.dataset_prompts is None else dataset
        self.workload.num_prompts = min(self.workload.num_prompts, dataset)
        self.sched = Scheduler(self.policy, num_prompts=self.workload.num_prompts, seed=config.seed,
                               batcher=BatcherConfig(),
                               rewards=RewardConfig(workers=c.reward.workers, t_min=c.reward.t_min,
                                                    scale=c.reward.scale, t_max=c.reward.t_max))
        self.reward_model = RewardModel(c.reward, config.seed)
        self.train_model = TrainModel(c.train, self.model, config.gpus, c.train.peak_flops)
        self.record_timeline = record_timeline
        self.max_context = MAX_PROMPT_TOKENS + config.max_tokens
        self.tp = config.tp
        self.online = OnlineTP(tp=config.tp, max_tp=max(self._feasible() or [config.tp]),
                               min_tp=min(self._feasible() or [config.tp]))
        self._build_instances(config.tp)
        self.now = 0.0
        self.heap: list = []
        self.seq = 0
        self.inbox: deque = deque()
        self.where: dict[str, Instance] = {}
        self.live: dict[str, SimRequest] = {}
        self.totals: dict[str, int] = {}
        self.root: dict[str, str] = {}
        self.ledger = EpochLedger()
        self.launched_keys: set = set()
        self.trainer_free = 0.0
        self.held_batches: list[TrainMicroBatch] = []
        self.scoring: dict[str, int] = {}
        self.timelines: dict[int, dict] = {}

    # -- instances and TP -------------------------------------------------------------------------

    def _feasible(self) -> list[int]:
        return feasible_tps(self.model, self.constants.hardware, self.config.gpus,
                            self.constants.engine.mem_fraction, self.max_context)

    def _build_instances(self, tp: int) -> None:
        e = self.constants.engine
        cost = CostModel(model=self.model, hardware=self.constants.hardware, tp=tp, mem_fraction=e.mem_fraction)
        if cost.kv_capacity <= self.max_context:
            raise ConfigError(
                f"{self.model.name} at TP{tp} leaves a KV pool of {max(cost.kv_capacity, 0)} tokens per "
                f"instance, less than one request ({self.max_context} tokens of prompt + --max-tokens); "
                f"raise --tp (feasible here: {self._feasible() or 'none'})"
            )
        self.tp = tp
        self.cost = cost
        self.instances = [Instance(i, cost, e.max_running, e.admit_watermark, spec=self.constants.spec)
                          for i in range(self.config.gpus // tp)]

    def _choose_tp(self, launches: list[LaunchRequest]) -> int:
        mode = self.config.tp_mode
        if mode == "online":
            return self.online.tp
        if mode != "plan":
            return self.tp
        pool = self.sched.state.pool
        mean = self.workload.mean_length()
        lengths = []
        for cmd in launches:
            pred = pool.predict(cmd.prompt.index)
            guess = pred.median if pred.count else mean
            lengths.append(min(float(guess), cmd.max_new_tokens))
        prompt = sum(self.workload.prompt_tokens(c.prompt.index) for c in launches) / max(len(launches), 1)
        return plan_tp(self.model, self.constants.hardware, self.config.gpus, self.constants.engine.mem_fraction,
                       lengths, prompt, self.max_context, candidates=tuple(self._feasible())).tp

    # -- the loop ---------------------------------------------------------------------------------

    def _push(self, at: float, kind: int, payload) -> None:
        heapq.heappush(self.heap, (at, self.seq, kind, payload))
        self.seq += 1

    def run_step(self) -> dict:
        start = self.now
        commands = self.sched.begin_round()
        launches = [c for c in commands if isinstance(c, LaunchRequest)]
        switch = 0.0
        tp = self._choose_tp(launches)
        if tp != self.tp:
            self._build_instances(tp)
            switch = self.constants.engine.tp_switch_s
            self.now += switch
        for inst in self.instances:
            inst.time = max(inst.time, self.now)
            inst.preemptions = inst.busy_s = inst.peak_running = 0
            inst.intervals = [] if self.record_timeline else None
        self.meter = StepMeter(self.now, self.config.bubble_capacity or self.config.prompts * self.config.samples)
        self.meter.tp, self.meter.switch_s = self.tp, switch
        self.dirty: set[int] = set()
        self.execute(commands)
        self._settle()
        while not self.sched.step_done:
            if self.inbox:
                self.execute(self.sched.handle(self.inbox.popleft()))
                self._settle()
                continue
            if not self.heap:
                raise RuntimeError(f"simulation deadlock at t={self.now:.3f}s in step {self.sched.state.step}")
            at, _, kind, payload = heapq.heappop(self.heap)
            self.now = max(self.now, at)
            self._fire(kind, payload)
            self._settle()
        end = max(self.now, self.trainer_free) + self.constants.train.optimizer_s
        self.trainer_free = end
        record = self.meter.finish(self, start, end)
        self.online = self.online.observe(record["preemptions"])
        self.now = end
        return record

    def _fire(self, kind: int, payload) -> None:
        if kind == WAKE:
            inst, version = payload
            if version != inst.version:
                return
            for req in inst.wake(self.now):
                self._ended(req.rid)
                self.meter.finished(self.now)
                self.inbox.append(RequestFinished(req.rid, req.target, req.reason, self.now))
            self.dirty.add(inst.index)
        elif kind == SCORED:
            rid, reward = payload
            self._rewards_out(self.sched.scoring_finished(rid, reward, self.now))
        else:
            self._rewards_out(self.sched.expire_rewards(self.now))

    def _settle(self) -> None:
        """Admit waiting work on changed instances and schedule their next wake-up."""
        for index in self.dirty:
            inst = self.instances[index]
            inst.advance_to(self.now)
            inst.admit()
            inst.version += 1
            at = inst.next_event_time()
            if at is not None:
                self._push(at, WAKE, (inst, inst.version))
        if self.dirty:
            self.meter.occupancy(self.now, sum(i.batch for i in self.instances), self.instances)
        self.dirty = set()

    def _ended(self, rid: str) -> None:
        inst = self.where.pop(rid)
        req = self.live.pop(rid)
        self.meter.request_ended(req)
        del inst

    # -- commands ---------------------------------------------------------------------------------

    def execute(self, commands) -> None:
        for cmd in commands:
            if isinstance(cmd, LaunchRequest):
                self._launch(cmd)
            elif isinstance(cmd, AbortRequest):
                self._abort(cmd.request_id)
            elif isinstance(cmd, ScoreSample):
                self.scoring[cmd.sample.request_id] = cmd.sample.prompt.index
                self._rewards_out(self.sched.start_scoring(cmd.sample.request_id, self.now))
            elif isinstance(cmd, TrainMicroBatch):
                self.meter.kept_lengths.extend(ref.sample.num_tokens for ref in cmd.samples)
                if self.constants.train.stream or self.meter.rollout_end is not None:
                    self._train(cmd)
                else:
                    self.held_batches.append(cmd)
            elif isinstance(cmd, RoundEnded):
                self._round_ended(cmd)
            elif isinstance(cmd, OptimizerStep):
                self.meter.optimizer(cmd, self.now)

    def _launch(self, cmd: LaunchRequest) -> None:
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
        req = SimRequest(cmd.request_id, prompt, new, reason)
        inst = min(self.instances, key=lambda i: (len(i.running) + len(i.waiting), i.index))
        inst.submit(req, self.now)
        self.where[cmd.request_id] = inst
        self.live[cmd.request_id] = req
        self.launched_keys.add(cmd.prompt)
        self.dirty.add(inst.index)

    def _abort(self, rid: str) -> None:
        inst = self.where.get(rid)
        if inst is None:
            return  # it finished; its RequestFinished is already on the way
        req = inst.remove(rid, self.now)
        self._ended(rid)
        self.dirty.add(inst.index)
        if req.generated >= req.target:
            self.inbox.append(RequestFinished(rid, req.target, req.reason, self.now))
        else:
            self.meter.aborted(inst.index, self.now, req.generated)
            self.inbox.append(RequestAborted(rid, req.generated, self.now))

    def _rewards_out(self, out) -> None:
        """Run the scorers the core starts (each answers by its deadline or times out there); the
        rewards the core decided are metered; the batcher's commands are executed."""
        for item in out:
            if isinstance(item, StartScoring):
                seconds, correct = self.reward_model.draw(self._prompt_of(item.request_id))
                if seconds <= item.timeout:
                    self._push(self.now + seconds, SCORED, (item.request_id, float(correct)))
                else:
                    self._push(item.deadline, DEADLINE, None)
            elif isinstance(item, RewardScored):
                self.meter.reward(item)
            else:
                self.execute([item])

    def _prompt_of(self, rid: str) -> int:
        return self.scoring.pop(rid)

    def _train(self, cmd: TrainMicroBatch) -> None:
        seconds = self.train_model.micro_batch_s(cmd.num_tokens)
        self.trainer_free = max(self.trainer_free, self.now) + seconds
        self.meter.trained(seconds)

    def _round_ended(self, cmd: RoundEnded) -> None:
        # A prefill an instance started just before the round closed still runs to its end: the
        # rollout is over when every instance is idle, not at the abort.
        self.meter.round_ended(cmd, max([self.now] + [inst.time for inst in self.instances]))
        self.ledger = self.ledger.record(cmd.trained)
        keep = set(cmd.carried_requests)
        self.root = {r: v for r, v in self.root.items() if r in keep}
        self.totals = {r: v for r, v in self.totals.items() if r in keep or r in self.root.values()}
        for batch in self.held_batches:
            self._train(batch)
        self.held_batches = []

    # -- a whole run ------------------------------------------------------------------------------

    def pending_keys(self) -> set:
        pool = self.sched.state.pool
        return set(pool.in_flight) | set(pool.deferred) | set(pool.returned)

    def run(self, progress=None) -> dict:
        steps = []
        for _ in range(self.config.steps):
            steps.append(self.run_step())
            if progress is not None:
                progress.update(1)
        pending = self.pending_keys()
        total = totals(steps)
        total["pending_prompts"] = len(pending)
        total["lost_prompts"] = self.ledger.lost(self.launched_keys, pending)
        total["duplicate_prompts"] = self.ledger.duplicates
        return {"config": self.config.to_dict(), "steps": steps, "total": total}
