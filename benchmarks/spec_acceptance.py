"""Speculative-decoding acceptance of the engine's n-gram drafter, measured on real rollouts.

    nice -n 10 .venv/bin/python benchmarks/spec_acceptance.py [--prompts 8] [--group 8] [--caps 512 2048]

Writes rollpacker/data/spec_acceptance.json, the table the simulator's speculation model reads
(rollpacker/sim/speculation.py).

1. Generate.  `--prompts` problems of the default reasoning-gym mix, rendered with the chat template as
   the reference trainer renders them (rollpacker.backends.data.tasks), `--group` samples each
   (temperature 1, EOS honoured), to completion at the largest cap, on the embedded engine with the
   default model (SmolLM2-135M-Instruct, rollpacker.backends.models.default_model_dir()), speculation
   off, every row in one batch (a round: all siblings start together).
2. Replay the drafter offline (rollpacker.backends.embedded.drafter.Drafter, the engine's own class,
   `spec_tokens` 4, `spec_ngram` 3).  Time is the decode step s: at step s every row still running holds
   its first s response tokens, a row whose length is <= s has finished (its whole text stays a
   source for its siblings).  Each row walks its verify steps as a lone speculating row would: at
   position p it asks for up to 4 drafts, the accepted prefix m is how many of them equal the tokens
   it actually sampled next, and its next verify is at p + m + 1.  For a deterministic draft, the
   standard speculative-sampling rule accepts a drafted token x with probability p(x), and the
   sampled token equals x with probability p(x) too, so the match rate is the expected acceptance.
   A smaller cap is replayed on the same generations truncated at that cap (seeded sampling: a
   request's tokens do not depend on its cap).

Reported per cap, overall and by bucket of response position and of finished-sibling share
(finished siblings / (group - 1) at the verify): verifies, drafted and accepted tokens, accepted
drafts per verify (a verify with no draft counts 0), acceptance (accepted / drafted, the engine's
`speculation_stats.acceptance_rate`) and the share of verifies that found no draft.

Assumption of the replay: a row sees its siblings at its own position (lockstep), as in a round whose
rows all decode one token a step; with speculation a row runs ahead of its siblings, which sees less
of their text at a given position (so the replay slightly overstates mid-round acceptance).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_flags import add_cpu_flags, apply_threads  # noqa: E402
from results_md import write_section  # noqa: E402
from rollpacker.backends.data.tasks import make_problems, render_prompt  # noqa: E402
from rollpacker.backends.embedded.drafter import Drafter  # noqa: E402
from rollpacker.backends.embedded.engine import EmbeddedEngine  # noqa: E402
from rollpacker.backends.models import default_model_dir, load_model  # noqa: E402
from rollpacker.core.protocols import GenerationRequest, GenerationResult  # noqa: E402

OUT = ROOT / "rollpacker" / "data" / "spec_acceptance.json"
POSITION_EDGES = (0, 64, 128, 256, 512, 1024, 2048, 1 << 30)
SHARE_EDGES = (0.0, 1e-9, 0.25, 0.5, 0.75, 1.0 - 1e-9, 1.0 + 1e-9)
"""Finished-sibling share buckets: 0, (0, 0.25), [0.25, 0.5), [0.5, 0.75), [0.75, 1), 1."""


def generate(model, tokenizer, prompts: int, group: int, cap: int, seed: int) -> list[dict]:
    problems = make_problems(None, size=prompts, seed=seed)
    requests = [GenerationRequest(f"p{i}s{k}", tuple(render_prompt(tokenizer, p)), cap, temperature=1.0,
                                  seed=seed * 7919 + i * 97 + k, group=f"p{i}")
                for i, p in enumerate(problems) for k in range(group)]
    out: dict[str, GenerationResult] = {}
    with EmbeddedEngine(model, capacity=len(requests), progress_every=1 << 30, spec_max_rows=0) as engine:
        engine.submit(requests)
        while len(out) < len(requests):
            for e in engine.poll(5.0):
                if isinstance(e, GenerationResult):
                    out[e.request_id] = e
    return [{"group": r.group, "prompt": list(r.prompt_ids), "response": list(out[r.request_id].token_ids),
             "finish": out[r.request_id].finish_reason} for r in requests]


def bucket(value: float, edges) -> int:
    for i in range(len(edges) - 1):
        if edges[i] <= value < edges[i + 1]:
            return i
    return len(edges) - 2


def replay(rows: list[dict], cap: int, spec_tokens: int, ngram: int) -> list[tuple[int, float, int, int, int]]:
    """Verify steps of every row: (position, finished-sibling share, running rows, drafted, accepted)."""
    responses = [r["response"][:cap] for r in rows]
    drafter = Drafter(ngram=ngram, min_ngram=min(2, ngram))
    contexts = [list(r["prompt"]) for r in rows]
    for i, r in enumerate(rows):
        drafter.track(str(i), r["group"], contexts[i], len(r["prompt"]))
    members: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        members.setdefault(r["group"], []).append(i)
    due = [0] * len(rows)
    verifies = []
    for s in range(max(len(x) for x in responses) + 1):
        running = sum(len(x) > s for x in responses)
        for i, resp in enumerate(responses):
            if s == len(resp):
                drafter.release(str(i))
            if s >= len(resp) or due[i] != s:
                continue
            sibs = [j for j in members[rows[i]["group"]] if j != i]
            share = sum(len(responses[j]) <= s for j in sibs) / len(sibs) if sibs else 0.0
            room = cap - s  # tokens the row may still emit
            draft = drafter.propose(str(i), min(spec_tokens, room - 1)) if room > 1 else []
            m = 0
            while m < len(draft) and s + m < len(resp) and draft[m] == resp[s + m]:
                m += 1
            verifies.append((s, share, running, len(draft), m))
            due[i] = s + m + 1
        for i, resp in enumerate(responses):  # every running row decodes one token
            if s < len(resp):
                contexts[i].append(resp[s])
    return verifies


def summarise(verifies: list) -> dict:
    n = len(verifies)
    drafted = sum(v[3] for v in verifies)
    accepted = sum(v[4] for v in verifies)
    return {"verifies": n, "drafted": drafted, "accepted": accepted,
            "accepted_per_verify": round(accepted / n, 4) if n else None,
            "acceptance": round(accepted / drafted, 4) if drafted else None,
            "no_draft_share": round(sum(v[3] == 0 for v in verifies) / n, 4) if n else None}


def table(verifies: list) -> dict:
    by_pos, by_share = {}, {}
    for v in verifies:
        by_pos.setdefault(bucket(v[0], POSITION_EDGES), []).append(v)
        by_share.setdefault(bucket(v[1], SHARE_EDGES), []).append(v)
    return {
        "all": summarise(verifies),
        "by_position": [{"from": POSITION_EDGES[b], "to": POSITION_EDGES[b + 1], **summarise(vs)}
                        for b, vs in sorted(by_pos.items())],
        "by_finished_share": [{"from": SHARE_EDGES[b], "to": SHARE_EDGES[b + 1], **summarise(vs)}
                              for b, vs in sorted(by_share.items())],
    }


def results_body(data: dict) -> str:
    """The RESULTS.md section for a written table."""
    def rows(entries, label):
        return "\n".join(f"| {label(e)} | {e['verifies']} | {e['drafted']} | {e['accepted']} | "
                         f"{e['accepted_per_verify']} | {e['acceptance']} | {e['no_draft_share']} |" for e in entries)

    head = ("| {} | verifies | drafted | accepted | accepted per verify | acceptance | no draft |\n"
            "|---|---|---|---|---|---|---|")
    parts = [f"`{data['command']}` on {data['machine']}, torch {data['torch']}: "
             f"{data['model']} {data['device']}, {data['prompts']} prompts x {data['group']} samples "
             f"({data['requests']} requests) of the {data['tasks']}, temperature {data['temperature']}, generated "
             f"to completion at cap {data['generated_at_cap']} in {data['generate_s']:.0f} s; the engine's "
             f"drafter (spec_tokens {data['spec_tokens']}, ngram {data['ngram']}) replayed offline (see the "
             f"script's docstring).  Table: rollpacker/data/spec_acceptance.json, read by the simulator.",
             f"Response lengths: median {sorted(data['response_lengths'])[len(data['response_lengths']) // 2]}, "
             f"max {max(data['response_lengths'])}, at the cap "
             f"{sum(n >= data['generated_at_cap'] for n in data['response_lengths'])} of {data['requests']}."]
    for cap, t in sorted(data["caps"].items(), key=lambda kv: int(kv[0])):
        a = t["all"]
        parts.append(f"**cap {cap}**: {a['verifies']} verifies, {a['accepted_per_verify']} accepted drafts per "
                     f"verify, acceptance {a['acceptance']}, no draft found in {a['no_draft_share']:.0%} of verifies.")
        parts.append(head.format("response position") + "\n" + rows(t["by_position"], lambda e: f"{e['from']}-{e['to'] if e['to'] < 1 << 29 else ''}"))
        parts.append(head.format("finished-sibling share") + "\n" + rows(
            t["by_finished_share"], lambda e: "0" if e["to"] < 1e-6 else ("1" if e["from"] > 1 - 1e-6 else f"{e['from']:.2f}-{e['to']:.2f}")))
    parts.append("Acceptance = accepted / drafted tokens (the engine's `speculation_stats.acceptance_rate`); "
                 "accepted per verify counts a verify that found no draft as 0.  Assumptions of the simulator's use "
                 "of it (rollpacker/sim/speculation.py): the table of a 135M model on short reasoning tasks stands "
                 "for 7B-32B models at 8k-32k (the longest cap measured here is used at every length), and a row "
                 "sees its siblings at its own position (lockstep).")
    return "\n\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (siblings)")
    ap.add_argument("--caps", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--spec-tokens", type=int, default=4, help="drafts per verify (the engine's spec_tokens)")
    ap.add_argument("--ngram", type=int, default=3, help="longest suffix matched (the engine's spec_ngram)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    add_cpu_flags(ap)
    ap.add_argument("--results-only", action="store_true", help="only rewrite RESULTS.md from --out")
    args = ap.parse_args()
    if args.results_only:
        write_section("Speculation acceptance", results_body(json.loads(args.out.read_text())))
        return
    apply_threads(args)
    model, tokenizer = load_model(None, dtype="float32", device="cpu")
    start = time.perf_counter()
    rows = generate(model, tokenizer, args.prompts, args.group, max(args.caps), args.seed)
    gen_s = time.perf_counter() - start
    lengths = [len(r["response"]) for r in rows]
    result = {
        "command": "python benchmarks/spec_acceptance.py " + " ".join(sys.argv[1:]),
        "model": default_model_dir().name, "device": "cpu float32",
        "machine": f"{platform.machine()} {os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__, "prompts": args.prompts, "group": args.group, "requests": len(rows),
        "tasks": "default reasoning-gym mix (rollpacker.backends.data.tasks.make_problems)",
        "temperature": 1.0, "spec_tokens": args.spec_tokens, "ngram": args.ngram, "seed": args.seed,
        "generated_at_cap": max(args.caps), "generate_s": round(gen_s, 1),
        "response_lengths": sorted(lengths),
        "caps": {},
    }
    for cap in sorted(args.caps):
        result["caps"][str(cap)] = table(replay(rows, cap, args.spec_tokens, args.ngram))
        print(json.dumps({"cap": cap, **result["caps"][str(cap)]["all"]}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({gen_s:.0f} s generating {sum(lengths)} tokens)", flush=True)
    if args.write_results:
        write_section("Speculation acceptance", results_body(result))


if __name__ == "__main__":
    main()
