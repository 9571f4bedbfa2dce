# SPDX-License-Identifier: MIT
"""Traces (kve_trace) and the evaluation harness (kve_eval).

A trace is a canonical synthetic trace, a .npy file, a query/key file
("qk:PATH": rows computed from queries and keys, and keys for the policies
that read them), a float32 array the caller holds (Trace.from_array,
over kve_trace_from_memory: no copy, no file), or a Python callable that
produces each step's rows as a model computes them (Trace.from_callback,
over kve_trace_from_callback: a PyTorch model evaluated live, without
[L, H, T, T] in memory). evaluate() runs several policies in lockstep over one pass of a
trace head and returns what the harness measured, as dicts (or one numpy
structured array) with the keys the command line's JSON uses.
"""
import ctypes
import os
import weakref

import numpy as np

from ._core import (_Handle, _text, as_size, as_spec, bank_options, check, f32_array, getter,
                    refuse)
from ._lib import (KVE_EVAL_AFTER_BUDGET, KVE_TRACE_NONE, KVE_TRACE_NORMALIZE, TRACE_FREE_FN,
                   TRACE_ROWS_FN, EvalJob, EvalResult, TraceCallbacks, lib)
from . import _errors


def _trace_options(normalize):
    """kve_trace_options with the flags of `normalize`."""
    options = lib.kve_trace_default_options()
    options.flags = KVE_TRACE_NORMALIZE if normalize else KVE_TRACE_NONE
    return options


