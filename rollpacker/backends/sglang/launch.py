"""Start SGLang-API servers as subprocesses, wait for /health, stop them cleanly; or attach to URLs.

    with launch_servers("Qwen/Qwen2.5-7B", num_servers=4, tp_size=2, gpus=range(8)) as group:
        engine = SGLangEngine(group.urls, expected_model="Qwen/Qwen2.5-7B")

`kind="sglang"` runs `python -m sglang.launch_server` with `python` (default: this interpreter; SGLang
pins its own torch, so it usually lives in a virtual environment of its own); `kind="rollpacker"` runs
`rollpacker serve` (the embedded engine).  On a machine without a CUDA device, SGLang servers get the
CPU flags (`CPU_SGLANG_ARGS`, each unless `extra_args` sets it) and `SGLANG_USE_CPU_ENGINE=1`.  Each server runs in its own process group (SGLang forks
scheduler and detokenizer processes), so stopping sends SIGTERM to the group, then SIGKILL after a
grace period.  Output goes to a log file per server; a server that exits or stays unhealthy past
the timeout fails the launch with the tail of its log.  `attach(urls)` gives the same group shape
for servers someone else runs (stop does nothing to them).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

from attrs import define, field

from rollpacker.backends.errors import ServerUnavailable
from rollpacker.core.errors import ConfigError

CPU_SGLANG_ARGS = {"--device": ("cpu",), "--attention-backend": ("torch_native",), "--dtype": ("float32",),
                   "--max-total-tokens": ("32768",), "--cuda-graph-backend-decode": ("disabled",),
                   "--cuda-graph-backend-prefill": ("disabled",), "--sleep-on-idle": ()}
"""SGLang (0.5.23) on a CPU: its plain-torch attention; float32 (`auto` turns a float32 checkpoint into
float16, about 5x slower on a CPU without AMX); a KV cache of 32k tokens (the default takes 72% of free
RAM); no CUDA graphs; an idle scheduler that waits on its sockets (by default it polls them in a busy
loop: a whole core per server, taken from the trainer and the other servers on the same CPUs).  Needs `SGLANG_USE_CPU_ENGINE=1` in the server's environment (set by
`launch_servers`) and an `sgl_kernel` module (see docs/sglang.md: Real SGLang servers, GPU and CPU)."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@define(eq=False)
class ServerProcess:
    url: str
    process: subprocess.Popen | None
    log_path: Path | None

    def log_tail(self, num_chars: int = 2000) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the server's whole process group (tests use SIGKILL to simulate a crash)."""
        if self.is_alive():
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.kill(signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.process.wait(5)


@define(eq=False)
class ServerGroup:
    servers: list[ServerProcess] = field(factory=list)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def attach(urls: Iterable[str], *, timeout_s: float = 30.0) -> ServerGroup:
    """Servers someone else runs: wait for their /health, manage nothing."""
    group = ServerGroup([ServerProcess(u.rstrip("/"), None, None) for u in urls])
    wait_healthy(group.servers, timeout_s)
    return group


STREAM_ARGS = {"--incremental-streaming-output": (), "--stream-interval": ("16",)}
"""How the SGLang servers we launch stream (unless `extra_args` sets the flag): each chunk carries only
the new tokens and log-probs (SGLang's default repeats all so far in every chunk: quadratic in the
response length), every 16 tokens (the client needs a stream for liveness and partial tokens on an
abort, not every token)."""


def has_cuda() -> bool:
    """Whether this machine has an NVIDIA device (without importing torch: the launcher may lack it)."""
    return Path("/dev/nvidiactl").exists()


def server_command(kind: str, model: str, host: str, port: int, tp_size: int, extra_args: Sequence[str],
                   *, python: str | None = None, cpu: bool = False) -> list[str]:
    if kind == "sglang":
        defaults = {**STREAM_ARGS, **(CPU_SGLANG_ARGS if cpu else {})}
        added = [part for flag, value in defaults.items() if not _has_flag(extra_args, flag)
                 for part in (flag, *value)]
        return [python or sys.executable, "-m", "sglang.launch_server", "--model-path", model,
                "--tp-size", str(tp_size), "--host", host, "--port", str(port), *added, *extra_args]
    if kind == "rollpacker":
        if tp_size != 1:
            raise ConfigError(f"rollpacker serve runs on CPU with tp_size=1, got tp_size={tp_size}")
        return [sys.executable, "-m", "rollpacker.cli", "serve", "--model", model, "--host", host,
                "--port", str(port), *extra_args]
    raise ConfigError(f"kind must be 'sglang' or 'rollpacker', got {kind!r}")


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def cpu_threads(num_servers: int, cores: int | None = None) -> int:
    """Torch threads each of `num_servers` CPU servers gets (its OMP_NUM_THREADS unless the environment
    sets one): the machine's cores split among them.  By default torch gives every process all the cores,
    and servers that decode together then oversubscribe them: on 2 cores two SGLang servers decoding at
    once took 4-13x as long as one alone, 1.1-1.3x with one thread each."""
    return max(1, (cores or os.cpu_count() or 1) // num_servers)


def launch_servers(model: str, *, num_servers: int = 1, tp_size: int = 1, kind: str = "sglang",
                   host: str = "127.0.0.1", ports: Sequence[int] | None = None, gpus: Iterable[int] | None = None,
                   extra_args: Sequence[str] = (), log_dir: str | os.PathLike | None = None,
                   timeout_s: float = 600.0, env: dict | None = None, python: str | None = None,
                   cpu: bool | None = None, threads: int | None = None) -> ServerGroup:
    """Start `num_servers` servers of `model` with `tp_size` GPUs each and wait until all are healthy.
    `gpus`: the GPU ids to split among them (tp_size consecutive ids per server).  `python`: the
    interpreter that runs SGLang (default: this one).  `cpu`: SGLang on the CPU (default: when this
    machine has no CUDA device).  `threads`: each CPU server's torch threads (default: the cores split among
    the `num_servers`, `cpu_threads`; an OMP_NUM_THREADS in the environment wins)."""
    if num_servers < 1 or tp_size < 1:
        raise ConfigError(f"num_servers and tp_size must be >= 1, got {num_servers}, {tp_size}")
    gpu_list = None if gpus is None else list(gpus)
    if gpu_list is not None and len(gpu_list) < num_servers * tp_size:
        raise ConfigError(f"{num_servers} servers x tp {tp_size} need {num_servers * tp_size} GPUs, got {gpu_list}")
    ports = list(ports) if ports is not None else [free_port(host) for _ in range(num_servers)]
    log_root = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="rollpacker-servers-"))
    log_root.mkdir(parents=True, exist_ok=True)
    cpu = (not has_cuda()) if cpu is None else cpu
    group = ServerGroup()
    try:
        for i in range(num_servers):
            server_env = dict(os.environ if env is None else env)
            if kind == "sglang" and cpu:
                server_env.setdefault("SGLANG_USE_CPU_ENGINE", "1")
            if cpu or kind == "rollpacker":  # (rollpacker serve runs on the CPU)
                server_env.setdefault("OMP_NUM_THREADS", str(threads or cpu_threads(num_servers)))
            if gpu_list is not None:
                server_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_list[i * tp_size:(i + 1) * tp_size]))
            log_path = log_root / f"server-{i}-{ports[i]}.log"
            with open(log_path, "wb") as log_file:
                proc = subprocess.Popen(
                    server_command(kind, model, host, ports[i], tp_size, extra_args, python=python, cpu=cpu),
                    stdout=log_file, stderr=subprocess.STDOUT, env=server_env, start_new_session=True)
            group.servers.append(ServerProcess(f"http://{host}:{ports[i]}", proc, log_path))
        wait_healthy(group.servers, timeout_s)
    except BaseException:
        group.stop()
        raise
    return group


def wait_healthy(servers: Sequence[ServerProcess], timeout_s: float) -> None:
    """Poll each server's /health until 200; fail naming the server if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    for server in servers:
        while True:
            if server.process is not None and server.process.poll() is not None:
                raise ServerUnavailable(
                    f"server {server.url} exited with code {server.process.returncode} before it was healthy; "
                    f"log {server.log_path}:\n{server.log_tail()}")
            try:
                with urllib.request.urlopen(server.url + "/health", timeout=2.0) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"server {server.url} not healthy after {timeout_s:.0f} s; "
                                        f"log {server.log_path}:\n{server.log_tail()}")
            time.sleep(0.25)
