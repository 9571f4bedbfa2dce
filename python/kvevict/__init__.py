# SPDX-License-Identifier: MIT
"""kvevict: KV-cache eviction policies (H2O and its neighbours) from Python.

A thin ctypes binding over the C library libkvevict (no compiler needed;
numpy is the only dependency). Everything the C API promises holds here:
the same policies, the same victims, the same harness figures bit for bit.

    import kvevict, numpy as np
    p = kvevict.Policy("h2o:budget=256,recent_window=64")
    for pos in range(4096):
        n = p.size
        p.step(pos, np.full(n, 1.0 / n, dtype=np.float32) if n else None)
        victims = p.evict(256)          # int32, ascending: drop them from your cache

    tr = kvevict.Trace.from_array(attn)  # float32 [L, H, T, T], no file written
    rows = kvevict.evaluate(tr, ["h2o", "streaming", "tova"], head=0)
    live = kvevict.Trace.from_callback(step_attention, heads=H, steps=T, layers=L)
    rows = kvevict.evaluate(live, ["h2o"], heads=live.heads)  # step by step, as computed

Errors raise KvevictError subclasses, one per kve_status, carrying the
library's message (.message) and the status's name (.status). Arrays are
checked before any call: numpy float32, C-contiguous, the right length.
The GIL is released during every library call (ctypes.CDLL; a live
trace's callable takes it back while it runs), so other
Python threads run while a long call (opening a trace, evaluate) works;
objects are not locked: use one object from one thread at a time. The
library is found through KVEVICT_LIBRARY, a built source tree, beside the
package, the prefix recorded at install, pkg-config or ldconfig (see
kvevict._lib). docs/python.md is the guide.
"""
from ._errors import (CanceledError, FormatError, InvalidArgumentError, KvevictError,
                      KvevictIOError, OutOfMemoryError, RangeError)
from ._lib import path as library_path
from ._core import (Bank, Policy, Rng, attn_row, isa, layer_budgets, min_budget, policies,
                    prefill_rows, prefill_scores, register_rule, spec_with, unregister_rule,
                    version, version_number)
from ._trace import PER_HEAD_KEYS, RESULT_DTYPE, Trace, evaluate

__version__ = "0.1.0"

__all__ = [
    "Bank", "CanceledError", "FormatError", "InvalidArgumentError", "KvevictError",
    "KvevictIOError", "OutOfMemoryError", "PER_HEAD_KEYS", "Policy", "RESULT_DTYPE", "RangeError",
    "Rng", "Trace", "attn_row", "evaluate", "isa", "layer_budgets", "library_path", "min_budget",
    "policies", "prefill_rows", "prefill_scores", "register_rule", "spec_with", "unregister_rule",
    "version", "version_number",
]
