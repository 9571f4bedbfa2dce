# SPDX-License-Identifier: MIT
"""Traces (kve_trace) and the evaluation harness (kve_eval_ex).

A trace is a canonical synthetic trace, a .npy file, or a float32 array the
caller holds (Trace.from_array, over kve_trace_from_memory: no copy, no
file). evaluate() runs several policies in lockstep over one pass of a
trace head and returns what the harness measured, as dicts (or one numpy
structured array) with the keys the command line's JSON uses.
"""
import ctypes
import os

import numpy as np

from ._core import _Handle, _text, as_size, as_spec, check, f32_array, getter, refuse
from ._lib import KVE_TRACE_NORMALIZE, EvalJob, EvalResult, lib


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

    def close(self):
        """Releases the trace (and its reference to a borrowed array)."""
        super().close()
        self._array = None

    @classmethod
    def open(cls, src, normalize=False):
        """Opens "canonical", "canonical:key=value,..." or a .npy file of
        shape [T,T], [H,T,T] or [L,H,T,T] (a str or os.PathLike). normalize:
        rescale each row to sum 1 instead of refusing rows that do not."""
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
        check(lib.kve_trace_open(raw, KVE_TRACE_NORMALIZE if normalize else 0, h))
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
                                        KVE_TRACE_NORMALIZE if normalize else 0, h))
        return cls(h.value, a)

    steps = getter(lib.kve_trace_steps, "T, the rows of every head.")
    heads = getter(lib.kve_trace_heads, "Heads, layer-major (L*H for [L,H,T,T]).")
    layers = getter(lib.kve_trace_layers, "L, the layers (1 unless [L,H,T,T]).")
    source = getter(lib.kve_trace_source, 'The canonical spec, the path, or "memory".', _text)
    npy_bytes = getter(lib.kve_trace_npy_bytes, "The size of the file write_npy writes.")

    def row(self, t, head=0):
        """Row t of head `head`: t + 1 float64 weights over keys 0..t."""
        h = self._handle()
        t = as_size("t", t)
        head = as_size("head", head)
        # a step out of range gets the library's refusal (and no huge buffer)
        out = np.empty(t + 1 if t < lib.kve_trace_steps(h) else 1, dtype=np.float64)
        check(lib.kve_trace_row(h, head, t, out.ctypes.data))
        return out

    def write_npy(self, path, head=0):
        """Writes head `head` as a [T,T] float32 .npy file (atomically)."""
        check(lib.kve_trace_write_npy(self._handle(), as_size("head", head),
                                      os.fsencode(os.fspath(path))))

    def __repr__(self):
        if self._h is None:
            return "<kvevict.Trace (closed)>"
        return f"<kvevict.Trace {self.source} steps={self.steps} heads={self.heads}>"


# The keys of a result dict (and the fields of the structured array).
RESULT_DTYPE = np.dtype([
    ("policy", "U160"), ("trace", "O"), ("head", np.int64), ("budget", np.int64),
    ("steps", np.int64), ("scored_steps", np.int64), ("seed", np.uint64), ("topk", np.int64),
    ("retained_mass", np.float64), ("top32_recall", np.float64), ("topk_recall", np.float64),
    ("min_retained_mass", np.float64), ("ns_per_step", np.float64), ("state_bytes", np.int64),
])


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


def evaluate(trace, jobs, head=0, *, seed=0, topk=32, as_array=False):
    """Evaluates policies on one head of `trace` (head=None: every head, in
    order), all in lockstep over one pass (kve_eval_ex).

    jobs: a spec, or a list of specs, (spec, budget) pairs or dicts
    {"policy": spec, "budget": b}; budget 0 or absent is the spec's. seed:
    the policies' random numbers (every job gets the same seed, so a job's
    result does not depend on the others). topk: the k of topk_recall.

    Returns a list of dicts, one per job (per head and job, head-major), with
    the keys policy (canonical spec, budget included), trace, head, budget,
    steps, scored_steps, seed, topk, retained_mass, top32_recall,
    topk_recall, min_retained_mass, ns_per_step and state_bytes; a metric
    over no scored step (budget >= steps - 1) is nan. as_array=True: the
    same as one numpy structured array (RESULT_DTYPE).
    """
    if not isinstance(trace, Trace):
        refuse(f"trace: a kvevict.Trace is required, got {type(trace).__name__}")
    h = trace._handle()
    pairs = _jobs(jobs)
    seed = as_size("seed", seed, 0, 2 ** 64 - 1)
    topk = as_size("topk", topk)
    n_heads = lib.kve_trace_heads(h)
    heads = range(n_heads) if head is None else [as_size("head", head)]
    c_jobs = (EvalJob * len(pairs))(*[EvalJob(spec, budget) for spec, budget in pairs])
    options = lib.kve_eval_default_options()
    options.seed = seed
    options.topk = topk
    source = _text(lib.kve_trace_source(h))
    rows = []
    for hd in heads:
        results = (EvalResult * len(pairs))()
        check(lib.kve_eval_ex(h, hd, c_jobs, len(pairs), options, results))
        for r in results:
            rows.append({
                "policy": _text(r.spec), "trace": source, "head": hd, "budget": r.budget,
                "steps": r.steps, "scored_steps": r.scored_steps, "seed": seed, "topk": r.topk,
                "retained_mass": r.retained_mass, "top32_recall": r.top32_recall,
                "topk_recall": r.topk_recall, "min_retained_mass": r.min_retained_mass,
                "ns_per_step": r.ns_per_step, "state_bytes": r.state_bytes,
            })
    if not as_array:
        return rows
    out = np.empty(len(rows), dtype=RESULT_DTYPE)
    for i, row in enumerate(rows):
        out[i] = tuple(row[k] for k in RESULT_DTYPE.names)
    return out
