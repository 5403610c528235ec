"""The run directory: everything a run leaves behind, in one place.

    RUN_DIR/metrics.jsonl          one JSON record per step (field names shared with `rollpacker simulate`)
    RUN_DIR/eval.jsonl             one JSON record per held-out evaluation (--eval-every; train/evaluation.py)
    RUN_DIR/tensorboard/           TensorBoard events of every numeric metric (equal to metrics.jsonl, resumes included)
    RUN_DIR/timeline.png           the step that shows the policy (plots.timeline.step_to_draw): running
                                   requests against capacity, aborts, the trainer's lane, token split
    RUN_DIR/summary.png            step times, tokens/s, wasted-token share and mean reward per step
    RUN_DIR/checkpoints/step_N/    HF-format checkpoint (safetensors + config + tokenizer)
    RUN_DIR/state/                 resumable state: trainer (DCP), scheduler (JSON), run config, and
                                   sizes.json and hashes.json (each file's size and CRC-32, checked
                                   before a resume reads any)
    RUN_DIR/run.lock               the PID of the trainer running here (an OS lock while it runs)

State is written to a temporary sibling and renamed, so a kill at any moment leaves either the old
state or the new one, never half of one.  A state damaged afterwards (a truncated copy, a full disk
outside the run, bytes overwritten in place) is one line naming the file and the way out, not a
traceback from the loader nor a resume from damaged weights (train/manifests.py).

One process at a time: the trainer holds an `fcntl.flock` on run.lock for its whole life, so a
second trainer (a new run, a --resume, a --compare) on the same directory is refused with one line
naming the PID, and a killed one (even kill -9) leaves no stale lock: the OS drops it with the process.

Several trainer ranks (torchrun, one node or several): every rank writes its own DCP shard into
state/trainer/, rank 0 everything else, and only global rank 0 takes run.lock.  On several nodes the
directory must be shared; train/nodes.py checks that it is before anything reads or writes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rollpacker.core.errors import ConfigError, RollpackerError

from .events import EVENTS_DIR, open_writer, rewrite_events, scalars
from .manifests import damaged_file, file_digest, write_manifests

STATE = "state"
SCHEDULER_FILE = "scheduler.json"
CONFIG_FILE = "config.json"
DATASET_MARK = "dataset.sha256"
LOCK_FILE = "run.lock"
LOCK_HOLDER_ENV = "ROLLPACKER_RUN_LOCK_HOLDER"
"""Set by a trainer that holds the lock for the processes it launches (--nproc: torchrun's rank 0)."""


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


_HELD_LOCKS: dict[Path, int] = {}
"""run.lock files this process holds, with their open descriptors (kept open until it exits)."""


class SaveError(RollpackerError):
    """Writing the run's state or a checkpoint failed (disk full, read-only, ...); names the path."""


class StateCorrupt(RollpackerError):
    """A file of the saved state is missing, cut short or unreadable; names it and the way out."""


class RunDirLocked(RollpackerError):
    """Another process runs a trainer in this directory; names its PID."""


def os_reason(exc: BaseException, path: Path) -> str:
    """One line for a failed write: "the disk is full" when it is, else the OS error."""
    no_space = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "unexpected pos" in str(exc)
    try:
        no_space = no_space or shutil.disk_usage(path).free < 1 << 20
    except OSError:
        pass
    if no_space:
        return "the disk is full"
    return getattr(exc, "strerror", None) or str(exc).splitlines()[0]


def write_errors() -> tuple[type[BaseException], ...]:
    """What a failed write raises: OS errors, torch's RuntimeError, and DCP's CheckpointException
    (a BaseException that wraps each rank's error)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return OSError, RuntimeError, CheckpointException


@contextlib.contextmanager
def interrupt_after():
    """Hold Ctrl-C and SIGTERM until the block ends: torch's writers turn an exception raised inside
    a write into RuntimeError("unexpected pos"), so a save finishes first and the signal follows (its
    own handler then runs: KeyboardInterrupt, or the trainer's SIGTERM line)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed = []
    previous = {sig: signal.signal(sig, lambda signum, _: pressed.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if pressed:
        signal.raise_signal(pressed[0])


def writable_dir(path: Path, flag: str, parents: bool = True) -> None:
    """Make `path` (and its missing parents, unless `parents` is False) and write a probe file in it:
    one line naming `flag` when that fails, before any model loads rather than at the first write."""
    if not parents and not path.parent.is_dir():
        raise ConfigError(f"{flag}: {path.parent} does not exist (is the filesystem mounted?); create it first")
    try:
        path.mkdir(parents=parents, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write_probe"):  # its own name: other ranks probe too
            pass
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot write there ({os_reason(exc, path)})") from None


class RunDir:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        writable_dir(self.path, f"--out {self.path}")
        self.metrics_path = self.path / "metrics.jsonl"
        self.eval_path = self.path / "eval.jsonl"
        self._tb = None

    def lock(self, flag: str = "--out") -> RunDir:
        """Hold run.lock for the life of this process (the OS releases it when the process ends,
        however it ends); another holder is one line naming its PID and `flag`."""
        path = self.path / LOCK_FILE
        if path.resolve() in _HELD_LOCKS:  # flock: a second open() of the file would not share the lock
            return self
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd)
            os.close(fd)
            if holder is not None and os.environ.get(LOCK_HOLDER_ENV) == str(holder):
                return self  # the trainer that launched this process (--nproc) holds it for us
            raise RunDirLocked(f"{flag} {self.path} is in use: process {holder or '(unknown)'} holds {path} (a "
                               f"trainer running there); wait for it to end or stop it (--resume {self.path} "
                               f"continues it then), or use a fresh --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _HELD_LOCKS[path.resolve()] = fd
        return self

    def holds_a_run(self) -> bool:
        """Whether an earlier run left metrics, state or checkpoints here."""
        return any((self.path / name).exists() for name in ("metrics.jsonl", STATE, STATE + ".old", "checkpoints"))

    def check_dataset(self, dataset: Path | None, resume: bool) -> None:
        """Note the --dataset file's sha256 when a run starts; a resume refuses a file that changed
        (its prompts would no longer be the ones the saved state counts)."""
        if dataset is None:
            return
        digest = file_digest(dataset, "sha256")
        mark = self.path / DATASET_MARK
        if resume and mark.is_file() and mark.read_text().split()[0] != digest:
            raise ConfigError(f"--resume {self.path}: the --dataset file {dataset} changed since the run started "
                              f"(sha256 in {mark}); put the original back or start a new run with a fresh --out")
        if not resume:
            mark.write_text(f"{digest}  {dataset}\n")

    def saved_step(self) -> int | None:
        """Steps finished in the saved state (None: nothing saved yet)."""
        try:
            return int(self.load_scheduler()["step"])
        except ConfigError:
            return None

    # -- metrics ---------------------------------------------------------------------------------

    def records(self) -> list[dict]:
        return read_jsonl(self.metrics_path)

    def eval_records(self) -> list[dict]:
        """The held-out evaluations (--eval-every), each with `step`: the optimizer steps before it."""
        return read_jsonl(self.eval_path)

    def eval_steps(self) -> set[int]:
        return {r["step"] for r in self.eval_records()}

    def truncate_to(self, steps: int) -> None:
        """Keep the records of the first `steps` steps, in metrics.jsonl and the TensorBoard events, and
        the evaluations of their weights (after a resume, the interrupted step is played again and logged
        anew)."""
        records = self.records()
        kept = [r for r in records if r["step"] < steps]
        self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        if len(kept) < len(records):  # events are written after the record: none beyond the records
            rewrite_events(self.path / EVENTS_DIR, kept)
        if self.eval_path.exists():
            evals = [r for r in self.eval_records() if r["step"] <= steps]
            self.eval_path.write_text("".join(json.dumps(r) + "\n" for r in evals))

    def log_step(self, record: dict) -> None:
        self._log(self.metrics_path, record)

    def log_eval(self, record: dict) -> None:
        self._log(self.eval_path, record)

    def _log(self, path: Path, record: dict) -> None:
        """One JSON line in `path`, and its numbers as TensorBoard scalars at its step."""
        with path.open("a") as f:
            f.write(json.dumps(_jsonable(record)) + "\n")
        if self._tb is None:
            self._tb = open_writer(self.path / EVENTS_DIR)
        for tag, value in scalars(record):
            self._tb.add_scalar(tag, value, record["step"])
        self._tb.flush()

    # -- plots -----------------------------------------------------------------------------------

    def plot_timeline(self, intervals, record: dict, capacity: int) -> Path | None:
        """The step's occupancy picture (rollpacker.plots.timeline) from the loop's request intervals
        and the step's record (its rollout_s is the round's end), drawn when the step (logged) is the
        run's `step_to_draw` so far; None when it is not."""
        from rollpacker.plots.timeline import EngineTrace, StepTimeline, plot_step_timeline, step_to_draw

        chosen, why = step_to_draw(self.records())
        if chosen != record["step"]:
            return None
        round_end = record["rollout_s"]
        training = tuple((start, stop, what) for start, stop, what in record.get("train_spans", ()))
        end = max([record.get("step_s", 0.0), round_end] + [i.end or i.start for i in intervals]
                  + [stop for _, stop, _ in training])
        tokens = {"kept": 0, "aborted": 0, "wasted": 0, "carried": 0}
        for i in intervals:
            if i.outcome in tokens:
                tokens[i.outcome] += i.num_tokens
        timeline = StepTimeline(
            title=f"step {record['step']} ({record.get('round', '?')} round): {len(intervals)} requests, "
                  f"rollout {round_end:.1f} s, bubble {record.get('bubble_ratio', 0.0):.1%}\n"
                  f"drawn as {why}",
            engines=(EngineTrace.from_spans("engine", [(i.start, i.end) for i in intervals], capacity, end),),
            round_end=round_end, step_end=end,
            aborts=tuple((i.end, 0) for i in intervals if i.outcome == "aborted" and i.end is not None),
            tokens=tokens,
            requests=tuple((i.start, i.end, i.outcome) for i in intervals), training=training)
        return plot_step_timeline(timeline, self.path / "timeline.png")

    def plot_summary(self, records: list[dict] | None = None) -> Path:
        from rollpacker.plots.summary import plot_step_summary

        records = self.records() if records is None else records
        return plot_step_summary(records, self.path / "summary.png", title=f"{self.path.name}: {len(records)} steps")

    # -- checkpoints and state -------------------------------------------------------------------

    def save_hf_checkpoint(self, step: int, weights: dict, model_dir: str | os.PathLike) -> Path:
        """HF-format checkpoint: safetensors weights plus the base model's config and tokenizer."""
        from safetensors.torch import save_file

        target = self.path / "checkpoints" / f"step_{step}"
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for item in Path(model_dir).iterdir():
            if item.is_file() and not item.name.endswith((".safetensors", ".bin", ".gguf")) and item.name != "model.safetensors.index.json":
                shutil.copy2(item, tmp / item.name)
        try:
            save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
        except write_errors() as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SaveError(f"writing the HF checkpoint {target} failed: {os_reason(exc, self.path)}; "
                            f"the resumable state in {self.path / STATE} is intact") from None
        _readable(tmp / "model.safetensors")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        return target

    def save_state(self, config, scheduler: dict, trainer) -> None:
        """Resumable state of a finished step, replaced atomically (a Ctrl-C waits for it)."""
        with interrupt_after():
            self._save_state(config, scheduler, trainer)

    def _save_state(self, config, scheduler: dict, trainer) -> None:
        tmp = self.path / (STATE + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            trainer.save(tmp / "trainer")
            (tmp / SCHEDULER_FILE).write_text(json.dumps(scheduler))
            (tmp / CONFIG_FILE).write_text(json.dumps(_jsonable(config), indent=1))
            write_manifests(tmp)
        except write_errors() as exc:  # torch reports a full disk as RuntimeError("unexpected pos")
            shutil.rmtree(tmp, ignore_errors=True)
            kept = f"the previous state in {self.path / STATE} is intact" if (self.path / STATE).exists() else \
                "no state was saved yet"
            raise SaveError(f"saving the state of step {scheduler['step']} to {tmp} failed: "
                            f"{os_reason(exc, self.path)}; {kept}") from None
        old = self.path / (STATE + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if (self.path / STATE).exists():
            os.replace(self.path / STATE, old)
        os.replace(tmp, self.path / STATE)
        shutil.rmtree(old, ignore_errors=True)

    def state_dir(self) -> Path:
        state = self.path / STATE
        if not (state / SCHEDULER_FILE).is_file():
            old = self.path / (STATE + ".old")  # killed between the two renames
            if (old / SCHEDULER_FILE).is_file():
                return old
            raise ConfigError(f"--resume {self.path}: no resumable state in {state} (was a step ever finished?)")
        return state

    def load_config_dict(self) -> dict:
        return self._read_json(self.state_dir() / CONFIG_FILE)

    def load_scheduler(self) -> dict:
        return self._read_json(self.state_dir() / SCHEDULER_FILE)

    def check_state(self) -> None:
        """Before a resume reads anything: every file the state was saved with is there, at the
        size and with the CRC-32 it was saved with (a state saved before sizes.json existed is not
        checked; one saved before hashes.json, by size only)."""
        damage = damaged_file(self.state_dir(), self._read_json)
        if damage is not None:
            raise self.corrupt(*damage)

    def corrupt(self, path: Path, what: str) -> StateCorrupt:
        """The one line for a damaged state file: what is wrong, and how to go on without it."""
        checkpoints = sorted(self.path.glob("checkpoints/step_*/model.safetensors"),
                             key=lambda p: int(p.parent.name.removeprefix("step_")))
        way = "start again with a fresh --out"
        if checkpoints:
            way += f", or from its newest checkpoint: --model {checkpoints[-1].parent} --out NEW_DIR"
        return StateCorrupt(f"--resume {self.path}: the saved state is damaged: {path} {what}; it cannot be "
                            f"resumed: {way}")

    def _read_json(self, path: Path):
        try:
            return json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            raise self.corrupt(path, f"is not valid JSON ({str(exc).splitlines()[0]})") from None


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file ([] when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _lock_holder(fd: int) -> int | None:
    """The PID written in a held lock file (None if it cannot be read: the holder may not have
    written it yet)."""
    for _ in range(20):
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode(errors="replace").strip()
        if text.isdigit():
            return int(text)
        time.sleep(0.05)
    return None


def _readable(path: Path) -> None:
    """safetensors writes 0600; give the checkpoint the mode the umask gives any new file."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)