class Trace(_Handle):
    """Attention rows, one head at a time: Trace.open(src) or
    Trace.from_array(attn). Row t of a head holds the weights query t paid
    to keys 0..t."""

    _free = lib.kve_trace_free
    _kind = "trace"

    def __init__(self, handle, array=None):
        super().__init__()
        self._h = handle
        self._array = array  # the borrowed array of a memory trace, kept alive
        self._live = None    # a live trace's callbacks (from_callback), kept alive
        self._raised = None  # the exception a live trace's callable raised, if any

    def close(self):
        """Releases the trace (and its reference to a borrowed array or a
        callable)."""
        super().close()
        self._array = None
        self._live = None

    def _check(self, status):
        """check(status), raising what a live trace's callable raised (as the
        cause) when that is why the call failed."""
        raised, self._raised = self._raised, None
        if status == 0:
            return
        if raised is not None and not isinstance(raised, Exception):
            raise raised  # KeyboardInterrupt, SystemExit: as they were
        try:
            check(status)
        except _errors.KvevictError as e:
            if raised is None:
                raise
            raise e from raised

    @classmethod
    def open(cls, src, normalize=False):
        """Opens "canonical", "canonical:key=value,...", a .npy file of
        shape [T,T], [H,T,T] or [L,H,T,T] (a str or os.PathLike), or
        "qk:PATH", a query/key trace (two .npy arrays back to back, queries
        [L,H,T,d] then keys [L,G,T,d]; its rows are computed, and its keys
        feed the policies that read keys). normalize: rescale each row to
        sum 1 instead of refusing rows that do not."""
        if isinstance(src, os.PathLike):
            src = os.fspath(src)
        if isinstance(src, str):
            if "\0" in src:
                refuse("src: contains a NUL character")
            raw = os.fsencode(src)
        elif isinstance(src, bytes):
            raw = src
        else:
            refuse(f"src: a str or path is required, got {type(src).__name__}")
        h = ctypes.c_void_p()
        check(lib.kve_trace_open(raw, _trace_options(normalize), h))
        return cls(h.value)

    @classmethod
    def from_array(cls, attn, normalize=False):
        """A trace over `attn`, float32 of shape [T,T], [H,T,T] or [L,H,T,T]
        (e.g. a model's output_attentions for one sequence, stacked), C order.
        The array is borrowed, not copied: the trace keeps a reference, and
        it must not change while the trace is open (a changed row is refused
        with FormatError when read). Rows are validated now, as a .npy file's
        are."""
        a = f32_array("attn", attn, (2, 3, 4))
        if a.shape[-1] != a.shape[-2]:
            refuse(f"attn: shape {a.shape}: the last two dimensions must be equal (T x T)")
        layers = a.shape[0] if a.ndim == 4 else 1
        heads = a.shape[-3] if a.ndim >= 3 else 1
        h = ctypes.c_void_p()
        check(lib.kve_trace_from_memory(a.ctypes.data, layers, heads, a.shape[-1],
                                        _trace_options(normalize), h))
        return cls(h.value, a)

    @classmethod
    def from_callback(cls, rows, heads, steps, *, layers=1, keys=None, key_dim=0,
                      normalize=False):
        """A live trace (kve_trace_from_callback): `rows(t)` is called when
        step t is first read and returns every head's attention of query t,
        an array of shape (layers * heads, n) or (layers, heads, n) with
        n >= t + 1 (float32 or float64; a numpy array, a CPU torch tensor or
        anything numpy.asarray takes): head h's weights over keys 0 .. t in
        its first t + 1 entries. heads: per layer; the trace has layers *
        heads of `steps` rows, layer-major. evaluate() over every head
        (heads=trace.heads) asks for each step once, in order, so a model
        can compute step t's attention when asked (a forward with a KV
        cache); a reader that goes back asks for an earlier t again.
        keys(t) (with key_dim d > 0): every head's key of position t, shape
        (layers * heads, d), for the policies that read keys.
        The rows are checked as every source's are (finite, >= 0, summing
        to 1 unless normalize=True, which rescales them): FormatError naming
        head, row and key. What the callables raise comes out of the call
        that read the trace (as the cause of a KvevictError naming the
        step; KeyboardInterrupt as it is)."""
        if not callable(rows):
            refuse(f"rows: a callable rows(t) is required, got {type(rows).__name__}")
        if keys is not None and not callable(keys):
            refuse(f"keys: a callable keys(t) or None is required, got {type(keys).__name__}")
        layers = as_size("layers", layers)
        per_layer = as_size("heads", heads)
        steps = as_size("steps", steps)
        key_dim = as_size("key_dim", key_dim)
        if (keys is None) != (key_dim == 0):
            refuse("keys and key_dim go together: keys(t) needs key_dim=d > 0, and key_dim "
                   "needs keys(t)")
        n_heads = layers * per_layer
        box = {}  # the Trace, once made: where the callables' exceptions go

        def deliver(what, fn, t, out, ld, width):
            try:
                value = fn(t)
                if hasattr(value, "detach"):  # a torch tensor
                    value = value.detach().cpu().numpy()
                a = np.asarray(value, dtype=np.float32)
                if a.ndim == 3 and a.shape[:2] == (layers, per_layer):
                    a = a.reshape(n_heads, a.shape[2])
                if a.ndim != 2 or a.shape[0] != n_heads or a.shape[1] < width:
                    want = f"({n_heads}, >= {width})" if what == "rows" else \
                        f"({n_heads}, {width})"
                    raise _errors.InvalidArgumentError(
                        f"Trace.from_callback: {what}({t}) returned shape {a.shape}, want "
                        f"{want}")
                view = np.ctypeslib.as_array(out, shape=(n_heads, ld))
                view[:, :width] = a[:, :width]
                return 0
            except BaseException as e:  # noqa: B902 - handed to the reader, not lost
                ref = box.get("trace")
                tr = ref() if ref is not None else None
                if tr is not None:
                    tr._raised = e
                code = e.code if isinstance(e, _errors.KvevictError) and e.code > 0 else 1
                text = f"Trace.from_callback: {what}({t}) raised {type(e).__name__}: {e}"
                lib.kve_set_error(code, b"%s", text.encode("utf-8", "replace"))
                return code

        def c_rows(user, t, out, ld):
            return deliver("rows", rows, t, out, ld, t + 1)

        def c_keys(user, t, out, ld):
            return deliver("keys", keys, t, out, ld, key_dim)

        callbacks = TraceCallbacks(TRACE_ROWS_FN(c_rows),
                                   TRACE_ROWS_FN(c_keys) if keys is not None else TRACE_ROWS_FN(),
                                   TRACE_FREE_FN())
        h = ctypes.c_void_p()
        check(lib.kve_trace_from_callback(callbacks, None, layers, per_layer, steps, key_dim,
                                          _trace_options(normalize), h))
        tr = cls(h.value)
        tr._live = (callbacks, rows, keys)
        box["trace"] = weakref.ref(tr)  # no cycle through the callables
        return tr

    steps = getter(lib.kve_trace_steps, "T, the rows of every head.")
    heads = getter(lib.kve_trace_heads, "Heads, layer-major (L*H for [L,H,T,T]).")
    layers = getter(lib.kve_trace_layers, "L, the layers (1 unless [L,H,T,T]).")
    source = getter(lib.kve_trace_source,
                    'The canonical spec, the path, "memory" or "callback".', _text)
    npy_bytes = getter(lib.kve_trace_npy_bytes, "The size of the file write_npy writes.")
    key_dim = getter(lib.kve_trace_key_dim, "d, the floats of a key: a q/K trace's, else 0.")

    def key(self, t, head=0):
        """The key of position t of head `head` (its KV head's), float32 of
        key_dim floats; a q/K trace only."""
        h = self._handle()
        head = as_size("head", head)
        t = as_size("t", t)
        out = np.empty(max(lib.kve_trace_key_dim(h), 1), dtype=np.float32)
        self._check(lib.kve_trace_key(h, head, t, out.ctypes.data, out.shape[0]))
        return out

    def row(self, t, head=0):
        """Row t of head `head`: t + 1 float64 weights over keys 0..t."""
        h = self._handle()
        t = as_size("t", t)
        head = as_size("head", head)
        # a step out of range gets the library's refusal (and no huge buffer)
        out = np.empty(t + 1 if t < lib.kve_trace_steps(h) else 1, dtype=np.float64)
        self._check(lib.kve_trace_row(h, head, t, out.ctypes.data, out.shape[0]))
        return out

    def write_npy(self, path, head=0):
        """Writes head `head` as a [T,T] float32 .npy file (atomically)."""
        self._check(lib.kve_trace_write_npy(self._handle(), as_size("head", head),
                                            os.fsencode(os.fspath(path))))

    def __repr__(self):
        if self._h is None:
            return "<kvevict.Trace (closed)>"
        d = self.key_dim
        keys = f" key_dim={d}" if d else ""
        return f"<kvevict.Trace {self.source} steps={self.steps} heads={self.heads}{keys}>"


