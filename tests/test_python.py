# SPDX-License-Identifier: MIT
"""test_python.py KVEVICT EVAL_REF SOURCE_DIR - the Python binding (python/kvevict).

Run by CTest with Debian's /usr/bin/python3, KVEVICT_LIBRARY set to the
build's libkvevict.so and PYTHONPATH to python/. Exits 77 (CTest's skip)
with the reason printed when numpy cannot be imported. Covered:
  - every public function and property of the package;
  - results identical to the C API and the CLI, three ways, bit for bit:
    evaluate() against eval_ref (a C program on the public header) and
    `kvevict eval --json`, on the canonical trace, on a multi-head .npy file,
    on the same attention held in memory (Trace.from_array) and on a
    query/key trace written here with numpy (every policy, those that read
    keys included), and with banks of several heads sharing a budget;
    Policy against `kvevict replay --json` on the canonical and the q/K
    trace; Bank (keys and shared budgets included) and Rng against eval_ref;
  - the ctypes structures against the C layout (sizes, offsets, constants);
  - errors: one exception class per status, the library's message and the
    status's name; arrays refused before the call (dtype, byte order,
    layout, alignment, shape, length) and integers out of their C range,
    with the object unchanged;
  - the GIL released during a library call (a call that blocks inside the
    library until another Python thread acts);
  - score rules written in numpy (register_rule): h2o and value-aware h2o
    against the built-in h2o and h2o:vnorm=1 in a Policy and a grouped Bank,
    victim for victim; an exception, a wrong shape or a NaN refuses the step
    and changes nothing; the registry's refusals and holds;
  - queries, values and the rescore flag of Policy.step: expected_attention
    against the numpy reference of tests/methods_ref.py;
  - the policies that read keys and shared budgets: keys validated and
    refused, the library's refusals of key dimensions, shared groups and
    their evictions, each with the object unchanged;
  - the lifecycle: clone(), copy_from(), remove(), reset(), save(),
    Policy.load() and Bank.load() and pickling through them, forks that
    continue bit for bit (the same victims and images), refusals that change
    nothing;
  - reference counting and leaks over 10 000 calls: input arrays' reference
    counts unchanged, Python allocations flat (tracemalloc), the library's
    state flat, and the process's resident memory flat while 10 000
    policies, banks and traces are made and released (key-reading, shared
    and q/K ones included).
"""
import gc
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
import unittest

try:
    import numpy as np
except ImportError as e:  # never a silent pass: CTest shows the test as skipped
    print(f"SKIP: numpy is not importable by {sys.executable} ({e}); "
          f"install python3-numpy to run the binding's tests")
    sys.exit(77)

if len(sys.argv) < 4:
    sys.exit("usage: test_python.py KVEVICT EVAL_REF SOURCE_DIR [unittest args]")
KVEVICT, EVAL_REF, SOURCE = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
del sys.argv[1:4]

import kvevict  # noqa: E402  (after the numpy check)
from kvevict import _core  # noqa: E402

CANON = "canonical:steps=700,seed=5"
ALL_SPECS = [p["name"] for p in kvevict.policies()]
# what runs on a trace without keys: every policy that reads attention or nothing
ATTN_SPECS = [p["name"] for p in kvevict.policies() if p["reads"] in ("attention", "nothing")]
KEY_SPECS = [p["name"] for p in kvevict.policies() if p["reads"] == "keys"]
# expected_attention: queries and values too, which no trace gives the harness yet
DATA_SPECS = [p["name"] for p in kvevict.policies() if "queries" in p["reads"]]
# what runs on a q/K trace: all the others
QK_SPECS = [name for name in ALL_SPECS if name not in DATA_SPECS]
METRICS = ("retained_mass", "top32_recall", "min_retained_mass")


def run(*args, **kw):
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False,
                          **kw)
    if done.returncode != 0:
        raise AssertionError(f"{args}: exit {done.returncode}: {done.stderr}")
    return done.stdout


def c_eval(trace, head, seed, topk, jobs):
    """eval_ref's results: one dict per job."""
    words = [f"{s}@{b}" for s, b in jobs]
    out = run(EVAL_REF, "eval", trace, head, seed, topk, *words)
    return [json.loads(line) for line in out.splitlines()]


def cli_eval(trace, spec, budget, seed, topk, per_head=False):
    args = [KVEVICT, "eval", "--trace", trace, "--policy", spec, "--budget", budget, "--seed",
            seed, "--topk", topk, "--json"] + (["--per-head"] if per_head else [])
    return json.loads(run(*args))


def same_float(a, b):
    """Equal as doubles, bit for bit (None, the JSON null, is NaN)."""
    a = math.nan if a is None else a
    b = math.nan if b is None else b
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                 math.copysign(1, b))


def attention_rows(rng, heads, steps):
    """float32 [heads, T, T] causal attention rows (softmax of random logits)."""
    logits = rng.standard_normal((heads, steps, steps)) * 2.0
    mask = np.triu(np.ones((steps, steps), dtype=bool), 1)
    logits[:, mask] = -np.inf
    w = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)


def write_qk(path, q, k):
    """A query/key trace file (kvevict.h, "qk:PATH"): the .npy of the
    queries, then the .npy of the keys, back to back."""
    with open(path, "wb") as f:
        np.save(f, q)
        np.save(f, k)
    return f"qk:{path}"


def qk_arrays(seed, heads, kv_heads, steps, d):
    """Random float32 queries [heads, T, d] and keys [kv_heads, T, d]; keys
    of varied norms, so knorm has something to choose by."""
    gen = np.random.default_rng(seed)
    q = gen.standard_normal((heads, steps, d)).astype(np.float32)
    k = gen.standard_normal((kv_heads, steps, d)) * gen.uniform(0.2, 2.0, (kv_heads, steps, 1))
    return q, k.astype(np.float32)


class QkFile:
    """One q/K trace file for the tests of this run: 4 query heads over 2 KV
    heads (grouped-query), 150 steps, d = 16."""
    D, STEPS = 16, 150
    _dir = tempfile.TemporaryDirectory()
    q, k = qk_arrays(21, 4, 2, STEPS, D)
    path = os.path.join(_dir.name, "qk.bin")
    src = write_qk(path, q, k)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Module(unittest.TestCase):
    def test_versions_agree(self):
        layout = json.loads(run(EVAL_REF, "layout"))
        self.assertEqual(kvevict.version(), layout["version"])
        self.assertEqual(kvevict.__version__, kvevict.version())
        major, minor, patch = map(int, kvevict.version().split("."))
        self.assertEqual(kvevict.version_number(), major * 10000 + minor * 100 + patch)
        pyproject = (SOURCE / "python" / "pyproject.toml").read_text()
        self.assertIn(f'version = "{kvevict.version()}"', pyproject)
        self.assertIn(f"kvevict {kvevict.version()}", run(KVEVICT, "--version"))

    def test_library_path(self):
        self.assertEqual(os.path.realpath(kvevict.library_path),
                         os.path.realpath(os.environ["KVEVICT_LIBRARY"]))

    def test_isa(self):
        self.assertIn(kvevict.isa(), ("avx512", "avx2", "scalar"))

    def test_layout(self):
        """The ctypes mirrors of the header's structs and constants."""
        import ctypes
        from kvevict import _lib
        c = json.loads(run(EVAL_REF, "layout"))
        self.assertEqual(ctypes.sizeof(_lib.RngState), c["kve_rng"])
        for name, cls in (("kve_eval_job", _lib.EvalJob), ("kve_eval_result", _lib.EvalResult),
                          ("kve_eval_options", _lib.EvalOptions),
                          ("kve_bank_options", _lib.BankOptions),
                          ("kve_policy_options", _lib.PolicyOptions),
                          ("kve_trace_options", _lib.TraceOptions), ("kve_rope", _lib.Rope),
                          ("kve_step_data", _lib.StepData), ("kve_score_step", _lib.ScoreStep),
                          ("kve_score_rule", _lib.ScoreRule),
                          ("kve_trace_callbacks", _lib.TraceCallbacks),
                          ("kve_schedule_options", _lib.ScheduleOptions),
                          ("kve_prefill_options", _lib.PrefillOptions)):
            self.assertEqual(ctypes.sizeof(cls), c[name], name)
            for field, *_ in cls._fields_:
                self.assertEqual(getattr(cls, field).offset, c[f"{name}.{field}"],
                                 f"{name}.{field}")
        self.assertEqual(_lib.KVE_SPEC_MAX, c["KVE_SPEC_MAX"])
        self.assertEqual(_lib.KVE_MAX_BUDGET, c["KVE_MAX_BUDGET"])
        self.assertEqual(_lib.KVE_TRACE_NORMALIZE, c["KVE_TRACE_NORMALIZE"])
        self.assertEqual(_lib.REDUCE["sum"], c["KVE_REDUCE_SUM"])
        self.assertEqual(_lib.REDUCE["max"], c["KVE_REDUCE_MAX"])
        self.assertEqual(kvevict.CanceledError.code, c["KVE_ECANCELED"])
        self.assertEqual(_lib.KVE_READS_ATTN, c["KVE_READS_ATTN"])
        self.assertEqual(_lib.KVE_READS_KEYS, c["KVE_READS_KEYS"])
        self.assertEqual(_lib.KVE_MAX_KEY_DIM, c["KVE_MAX_KEY_DIM"])
        self.assertEqual(_lib.KVE_READS_QUERIES, c["KVE_READS_QUERIES"])
        self.assertEqual(_lib.KVE_READS_VALUES, c["KVE_READS_VALUES"])
        self.assertEqual(_lib.ROPE_PAIRS["half"], c["KVE_ROPE_HALF"])
        self.assertEqual(_lib.KVE_STEP_RESCORE, c["KVE_STEP_RESCORE"])
        self.assertEqual(_lib.KVE_MAX_QUERY_GROUP, c["KVE_MAX_QUERY_GROUP"])
        self.assertEqual(_lib.KVE_MAX_RULE_STATE, c["KVE_MAX_RULE_STATE"])
        # the defaults come back through the mirrors, and the binding's
        # keyword defaults are the library's
        import inspect
        bank, ev = _lib.lib.kve_bank_default_options(), _lib.lib.kve_eval_default_options()
        self.assertEqual((bank.allocator, bank.key_dim, bank.share, bank.min_share),
                         (None, 0, 0, c["default.min_share"]))
        self.assertEqual((ev.allocator, ev.topk, ev.score_after),
                         (None, c["default.topk"], c["default.score_after"]))
        self.assertEqual(ev.score_after, _lib.KVE_EVAL_AFTER_BUDGET)
        self.assertEqual((ev.share, ev.min_share), (0, c["default.eval_min_share"]))
        self.assertEqual(_lib.lib.kve_policy_default_options().key_dim, 0)
        self.assertEqual(_lib.lib.kve_policy_default_options().unchecked, 0)
        self.assertEqual(bank.unchecked, 0)
        for fn in (kvevict.Policy.__init__, kvevict.Bank.__init__):
            self.assertIs(inspect.signature(fn).parameters["unchecked"].default, False)
        tr = _lib.lib.kve_trace_default_options()
        self.assertEqual((tr.allocator, tr.flags, tr.progress, tr.user), (None, 0, None, None))
        for fn in (kvevict.Bank.__init__, kvevict.evaluate):
            params = inspect.signature(fn).parameters
            self.assertEqual(params["min_share"].default, c["default.min_share"])
            self.assertEqual(params["share"].default, 0)
        self.assertEqual(inspect.signature(kvevict.evaluate).parameters["heads"].default, 1)

    def test_policies_match_cli(self):
        cli = [json.loads(line) for line in run(KVEVICT, "policies", "--json").splitlines()]
        self.assertEqual(kvevict.policies(), cli)
        self.assertIn("h2o", ALL_SPECS)
        self.assertEqual({p["reads"] for p in cli},
                         {"nothing", "attention", "keys", "keys+queries+values"})
        self.assertIn("knorm", KEY_SPECS)
        self.assertEqual(DATA_SPECS, ["expected_attention"])
        self.assertEqual(len(ATTN_SPECS) + len(KEY_SPECS) + len(DATA_SPECS), len(ALL_SPECS))

    def test_min_budget(self):
        self.assertEqual(kvevict.min_budget("h2o"), 33)
        self.assertEqual(kvevict.min_budget("streaming"), 5)
        self.assertEqual(kvevict.min_budget("window"), 1)
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.min_budget("nope")

    def test_spec_with(self):
        self.assertEqual(kvevict.spec_with("h2o"), "h2o:budget=512,recent_window=32")
        self.assertEqual(kvevict.spec_with("h2o", "recent_window", 64),
                         "h2o:budget=512,recent_window=64")
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            kvevict.spec_with("h2o", "nokey", "1")
        self.assertIn("nokey", e.exception.message)
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.spec_with("h2o", "budget")


