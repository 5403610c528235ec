"""Held-out evaluation of a run (--eval-every K): a fixed set of prompts that no step trains, decoded
greedily with the run's current weights every K steps (and before the first), scored by the run's
reward function; with --eval-samples N, also sampled N times a prompt as the run samples, with fixed
seeds (the reward of the policy as it is trained, which greedy decoding may not show: a small model's
greedy reply can already be what training sharpens its samples towards).

The prompts are the first --eval-prompts distinct problems of the run's --tasks drawn with a seed of
their own (`EVAL_SEED`): every run of the same tasks, whatever its --seed or --policy, is scored on the
same prompts, and its training rows leave them out (a training row asking a held-out question is not
trained; the trainer says how many).

The evaluation has an engine of its own (a copy of the model; the trainer's weights are loaded into it
before each evaluation) and a scoring worker of its own: nothing of the run's rollout (requests still
being aborted, rewards of carried groups still in flight) is touched.  It runs between steps, after the
step's state is saved, so no step's time (`step_s`) includes it; its own time is `eval_s`.  Each
evaluation is one line of RUN_DIR/eval.jsonl: the steps trained before it, the set's digest, mean reward
and each prompt's, mean response length, how many replies hit --max-tokens, a few replies as text, and
the seconds it took (with --eval-samples, the sampled replies' mean reward and length, and each reply's
reward by prompt).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import attrs

from rollpacker.core.errors import ConfigError
from rollpacker.core.protocols import GenerationRequest, GenerationResult, RewardJob
from rollpacker.train.algorithm import SamplingOptions
from rollpacker.train.prompts import RowPrompts, question

EVAL_SEED = 7_919
"""Seed of the held-out problems (no run's --seed enters it)."""
REPLIES_KEPT = 3
"""Prompts whose replies each evaluation keeps as text."""


def generate_all(engine, requests: Sequence[GenerationRequest]) -> dict[str, GenerationResult]:
    """Submit `requests` and wait for each one's result (by request id); other results are ignored."""
    wanted = {r.request_id for r in requests}
    engine.submit(list(requests))
    results: dict[str, GenerationResult] = {}
    while len(results) < len(wanted):
        for result in engine.poll(timeout=1.0):
            if isinstance(result, GenerationResult) and result.request_id in wanted:
                results[result.request_id] = result
    return results


def score_all(rewards, jobs: Sequence[RewardJob]) -> dict[str, tuple[float, bool]]:
    """(reward, failed) of each job (by request id) from the reward executor `rewards`; a failed
    scoring counts as reward 0.  Outcomes of other jobs (a past step's, late) are ignored."""
    wanted = {job.request_id for job in jobs}
    for job in jobs:
        rewards.submit(job)
    outcomes: dict[str, tuple[float, bool]] = {}
    while len(outcomes) < len(wanted):
        for outcome in rewards.poll(timeout=1.0):
            if outcome.request_id in wanted:
                outcomes[outcome.request_id] = (0.0 if outcome.failed else outcome.reward, outcome.failed)
    return outcomes


def held_out_rows(tasks: Sequence[str] | None, num_prompts: int) -> list:
    """`num_prompts` PromptRows of `tasks` (None: the default mix) drawn with EVAL_SEED, no two asking
    the same question: one set for every run of those tasks, whatever its --seed or --policy (the run's
    training rows leave these out: `without_held_out`).  A ConfigError when the tasks cannot give that many."""
    from rollpacker.backends.data.tasks import make_problems, rows_from_problems

    rows: dict[str, object] = {}
    for row in rows_from_problems(make_problems(tasks, size=4 * num_prompts, seed=EVAL_SEED)):
        rows.setdefault(question(row), row)  # easy tasks repeat short problems: the first of each is kept
    if len(rows) < num_prompts:
        raise ConfigError(f"--eval-prompts {num_prompts}: the tasks give only {len(rows)} distinct problems; lower "
                          f"--eval-prompts")
    return list(rows.values())[:num_prompts]


def set_id(rows: Sequence) -> str:
    """A short digest of the rows' questions, in order: runs scored on the same held-out set share it."""
    import hashlib

    return hashlib.sha1("\n\0".join(question(row) for row in rows).encode()).hexdigest()[:12]


class HeldOutEval:
    """The held-out set of a run, with the engine and the scoring worker that evaluate it."""

    def __init__(self, config, model_dir, device: str, rows: Sequence, tokenizer) -> None:
        """`rows`: the held-out set (`held_out_rows`), rendered with the run's `tokenizer`."""
        from rollpacker.backends.data.rows import render_rows
        from rollpacker.backends.embedded.engine import EmbeddedEngine

        rows, ids, _ = render_rows(rows, tokenizer, context=None, max_tokens=config.max_tokens, skip_long=False)
        self.prompts = RowPrompts(rows, ids, tokenizer, config.reward_deadline_s)
        self.set_id = set_id(rows)
        self.max_tokens, self.samples = config.max_tokens, config.eval_samples
        self.sampling = config.options(SamplingOptions)
        self.engine = EmbeddedEngine(model_dir, capacity=len(rows), dtype=config.dtype, device=device,
                                     seed=config.seed, spec_max_rows=0)
        self.rewards = attrs.evolve(config.rewards_options(), reward_workers=1, reward_burst_workers=0).build()

    def run(self, trainer, step: int) -> dict:
        """Evaluate the trainer's current weights (`step`: the optimizer steps they have had)."""
        from rollpacker.driver import sync_weights

        start = time.perf_counter()
        sync_weights(self.engine, trainer, version=step)
        n = len(self.prompts)
        greedy, sampled = eval_requests([self.prompts.prompt_ids(i) for i in range(n)], step, self.samples,
                                        self.sampling, self.max_tokens)
        results = generate_all(self.engine, greedy + sampled)
        jobs = [self.prompts.reward_job(r.request_id, i % n, results[r.request_id].token_ids)
                for i, r in enumerate(greedy + sampled)]
        scores = score_all(self.rewards, jobs)
        record = {"step": step, **_scored("eval", greedy, results, scores), "eval_prompts": n,
                  "eval_set": self.set_id,
                  "eval_truncated": sum(results[r.request_id].finish_reason == "length" for r in greedy),
                  "eval_failed": sum(failed for _, failed in scores.values()),
                  "eval_scores": [scores[r.request_id][0] for r in greedy]}
        if sampled:
            record.update(_scored("eval_sampled", sampled, results, scores), eval_samples=self.samples,
                          eval_sampled_scores=[[scores[r.request_id][0] for r in sampled[i::n]] for i in range(n)])
        record["eval_replies"] = self.replies(greedy, sampled, results)
        return {**record, "eval_s": round(time.perf_counter() - start, 3)}

    def replies(self, greedy, sampled, results, shown: int = REPLIES_KEPT) -> list[dict]:
        """The first `shown` prompts' greedy reply and first sampled one, as text (a sample to read)."""
        text = lambda request: self.prompts.tokenizer.decode(  # noqa: E731
            list(results[request.request_id].token_ids), skip_special_tokens=True)
        n = len(greedy)
        return [{"prompt": i, "greedy": text(greedy[i]), **({"sampled": text(sampled[i])} if sampled else {})}
                for i in range(min(shown, n))]

    def close(self) -> None:
        for part in (self.rewards, self.engine):
            part.close()


def eval_requests(prompt_ids: Sequence[Sequence[int]], step: int, samples: int, sampling: SamplingOptions,
                  max_tokens: int) -> tuple[list[GenerationRequest], list[GenerationRequest]]:
    """One greedy request a prompt, and `samples` sampled ones (as `sampling` says) whose seeds depend on
    the prompt and the reply only: every evaluation (`step` names the requests) draws alike."""
    n = len(prompt_ids)
    greedy = [GenerationRequest(f"eval{step}-{i}", tuple(ids), max_new_tokens=max_tokens, temperature=0.0, seed=0)
              for i, ids in enumerate(prompt_ids)]
    sampled = [GenerationRequest(f"eval{step}-{i}-s{k}", tuple(ids), max_new_tokens=max_tokens,
                                 temperature=sampling.temperature, top_p=sampling.top_p, seed=1 + k * n + i)
               for k in range(samples) for i, ids in enumerate(prompt_ids)]
    return greedy, sampled


def _scored(prefix: str, requests: Sequence[GenerationRequest], results: Mapping[str, GenerationResult],
            scores: Mapping[str, tuple[float, bool]]) -> dict:
    """PREFIX_reward and PREFIX_length: the means over `requests`."""
    rewards = [scores[r.request_id][0] for r in requests]
    lengths = [len(results[r.request_id].token_ids) for r in requests]
    return {f"{prefix}_reward": sum(rewards) / len(rewards), f"{prefix}_length": sum(lengths) / len(lengths)}


def eval_summary(record: Mapping) -> str:
    """The line the trainer prints after an evaluation."""
    sampled = (f"; sampled ({record['eval_samples']} a prompt): reward {record['eval_sampled_reward']:.3f}, mean length "
               f"{record['eval_sampled_length']:.1f}" if "eval_sampled_reward" in record else "")
    return (f"eval after {record['step']} steps: reward {record['eval_reward']:.3f} on {record['eval_prompts']} "
            f"held-out prompts (greedy), mean length {record['eval_length']:.1f} tokens, "
            f"{record['eval_truncated']} at --max-tokens{sampled}, {record['eval_s']:.1f} s")