# The keys of a result dict (and the fields of the structured array).
RESULT_DTYPE = np.dtype([
    ("policy", "U160"), ("trace", "O"), ("head", np.int64), ("heads", np.int64),
    ("budget", np.int64), ("steps", np.int64), ("scored_steps", np.int64), ("seed", np.uint64),
    ("topk", np.int64), ("retained_mass", np.float64), ("top32_recall", np.float64),
    ("topk_recall", np.float64), ("min_retained_mass", np.float64), ("mean_kept", np.float64),
    ("ns_per_step", np.float64), ("state_bytes", np.int64),
])

# The keys of a per-head dict (evaluate(..., per_head=True)).
PER_HEAD_KEYS = ("head", "scored_steps", "retained_mass", "top32_recall", "topk_recall",
                 "min_retained_mass", "mean_kept", "ns_per_step", "state_bytes")


def _jobs(jobs):
    """Specs, (spec, budget) pairs or {"policy": spec, "budget": b} dicts."""
    if isinstance(jobs, (str, tuple, dict)):
        jobs = [jobs]
    out = []
    for job in jobs:
        if isinstance(job, str):
            spec, budget = job, 0
        elif isinstance(job, tuple) and len(job) == 2:
            spec, budget = job
        elif isinstance(job, dict) and set(job) <= {"policy", "budget"} and "policy" in job:
            spec, budget = job["policy"], job.get("budget", 0)
        else:
            refuse(f"jobs: {job!r} is not a spec, a (spec, budget) pair or a dict with "
                   f"'policy' and 'budget'")
        out.append((as_spec(spec), as_size("budget", 0 if budget is None else budget)))
    if not out:
        refuse("jobs: no job to evaluate")
    return out


def _row(r, **extra):
    """The metrics of one kve_eval_result."""
    return dict(extra, scored_steps=r.scored_steps, retained_mass=r.retained_mass,
                top32_recall=r.top32_recall, topk_recall=r.topk_recall,
                min_retained_mass=r.min_retained_mass, mean_kept=r.mean_kept,
                ns_per_step=r.ns_per_step, state_bytes=r.state_bytes)