class Errors(unittest.TestCase):
    def test_classes_carry_status_and_message(self):
        from kvevict import _lib
        for cls in (kvevict.InvalidArgumentError, kvevict.OutOfMemoryError, kvevict.RangeError,
                    kvevict.FormatError, kvevict.KvevictIOError, kvevict.CanceledError):
            self.assertTrue(issubclass(cls, kvevict.KvevictError))
            self.assertEqual(cls.status, _lib.lib.kve_status_name(cls.code).decode())
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            kvevict.Policy("h2o:budget=8,recent_window=8")
        err = e.exception
        self.assertEqual(err.status, "KVE_EINVAL")
        self.assertEqual(err.code, 1)
        self.assertEqual(err.message, "h2o: recent_window 8 must be smaller than budget 8")
        self.assertEqual(str(err), err.message)  # no C status prefix
        self.assertNotIn("KVE_", str(err))
        self.assertIsInstance(err, ValueError)

    def test_each_status(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(kvevict.KvevictIOError) as e:
                kvevict.Trace.open(os.path.join(d, "absent.npy"))
            self.assertIn("No such file or directory", e.exception.message)
            self.assertIsInstance(e.exception, OSError)
            bad = os.path.join(d, "bad.npy")
            pathlib.Path(bad).write_bytes(b"\x93NUMPY\x01\x00garbage")
            with self.assertRaises(kvevict.FormatError):
                kvevict.Trace.open(bad)
            # row 0 is not held to sum 1: a float64 weight beyond float32
            big = np.zeros((2, 2))
            big[0, 0], big[1, :] = 1e300, 0.5
            np.save(os.path.join(d, "big.npy"), big)
            with kvevict.Trace.open(os.path.join(d, "big.npy")) as tr:
                with self.assertRaises(kvevict.RangeError) as e:
                    tr.write_npy(os.path.join(d, "out.npy"))
            self.assertIn("does not fit float32", e.exception.message)
            self.assertFalse(os.path.exists(os.path.join(d, "out.npy")))
        with self.assertRaises(kvevict.OutOfMemoryError) as e:
            kvevict.Bank("h2o:budget=16777216", 2 ** 50)
        self.assertIsInstance(e.exception, MemoryError)
        with self.assertRaises(kvevict.CanceledError) as e:  # no call of the binding cancels
            _core.check(6)
        self.assertEqual(e.exception.status, "KVE_ECANCELED")
        with self.assertRaises(kvevict.KvevictError) as e:
            _core.check(99)
        self.assertEqual(e.exception.status, "KVE_UNKNOWN")


def renormalised(row, kept):
    """What the harness hands a policy: the kept weights summed in double in
    kept order, each divided by the sum in double and rounded to float32;
    None (no information) for a zero sum."""
    w = [float(row[i]) for i in kept]
    total = 0.0
    for x in w:
        total += x
    if total == 0.0:
        return None
    return np.array([x / total for x in w], dtype=np.float32)


class PolicyTests(unittest.TestCase):
    def test_replay_matches_cli(self):
        """Policy.step/evict on the harness's rows: the victims `kvevict
        replay` prints, step for step, for every policy."""
        trace = "canonical:steps=400,seed=2"
        with kvevict.Trace.open(trace) as tr:
            rows = [tr.row(t) for t in range(tr.steps)]
        for name in ATTN_SPECS:
            spec = kvevict.spec_with(name, "budget", 48)
            out = run(KVEVICT, "replay", "--trace", trace, "--policy", spec, "--seed", 9,
                      "--json")
            want = [json.loads(line) for line in out.splitlines()]
            rng = kvevict.Rng(9) if name == "random" else None
            with kvevict.Policy(spec, rng=rng) as p:
                for t, row in enumerate(rows):
                    attn = np.zeros(0, np.float32) if t == 0 else renormalised(row, p.positions)
                    p.step(t, attn)
                    victims = p.evict(48)
                    self.assertEqual(victims.dtype, np.int32)
                    self.assertEqual(victims.tolist(), want[t]["victims"], f"{spec} at {t}")
                    self.assertEqual(p.size, want[t]["size"])

    def test_replay_qk_matches_cli(self):
        """Every policy on a q/K trace, its keys from Trace.key: the victims
        `kvevict replay` prints. Every policy is built with the trace's
        key_dim and given every key: those that read attention validate and
        ignore it (the harness steps them without keys)."""
        head, budget = 1, 40
        with kvevict.Trace.open(QkFile.src) as tr:
            rows = [tr.row(t, head) for t in range(tr.steps)]
            keys = [tr.key(t, head) for t in range(tr.steps)]
            d = tr.key_dim
        for name in QK_SPECS:
            spec = kvevict.spec_with(name, "budget", budget)
            out = run(KVEVICT, "replay", "--trace", QkFile.src, "--head", head, "--policy",
                      spec, "--seed", 4, "--json")
            want = [json.loads(line) for line in out.splitlines()]
            self.assertEqual(len(want), QkFile.STEPS)
            rng = kvevict.Rng(4) if name == "random" else None
            with kvevict.Policy(spec, rng=rng, key_dim=d) as p:
                self.assertEqual(p.key_dim, d)
                for t, (row, key) in enumerate(zip(rows, keys)):
                    attn = np.zeros(0, np.float32) if t == 0 else renormalised(row, p.positions)
                    p.step(t, attn, key=key)
                    self.assertEqual(p.evict(budget).tolist(), want[t]["victims"],
                                     f"{spec} at {t}")
        # the same victims for a key policy stepped without attention
        with kvevict.Policy(kvevict.spec_with("knorm", "budget", budget), key_dim=d) as a, \
                kvevict.Policy(kvevict.spec_with("knorm", "budget", budget), key_dim=d) as b:
            for t, (row, key) in enumerate(zip(rows, keys)):
                a.step(t, None, key)
                b.step(t, np.zeros(0, np.float32) if t == 0 else renormalised(row, b.positions),
                       key=key)
                self.assertEqual(a.evict(budget).tolist(), b.evict(budget).tolist())

    def test_properties(self):
        p = kvevict.Policy("h2o:budget=8,recent_window=2")
        self.assertEqual(p.spec, "h2o:budget=8,recent_window=2")
        self.assertEqual(p.name, "h2o")
        self.assertEqual(p.budget, 8)
        self.assertEqual(p.size, 0)
        self.assertEqual(p.positions.tolist(), [])
        self.assertEqual(p.state_bytes, 13 * 9)
        for pos in range(12):
            p.step(pos, None)  # no information: admitted all the same
            p.evict(8)
        self.assertEqual(p.size, 8)
        self.assertEqual(p.positions.dtype, np.int32)
        # no information: every score 0, ties evict the lower position first
        self.assertEqual(p.positions.tolist(), list(range(4, 12)))
        self.assertIn("h2o:budget=8", repr(p))
        self.assertEqual((p.reads, p.key_dim), ("attention", 0))
        self.assertEqual(kvevict.Policy("window").reads, "nothing")
        kn = kvevict.Policy("knorm:budget=8", key_dim=5)
        self.assertEqual((kn.reads, kn.key_dim), ("keys", 5))
        full = kvevict.Policy("full:budget=4")
        for pos in range(10):
            full.step(pos)
        self.assertEqual(full.evict(4).tolist(), [])  # full never evicts
        self.assertEqual(full.size, 10)

    def test_rng_streams(self):
        """One Rng for several random policies: the draws the C API makes."""
        a, b = kvevict.Rng(3), kvevict.Rng(3)
        self.assertEqual([a.next() for _ in range(4)], [b.next() for _ in range(4)])
        self.assertEqual(a.state, b.state)
        u = a.uniform()
        self.assertTrue(0.0 <= u < 1.0)
        self.assertEqual(a.below(0), 0)
        self.assertTrue(all(0 <= a.below(7) < 7 for _ in range(100)))
        r = kvevict.Rng(11)
        before = r.state
        kvevict.Policy("random:budget=4", rng=r)
        self.assertNotEqual(r.state, before)  # one draw made
        det = kvevict.Rng(11)
        kvevict.Policy("h2o:budget=8,recent_window=2", rng=det)
        self.assertEqual(det.state, kvevict.Rng(11).state)  # deterministic: untouched
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.Policy("random:budget=4")  # random needs a generator

    def test_close(self):
        with kvevict.Policy("window:budget=4") as p:
            p.step(0)
        self.assertIn("closed", repr(p))
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            p.step(1)
        self.assertIn("after close", e.exception.message)
        p.close()  # twice: a no-op

    def test_refusals_change_nothing(self):
        p = kvevict.Policy("h2o:budget=4,recent_window=1")
        for pos in range(5):
            p.step(pos, np.full(p.size, 1.0 / max(p.size, 1), np.float32) if p.size else None)
        p.evict(4)
        before = (p.positions.tolist(), p.size)
        n = p.size
        good = np.full(n, 0.25, np.float32)
        cases = [
            (np.full(n, 0.25, np.float64), "dtype <f8"),
            (np.full(n, 0.25, np.float32).astype(">f4"), "dtype >f4"),
            (list(good), "numpy.ndarray"),
            (np.full((1, n), 0.25, np.float32), "2 dimensions"),
            (np.full(2 * n, 0.25, np.float32)[::2], "not C-contiguous"),
            (np.frombuffer(bytearray(4 * n + 1), np.float32, n, 1), "not aligned"),
            (np.full(n + 1, 0.25, np.float32), f"want {n}"),
            (np.full(n - 1, 0.25, np.float32), f"want {n}"),
        ]
        for attn, words in cases:
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                p.step(10, attn)
            self.assertIn(words, e.exception.message)
        bad = good.copy()
        bad[2] = np.nan
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            p.step(10, bad)  # the library's own check
        self.assertIn("attn[2] = nan", e.exception.message)
        for pos, words in ((4, "not greater"), (-1, "negative"), (2 ** 31, "out of range"),
                           (1.5, "integer")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                p.step(pos, good)
            self.assertIn(words, e.exception.message)
        for budget, words in ((-1, "out of range"), (0, "budget"), ("4", "integer"),
                              (1, "recent_window")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                p.evict(budget)
            self.assertIn(words, e.exception.message)
        self.assertEqual((p.positions.tolist(), p.size), before)
        for spec in (4, "h2o\0x", "nope", "h2o:budget=0"):
            with self.assertRaises(kvevict.InvalidArgumentError):
                kvevict.Policy(spec)

    def test_unchecked(self):
        """unchecked=True skips the weights' validation only: the same victims
        on valid weights, a NaN accepted, every other refusal kept."""
        spec = "h2o:budget=6,recent_window=2"
        rng = kvevict.Rng(5)
        with kvevict.Policy(spec) as a, kvevict.Policy(spec, unchecked=True) as b, \
                kvevict.Bank(spec, 2, unchecked=True) as bank:
            for pos in range(40):
                row = np.array([rng.uniform() for _ in range(a.size)], np.float32)
                a.step(pos, row if a.size else None)
                b.step(pos, row if b.size else None)
                self.assertEqual(a.evict(6).tolist(), b.evict(6).tolist())
            bad = np.full(b.size, np.nan, np.float32)
            with self.assertRaises(kvevict.InvalidArgumentError):
                a.step(40, bad)
            b.step(40, bad)  # garbage in, garbage scores: still a kept victim out
            self.assertEqual(len(b.evict(6)), 1)
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                b.step(40, np.zeros(b.size, np.float32))
            self.assertIn("not greater", e.exception.message)
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                b.step(41, np.zeros(b.size + 1, np.float32))
            self.assertIn(f"want {b.size}", e.exception.message)
            bank.step(0, None)
            bank.step(1, np.full((2, 1), np.inf, np.float32))
        for bad in (1, "yes", None):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                kvevict.Policy(spec, unchecked=bad)
            self.assertIn("unchecked", e.exception.message)


class BankTests(unittest.TestCase):
    def c_bank(self, spec, heads, group, reduce, seed, steps, budget):
        out = run(EVAL_REF, "bank", spec, heads, group, reduce, seed, steps, budget)
        return [json.loads(line)["victims"] for line in out.splitlines()]

    def test_matches_c(self):
        """Grouped steps with every reduction, the same weights drawn from the
        same Rng as the C program: the same victims, head by head."""
        for spec, group, reduce in (("h2o:budget=12,recent_window=3", 1, "mean"),
                                    ("tova:budget=12", 2, "mean"),
                                    ("h2o_decay:budget=12,recent_window=3,decay=0.9", 3, "sum"),
                                    ("scissorhands:budget=12,recent_window=2", 2, "max"),
                                    ("random:budget=12,recent_window=2", 2, "mean")):
            heads, steps, budget = 3, 60, 12
            want = self.c_bank(spec, heads, group, kvevict._lib.REDUCE[reduce], 17, steps,
                               budget)
            rng = kvevict.Rng(17)
            b = kvevict.Bank(spec, heads, rng=rng)
            ld = budget + 1
            for pos in range(steps):
                attn = np.array([rng.uniform() for _ in range(heads * group * ld)],
                                dtype=np.float32).reshape(heads, group, ld)
                b.step(pos, attn if group > 1 else attn.reshape(heads, ld), reduce=reduce)
                victims, counts = b.evict(budget)
                got = [victims[h, :counts[h]].tolist() for h in range(heads)]
                self.assertEqual(got, want[pos], f"{spec} at {pos}")
                self.assertTrue((victims[counts == 0] == -1).all())

    def test_as_policies_and_ranges(self):
        """Head h of a bank is the h-th of n policies; disjoint ranges stepped
        one after the other equal one step of every head."""
        spec, heads = "h2o:budget=6,recent_window=2", 4
        whole = kvevict.Bank(spec, heads)
        halves = kvevict.Bank(spec, heads)
        policies = [kvevict.Policy(spec) for _ in range(heads)]
        gen = np.random.default_rng(1)
        for pos in range(30):
            n = int(whole.sizes.max())
            attn = gen.random((heads, max(n, 1)), dtype=np.float32)
            whole.step(pos, attn)
            halves.step(pos, np.ascontiguousarray(attn[:2]), first=0, count=2)
            halves.step(pos, np.ascontiguousarray(attn[2:]), first=2, count=2)
            for h, p in enumerate(policies):
                p.step(pos, np.ascontiguousarray(attn[h, :p.size]))
            v, c = whole.evict(6)
            v1, c1 = halves.evict(6, first=0, count=2)
            v2, c2 = halves.evict(6, first=2)
            for h, p in enumerate(policies):
                mine = p.evict(6).tolist()
                self.assertEqual(v[h, :c[h]].tolist(), mine)
                vr, cr = (v1, c1) if h < 2 else (v2, c2)
                self.assertEqual(vr[h % 2, :cr[h % 2]].tolist(), mine)
            for h in range(heads):
                self.assertEqual(whole.positions(h).tolist(), policies[h].positions.tolist())
                self.assertEqual(whole.size(h), policies[h].size)
        self.assertEqual(whole.heads, heads)
        self.assertEqual(whole.spec, spec)
        self.assertEqual(whole.budget, 6)
        self.assertEqual(whole.state_bytes, heads * policies[0].state_bytes)
        whole.step(30, None)
        halves.step(30, None, first=1, count=3)
        halves.step(30, None, first=0, count=1)
        self.assertEqual(whole.sizes.tolist(), halves.sizes.tolist())
        self.assertIn("heads=4", repr(whole))
        whole.close()
        self.assertIn("closed", repr(whole))

    def test_refusals(self):
        b = kvevict.Bank("h2o:budget=4,recent_window=1", 2)
        for pos in range(5):
            b.step(pos, np.full((2, 5), 0.2, np.float32))
        b.evict(4)
        before = [b.positions(h).tolist() for h in range(2)]
        cases = [
            (dict(attn=np.full((3, 5), 0.2, np.float32)), "3 rows, want 2"),
            (dict(attn=np.full((2, 3), 0.2, np.float32)), "keeps 4 positions"),
            (dict(attn=np.full((2, 2, 5), 0.2, np.float32), group=3), "groups of 2"),
            (dict(attn=np.full((4, 5), 0.2, np.float32), group=2, reduce="median"), "reduce"),
            (dict(attn=np.full((2, 5), 0.2, np.float64)), "dtype <f8"),
            (dict(attn=np.full(10, 0.2, np.float32)), "1 dimensions"),
            (dict(attn=np.full((2, 5), 0.2, np.float32), first=1, count=2), "out of range"),
            (dict(attn=np.full((2, 5), 0.2, np.float32), first=3), "out of range"),
            (dict(attn=np.full((2, 5), -0.2, np.float32)), "negative"),
        ]
        for kw, words in cases:
            attn = kw.pop("attn")
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                b.step(5, attn, **kw)
            self.assertIn(words, e.exception.message)
        with self.assertRaises(kvevict.InvalidArgumentError):
            b.evict(1)  # budget <= recent_window
        with self.assertRaises(kvevict.InvalidArgumentError):
            b.size(2)
        self.assertEqual([b.positions(h).tolist() for h in range(2)], before)
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.Bank("h2o", 0)
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.Bank("h2o", -1)


class KeyPolicies(unittest.TestCase):
    """Policies that read keys: Policy and Bank with key_dim and keys."""

    def test_bank_matches_c(self):
        """Banks built with kve_bank_new_ex and stepped with keys (and
        attention) from the same Rng as the C program: the same victims and
        sizes, step for step; shared budgets evicted with evict_shared."""
        for spec, heads, d, share, min_share in (
                ("knorm:budget=10,recent_window=2", 3, 8, 0, 0.2),
                ("keydiff:budget=10", 2, 5, 0, 0.2),
                ("h2o:budget=10,recent_window=2", 2, 6, 0, 0.2),  # keys validated, ignored
                ("h2o:budget=10,recent_window=2", 4, 0, 2, 0.2),
                ("tova:budget=10", 4, 0, 4, 0.5),
                ("keydiff:budget=10,recent_window=1", 4, 8, 2, 0.0)):
            steps, budget = 50, 10
            out = run(EVAL_REF, "bankx", spec, heads, d, share, min_share, 17, steps, budget)
            want = [json.loads(line) for line in out.splitlines()]
            rng = kvevict.Rng(17)
            b = kvevict.Bank(spec, heads, rng=rng, key_dim=d, share=share, min_share=min_share)
            self.assertEqual((b.key_dim, b.share, b.min_share), (d, share, min_share))
            ld = max(share, 1) * budget + 1
            for pos in range(steps):
                attn = np.array([rng.uniform() for _ in range(heads * ld)],
                                dtype=np.float32).reshape(heads, ld)
                keys = np.array([rng.uniform() - 0.5 for _ in range(heads * d)],
                                dtype=np.float32).reshape(heads, d) if d else None
                b.step(pos, attn, keys)
                victims, counts = (b.evict_shared(share * budget) if share
                                   else b.evict(budget))
                got = [victims[h, :counts[h]].tolist() for h in range(heads)]
                self.assertEqual(got, want[pos]["victims"], f"{spec} at {pos}")
                self.assertEqual(b.sizes.tolist(), want[pos]["sizes"], f"{spec} at {pos}")
            if share:  # the heads' sizes differ, each group's add up to its budget
                sizes = b.sizes.reshape(-1, share)
                self.assertTrue((sizes.sum(axis=1) == share * budget).all(), sizes)

    def test_bank_is_policies(self):
        """Head h of a key-reading bank is the h-th of n policies, keys in
        ranges included."""
        spec, heads, d = "keydiff:budget=9,recent_window=2", 3, 7
        gen = np.random.default_rng(6)
        bank = kvevict.Bank(spec, heads, key_dim=d)
        self.assertEqual((bank.reads, bank.key_dim, bank.share), ("keys", d, 0))
        policies = [kvevict.Policy(spec, key_dim=d) for _ in range(heads)]
        for pos in range(40):
            keys = gen.standard_normal((heads, d)).astype(np.float32)
            if pos % 2:
                bank.step(pos, None, keys)
            else:  # two ranges, one after the other
                bank.step(pos, None, np.ascontiguousarray(keys[:1]), count=1)
                bank.step(pos, None, np.ascontiguousarray(keys[1:]), first=1)
            v, c = bank.evict(9)
            for h, p in enumerate(policies):
                p.step(pos, key=keys[h])
                self.assertEqual(v[h, :c[h]].tolist(), p.evict(9).tolist())
                self.assertEqual(bank.positions(h).tolist(), p.positions.tolist())
        self.assertEqual(bank.state_bytes, sum(p.state_bytes for p in policies))

    def test_refusals_change_nothing(self):
        p = kvevict.Policy("knorm:budget=4,recent_window=1", key_dim=4)
        gen = np.random.default_rng(3)
        for pos in range(6):
            p.step(pos, key=gen.standard_normal(4).astype(np.float32))
            p.evict(4)
        before = p.positions.tolist()
        good = np.ones(4, np.float32)
        nan = good.copy()
        nan[3] = np.nan
        for key, words in ((None, "reads keys, but the step carries none"),
                           (good.astype(np.float64), "dtype <f8"),
                           (np.ones(5, np.float32), "want (4,)"),
                           (np.ones((1, 4), np.float32), "2 dimensions"),
                           (np.ones(8, np.float32)[::2], "not C-contiguous"),
                           (list(good), "numpy.ndarray"),
                           (nan, "key[3]")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                p.step(10, None, key)
            self.assertIn(words, e.exception.message)
        self.assertEqual(p.positions.tolist(), before)
        for kw, words in (({}, "key_dim must be at least 1"),
                          ({"key_dim": kvevict._lib.KVE_MAX_KEY_DIM + 1}, "key_dim"),
                          ({"key_dim": -1}, "out of range")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                kvevict.Policy("knorm", **kw)
            self.assertIn(words, e.exception.message)
        with self.assertRaises(kvevict.InvalidArgumentError) as e:  # no keys to give
            kvevict.Policy("h2o:budget=8,recent_window=2").step(0, None, good)
        self.assertIn("key", e.exception.message)
        b = kvevict.Bank("knorm:budget=4,recent_window=1", 2, key_dim=4)
        for keys, kw, words in ((None, {}, "carries none"),
                                (np.ones((3, 4), np.float32), {}, "want (2, 4)"),
                                (np.ones((1, 4), np.float32), {}, "want (2, 4)"),
                                (np.ones((2, 3), np.float32), {}, "want (2, 4)"),
                                (np.ones((2, 4), np.float32), {"first": 1}, "want (1, 4)"),
                                (np.ones(8, np.float32), {}, "1 dimensions")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                b.step(0, None, keys, **kw)
            self.assertIn(words, e.exception.message)
        self.assertEqual(b.sizes.tolist(), [0, 0])


class SharedBanks(unittest.TestCase):
    def test_evict_shared(self):
        """Skewed heads: the head whose attention is spread thin gives up its
        positions to the one that concentrates it; no head below its floor;
        victims ascending; each group holds its budget."""
        spec, heads, share, budget = "h2o:budget=16,recent_window=2", 4, 2, 16
        b = kvevict.Bank(spec, heads, share=share, min_share=0.25)
        gen = np.random.default_rng(9)
        for pos in range(80):
            n = int(b.sizes.max())
            attn = gen.random((heads, max(n, 1)), dtype=np.float32)
            attn[0::2] *= np.float32(1e-3)  # heads 0 and 2 attend little
            b.step(pos, attn)
            victims, counts = b.evict_shared(share * budget)
            for h in range(heads):
                v = victims[h, :counts[h]]
                self.assertTrue((np.diff(v) > 0).all())
                self.assertFalse(np.isin(v, b.positions(h)).any())
        sizes = b.sizes
        self.assertTrue((sizes.reshape(-1, share).sum(axis=1) == share * budget).all())
        floor = max(2, int(0.25 * share * budget / share))
        self.assertTrue((sizes >= floor).all(), sizes)
        self.assertGreater(sizes[1], sizes[0])
        # one group at a time: the other group is untouched
        b.step(80, None)
        before = b.positions(0).tolist()
        victims, counts = b.evict_shared(share * budget, first=2, count=2)
        self.assertEqual(victims.shape[0], 2)
        self.assertEqual(b.positions(0).tolist(), before)
        self.assertEqual(int(counts.sum()), share)  # each head of the group admitted one
        self.assertIn("share=2", repr(b))

    def test_refusals(self):
        for args, kw, words in ((("h2o", 4), {"share": 3}, "share"),
                                (("window", 4), {"share": 2}, "share"),
                                (("h2o:block=4,recent_window=8", 4), {"share": 2}, "block"),
                                (("h2o", 4), {"share": 2, "min_share": 1.5}, "min_share"),
                                (("h2o", 4), {"share": 2, "min_share": float("nan")}, "min_share"),
                                (("h2o", 4), {"share": 2, "min_share": "x"}, "min_share"),
                                (("h2o", 4), {"share": -2}, "out of range")):
            with self.assertRaises(kvevict.InvalidArgumentError, msg=str(kw)) as e:
                kvevict.Bank(*args, **kw)
            self.assertIn(words, e.exception.message)
        b = kvevict.Bank("h2o:budget=8,recent_window=2", 4, share=2)
        for pos in range(12):
            b.step(pos, np.full((4, 13), 0.1, np.float32))
        before = [b.positions(h).tolist() for h in range(4)]
        for call, words in ((lambda: b.evict_shared(16, first=1, count=2), "group"),
                            (lambda: b.evict_shared(4), "recent windows"),
                            (lambda: b.evict_shared(16, count=5), "out of range"),
                            (lambda: b.evict(8, first=1, count=2), "group"),
                            (lambda: b.step(12, None, first=1, count=1), "group")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                call()
            self.assertIn(words, e.exception.message)
        self.assertEqual([b.positions(h).tolist() for h in range(4)], before)
        plain = kvevict.Bank("h2o:budget=8,recent_window=2", 4)
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            plain.evict_shared(16)
        self.assertIn("share", e.exception.message)


class SamePositions(unittest.TestCase):
    def test_one_decision(self):
        """same_positions=True: heads stepped a range at a time keep one kept
        set, the victims those of the heads' scores added in head order (the
        numpy model below); a part of the bank cannot be evicted; forks and
        images continue alike."""
        spec, heads, budget, rw = "h2o:budget=12,recent_window=3", 4, 12, 3
        b = kvevict.Bank(spec, heads, same_positions=True)
        self.assertTrue(b.same_positions)
        self.assertFalse(kvevict.Bank(spec, heads).same_positions)
        gen = np.random.default_rng(5)
        score = np.zeros((heads, 0))
        for pos in range(60):
            n = int(b.sizes[0])
            attn = gen.random((heads, max(n, 1)), dtype=np.float32)
            b.step(pos, attn[:2], first=0, count=2)
            b.step(pos, attn[2:], first=2, count=2)
            score = np.concatenate([score + attn[:, :n].astype(np.float64),
                                    np.zeros((heads, 1))], axis=1)
            kept = b.positions(0)
            victims, counts = b.evict(budget)
            if n + 1 > budget:
                total = score[0].copy()
                for h in range(1, heads):
                    total += score[h]
                v = int(np.argmin(total[:n + 1 - rw]))  # ties: the lower position
                self.assertEqual(counts.tolist(), [1] * heads)
                self.assertEqual(victims[:, 0].tolist(), [int(kept[v])] * heads)
                score = np.delete(score, v, axis=1)
            for h in range(1, heads):
                self.assertEqual(b.positions(h).tolist(), b.positions(0).tolist())
        c = b.clone()
        img = b.save()
        loaded = kvevict.Bank.load(img)
        self.assertTrue(loaded.same_positions)
        attn = gen.random((heads, budget), dtype=np.float32)
        for x in (b, c, loaded):
            x.step(60, attn)
        taken = [x.evict(budget)[0].tolist() for x in (b, c, loaded)]
        self.assertEqual(taken[0], taken[1])
        self.assertEqual(taken[0], taken[2])
        self.assertEqual(b.save(), loaded.save())
        b.step(61, None, first=0, count=1)
        before = b.positions(1).tolist()
        for call, words in ((lambda: b.evict(budget), "has not admitted"),
                            (lambda: b.evict(budget, first=0, count=2), "every head"),
                            (lambda: b.step(62, None, first=1, count=3), "same_positions")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                call()
            self.assertIn(words, e.exception.message)
        self.assertEqual(b.positions(1).tolist(), before)
        for kw, words in (({"same_positions": 1}, "True or False"),
                          ({"same_positions": True, "share": 2}, "choose one")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                kvevict.Bank(spec, heads, **kw)
            self.assertIn(words, e.exception.message)


class Lifecycle(unittest.TestCase):
    """clone(), copy_from(), remove(), reset(), save(), load() and pickling
    (kvevict.h, "Lifecycle"): forks continue bit for bit (the same victims
    and the same image after every call), refusals change nothing."""

    CASES = (("h2o:budget=10,recent_window=2", 3, 0, 0),
             ("scissorhands:budget=9,recent_window=1,history=5", 2, 0, 0),
             ("h2o_mean:budget=8,recent_window=1,block=2", 2, 0, 0),
             ("random:budget=7,recent_window=1", 3, 0, 0),
             ("streaming:budget=9,sinks=2", 2, 0, 0),
             ("keydiff:budget=8,recent_window=1", 2, 5, 0),
             ("knorm:budget=9,recent_window=0", 4, 3, 2),
             ("tova:budget=10", 4, 0, 2))

    @staticmethod
    def drive(objs, gen, pos, steps, key_dim):
        """The same random calls on every object of objs (banks); returns the
        next position and each call's (victims, counts) of the first."""
        for _ in range(steps):
            b0 = objs[0]
            kind = gen.integers(10)
            if kind < 6:
                ld = int(b0.sizes.max()) + 1
                attn = gen.random((b0.heads, ld)).astype(np.float32)
                keys = (gen.standard_normal((b0.heads, key_dim)).astype(np.float32)
                        if key_dim else None)
                for b in objs:
                    b.step(pos, None if kind == 5 else attn, keys)
                pos += 1
            elif kind < 9:
                budget = b0.budget
                got = [b.evict_shared(b.share * budget) if b.share and kind == 8
                       else b.evict(budget) for b in objs]
                for v, c in got[1:]:
                    np.testing.assert_array_equal(c, got[0][1])
                    np.testing.assert_array_equal(v, got[0][0])
            else:
                p0 = int(gen.integers(pos + 1))
                rewind = gen.integers(2) == 0
                for b in objs:
                    b.remove(p0) if rewind else b.remove(p0, p0 + 3)
                if rewind:
                    pos = p0
            image = objs[0].save()
            for b in objs[1:]:
                if b.save() != image:
                    raise AssertionError(f"{b0.spec}: the forks' images differ")
        return pos

    def test_forks_continue(self):
        import copy
        import pickle
        gen = np.random.default_rng(18)
        for spec, heads, d, share in self.CASES:
            a = kvevict.Bank(spec, heads, rng=kvevict.Rng(5), key_dim=d, share=share)
            pos = self.drive([a], gen, 0, 80, d)
            other = kvevict.Bank(spec, heads, rng=kvevict.Rng(6), key_dim=d, share=share)
            self.drive([other], gen, 0, 30, d)
            other.copy_from(a)
            forks = [a, a.clone(), other, kvevict.Bank.load(a.save()),
                     pickle.loads(pickle.dumps(a)), copy.deepcopy(a)]
            for f in forks[1:]:
                self.assertEqual((f.spec, f.heads, f.key_dim, f.share, f.min_share),
                                 (a.spec, a.heads, a.key_dim, a.share, a.min_share))
            self.drive(forks, gen, pos, 120, d)
            # a policy: the same through the Policy class
            p = kvevict.Policy(spec, rng=kvevict.Rng(5), key_dim=d)
            for t in range(30):
                n = p.size
                p.step(t, gen.random(n).astype(np.float32) if n else None,
                       gen.standard_normal(d).astype(np.float32) if d else None)
                p.evict(p.budget)
            twins = [p.clone(), kvevict.Policy.load(p.save()), pickle.loads(pickle.dumps(p))]
            q = kvevict.Policy(spec, rng=kvevict.Rng(9), key_dim=d)
            q.copy_from(p)
            twins.append(q)
            for t in range(30, 70):
                n = p.size
                attn = gen.random(n).astype(np.float32) if n else None
                key = gen.standard_normal(d).astype(np.float32) if d else None
                want = None
                for x in [p] + twins:
                    x.step(t, attn, key)
                    got = x.evict(p.budget).tolist()
                    want = got if want is None else want
                    self.assertEqual(got, want, f"{spec} at {t}")
                self.assertTrue(all(x.save() == p.save() for x in twins), spec)

    def test_remove_and_rewind(self):
        p = kvevict.Policy("h2o:budget=8,recent_window=2")
        for t in range(10):
            p.step(t, np.full(p.size, 0.5, np.float32) if p.size else None)
        self.assertEqual(p.remove(2, 4), 2)
        self.assertEqual(p.remove(20, 30), 0)
        self.assertEqual(p.remove(7), 3)  # a rewind to 7: 7, 8 and 9 go
        self.assertEqual(p.positions.tolist(), [0, 1, 4, 5, 6])
        p.step(7, np.full(p.size, 0.5, np.float32))  # 7 again
        self.assertEqual(p.remove(-3, 1), 1)
        for p0, p1 in ((5, 5), (6, 2)):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                p.remove(p0, p1)
            self.assertIn("p0 must be below p1", e.exception.message)
        for p0, words in ((2 ** 31, "out of range"), (1.5, "integer")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                p.remove(p0)
            self.assertIn(words, e.exception.message)
        b = kvevict.Bank("window:budget=4", 3)
        for t in range(6):
            b.step(t)
        b.remove(3)
        self.assertEqual(b.sizes.tolist(), [3, 3, 3])
        b.step(3)

    def test_reset_replays(self):
        gen = np.random.default_rng(4)
        for spec, heads, d, share in self.CASES:
            a = kvevict.Bank(spec, heads, rng=kvevict.Rng(11), key_dim=d, share=share)
            self.drive([a], gen, 0, 60, d)
            a.reset()
            self.assertEqual(a.sizes.tolist(), [0] * heads)
            fresh = kvevict.Bank(spec, heads, rng=kvevict.Rng(11), key_dim=d, share=share)
            self.assertEqual(a.save(), fresh.save())
            self.drive([a, fresh], gen, 0, 60, d)

    def test_refusals_change_nothing(self):
        p = kvevict.Policy("h2o:budget=8,recent_window=2")
        for t in range(12):
            p.step(t, np.full(p.size, 0.25, np.float32) if p.size else None)
            p.evict(8)
        image = p.save()
        for other, words in ((kvevict.Policy("h2o:budget=9,recent_window=2"), "spec"),
                             (kvevict.Policy("h2o:budget=8,recent_window=2", key_dim=2),
                              "key_dim")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                p.copy_from(other)
            self.assertIn(words, e.exception.message)
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            p.copy_from(kvevict.Bank("h2o:budget=8,recent_window=2", 1))
        self.assertIn("a Policy is required", e.exception.message)
        self.assertEqual(p.save(), image)
        bank = kvevict.Bank("h2o:budget=8,recent_window=2", 2)
        bimage = bank.save()
        for data, words, cls in (
                (image[:-1], "size", kvevict.Policy),
                (image[:40] + bytes([image[40] ^ 1]) + image[41:], "checksum", kvevict.Policy),
                (b"", "truncated", kvevict.Policy),
                (bimage, "kve_bank_load", kvevict.Policy),
                (image, "kve_policy_load", kvevict.Bank),
                ("text", "bytes are required", kvevict.Policy),
                (np.zeros(4), "bytes are required", kvevict.Bank)):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                cls.load(data)
            self.assertIn(words, e.exception.message)
        self.assertEqual(kvevict.Policy.load(bytearray(image)).save(), image)
        self.assertEqual(kvevict.Policy.load(memoryview(image)).save(), image)
        p.close()
        for call in (p.save, p.clone, p.reset, lambda: p.remove(0)):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                call()
            self.assertIn("used after close()", e.exception.message)

    def test_image_matches_documented_size(self):
        """The size docs/api.md gives: 72 + len(spec) + 8, and per head 64
        and 12 bytes a kept position (h2o)."""
        b = kvevict.Bank("h2o:budget=6,recent_window=2", 3)
        for t in range(9):
            b.step(t)
            b.evict(6)
        self.assertEqual(len(b.save()), 72 + len(b.spec) + 8 + 3 * (64 + 6 * 12))


class AttnRow(unittest.TestCase):
    def test_softmax(self):
        gen = np.random.default_rng(4)
        q = gen.standard_normal(16).astype(np.float32)
        keys = gen.standard_normal((9, 16)).astype(np.float32)
        got = kvevict.attn_row(q, keys, 0.25)
        logits = 0.25 * (keys.astype(np.float64) @ q.astype(np.float64))
        want = np.exp(logits - logits.max())
        want /= want.sum()
        self.assertEqual(got.dtype, np.float32)
        self.assertTrue(np.allclose(got, want, rtol=1e-5, atol=1e-7))
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.attn_row(q[:8], keys, 0.25)
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.attn_row(q, keys, float("nan"))


class TraceTests(unittest.TestCase):
    def test_canonical(self):
        with kvevict.Trace.open(CANON) as tr:
            self.assertEqual((tr.steps, tr.heads, tr.layers), (700, 1, 1))
            self.assertTrue(tr.source.startswith("canonical:version=3,seed=5,steps=700"))
            row = tr.row(99)
            self.assertEqual((row.dtype, row.shape), (np.float64, (100,)))
            self.assertAlmostEqual(row.sum(), 1.0, places=6)
            self.assertEqual(tr.row(0).tolist(), [1.0])
            for t, head in ((700, 0), (2 ** 62, 0), (0, 1)):
                with self.assertRaises(kvevict.InvalidArgumentError):
                    tr.row(t, head)
            self.assertIn("steps=700", repr(tr))

    def test_npy_round_trip(self):
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d) / "t.npy"
            with kvevict.Trace.open("canonical:steps=50") as tr:
                tr.write_npy(path)
                self.assertEqual(tr.npy_bytes, path.stat().st_size)
                a = np.load(path)
                self.assertEqual(a.shape, (50, 50))
                for t in (0, 17, 49):
                    self.assertTrue((a[t, :t + 1] == tr.row(t).astype(np.float32)).all())
                with kvevict.Trace.open(path) as back:  # os.PathLike
                    self.assertEqual(back.source, str(path))
                with kvevict.Trace.from_array(a) as mem:
                    self.assertEqual(mem.source, "memory")
                    for t in (0, 17, 49):
                        self.assertEqual(mem.row(t).tolist(), a[t, :t + 1].astype(np.float64).tolist())

    def test_from_array_shapes(self):
        gen = np.random.default_rng(8)
        a = attention_rows(gen, 6, 20)
        for arr, shape in ((a[0], (1, 1)), (a, (1, 6)), (a.reshape(2, 3, 20, 20), (2, 6))):
            with kvevict.Trace.from_array(arr) as tr:
                self.assertEqual((tr.layers, tr.heads, tr.steps), shape + (20,))
                last = arr.reshape(-1, 20, 20)[-1]
                self.assertEqual(tr.row(19, tr.heads - 1).tolist(),
                                 last[19].astype(np.float64).tolist())
        scaled = a * np.float32(3.0)
        with self.assertRaises(kvevict.FormatError) as e:
            kvevict.Trace.from_array(scaled)
        self.assertIn("memory: head 0, row 1 sums to", e.exception.message)
        with kvevict.Trace.from_array(scaled, normalize=True) as tr:
            self.assertAlmostEqual(tr.row(10, 3).sum(), 1.0, places=12)

    def test_from_array_refusals(self):
        a = attention_rows(np.random.default_rng(2), 2, 8)
        for arr, words in ((a.astype(np.float64), "dtype <f8"), (a[0].tolist(), "ndarray"),
                           (a[0, 0], "1 dimensions"), (a.reshape(1, 1, 2, 8, 8), "5 dimensions"),
                           (a[:, :, :4].copy(), "last two dimensions"),
                           (a.transpose(0, 2, 1), "C-contiguous"),
                           (np.zeros((0, 0), np.float32), "zero dimension")):
            with self.assertRaises(kvevict.KvevictError) as e:
                kvevict.Trace.from_array(arr)
            self.assertIn(words, e.exception.message)
        bad = a.copy()
        bad[1, 5, 2] = np.nan
        with self.assertRaises(kvevict.FormatError) as e:
            kvevict.Trace.from_array(bad.reshape(2, 1, 8, 8))
        self.assertEqual(e.exception.message,
                         "memory: head 1 (layer 1, head 0), row 5: weight at key 2 is nan "
                         "(want finite and >= 0)")
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            kvevict.Trace.open("memory")
        self.assertIn("kvevict.Trace.from_array", e.exception.message)
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.Trace.open(42)

    def test_from_array_borrows(self):
        """The trace holds one reference to the array while open, none after;
        a row changed under it is refused, not trusted."""
        a = attention_rows(np.random.default_rng(3), 1, 12)[0]
        base = sys.getrefcount(a)
        tr = kvevict.Trace.from_array(a)
        self.assertEqual(sys.getrefcount(a), base + 1)
        a[7, 3] = 5.0
        with self.assertRaises(kvevict.FormatError):
            tr.row(7)
        tr.close()
        self.assertEqual(sys.getrefcount(a), base)


class Evaluate(unittest.TestCase):
    """The harness three ways: Python, C (eval_ref), the CLI (kvevict eval)."""

    def three_way(self, trace_py, trace_src, head, seed, topk, jobs):
        py = kvevict.evaluate(trace_py, jobs, head=head, seed=seed, topk=topk)
        c = c_eval(trace_src, head, seed, topk, jobs)
        self.assertEqual(len(py), len(jobs))
        for (spec, budget), p, r in zip(jobs, py, c):
            cli = cli_eval(trace_src, spec, budget, seed, topk, per_head=True)
            cli_head = cli["per_head"][head]
            recall_key = "topk_recall"  # cli_eval gives --topk
            self.assertEqual(p["policy"], r["policy"])
            self.assertEqual(p["policy"], cli["policy"])
            for key in ("budget", "steps", "scored_steps", "state_bytes", "topk"):
                self.assertEqual(p[key], r[key], key)
            self.assertTrue(same_float(p["mean_kept"], r["mean_kept"]))
            for key in ("budget", "steps", "scored_steps"):
                self.assertEqual(p[key], cli[key], key)
            self.assertEqual(p["state_bytes"], cli_head["state_bytes"])
            for key in METRICS + ("topk_recall",):
                self.assertTrue(same_float(p[key], r[key]), f"{spec}: {key} {p[key]} {r[key]}")
            for key in ("retained_mass", "min_retained_mass"):
                self.assertTrue(same_float(p[key], cli_head[key]), f"{spec}: {key}")
            self.assertTrue(same_float(p["topk_recall"], cli_head[recall_key]))
            self.assertEqual(p["seed"], seed)
            self.assertEqual(p["head"], head)
        return py

    def jobs(self, budgets, names=ATTN_SPECS):
        return [(kvevict.spec_with(name), b) for b in budgets for name in names]

    def test_qk_three_ways(self):
        """Every policy on a q/K trace (grouped-query, two KV heads), those
        that read keys included."""
        with kvevict.Trace.open(QkFile.src) as tr:
            self.assertEqual((tr.heads, tr.steps, tr.key_dim), (2, QkFile.STEPS, QkFile.D))
            for head in (0, 1):
                py = self.three_way(tr, QkFile.src, head, 5, 16, self.jobs((40, 100), QK_SPECS))
                self.assertTrue(all(r["scored_steps"] > 0 for r in py))

    def test_key_policy_needs_keys(self):
        with kvevict.Trace.open("canonical:steps=60") as tr:
            self.assertEqual(tr.key_dim, 0)
            for name in KEY_SPECS:
                with self.assertRaises(kvevict.InvalidArgumentError) as e:
                    kvevict.evaluate(tr, [name])
                self.assertIn("the policy reads keys, but the trace has none", e.exception.message)

    def test_heads_and_shared_three_ways(self):
        """Banks of several heads (kve_eval_options.heads), their budgets
        shared or not, against eval_ref and `kvevict eval --share-heads`,
        whose layers are such banks."""
        a = attention_rows(np.random.default_rng(13), 4, 90).reshape(2, 2, 90, 90)
        specs = ["h2o:budget=20,recent_window=4", "tova:budget=20", "scissorhands:budget=20,"
                 "recent_window=4,history=0", "h2o_decay:budget=20,recent_window=4,decay=0.99"]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "attn.npy")
            np.save(path, a)
            with kvevict.Trace.open(path) as tr:
                for share, min_share in ((0, 0.2), (2, 0.2), (2, 0.5)):
                    opts = dict(heads=2, share=share, min_share=min_share, score_after=20)
                    for first in (0, 2):
                        py = kvevict.evaluate(tr, specs, head=first, seed=1, topk=32,
                                              per_head=True, **opts)
                        c = [json.loads(line) for line in run(
                            EVAL_REF, "eval", *[f"{k}={v}" for k, v in opts.items()], path,
                            first, 1, 32, *specs).splitlines()]
                        for p, r in zip(py, c):
                            self.assertEqual((p["heads"], p["head"]), (2, first))
                            for x, y in [(p, r)] + list(zip(p["per_head"], r["per_head"])):
                                for key in METRICS + ("topk_recall", "mean_kept"):
                                    self.assertTrue(same_float(x[key], y[key]), (p, key))
                                for key in ("scored_steps", "state_bytes"):
                                    self.assertEqual(x[key], y[key], key)
                            self.assertEqual([h["head"] for h in p["per_head"]],
                                             [first, first + 1])
                            if share:
                                continue
                            for h in p["per_head"]:  # without sharing: a one-head run
                                one = kvevict.evaluate(tr, p["policy"], head=h["head"], seed=1,
                                                       score_after=20)[0]
                                for key in METRICS + ("mean_kept", "scored_steps"):
                                    self.assertTrue(one[key] == h[key], key)
                    if not share:
                        continue
                    for spec in specs:
                        out = run(KVEVICT, "eval", "--trace", path, "--policy", spec,
                                  "--share-heads", "--min-share", min_share, "--per-head",
                                  "--json")
                        cli = [json.loads(line) for line in out.splitlines()]
                        for row in cli[1:]:  # the layers' heads
                            p = kvevict.evaluate(tr, spec, head=2 * row["layer"], seed=0,
                                                 per_head=True, **opts)[0]
                            h = p["per_head"][row["head"]]
                            for key in METRICS + ("mean_kept",):
                                self.assertTrue(same_float(h[key], row[key]), (spec, key))
                            self.assertEqual(h["state_bytes"], row["state_bytes"])
                        self.assertEqual(len(cli), 5)
                every = kvevict.evaluate(tr, specs[:1], head=None, heads=2, share=2)
                self.assertEqual([r["head"] for r in every], [0, 2])
                with self.assertRaises(kvevict.InvalidArgumentError) as e:
                    kvevict.evaluate(tr, specs[:1], head=None, heads=3)
                self.assertIn("does not divide", e.exception.message)
                for kw, words in (({"heads": 3}, "heads"), ({"share": 3, "heads": 2}, "share"),
                                  ({"share": 2, "heads": 2, "min_share": 2.0}, "min_share"),
                                  ({"heads": 0}, "out of range"),
                                  ({"per_head": True, "as_array": True}, "per_head")):
                    with self.assertRaises(kvevict.InvalidArgumentError, msg=str(kw)) as e:
                        kvevict.evaluate(tr, ["window:budget=20"] if "share" not in kw
                                         else specs[:1], head=2, **kw)
                    self.assertIn(words, e.exception.message)

    def test_canonical_three_ways(self):
        with kvevict.Trace.open(CANON) as tr:
            py = self.three_way(tr, CANON, 0, 7, 8, self.jobs((64, 256)))
            self.assertEqual({r["trace"] for r in py}, {tr.source})
        self.assertTrue(all(r["scored_steps"] > 0 for r in py))

    def test_memory_and_npy_three_ways(self):
        """Attention held in memory (Trace.from_array) gives the results the
        .npy file of the same array gives through C and the CLI."""
        gen = np.random.default_rng(12)
        a = attention_rows(gen, 4, 160).reshape(2, 2, 160, 160)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "attn.npy")
            np.save(path, a)
            jobs = self.jobs((48, 100))
            with kvevict.Trace.from_array(a) as mem, kvevict.Trace.open(path) as npy:
                for head in (0, 3):
                    py = self.three_way(mem, path, head, 3, 32, jobs)
                    from_file = kvevict.evaluate(npy, jobs, head=head, seed=3)
                    for x, y in zip(py, from_file):
                        for key in METRICS + ("topk_recall", "state_bytes", "policy"):
                            self.assertTrue(x[key] == y[key] or same_float(x[key], y[key]))
                every = kvevict.evaluate(mem, jobs[:3], head=None, seed=3)
                self.assertEqual([r["head"] for r in every], [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])

    def test_structured_array_and_nan(self):
        with kvevict.Trace.open("canonical:steps=100") as tr:
            jobs = ["h2o:budget=16,recent_window=4", ("window", 40),
                    {"policy": "tova", "budget": 200}]
            rows = kvevict.evaluate(tr, jobs, topk=4)
            arr = kvevict.evaluate(tr, jobs, topk=4, as_array=True)
            single = kvevict.evaluate(tr, "streaming:budget=20")
        self.assertEqual(arr.dtype, kvevict.RESULT_DTYPE)
        for r, x in zip(rows, arr):  # two runs: all but the timing agree
            for key in set(kvevict.RESULT_DTYPE.names) - {"ns_per_step"}:
                self.assertTrue(r[key] == x[key] or same_float(r[key], float(x[key])), key)
        self.assertEqual(rows[2]["scored_steps"], 0)  # budget 200 >= steps - 1
        for key in METRICS + ("topk_recall",):
            self.assertTrue(math.isnan(rows[2][key]))
        self.assertEqual(len(single), 1)
        out = json.loads(run(KVEVICT, "eval", "--trace", "canonical:steps=100", "--policy",
                             "tova:budget=200", "--json"))
        self.assertIsNone(out["retained_mass"])  # the CLI's null is the binding's nan

    def test_refusals(self):
        with kvevict.Trace.open("canonical:steps=60") as tr:
            for jobs, head, kw, words in (
                    (["h2o:budget=8,recent_window=9"], 0, {}, "recent_window 9"),
                    (["h2o"], 1, {}, "head 1"),
                    (["h2o"], 0, {"topk": 0}, "topk"),
                    ([], 0, {}, "no job"),
                    ([3], 0, {}, "is not a spec"),
                    ([("h2o", -5)], 0, {}, "out of range"),
                    (["h2o"], 0, {"seed": -1}, "out of range")):
                with self.assertRaises(kvevict.InvalidArgumentError) as e:
                    kvevict.evaluate(tr, jobs, head=head, **kw)
                self.assertIn(words, e.exception.message)
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.evaluate("canonical", ["h2o"])


def same_results(a, b):
    """Two evaluate() outputs equal bit for bit (repr of every float), timings
    and the trace's name aside."""
    def strip(x):
        if isinstance(x, list):
            return [strip(v) for v in x]
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("ns_per_step", "trace")}
        return repr(x)
    return strip(a) == strip(b)


class LiveTraces(unittest.TestCase):
    """Trace.from_callback (kve_trace_from_callback): a Python callable
    producing each step's rows, evaluated as it produces them."""

    def test_same_as_array(self):
        a = attention_rows(np.random.default_rng(11), 6, 60)  # [H, T, T]
        asked = []

        def rows(t):
            asked.append(t)
            return a[:, t, :t + 1]  # exactly t + 1 weights a head

        jobs = ["h2o:budget=16,recent_window=4", "tova:budget=12", "streaming:budget=10"]
        for layers, per in ((1, 6), (2, 3)):
            asked.clear()
            with kvevict.Trace.from_callback(rows, per, 60, layers=layers) as live, \
                    kvevict.Trace.from_array(a.reshape(layers, per, 60, 60)) as mem:
                self.assertEqual((live.heads, live.layers, live.steps, live.source),
                                 (6, layers, 60, "callback"))
                got = kvevict.evaluate(live, jobs, heads=6, per_head=True, seed=3)
                self.assertEqual(asked, list(range(60)))  # each step once, in order
                want = kvevict.evaluate(mem, jobs, heads=6, per_head=True, seed=3)
                self.assertTrue(same_results(got, want))
                self.assertEqual(live.row(17, 4).tolist(), mem.row(17, 4).tolist())
        # (layers, heads, n) and float64 are accepted; normalize rescales
        big = (a * 3.0).astype(np.float64)
        with kvevict.Trace.from_callback(lambda t: big[:, t].reshape(2, 3, 60), 3, 60,
                                         layers=2, normalize=True) as live, \
                kvevict.Trace.from_array(np.ascontiguousarray(big, dtype=np.float32),
                                         normalize=True) as mem:
            self.assertTrue(same_results(kvevict.evaluate(live, jobs, heads=6),
                                         kvevict.evaluate(mem, jobs, heads=6)))

    def test_model_live(self):
        """An attention computed one decode step at a time from queries and
        a growing set of keys (as a model with a KV cache does; numpy here,
        the PyTorch model of tests/test_python_example.py there), evaluated
        live, equals the stacked [H, T, T] array."""
        gen = np.random.default_rng(0)
        H, T, d = 4, 48, 16
        q, k = gen.standard_normal((H, T, d)), gen.standard_normal((H, T, d))
        calls = []

        def step_attention(t):  # what a decoder's step t computes, no more
            calls.append(t)
            logits = np.einsum("hd,hkd->hk", q[:, t], k[:, :t + 1]) / d ** 0.5
            w = np.exp(logits - logits.max(axis=1, keepdims=True))
            return w / w.sum(axis=1, keepdims=True)  # float64, [H, t + 1]

        full = np.zeros((H, T, T), dtype=np.float32)
        for t in range(T):
            full[:, t, :t + 1] = step_attention(t)
        calls.clear()
        specs = ["h2o:budget=12,recent_window=4", "tova:budget=12"]
        with kvevict.Trace.from_callback(step_attention, H, T) as live, \
                kvevict.Trace.from_array(full) as mem:
            self.assertTrue(same_results(kvevict.evaluate(live, specs, heads=H),
                                         kvevict.evaluate(mem, specs, heads=H)))
        self.assertEqual(calls, list(range(T)))

    def test_keys(self):
        """Rows and keys relayed from a q/K trace: key-reading policies give
        the q/K trace's figures."""
        with kvevict.Trace.open(QkFile.src) as qk:
            H, T, d = qk.heads, qk.steps, qk.key_dim

            def rows(t):
                return np.stack([qk.row(t, h) for h in range(H)])

            def keys(t):
                return np.stack([qk.key(t, h) for h in range(H)])

            specs = ["knorm:budget=40", "keydiff:budget=40", "h2o:budget=40"]
            with kvevict.Trace.from_callback(rows, H, T, keys=keys, key_dim=d) as live:
                self.assertEqual(live.key_dim, d)
                self.assertTrue(same_results(kvevict.evaluate(live, specs, heads=H),
                                             kvevict.evaluate(qk, specs, heads=H)))
                self.assertEqual(live.key(7, 1).tolist(), qk.key(7, 1).tolist())

    def test_errors(self):
        a = attention_rows(np.random.default_rng(4), 2, 10)

        def raising(t):
            if t == 3:
                raise ValueError("the model broke")
            return a[:, t]

        with kvevict.Trace.from_callback(raising, 2, 10) as tr:
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                kvevict.evaluate(tr, "window:budget=4", heads=2)
            self.assertIsInstance(e.exception.__cause__, ValueError)
            self.assertEqual(e.exception.message, "Trace.from_callback: rows(3) raised "
                             "ValueError: the model broke")
            self.assertEqual(tr.row(2, 1).tolist(), a[1, 2, :3].astype(np.float64).tolist())
        with kvevict.Trace.from_callback(lambda t: a[:1, t], 2, 10) as tr:
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                tr.row(0)
            self.assertIn("rows(0) returned shape (1, 10), want (2, >= 1)", e.exception.message)
        bad = a.copy()
        bad[1, 5, 2] = -0.25
        with kvevict.Trace.from_callback(lambda t: bad[:, t], 2, 10) as tr:
            with self.assertRaises(kvevict.FormatError) as e:
                kvevict.evaluate(tr, "window:budget=4", heads=2)
            self.assertEqual(e.exception.message, "callback: head 1, row 5: weight at key 2 is "
                             "-0.25 (want finite and >= 0)")

        def interrupted(t):
            raise KeyboardInterrupt

        with kvevict.Trace.from_callback(interrupted, 2, 10) as tr:
            with self.assertRaises(KeyboardInterrupt):
                tr.row(0)
        for kw, words in ((dict(rows=42), "a callable rows(t)"),
                          (dict(key_dim=4), "keys and key_dim go together"),
                          (dict(keys=lambda t: None), "keys and key_dim go together"),
                          (dict(steps=0), "zero dimension"), (dict(heads=-1), "out of range")):
            args = dict(rows=lambda t: a[:, t], heads=2, steps=10)
            args.update(kw)
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                kvevict.Trace.from_callback(**args)
            self.assertIn(words, e.exception.message)
            self.assertNotIn("NULL", e.exception.message)


class PythonWords(unittest.TestCase):
    """Refusals name the Python argument or class, never a C name."""

    def test_messages(self):
        b = kvevict.Bank("h2o:budget=4,recent_window=1", 2)
        for pos in range(5):
            b.step(pos, np.full((2, 5), 0.2, np.float32))
        b.evict(4)
        a = attention_rows(np.random.default_rng(2), 1, 8)[0] * np.float32(2)
        cases = (
            (lambda: kvevict.Policy("random:budget=8"), "rng is None (pass rng=SEED"),
            (lambda: kvevict.Bank("random:budget=8", 2), "rng is None"),
            (lambda: kvevict.Policy("knorm:budget=8"), "pass key_dim=d to kvevict.Policy"),
            (lambda: kvevict.Bank("h2o:budget=64,recent_window=4", 2).evict_shared(64),
             "share=N"),
            (lambda: kvevict.Trace.from_array(a), "pass normalize=True"),
            (lambda: kvevict.Trace.open("memory"), "kvevict.Trace.from_array"),
            (lambda: kvevict.Trace.open("callback"), "kvevict.Trace.from_callback"),
            (lambda: b.step(5, np.full((2, 3), 0.2, np.float32)),
             "attn: rows of 3 weights, but the head keeps 4 positions"),
            (lambda: kvevict.Policy("h2o:budget=8", key_dim=10 ** 6),
             "key_dim 1000000 is above the largest"),
            (lambda: kvevict.layer_budgets(10, 3, "weighted"), "weights: None"),
            (lambda: kvevict.layer_budgets(10, 3, "cubic"), "schedule: 'cubic'"),
        )
        for call, words in cases:
            with self.assertRaises(kvevict.KvevictError) as e:
                call()
            self.assertIn(words, e.exception.message)
            for c_word in ("NULL", "kve_", "KVE_", "_ex"):
                self.assertNotIn(c_word, e.exception.message)


class BulkBank(unittest.TestCase):
    """sizes, evict and step size a bank in one library call
    (kve_bank_sizes), not a call per head."""

    def test_sizes_in_one_call(self):
        b = kvevict.Bank("h2o:budget=6,recent_window=2", 5)
        gen = np.random.default_rng(0)
        for pos in range(9):
            b.step(pos, gen.random((5, 10), dtype=np.float32))
            if pos % 3 == 0:
                b.evict(6, first=1, count=3)
        self.assertEqual(b.sizes.tolist(), [9, 8, 8, 8, 9])
        self.assertEqual(b.sizes.tolist(), [b.size(h) for h in range(5)])
        v, c = b.evict(6)
        self.assertEqual(v.shape, (5, 3))  # the most any head evicts
        self.assertEqual(c.tolist(), [3, 2, 2, 2, 3])
        self.assertEqual(c.dtype, np.intp)
        self.assertTrue((v[1:4, 2] == -1).all())
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            b.evict(6, first=4, count=2)
        self.assertIn("out of range", e.exception.message)
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            b.step(9, gen.random((5, 5), dtype=np.float32))  # the library's refusal
        self.assertIn("attn: rows of 5 weights, but the head keeps 6 positions",
                      e.exception.message)

    def test_pages_evict_more(self):
        # whole pages of 4: 11 kept, budget 6, so 8 go (more than 11 - 6),
        # and the buffer sized from the largest head holds them
        for first, count in ((0, None), (1, 2)):
            b = kvevict.Bank("h2o:budget=6,recent_window=1,block=4", 3)
            for pos in range(11):
                b.step(pos, np.full((3, pos), 0.1, dtype=np.float32))
            v, c = b.evict(6, first=first, count=count)
            n = 3 - first
            self.assertEqual(c.tolist(), [8] * n)
            self.assertEqual(v.tolist(), [list(range(8))] * n)
            self.assertEqual(b.sizes.tolist(), [11] * first + [3] * n)


class Prefill(unittest.TestCase):
    def prompt(self, heads, group, n, seed):
        a = attention_rows(np.random.default_rng(seed), heads * group, n)
        return a.reshape(heads, group, n, n)

    def test_h2o_rule(self):
        """Bank.prefill keeps the newest recent_window positions and, of the
        others, the budget - recent_window of highest prefill_scores (ties
        to the lower position), head by head."""
        heads, group, n, budget, rw = 3, 2, 40, 12, 4
        rows = self.prompt(heads, group, n, 5)
        b = kvevict.Bank(f"h2o:budget={budget},recent_window={rw}", heads)
        self.assertEqual(kvevict.prefill_rows(n), n)
        b.prefill(n, budget, rows)
        for h in range(heads):
            scores = kvevict.prefill_scores(rows[h], n)
            want = set(range(n - rw, n))
            old = sorted(range(n - rw), key=lambda i: (-scores[i], i))[:budget - rw]
            self.assertEqual(b.positions(h).tolist(), sorted(want | set(old)))
            self.assertAlmostEqual(scores.sum(), n * group / group, places=3)
        b.step(n, np.full((heads, budget + 1), 1.0 / (budget + 1), np.float32))
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            b.prefill(n, budget, rows)  # a head holds positions
        self.assertNotIn("NULL", e.exception.message)

    def test_snapkv(self):
        heads, group, n, budget, w = 2, 1, 50, 16, 8
        r = kvevict.prefill_rows(n, "snapkv", window=w)
        self.assertEqual(r, w)
        full = self.prompt(heads, group, n, 6)
        rows = np.ascontiguousarray(full[:, :, n - r:])
        b = kvevict.Bank(f"h2o:budget={budget},recent_window=2", heads)
        b.prefill(n, budget, rows, method="snapkv", window=w, kernel=3, pool="avg")
        for h in range(heads):
            kept = b.positions(h).tolist()
            self.assertEqual(len(kept), budget)
            self.assertTrue(set(range(n - w, n)) <= set(kept))
            scores = kvevict.prefill_scores(rows[h], n, method="snapkv", window=w, kernel=3,
                                            pool="avg")
            old = sorted(range(n - w), key=lambda i: (-scores[i], i))[:budget - w]
            self.assertEqual(kept, sorted(set(old) | set(range(n - w, n))))
        for kw, words in ((dict(method="h3o"), "method: 'h3o'"),
                          (dict(method="snapkv", window=8, kernel=4), "kernel"),
                          (dict(method="snapkv", window=7), "8 rows a query head, want 7")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                kvevict.Bank("h2o:budget=16,recent_window=2", heads).prefill(n, budget, rows,
                                                                              **kw)
            self.assertIn(words, e.exception.message)


class Schedules(unittest.TestCase):
    def test_layer_budgets(self):
        self.assertEqual(kvevict.layer_budgets(10, 3).tolist(), [4, 3, 3])
        p = kvevict.layer_budgets(1000, 8, "pyramid", floor=20, beta=20)
        self.assertEqual(int(p.sum()), 1000)
        self.assertTrue(all(x >= y for x, y in zip(p, p[1:])) and p[-1] >= 20, p)
        w = kvevict.layer_budgets(100, 4, "weighted", weights=[1, 1, 2, 0])
        self.assertEqual(w.tolist(), [25, 25, 50, 0])
        self.assertEqual(kvevict.layer_budgets(100, 2, "weighted", floor=10,
                                               weights=np.array([3.0, 1.0])).tolist(), [70, 30])
        for kw, words in ((dict(total=5, n_layers=3, floor=2), "cannot give 3 layers 2 each"),
                          (dict(total=5, n_layers=0), "n_layers"),
                          (dict(total=10, n_layers=2, schedule="pyramid", beta=0.5), "beta"),
                          (dict(total=10, n_layers=2, schedule="weighted", weights=[1.0]),
                           "one weight a layer"),
                          (dict(total=10, n_layers=2, schedule="weighted",
                                weights=[1.0, float("nan")]), "nan")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                kvevict.layer_budgets(**kw)
            self.assertIn(words, e.exception.message)
            self.assertNotIn("NULL", e.exception.message)


class Gil(unittest.TestCase):
    def test_released_during_a_call(self):
        """Trace.open on a FIFO blocks inside the library (in fopen) until a
        writer opens the FIFO, and only this thread can open it: if the call
        held the GIL, this thread could never run and the call never return.
        It returns (refusing the FIFO, which is not a regular file)."""
        with tempfile.TemporaryDirectory() as d:
            fifo = os.path.join(d, "fifo")
            os.mkfifo(fifo)
            outcome = {}

            def opener():
                try:
                    kvevict.Trace.open(fifo)
                except kvevict.KvevictError as e:
                    outcome["error"] = e

            t = threading.Thread(target=opener, daemon=True)
            t.start()
            fd, deadline = None, time.monotonic() + 60
            while fd is None and time.monotonic() < deadline:
                try:  # succeeds once the other thread is blocked in the library's open
                    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:
                    time.sleep(0.01)
            self.assertIsNotNone(fd, "the library's open never started")
            os.close(fd)
            t.join(60)
            self.assertFalse(t.is_alive())
        self.assertIsInstance(outcome.get("error"), kvevict.KvevictIOError)
        self.assertIn("not a regular file", outcome["error"].message)


class Leaks(unittest.TestCase):
    """10 000 calls of each kind: nothing grows."""

    N = 10_000

    def test_steps_and_evicts(self):
        import tracemalloc
        p = kvevict.Policy("h2o:budget=64,recent_window=8")
        b = kvevict.Bank("tova:budget=64", 4)
        kp = kvevict.Policy("keydiff:budget=64,recent_window=4", key_dim=16)
        sb = kvevict.Bank("knorm:budget=32,recent_window=2", 4, key_dim=16, share=2)
        attn = np.full(65, 1.0 / 65, np.float32)
        rows = np.full((4, 65), 1.0 / 65, np.float32)
        gen = np.random.default_rng(1)
        key = gen.standard_normal(16).astype(np.float32)
        keys = gen.standard_normal((4, 16)).astype(np.float32)
        for pos in range(100):  # the steady state: size 64 before each step
            p.step(pos, attn[:p.size].copy())
            p.evict(64)
            b.step(pos, rows)
            b.evict(64)
            kp.step(pos, None, key)
            kp.evict(64)
            sb.step(pos, None, keys)
            sb.evict_shared(64)
        view = np.ascontiguousarray(attn[:64])
        refs = (sys.getrefcount(view), sys.getrefcount(rows), sys.getrefcount(key),
                sys.getrefcount(keys))
        state = (p.state_bytes, b.state_bytes, kp.state_bytes, sb.state_bytes)
        gc.collect()
        tracemalloc.start()
        start = tracemalloc.take_snapshot()
        for pos in range(100, 100 + self.N):
            p.step(pos, view)
            p.evict(64)
            p.positions
            b.step(pos, rows)
            b.evict(64)
            kp.step(pos, None, key)
            kp.evict(64)
            sb.step(pos, None, keys)
            sb.evict_shared(64)
        gc.collect()
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(start, "filename")
                    if s.size_diff > 0)
        tracemalloc.stop()
        self.assertEqual((sys.getrefcount(view), sys.getrefcount(rows), sys.getrefcount(key),
                          sys.getrefcount(keys)), refs)
        self.assertEqual((p.state_bytes, b.state_bytes, kp.state_bytes, sb.state_bytes), state)
        self.assertEqual(int(sb.sizes.sum()), 2 * 64)
        self.assertLess(grown, 64 * 1024, f"Python allocations grew by {grown} bytes")

    def test_objects_made_and_released(self):
        """10 000 policies, banks, traces over one array and evaluations
        (key-reading and shared ones, and q/K traces, included): resident
        memory stays flat (a leaked policy of budget 512 alone would be 6.7
        KB; 10 000 of them 67 MB), and the array's reference count is back
        where it started."""
        a = attention_rows(np.random.default_rng(5), 1, 40)[0]
        base = sys.getrefcount(a)
        for _ in range(200):  # warm-up: allocator pools, caches
            kvevict.Policy("h2o").close()
        gc.collect()
        before = rss_bytes()
        for i in range(self.N):
            kvevict.Policy("h2o:budget=512")  # released on collection
            with kvevict.Bank("h2o:budget=64", 4):
                pass
            kvevict.Policy("keydiff:budget=512", key_dim=16)  # 13 + 64 bytes a slot
            with kvevict.Bank("h2o:budget=64", 4, key_dim=8, share=2):
                pass
            with kvevict.Trace.from_array(a) as tr:
                if i % 50 == 0:
                    kvevict.evaluate(tr, ["h2o:budget=16,recent_window=4"], heads=1,
                                     per_head=True)
            with kvevict.Trace.open("canonical:steps=10"):
                pass
            if i % 10 == 0:
                with kvevict.Trace.open(QkFile.src) as tr:
                    tr.key(5, 1)
                    if i % 500 == 0:
                        kvevict.evaluate(tr, ["knorm:budget=40"], heads=2, per_head=True)
        gc.collect()
        grown = rss_bytes() - before
        self.assertEqual(sys.getrefcount(a), base)
        self.assertLess(grown, 8 << 20, f"resident memory grew by {grown} bytes")



# ---- score rules written in numpy, and the step's queries and values ----

def numpy_h2o(scores, attn, state, vnorm):
    """h2o as a user writes it: the state is the attention received so far."""
    del scores, vnorm
    state[:, 0] += attn
    return state[:, 0]


def numpy_vh2o(scores, attn, state, vnorm):
    """Value-aware h2o (CriticalKV, VATP): the same sum, times ||v||."""
    del scores
    state[:, 0] += attn
    return state[:, 0] * vnorm


class ScoreRuleTests(unittest.TestCase):
    """register_rule: a numpy rule gives what the built-in lane gives, victim
    for victim and position for position, in a Policy and a grouped Bank; an
    exception refuses the step and changes nothing; the registry's holds."""

    def setUp(self):
        kvevict.register_rule("py_h2o", numpy_h2o, state=1, summary="h2o in numpy")
        kvevict.register_rule("py_vh2o", numpy_vh2o, state=1, values=True)

    def tearDown(self):
        gc.collect()
        for name in ("py_h2o", "py_vh2o"):
            kvevict.unregister_rule(name)

    def twin_run(self, mine, builtin, steps=80, budget=12, value_dim=0):
        rng = np.random.default_rng(31)
        a = kvevict.Policy(mine, value_dim=value_dim)
        b = kvevict.Policy(builtin, value_dim=value_dim)
        for pos in range(steps):
            attn = None if pos % 9 == 4 else rng.random(a.size).astype(np.float32)
            value = rng.uniform(-1, 1, value_dim).astype(np.float32) if value_dim else None
            a.step(pos, attn, value=value)
            b.step(pos, attn, value=value)
            self.assertEqual(a.evict(budget).tolist(), b.evict(budget).tolist(), f"at {pos}")
            self.assertEqual(a.positions.tolist(), b.positions.tolist())
        a.close()
        b.close()

    def test_rule_is_the_builtin(self):
        self.twin_run("py_h2o:budget=12,recent_window=3", "h2o:budget=12,recent_window=3")
        self.twin_run("py_h2o:budget=12,recent_window=0", "h2o:budget=12,recent_window=0")
        self.twin_run("py_vh2o:budget=12,recent_window=2", "h2o:budget=12,recent_window=2,vnorm=1",
                      value_dim=4)
        self.twin_run("py_h2o:budget=12,recent_window=2,vnorm=1",
                      "h2o:budget=12,recent_window=2,vnorm=1", value_dim=3)

    def test_bank_with_groups(self):
        rng = np.random.default_rng(5)
        heads, group, budget = 3, 2, 10
        a = kvevict.Bank("py_h2o:budget=10,recent_window=2", heads)
        b = kvevict.Bank("h2o:budget=10,recent_window=2", heads)
        for pos in range(50):
            attn = rng.random((heads, group, budget + 1)).astype(np.float32)
            a.step(pos, attn, reduce="mean")
            b.step(pos, attn, reduce="mean")
            va, ca = a.evict(budget)
            vb, cb = b.evict(budget)
            self.assertEqual(va.tolist(), vb.tolist(), f"at {pos}")
            self.assertEqual(ca.tolist(), cb.tolist())
        a.close()
        b.close()

    def test_exception_refuses_and_changes_nothing(self):
        def fails(scores, attn, state, vnorm):
            raise RuntimeError("my rule is unhappy")

        def wrong_shape(scores, attn, state, vnorm):
            return np.zeros(len(attn) + 1)

        def not_finite(scores, attn, state, vnorm):
            return np.full(len(attn), np.nan)

        for name, fn, words in (("py_fails", fails, "my rule is unhappy"),
                                ("py_shape", wrong_shape, "shape"),
                                ("py_nan", not_finite, "not finite")):
            kvevict.register_rule(name, fn)
            p = kvevict.Policy(f"{name}:budget=8,recent_window=1")
            p.step(0, None)
            p.step(1, None)  # no attention: the rule is not called
            before = p.positions.tolist()
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                p.step(2, np.ones(2, dtype=np.float32))
            self.assertIn(words, e.exception.message)
            self.assertEqual(p.positions.tolist(), before)
            p.close()
            kvevict.unregister_rule(name)

    def test_calls_from_inside_a_rule(self):
        # before: stepping the policy from inside its own rule wrote past a
        # buffer (ASan) and the interpreter aborted with free(): invalid pointer
        seen = {}
        holder = {}

        def tries(calls):  # each call's refusal message, or "went through"
            for what, call in calls:
                try:
                    call()
                    seen[what] = "went through"
                except kvevict.InvalidArgumentError as e:
                    seen[what] = e.message

        def reenters(scores, attn, state, vnorm):
            p = holder["p"]
            tries((("step", lambda: p.step(100, np.ones(p.size, np.float32))),
                   ("evict", lambda: p.evict(1)),
                   ("save", p.save),
                   ("close", p.close)))
            return scores + attn

        kvevict.register_rule("py_reenter", reenters)
        p = kvevict.Policy("py_reenter:budget=4,recent_window=1")
        ref = kvevict.Policy("h2o:budget=4,recent_window=1")
        holder["p"] = p
        rng = np.random.default_rng(3)
        for pos in range(12):
            attn = rng.random(p.size).astype(np.float32) if p.size else None
            p.step(pos, attn)
            ref.step(pos, attn)
            self.assertEqual(p.evict(4).tolist(), ref.evict(4).tolist())
        self.assertEqual(sorted(seen), ["close", "evict", "save", "step"])
        for what, message in seen.items():
            self.assertIn("from inside", message, what)
        self.assertEqual(p.positions.tolist(), ref.positions.tolist())
        p.close()
        ref.close()
        # a Bank: the same, its prefill and clone besides
        seen.clear()
        holder.clear()

        def reenters_bank(scores, attn, state, vnorm):
            b = holder["b"]
            rows = np.full((2, 2), 0.5, np.float32)
            tries((("step", lambda: b.step(100, None)),
                   ("evict", lambda: b.evict(1)),
                   ("save", b.save),
                   ("clone", b.clone),
                   ("prefill", lambda: b.prefill(2, 2, rows, first=0, count=1)),
                   ("close", b.close)))
            return scores + attn

        kvevict.register_rule("py_reenter_bank", reenters_bank)
        b = kvevict.Bank("py_reenter_bank:budget=4,recent_window=1", 2)
        bref = kvevict.Bank("h2o:budget=4,recent_window=1", 2)
        holder["b"] = b
        for pos in range(12):
            n = b.size(0)
            attn = rng.random((2, n)).astype(np.float32) if n else None
            b.step(pos, attn)
            bref.step(pos, attn)
            va, ca = b.evict(4)
            vb, cb = bref.evict(4)
            self.assertEqual(va.tolist(), vb.tolist(), f"at {pos}")
            self.assertEqual(ca.tolist(), cb.tolist())
        self.assertEqual(sorted(seen), ["clone", "close", "evict", "prefill", "save", "step"])
        for what, message in seen.items():
            self.assertIn("from inside", message, what)
        for h in range(2):
            self.assertEqual(b.positions(h).tolist(), bref.positions(h).tolist())
        b.close()
        bref.close()
        kvevict.unregister_rule("py_reenter")
        kvevict.unregister_rule("py_reenter_bank")

    def test_state_not_finite_refused(self):
        # before: every step went through, save() too, and load() refused the
        # image ("state[1][0] of rule py_nanst is NaN"): what is saved must load
        bad = {"value": None}

        def writes_state(scores, attn, state, vnorm):
            state[:, 0] += attn
            if bad["value"] is not None and len(attn) > 1:
                state[1, 0] = bad["value"]
            return scores + attn

        kvevict.register_rule("py_nanst", writes_state, state=1)
        p = kvevict.Policy("py_nanst:budget=8,recent_window=1")
        for pos in range(4):
            p.step(pos, np.full(p.size, 0.25, np.float32) if p.size else None)
        for value, words in ((np.nan, "is nan, not finite"), (np.inf, "is inf, not finite")):
            image = p.save()
            bad["value"] = value
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                p.step(4, np.full(p.size, 0.25, np.float32))
            self.assertIn("py_nanst: the rule's new state[1][0] (slot 1, position 1)",
                          e.exception.message)
            self.assertIn(words, e.exception.message)
            self.assertEqual(p.save(), image)  # unchanged
            bad["value"] = None
        p.step(4, np.full(p.size, 0.25, np.float32))
        q = kvevict.Policy.load(p.save())  # what it saves loads
        self.assertEqual(q.save(), p.save())
        q.close()
        p.close()
        kvevict.unregister_rule("py_nanst")

    def test_kept_arrays_are_the_rules_own(self):
        # before: the arrays were views of the library's buffers, writable
        # (state) after the call and after close()
        kept = []

        def keeps(scores, attn, state, vnorm):
            kept.append((scores, attn, state))
            state[:, 0] += attn
            return scores + attn

        kvevict.register_rule("py_keeps", keeps, state=1)
        p = kvevict.Policy("py_keeps:budget=6,recent_window=1")
        ref = kvevict.Policy("h2o:budget=6,recent_window=1")
        rng = np.random.default_rng(4)
        for pos in range(10):
            attn = rng.random(p.size).astype(np.float32) if p.size else None
            p.step(pos, attn)
            ref.step(pos, attn)
            self.assertEqual(p.evict(6).tolist(), ref.evict(6).tolist())
        p.close()
        for scores, attn, state in kept:  # no library memory behind them
            self.assertTrue(scores.flags.owndata and attn.flags.owndata)
            state[:] = 7.0
            self.assertFalse(scores.flags.writeable)
        ref.close()
        kvevict.unregister_rule("py_keeps")

    def test_interrupt_in_a_rule_propagates(self):
        # before: KeyboardInterrupt and SystemExit became InvalidArgumentError
        for exc in (KeyboardInterrupt, SystemExit):
            def interrupts(scores, attn, state, vnorm, exc=exc):
                raise exc("stop")

            kvevict.register_rule("py_interrupt", interrupts)
            p = kvevict.Policy("py_interrupt:budget=4,recent_window=1")
            p.step(0, None)
            with self.assertRaises(exc):
                p.step(1, np.ones(1, np.float32))
            self.assertEqual(p.positions.tolist(), [0])
            p.step(1, None)  # usable after
            self.assertEqual(p.positions.tolist(), [0, 1])
            p.close()
            kvevict.unregister_rule("py_interrupt")

    def test_registry(self):
        p = kvevict.Policy("py_h2o:budget=8,recent_window=1")
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            kvevict.unregister_rule("py_h2o")
        self.assertIn("held by 1 object", e.exception.message)
        p.close()
        for name in ("h2o", "py_h2o", "Bad-Name", ""):
            with self.assertRaises(kvevict.InvalidArgumentError):
                kvevict.register_rule(name, numpy_h2o)
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.register_rule("py_x", 3)
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.unregister_rule("py_never")
        with self.assertRaises(kvevict.InvalidArgumentError):
            kvevict.Policy("py_vh2o:budget=8,recent_window=1")  # values=True needs a value_dim


class StepDataTests(unittest.TestCase):
    """Policy.step's queries, values and rescore flag against the numpy
    reference of tests/methods_ref.py (expected_attention), victim for
    victim and position for position."""

    def test_expected_attention_matches_reference(self):
        sys.path.insert(0, str(SOURCE / "tests"))
        import methods_ref  # noqa: E402  (the reference, numpy only)
        d, V, G, r, budget = 8, 5, 2, 8, 10
        spec = ("expected_attention:budget=10,n_sink=2,interval=3,n_queries=9,"
                "n_future_positions=6,epsilon=0.01")
        ref = methods_ref.ExpectedAttention(budget, 0, d, G, r, 10000.0, "half", 6, 2, 1, 1,
                                            0.01, 3, 9)
        p = kvevict.Policy(spec, key_dim=d, value_dim=V, query_group=G,
                           rope={"rotary_dim": r, "base": 10000.0, "pairs": "half"})
        rng = np.random.default_rng(11)
        drift = rng.uniform(-1, 1, d)
        for t in range(40):
            key = rng.uniform(-1, 1, d).astype(np.float32)
            q = (rng.uniform(-1, 1, (G, d)) * 0.5 + drift).astype(np.float32)
            value = rng.uniform(-1, 1, V).astype(np.float32)
            rescore = t % 7 == 6
            p.step(t, key=key, query=q, value=value, rescore=rescore)
            ref.step(t, key, q, value, 1 if rescore else 0)
            self.assertEqual(p.evict(budget).tolist(), ref.evict(budget), f"at {t}")
            self.assertEqual(p.positions.tolist(), list(ref.pos))
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            p.step(40, key=key, value=value)
        self.assertIn("queries", e.exception.message)
        p.close()

    def test_rope_scaling_reaches_the_library(self):
        """rope's scaling keys: "none" is the unscaled rotation bit for bit;
        linear scaling changes expected attention's victims; the library's
        own checks of the fields (llama3 without original_max_position, a
        factor below 1) come back as InvalidArgumentError naming the field;
        a bad name or type is refused here."""
        d, V, G, r = 8, 5, 2, 8
        spec = "expected_attention:budget=10,n_sink=2,interval=3,n_queries=9,n_future_positions=64"

        def run(rope):
            p = kvevict.Policy(spec, key_dim=d, value_dim=V, query_group=G, rope=rope)
            rng = np.random.default_rng(5)
            drift = rng.uniform(-1, 1, d)
            victims = []
            for t in range(60):
                p.step(t, key=rng.uniform(-1, 1, d).astype(np.float32),
                       query=(rng.uniform(-1, 1, (G, d)) * 0.5 + drift).astype(np.float32),
                       value=rng.uniform(-1, 1, V).astype(np.float32))
                victims += p.evict(10).tolist()
            p.close()
            return victims

        base = {"rotary_dim": r, "base": 10000.0, "pairs": "half"}
        plain = run(base)
        self.assertEqual(run({**base, "scaling": "none"}), plain)
        self.assertNotEqual(run({**base, "scaling": "linear", "factor": 8.0}), plain)
        for bad, word in (({**base, "scaling": "llama3", "factor": 8.0}, "original_max_position"),
                          ({**base, "scaling": "linear", "factor": 0.5}, "factor")):
            with self.assertRaises(kvevict.InvalidArgumentError) as e:
                kvevict.Policy(spec, key_dim=d, value_dim=V, query_group=G, rope=bad)
            self.assertIn(word, e.exception.message)
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            kvevict.Policy(spec, key_dim=d, value_dim=V, query_group=G,
                           rope={**base, "scaling": "ntk"})
        self.assertIn("scaling", e.exception.message)
        with self.assertRaises(kvevict.InvalidArgumentError) as e:
            kvevict.Policy(spec, key_dim=d, value_dim=V, query_group=G,
                           rope={**base, "scaling": "yarn", "beta_fast": "fast"})
        self.assertIn("beta_fast", e.exception.message)


if __name__ == "__main__":
    result = unittest.main(verbosity=2, exit=False).result
    print(f"test_python: {result.testsRun} tests, {len(result.failures)} failures, "
          f"{len(result.errors)} errors")
    sys.exit(0 if result.wasSuccessful() else 1)
