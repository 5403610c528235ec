"""The model cache keeps no half-written copy (rollpacker/backends/models.py `save_once`): a
conversion stopped by Ctrl-C removes its temporary folder, and one a killed process left (half a
gigabyte for the default model) is removed by the next conversion.  Real conversions (the tiny
random Llama, saved as the default model is) in real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from rollpacker.backends.models import is_converted, tiny_random_llama

CTRL_C_DURING_THE_SAVE = textwrap.dedent("""
    import os, signal, sys, threading, time
    from pathlib import Path
    from rollpacker.backends.models import tiny_random_llama

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as the trainer does: a CI runner may hand SIGINT ignored
    target = Path(sys.argv[1])
    sys.setswitchinterval(1e-5)  # the watcher runs within microseconds of the copy's folder appearing
    def press_ctrl_c_once_a_copy_is_written():
        while not any(p.is_dir() for p in target.parent.glob(target.name + ".*")):
            time.sleep(0.0005)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=press_ctrl_c_once_a_copy_is_written, daemon=True).start()
    try:
        tiny_random_llama(target, hidden_size=1024, num_layers=8)  # about 330 MB: a save of a second or more
    except KeyboardInterrupt:
        sys.exit(130)
""")


def temporary_copies(target) -> list:
    return [p.name for p in target.parent.iterdir() if p.name.startswith(target.name + ".")]


def test_ctrl_c_during_a_conversion_leaves_no_copy_in_the_cache(tmp_path):
    tiny_random_llama()  # the tokenizer it borrows is converted beforehand, outside the interrupted process
    target = tmp_path / "models" / "tiny"
    proc = subprocess.run([sys.executable, "-c", CTRL_C_DURING_THE_SAVE, str(target)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert temporary_copies(target) == [] and not target.exists()


def test_a_copy_left_by_a_killed_conversion_is_removed_by_the_next_one_and_a_live_ones_kept(tmp_path):
    target = tmp_path / "models" / "tiny"
    target.parent.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = target.parent / f"tiny.{gone.stdout.strip()}.abc123"  # as kill -9 leaves it: PID no longer running
    live = target.parent / f"tiny.{os.getpid()}.def456"  # a conversion still writing (this process)
    for copy in (orphan, live):
        copy.mkdir()
        (copy / "model.safetensors").write_bytes(b"\0" * 1024)
    tiny_random_llama(target)
    assert is_converted(target)
    assert temporary_copies(target) == [live.name]
