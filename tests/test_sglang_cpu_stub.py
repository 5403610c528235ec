"""The `sgl_kernel` stand-in the real SGLang server loads on a CPU (tests/sglang_cpu/sgl_kernel): every
name SGLang imports from it exists, and a call records itself and raises, so that the SGLang suite's
check (`check_stub_never_called`, after each module's servers stop) fails if SGLang ever uses one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import sglang_helpers

STUB = Path(__file__).with_name("sglang_cpu") / "sgl_kernel" / "__init__.py"
IMPORTED_BY_SGLANG_ON_CPU = ("copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu",
                             "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
                             "build_tree_kernel_efficient_cpu", "fill_accept_out_cache_loc_cpu",
                             "fill_bonus_tokens_cpu", "verify_tree_greedy_cpu")


def load_stub():
    spec = importlib.util.spec_from_file_location("sgl_kernel_stand_in", STUB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_name_exists_and_a_call_records_itself_and_raises(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv("ROLLPACKER_SGL_KERNEL_CALLS", str(calls))
    stub = load_stub()
    assert stub.STAND_IN is True
    for name in IMPORTED_BY_SGLANG_ON_CPU:
        with pytest.raises(NotImplementedError, match=name):
            getattr(stub, name)(1, x=2)
    lines = calls.read_text().splitlines()
    assert [line.split()[0] for line in lines] == list(IMPORTED_BY_SGLANG_ON_CPU)


def test_the_suite_check_fails_once_a_call_was_recorded(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setattr(sglang_helpers, "STUB_CALLS", calls)
    sglang_helpers.check_stub_never_called()  # nothing recorded: passes
    monkeypatch.setenv("ROLLPACKER_SGL_KERNEL_CALLS", str(calls))
    with pytest.raises(NotImplementedError):
        load_stub().fill_bonus_tokens_cpu()
    with pytest.raises(AssertionError, match="fill_bonus_tokens_cpu"):
        sglang_helpers.check_stub_never_called()
