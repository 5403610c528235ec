"""The SGLang client under many streams: how many streamed tokens one client core takes in.

    .venv/bin/python benchmarks/stream_client.py [--trees OLD_TREE .] [--write-results]

Fake SGLang servers, each its own process on 127.0.0.1, answer /generate as SGLang does with
`--incremental-streaming-output --stream-interval 16`: a chunk of 16 new output ids and their
log-probs per line, as fast as the client reads.  The client (`SGLangEngine`, in its own process
with PYTHONPATH set to each tree, so an older checkout runs side by side with this one) submits
every request at once and polls until each result is in.  Two loads:

- many: 10,000 concurrent streams of 256 tokens (sockets, the loop's per-request cost);
- long: 64 streams of 32,768 tokens (the per-token cost as a response grows).

Printed per tree and load: tokens received, results that came back aborted, the client process's
CPU seconds and tokens per client CPU second (the figure that matters: wall time here is shared
with the servers on the same cores).  `--nofile N` starts the client with a soft open-file limit of
N (the hard limit unchanged), as many distributions set it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 16
LOADS = {"many": (10_000, 256), "long": (64, 32_768)}


# -- the fake server (a subprocess: `stream_client.py --serve PORT`) -------------------------------

def serve(port: int, capacity: int) -> None:
    from aiohttp import web

    async def ok(request):
        return web.Response(status=200)

    async def model_info(request):
        return web.json_response({"model_path": "fake"})

    async def server_info(request):
        return web.json_response({"max_running_requests": capacity, "incremental_streaming_output": True})

    async def generate(request):
        body = await request.json()
        n = int(body["sampling_params"]["max_new_tokens"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for start in range(0, n, CHUNK):
            ids = list(range(start, min(n, start + CHUNK)))
            done = start + CHUNK >= n
            meta = {"completion_tokens": start + len(ids), "prompt_tokens": 3,
                    "finish_reason": {"type": "length", "length": n} if done else None,
                    "output_token_logprobs": [[-0.5, i, None] for i in ids]}
            await resp.write(b"data: " + json.dumps({"output_ids": ids, "meta_info": meta}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.add_routes([web.get("/health", ok), web.get("/get_model_info", model_info),
                    web.get("/get_server_info", server_info), web.post("/generate", generate),
                    web.post("/abort_request", ok)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=4096)


# -- the client (a subprocess per tree: `stream_client.py --client URLS ...`) ----------------------

def client(urls: list[str], requests: int, tokens: int) -> dict:
    from rollpacker.backends.sglang.client import SGLangEngine
    from rollpacker.core.protocols import GenerationRequest, GenerationResult

    with SGLangEngine(urls, capacity_per_server=requests, stall_timeout_s=60, start_timeout_s=60) as engine:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        engine.submit([GenerationRequest(f"rp{i:012d}", (1, 2, 3), max_new_tokens=tokens, temperature=0.0)
                       for i in range(requests)])
        received = aborted = results = 0
        error = None
        deadline = time.monotonic() + 1800
        while results < requests and time.monotonic() < deadline:
            try:
                events = engine.poll(1.0)
            except Exception as exc:  # noqa: BLE001  (reported, not hidden: the old tree aborts silently)
                error = f"{type(exc).__name__}: {str(exc)[:160]}"
                break
            for event in events:
                if isinstance(event, GenerationResult):
                    results += 1
                    received += len(event.token_ids)
                    aborted += event.finish_reason == "abort"
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"requests": requests, "results": results, "aborted": aborted, "tokens": received,
            "cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "tok_per_cpu_s": round(received / max(cpu, 1e-9)),
            "error": error}


# -- the side-by-side run -------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_servers(n: int, capacity: int) -> tuple[list[subprocess.Popen], list[str]]:
    procs, urls = [], []
    for _ in range(n):
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--capacity", str(capacity)]))
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    for url in urls:
        port = int(url.rsplit(":", 1)[1])
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"error: fake server {url} did not start")
                time.sleep(0.2)
    return procs, urls


def run_client(tree: Path, urls: list[str], load: str, nofile: int | None) -> dict:
    requests, tokens = LOADS[load]
    env = dict(os.environ, PYTHONPATH=str(tree))

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    out = subprocess.run([sys.executable, __file__, "--client", *urls, "--load", load], env=env, cwd=tree,
                         capture_output=True, text=True, preexec_fn=limit, timeout=2400)
    if out.returncode != 0:
        raise SystemExit(f"error: the client on {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="+", default=[str(ROOT)], help="checkouts to compare, side by side")
    ap.add_argument("--loads", nargs="+", choices=sorted(LOADS), default=["many", "long"])
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--nofile", type=int, default=None, help="the client's soft open-file limit")
    ap.add_argument("--write-results", action="store_true", help="write the table into benchmarks/RESULTS.md")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--capacity", type=int, default=10_000, help=argparse.SUPPRESS)
    ap.add_argument("--client", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--load", choices=sorted(LOADS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args.capacity)
    if args.client:
        print(json.dumps(client(args.client, *LOADS[args.load])))
        return
    procs, urls = start_servers(args.servers, max(r for r, _ in LOADS.values()))
    rows = []
    try:
        for load in args.loads:
            for tree in args.trees:
                r = run_client(Path(tree).resolve(), urls, load, args.nofile)
                rows.append((load, tree, r))
                print(f"{load:5s} {tree}: {r['tokens']:,} tokens, {r['results']}/{r['requests']} results "
                      f"({r['aborted']} aborted), client {r['cpu_s']} CPU s, {r['tok_per_cpu_s']:,} tok per CPU s"
                      + (f"; {r['error']}" if r["error"] else ""), flush=True)
    finally:
        for p in procs:
            p.terminate()
    if args.write_results:
        write_results(rows, args)


def write_results(rows: list, args: argparse.Namespace) -> None:
    from results_md import write_section

    lines = [f"`python benchmarks/stream_client.py --trees {' '.join(args.trees)}"
             + (f" --nofile {args.nofile}" if args.nofile else "") + f" --write-results` ({args.servers} fake "
             "SGLang server processes streaming 16-token incremental chunks on 127.0.0.1; client and servers "
             f"share the machine's {os.cpu_count()} cores, so tokens per client CPU second is the figure, not wall time).",
             "", "| load | tree | results (aborted) | tokens | client CPU s | tokens per client CPU s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for load, tree, r in rows:
        n, t = LOADS[load]
        lines.append(f"| {load}: {n:,} x {t:,} tokens | `{tree}` | {r['results']:,} ({r['aborted']:,}) | "
                     f"{r['tokens']:,} | {r['cpu_s']} | {r['tok_per_cpu_s']:,} |" + (f" {r['error']}" if r["error"] else ""))
    write_section("SGLang client under many streams", "\n".join(lines))


if __name__ == "__main__":
    main()
