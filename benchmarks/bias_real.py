"""Bias, measured: the length and reward of what each policy keeps vs every sample it launched.

    .venv/bin/python benchmarks/bias_real.py [--steps 3] [--prompts 4] [--samples 4] [--max-tokens 128] \
        [--policies sync,tail,response-only,sorted,partial] [--write-results]

Each policy runs a few steps of the reference trainer (the `Session` reference/train.py drives, on
the embedded engine and the model --model names, default SmolLM2-135M-Instruct) with `lr = 0`: the
weights never move, so a sample that the policy aborted can be generated to its end afterwards under
the very weights that started it.  Every launched sample is then known in full:

- kept: the policy trained it (its reward is the run's);
- pending: not trained when the run ended, but a later step might (scored in a group still carried,
  or tokens carried for partial rollout to resume); launched means are also given without them;
- finished but not kept (a late answer to a full group, or a group dropped): its own tokens, scored
  here if the run did not;
- aborted: its request is submitted again, same prompt and resumed ids, same seed, same max tokens,
  and run to its end.  The engine draws every token from a hash of (seed, token index), not from a
  generator's state, so the new run repeats the aborted tokens and goes on; `prefix_mismatches`
  lists the completions that did not (a near tie in the logits that a batch of other rows rounds the
  other way does that; such a completion is still a sample of the same model, counted as it came).
  Scored here with the trainer's reward function and workers.

A partial-rollout sample spans several requests (each resumes the previous one's tokens); it counts
once, as its last request's prompt + resumed + own tokens.  A "length" finish is always at the run's
--max-tokens (the planner's max_new_tokens subtracts only resumed tokens), so only aborts cut a
sample short.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import attrs

from rollpacker.train.config import SECTIONS, RunConfig, parse
from rollpacker.train.evaluation import generate_all, score_all
from rollpacker.train.outputs import RunDir
from rollpacker.train.session import Session

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("sync", "tail", "response-only", "sorted", "partial")
"""response-only: tail batching that over-samples responses only (eta_prompts 1.0, eta_responses 1.5)."""


@attrs.frozen
class LaunchedSample:
    """One launched sample in full: `response_ids` are its resumed, own and (if aborted) completed tokens."""

    request_id: str
    prompt: int
    is_kept: bool
    """The policy trained it."""
    is_aborted: bool
    is_pending: bool
    """Not trained yet when the run ended, but a later step may: scored in a group still carried, or
    tokens carried for partial rollout to resume."""
    num_generated: int
    """Response tokens it had when the run ended (resumed and own; an aborted one's prefix)."""
    response_ids: tuple[int, ...]
    reward: float


@attrs.frozen
class PolicyBias:
    policy: str
    samples: tuple[LaunchedSample, ...]
    requests: int
    """Requests launched (a resumed partial sample is several)."""
    prefix_mismatches: tuple[tuple[int, int], ...]
    """(tokens it had, first differing index) of each aborted request whose completion did not
    start with the tokens it had."""
    rounds: tuple[str, ...]
    """Each step's round: "normal" (sync), "short" or "long" (tail), ..."""
    seconds: float

    def means(self, kept_only: bool, with_pending: bool = True) -> tuple[int, float, float]:
        """(count, mean length, mean reward) of the kept samples or of all launched ones (without
        those still pending at the end of the run if not `with_pending`)."""
        chosen = [s for s in self.samples if (s.is_kept or not kept_only) and (with_pending or not s.is_pending)]
        if not chosen:
            return 0, 0.0, 0.0
        return (len(chosen), sum(len(s.response_ids) for s in chosen) / len(chosen),
                sum(s.reward for s in chosen) / len(chosen))


def measure(base: RunConfig, policies: list[str], steps: int, out: Path) -> list[PolicyBias]:
    """Each policy's run (in out/POLICY) and its samples, kept and launched."""
    results = []
    for name in policies:
        print(f"== {name} ==", flush=True)
        results.append(run_policy(policy_config(base, name, out / name), name, steps))
    return results


# -- one policy ------------------------------------------------------------------------------------

def policy_config(base: RunConfig, name: str, out: Path) -> RunConfig:
    """The run config of one column: its policy (response-only is tail with other knobs), lr 0."""
    config = dataclasses.replace(base, policy="tail" if name == "response-only" else name, lr=0.0, out=out)
    if name == "response-only":
        config.tail = SECTIONS["tail"](eta_prompts=1.0, eta_responses=1.5)
    return config


def run_policy(config: RunConfig, name: str, steps: int) -> PolicyBias:
    """`steps` steps of the reference trainer, then every launched sample completed and scored."""
    start = time.perf_counter()
    config.validate()
    session = Session(config, RunDir(config.out), config.policy)
    try:
        timeline, rounds = [], []
        for _ in range(steps):
            record = session.run_step()
            session.run_dir.log_step(record)
            timeline.extend(session.loop.last_timeline)
            rounds.append(record["round"])
            print(f"  {name} step {record['step']}: {record['launched_requests']} launched, "
                  f"{record['step_s']:.0f} s", flush=True)
        samples, mismatches = complete_samples(session, timeline)
    finally:
        session.close()
    return PolicyBias(name, tuple(samples), len(timeline), mismatches, tuple(rounds), time.perf_counter() - start)


def final_requests(timeline) -> list:
    """The intervals that end a sample: those no later request resumed (partial rollout)."""
    resumed = {rid for interval in timeline for rid in interval.resumes}
    return [i for i in timeline if i.request_id not in resumed]


def complete_samples(session: Session, timeline) -> tuple[list[LaunchedSample], tuple]:
    """Every launched sample in full, aborted ones generated to their end, unscored ones scored."""
    finals = final_requests(timeline)
    unfinished = [i for i in finals if i.finish_reason in ("abort", "")]
    completions = regenerate(session.engine, [i.request for i in unfinished])
    mismatches = tuple((len(i.token_ids), first_difference(completions[i.request_id], i.token_ids))
                       for i in unfinished if completions[i.request_id][: len(i.token_ids)] != i.token_ids)
    responses = {i.request_id: i.request.resume_ids + completions.get(i.request_id, i.token_ids) for i in finals}
    missing = {i.request_id: i.prompt for i in finals if i.reward is None}
    rewards = score(session, {rid: (prompt, responses[rid]) for rid, prompt in missing.items()})
    carried = set(session.loop.tokens)  # what the loop keeps after a step: tokens a later step needs
    samples = [LaunchedSample(i.request_id, i.prompt, i.is_trained, i.request_id in completions,
                              not i.is_trained and i.request_id in carried,
                              len(i.request.resume_ids) + len(i.token_ids), responses[i.request_id],
                              i.reward if i.reward is not None else rewards[i.request_id])
               for i in finals]
    return samples, mismatches


def first_difference(a, b) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def regenerate(engine, requests) -> dict[str, tuple[int, ...]]:
    """Token ids of `requests` generated again to their end (same prompt, resumed ids, seed, max tokens)."""
    again = {f"{r.request_id}/again": r.request_id for r in requests}
    results = generate_all(engine, [attrs.evolve(r, request_id=f"{r.request_id}/again") for r in requests])
    for result in results.values():
        assert result.finish_reason != "abort", result
    return {again[rid]: result.token_ids for rid, result in results.items()}


def score(session: Session, responses: dict[str, tuple[int, tuple[int, ...]]]) -> dict[str, float]:
    """Rewards of `responses` (id -> (prompt index, response ids)) by the run's reward workers (a late
    answer of the run's last step is not one of them)."""
    jobs = [session.prompts.reward_job(rid, prompt, ids) for rid, (prompt, ids) in responses.items()]
    return {rid: reward for rid, (reward, _) in score_all(session.rewards, jobs).items()}


# -- the table -------------------------------------------------------------------------------------

def table(results: list[PolicyBias]) -> list[str]:
    lines = ["| policy | rounds | requests | launched samples | kept (trained) | not trained: dropped / pending "
             "| aborted, completed here | kept / launched mean length | kept / launched mean reward "
             "| prefix mismatches |", "|---|---|---|---|---|---|---|---|---|---|"]
    # requests > launched samples: partial rollout resumed some samples in later requests
    for r in results:
        n_kept, kept_len, kept_reward = r.means(kept_only=True)
        n_all, all_len, all_reward = r.means(kept_only=False)
        pending = sum(s.is_pending for s in r.samples)
        aborted = sum(s.is_aborted for s in r.samples)
        lines.append(f"| {r.policy} | {' '.join(r.rounds)} | {r.requests} | {n_all} | {n_kept} "
                     f"| {n_all - n_kept - pending} / {pending} | {aborted} | {kept_len:.1f} / {all_len:.1f} "
                     f"| {kept_reward:.3f} / {all_reward:.3f} | {len(r.prefix_mismatches)} |")
    return lines


def notes(results: list[PolicyBias]) -> list[str]:
    """Launched means without the samples pending at the end (a longer run may train them), and
    where completions parted from the aborted tokens."""
    lines = []
    for r in results:
        dropped = [s for s in r.samples if not s.is_kept and not s.is_pending]
        if dropped:
            lines.append(f"- {r.policy}, the {len(dropped)} dropped samples: mean length "
                         f"{sum(len(s.response_ids) for s in dropped) / len(dropped):.1f}, mean reward "
                         f"{sum(s.reward for s in dropped) / len(dropped):.3f}; correct (reward 1) "
                         f"{sum(s.reward >= 1.0 for s in dropped)} dropped vs "
                         f"{sum(s.reward >= 1.0 for s in r.samples if s.is_kept)} kept samples.")
        if any(s.is_pending for s in r.samples):
            n, length, reward = r.means(kept_only=False, with_pending=False)
            lines.append(f"- {r.policy}, launched without the {len(r.samples) - n} pending samples: "
                         f"{n} samples, mean length {length:.1f}, mean reward {reward:.3f}.")
        for had, at in r.prefix_mismatches:
            lines.append(f"- {r.policy}: an aborted request with {had} tokens was completed along another path "
                         f"from token {at} on.")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--out", type=Path, default=None, help="run directories (default: a new temporary one)")
    ap.add_argument("--write-results", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args, train_flags = ap.parse_known_args()  # anything else goes to the run config, e.g. --model DIR
    out = args.out or Path(tempfile.mkdtemp(prefix="rollpacker-bias-"))
    base = parse(["--prompts", str(args.prompts), "--samples", str(args.samples), "--max-tokens",
                  str(args.max_tokens), "--steps", str(args.steps), *train_flags])
    results = measure(base, args.policies.split(","), args.steps, out)
    results.sort(key=lambda r: POLICIES.index(r.policy) if r.policy in POLICIES else len(POLICIES))
    lines = table(results) + [""] + notes(results)
    print("\n".join(lines))
    (out / "bias.json").write_text(json.dumps([attrs.asdict(r) for r in results]))
    if args.write_results:
        write_results(args, train_flags, results, lines)
    return 0


def write_results(args, train_flags: list[str], results: list[PolicyBias], lines: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results_md import write_section

    seconds = sum(r.seconds for r in results)
    body = [
        f"`.venv/bin/python benchmarks/bias_real.py {' '.join(sys.argv[1:])}` on this machine's CPU "
        f"({os.cpu_count()} cores, shared with other jobs), {args.steps} steps per policy, "
        f"P={args.prompts} R={args.samples} max_tokens={args.max_tokens}, "
        f"SmolLM2-135M-Instruct fp32 (the embedded default){', trainer flags ' + ' '.join(train_flags) if train_flags else ''}, "
        f"default task mix and reward (reasoning-gym scorers), seed 0; {seconds / 60:.0f} minutes in all; "
        f"every sample in {args.out or 'the run directory'}/bias.json.  "
        "`--lr 0`: the weights stay fixed, so every aborted sample is generated to its end afterwards "
        "under the same weights and seed (lengths and rewards of the samples the policy dropped are "
        "measured, not guessed); the policies' step times are not the point here.",
        "",
        *lines,
    ]
    write_section("Bias on real runs", "\n".join(body),
                  subsection=f"P={args.prompts} R={args.samples} max_tokens={args.max_tokens}, {args.steps} steps")


if __name__ == "__main__":
    sys.exit(main())