def evaluate(trace, jobs, head=0, *, seed=0, topk=32, heads=1, share=0, min_share=0.2,
             score_after=0, per_head=False, as_array=False):
    """Evaluates policies on heads [head, head + heads) of `trace` (head=None:
    every such group of heads, in order), all in lockstep over one pass
    (kve_eval).

    jobs: a spec, or a list of specs, (spec, budget) pairs or dicts
    {"policy": spec, "budget": b}; budget 0 or absent is the spec's. A
    policy that reads keys (policies()'s reads == "keys") needs a trace
    with keys (a q/K trace, "qk:PATH"). seed: the policies' random numbers
    (every job gets the same seed, so a job's result does not depend on the
    others). topk: the k of topk_recall.

    heads: the trace heads run together, one bank of `heads` heads per job
    (kve_eval's count of heads); the metrics are then means over the heads
    (min_retained_mass the minimum, state_bytes and ns_per_step the bank's).
    Without sharing a head's figures are those of a one-head evaluation of
    it. share, min_share: the banks' shared budgets (kve_bank_options): each
    group of `share` heads is evicted to share * budget together
    (Bank.evict_shared), the scored policies only. score_after: the metrics
    are over steps t > score_after (0: t > the job's budget), so that jobs of
    different budgets are measured on the same steps. per_head: each row
    also holds "per_head", a list of one dict per head with the keys
    PER_HEAD_KEYS (state_bytes and ns_per_step: the bank's divided by heads).

    Returns a list of dicts, one per job (per group of heads and job, head
    group first), with the keys policy (canonical spec, budget included),
    trace, head (the first), heads, budget, steps, scored_steps, seed, topk,
    retained_mass, top32_recall, topk_recall, min_retained_mass, mean_kept
    (positions kept after an evict, mean over scored steps), ns_per_step and
    state_bytes; a metric over no scored step (budget >= steps - 1) is nan.
    as_array=True: the same as one numpy structured array (RESULT_DTYPE;
    without per_head).
    """
    if not isinstance(trace, Trace):
        refuse(f"trace: a kvevict.Trace is required, got {type(trace).__name__}")
    h = trace._handle()
    pairs = _jobs(jobs)
    seed = as_size("seed", seed, 0, 2 ** 64 - 1)
    topk = as_size("topk", topk)
    width = as_size("heads", heads, 1)
    bank = bank_options(0, share, min_share)
    score_after = as_size("score_after", score_after)
    after = KVE_EVAL_AFTER_BUDGET if score_after == 0 else score_after
    if per_head and as_array:
        refuse("per_head: a structured array has no per-head rows; use as_array=False")
    n_heads = lib.kve_trace_heads(h)
    if head is None:
        if n_heads % width:
            refuse(f"heads: {width} does not divide the trace's {n_heads} heads (head=None "
                   f"evaluates every group of {width})")
        firsts = range(0, n_heads, width)
    else:
        firsts = [as_size("head", head)]
    c_jobs = (EvalJob * len(pairs))(*[EvalJob(spec, budget) for spec, budget in pairs])
    options = lib.kve_eval_default_options()
    options.seed = seed
    options.topk = topk
    options.share = bank.share
    options.min_share = bank.min_share
    options.score_after = after
    heads_out = (EvalResult * (len(pairs) * width))() if per_head else None
    source = _text(lib.kve_trace_source(h))
    rows = []
    for first in firsts:
        results = (EvalResult * len(pairs))()
        trace._check(lib.kve_eval(h, first, width, c_jobs, len(pairs), options, results,
                                  heads_out))
        for j, r in enumerate(results):
            row = _row(r, policy=_text(r.spec), trace=source, head=first, heads=width,
                       budget=r.budget, steps=r.steps, seed=seed, topk=r.topk)
            if per_head:
                row["per_head"] = [_row(heads_out[j * width + i], head=first + i)
                                   for i in range(width)]
            rows.append(row)
    if not as_array:
        return rows
    out = np.empty(len(rows), dtype=RESULT_DTYPE)
    for i, row in enumerate(rows):
        out[i] = tuple(row[k] for k in RESULT_DTYPE.names)
    return out
