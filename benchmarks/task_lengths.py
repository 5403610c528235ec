"""Response lengths and rewards of the default model on the default task mix (one GRPO-like rollout).

    .venv/bin/python benchmarks/task_lengths.py                 # 12 prompts x 4 samples per task
    .venv/bin/python benchmarks/task_lengths.py --prompts 4 --group 2 --cap 128   # a quick look

Samples each task's prompts `--group` times at temperature 1 with the embedded engine, scores every
response with the reward executor, and prints one JSON line per task and one for the mix: length
percentiles (tokens), share at the cap, mean reward, and the share of groups whose rewards differ
(GRPO learns nothing from a group with equal rewards), and the share of groups holding both a
correct (reward 1) and an incorrect answer (partial credit such as gsm_symbolic's 0.01 for a wrong
number counts as variance but teaches little).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollpacker.backends.embedded.engine import EmbeddedEngine  # noqa: E402
from rollpacker.backends.models import load_model  # noqa: E402
from rollpacker.backends.rewards.pool import ProcessRewardExecutor  # noqa: E402
from rollpacker.backends.data.tasks import DEFAULT_MIX, make_problems, render_prompt  # noqa: E402
from rollpacker.core.protocols import GenerationRequest, GenerationResult, RewardJob  # noqa: E402


def summary(name, lengths, rewards, groups, cap):
    a = np.asarray(lengths)
    varied = [len(set(rs)) > 1 for rs in groups.values()]
    return {
        "task": name, "samples": len(a),
        "p50": int(np.percentile(a, 50)), "p90": int(np.percentile(a, 90)), "max": int(a.max()),
        "mean": round(float(a.mean()), 1), "max_over_p50": round(float(a.max() / max(np.percentile(a, 50), 1)), 1),
        "at_cap": round(float((a >= cap).mean()), 3),
        "mean_reward": round(float(np.mean(rewards)), 3),
        "groups_with_reward_variance": round(float(np.mean(varied)), 3),
        "groups_mixed_correct": round(float(np.mean(
            [any(r >= 1.0 for r in rs) and any(r < 1.0 for r in rs) for rs in groups.values()])), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=12, help="prompts per task")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt")
    parser.add_argument("--cap", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", nargs="+", default=None, help="tasks to sample (default: the default mix)")
    parser.add_argument("--write-results", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()

    model, tokenizer = load_model(None, dtype=args.dtype)
    mix = args.tasks or DEFAULT_MIX
    problems = make_problems(mix, size=args.prompts * len(mix), seed=args.seed)
    requests, owner = [], {}
    for i, p in enumerate(problems):
        ids = tuple(render_prompt(tokenizer, p))
        for g in range(args.group):
            rid = f"p{i}-g{g}"
            owner[rid] = p
            requests.append(GenerationRequest(rid, ids, args.cap, temperature=1.0, seed=args.seed * 7919 + len(requests)))
    start = time.perf_counter()
    results = {}
    with EmbeddedEngine(model, capacity=64, progress_every=1 << 30) as engine, \
            ProcessRewardExecutor(num_workers=2) as rewards:
        engine.submit(requests)
        outcomes = {}
        while len(outcomes) < len(requests):
            for e in engine.poll(0.5):
                if isinstance(e, GenerationResult):
                    results[e.request_id] = e
                    p = owner[e.request_id]
                    text = tokenizer.decode(e.token_ids, skip_special_tokens=True)
                    rewards.submit(RewardJob(e.request_id, p.task, p.entry, text, deadline_s=10.0))
            for o in rewards.poll(0.0 if len(results) < len(requests) else 0.5):
                outcomes[o.request_id] = o
        report = rewards.step_report()
    elapsed = time.perf_counter() - start
    by_task: dict[str, tuple[list, list, dict]] = {}
    for rid, r in results.items():
        p = owner[rid]
        lengths, rs, groups = by_task.setdefault(p.task, ([], [], {}))
        lengths.append(len(r.token_ids))
        rs.append(outcomes[rid].reward)
        groups.setdefault(rid.split("-")[0], []).append(outcomes[rid].reward)
    for task, (lengths, rs, groups) in sorted(by_task.items()):
        print(json.dumps(summary(task, lengths, rs, groups, args.cap)))
    all_l = [x for l, _, _ in by_task.values() for x in l]
    all_r = [x for _, r, _ in by_task.values() for x in r]
    all_g = {f"{t}/{k}": v for t, (_, _, g) in by_task.items() for k, v in g.items()}
    line = summary("mix", all_l, all_r, all_g, args.cap)
    line.update({"cap": args.cap, "group": args.group, "dtype": args.dtype, "seconds": round(elapsed, 1),
                 "tokens_per_s": round(sum(all_l) / elapsed, 1), "reward_failures": report.num_failed,
                 "reward_queue_s_max": round(report.queue_s_max, 3)})
    print(json.dumps(line))
    if args.write_results:
        from engine_throughput import update_results

        rows = [summary(t, *by_task[t], args.cap) for t in sorted(by_task)] + [line]
        table = "| task | samples | p50 | p90 | max | mean | at cap | mean reward | groups w/ variance | groups mixed correct |\n"
        table += "|---|---|---|---|---|---|---|---|---|---|\n"
        table += "".join(
            f"| {r['task']} | {r['samples']} | {r['p50']} | {r['p90']} | {r['max']} | {r['mean']} | {r['at_cap']} | "
            f"{r['mean_reward']} | {r['groups_with_reward_variance']} | {r['groups_mixed_correct']} |\n" for r in rows)
        update_results("Default task mix", (
            f"`python benchmarks/task_lengths.py --prompts {args.prompts} --group {args.group} --cap {args.cap}`: "
            f"SmolLM2-135M-Instruct {args.dtype}, temperature 1, chat template, answer = last number; "
            f"response lengths in tokens.\n\n" + table))


if __name__ == "__main__":
    main()
