"""Import-time stand-in for `sgl_kernel` (SGLang's compiled kernel package) in the CPU test server.

What and why: with `SGLANG_USE_CPU_ENGINE=1`, SGLang 0.5.23 imports a handful of names from
`sgl_kernel` when its modules load (KV-cache copies, request-to-token bookkeeping and
speculative-decoding tree kernels).  PyPI has no CPU build of that package, and its source build
targets AMX / AVX-512.  On a CPU without AMX, SGLang's layers take their plain-torch paths and never
call these functions, so this module only has to let the imports succeed.

Every name here is a function that records the call and raises NotImplementedError.  The record goes
to the file named by `ROLLPACKER_SGL_KERNEL_CALLS` (one line per call) so that the test suite can fail
if SGLang ever calls one: then the stand-in hides a real dependency and the CPU server is not
running SGLang's real code path.  It is test support only; never install it beside a real sgl-kernel.
"""

from __future__ import annotations

import os

STAND_IN = True
"""Lets a test tell this module from a real sgl-kernel."""

NAMES = ("copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu",
         "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
         "build_tree_kernel_efficient_cpu", "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu",
         "verify_tree_greedy_cpu")


def _record(name: str) -> None:
    path = os.environ.get("ROLLPACKER_SGL_KERNEL_CALLS")
    if path:
        with open(path, "a") as f:
            f.write(f"{name} pid={os.getpid()}\n")


def _stand_in(name: str):
    def call(*args, **kwargs):
        _record(name)
        raise NotImplementedError(f"sgl_kernel.{name} is an import-time stand-in on this CPU server "
                                  "(no CPU build of sgl-kernel exists); SGLang called it")

    call.__name__ = call.__qualname__ = name
    return call


for _name in NAMES:
    globals()[_name] = _stand_in(_name)

