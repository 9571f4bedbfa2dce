# SPDX-License-Identifier: MIT
"""Finding and loading libkvevict, and the C declarations the binding uses.

The binding loads libkvevict_eval, the harness library (kvevict_eval.h),
which loads the engine core libkvevict (kvevict.h) beside it: every
function of both is found through the one handle. Where it is looked for,
in order (the first that loads wins, except that KVEVICT_LIBRARY, when set,
is the only place tried), so that `import kvevict` finds an installed
library by itself:
  1. the KVEVICT_LIBRARY environment variable: the path of
     libkvevict_eval.so;
  2. a freshly built source tree: when this package is imported from
     python/ of a kvevict checkout, that checkout's build/ (what `make`
     builds);
  3. beside the package: the package's own directory, then lib/ (and
     lib64/) of each of the four directories above it, which holds the
     library when the package sits inside the prefix it was installed with
     (PREFIX/share/kvevict/python/kvevict, where `cmake --install` puts it,
     or PREFIX/lib/python3.X/site-packages/kvevict);
  4. the prefix recorded at install time: `cmake --install` writes
     kvevict/_install.py beside the copy of this package it installs, with
     the library's directory relative to the package (so a moved prefix
     still works) and as an absolute path (which a `pip install` of that
     copy carries wherever it puts the package);
  5. an installed prefix that pkg-config knows: `pkg-config
     --variable=libdir kvevict-eval`;
  6. the dynamic linker's cache (ctypes.util.find_library, i.e. ldconfig).

Every C function the binding calls is declared once, in _FUNCTIONS: name,
result type, argument types. Binding a function the library gains later is
one line there (marked optional if older libraries lack it) and a method
that calls it.

The GIL: every call goes through a ctypes.CDLL, which releases the GIL for
the duration of each foreign call and takes it back on return (a PyDLL
would hold it). So long calls (opening and validating a trace, evaluate)
let other Python threads run; tests/test_python.py checks it with a call
that blocks inside the library until another thread acts.
"""
import ctypes
import ctypes.util
import os
import pathlib
import subprocess
import sys

_SONAME = "libkvevict_eval.dylib" if sys.platform == "darwin" else "libkvevict_eval.so"

# ---- C types of the public headers (include/kvevict.h, kvevict_eval.h) -----

c_size_t = ctypes.c_size_t
c_int32 = ctypes.c_int32
c_uint64 = ctypes.c_uint64
c_status = ctypes.c_int  # kve_status, an enum
c_ptr = ctypes.c_void_p  # opaque handles and array data
c_str = ctypes.c_char_p

KVE_SPEC_MAX = 256  # the size of kve_eval_result.spec (kvevict.h)
KVE_MAX_BUDGET = 16777216
KVE_TRACE_NONE, KVE_TRACE_NORMALIZE = 0, 1  # kve_trace_flags
KVE_EVAL_AFTER_BUDGET = ctypes.c_size_t(-1).value  # kve_eval_options.score_after: SIZE_MAX
KVE_MAX_KEY_DIM = 65536
KVE_POS_END = 2 ** 31 - 1  # as p1 of a remove: through the end (kvevict.h)
KVE_READS_ATTN, KVE_READS_KEYS = 1, 2  # kve_policy_reads bits
KVE_READS_QUERIES, KVE_READS_VALUES = 4, 8
REDUCE = {"mean": 0, "sum": 1, "max": 2}  # kve_reduce
ROPE_PAIRS = {"adjacent": 0, "half": 1}  # kve_rope_pairs
ROPE_SCALINGS = {"none": 0, "linear": 1, "llama3": 2, "yarn": 3}  # kve_rope_scaling
ROPE_SCALING = {"none": 0, "linear": 1, "llama3": 2, "yarn": 3}  # kve_rope_scaling
KVE_ROPE_UNSET = ctypes.c_size_t(-1).value
KVE_STEP_RESCORE = 1
KVE_MAX_QUERY_GROUP = 4096
KVE_MAX_RULE_STATE = 16


class RngState(ctypes.Structure):
    """kve_rng: the generator's four words, on the caller's side."""
    _fields_ = [("s", c_uint64 * 4)]


class EvalJob(ctypes.Structure):
    """kve_eval_job."""
    _fields_ = [("spec", c_str), ("budget", c_size_t)]


class EvalResult(ctypes.Structure):
    """kve_eval_result."""
    _fields_ = [
        ("spec", ctypes.c_char * KVE_SPEC_MAX),
        ("budget", c_size_t),
        ("steps", c_size_t),
        ("scored_steps", c_size_t),
        ("retained_mass", ctypes.c_double),
        ("top32_recall", ctypes.c_double),
        ("min_retained_mass", ctypes.c_double),
        ("ns_per_step", ctypes.c_double),
        ("state_bytes", c_size_t),
        ("topk", c_size_t),
        ("topk_recall", ctypes.c_double),
        ("mean_kept", ctypes.c_double),
    ]


class Rope(ctypes.Structure):
    """kve_rope: the model's rotary embedding."""
    _fields_ = [("rotary_dim", c_size_t), ("base", ctypes.c_double), ("pairs", ctypes.c_int),
                ("scaling", ctypes.c_int), ("factor", ctypes.c_double),
                ("low_freq_factor", ctypes.c_double), ("high_freq_factor", ctypes.c_double),
                ("original_max_position", c_size_t), ("beta_fast", ctypes.c_double),
                ("beta_slow", ctypes.c_double), ("attention_factor", ctypes.c_double),
                ("freq_factors", c_ptr)]


class PolicyOptions(ctypes.Structure):
    """kve_policy_options (the binding leaves the allocator NULL: the C library's)."""
    _fields_ = [("allocator", c_ptr), ("key_dim", c_size_t), ("value_dim", c_size_t),
                ("query_group", c_size_t), ("rope", Rope), ("unchecked", ctypes.c_int)]


class BankOptions(ctypes.Structure):
    """kve_bank_options."""
    _fields_ = [("allocator", c_ptr), ("key_dim", c_size_t), ("share", c_size_t),
                ("min_share", ctypes.c_double), ("value_dim", c_size_t),
                ("query_group", c_size_t), ("rope", Rope), ("unchecked", ctypes.c_int),
                ("same_positions", ctypes.c_int)]


class StepData(ctypes.Structure):
    """kve_step_data."""
    _fields_ = [("attn", c_ptr), ("ld", c_size_t), ("group", c_size_t), ("reduce", ctypes.c_int),
                ("keys", c_ptr), ("ld_keys", c_size_t), ("queries", c_ptr),
                ("ld_queries", c_size_t), ("values", c_ptr), ("ld_values", c_size_t),
                ("flags", ctypes.c_uint)]


class ScoreStep(ctypes.Structure):
    """kve_score_step: one step of a score rule for one head."""
    _fields_ = [("n", c_size_t), ("pos", c_ptr), ("attn", c_ptr), ("score", c_ptr),
                ("state", c_ptr), ("n_state", c_size_t), ("vnorm", c_ptr), ("step", c_uint64),
                ("new_score", c_ptr), ("new_state", c_ptr)]


SCORE_FN = ctypes.CFUNCTYPE(c_status, c_ptr, ctypes.POINTER(ScoreStep))  # kve_score_fn


class ScoreRule(ctypes.Structure):
    """kve_score_rule."""
    _fields_ = [("name", c_str), ("summary", c_str), ("observe", SCORE_FN), ("user", c_ptr),
                ("state", c_size_t), ("recent_window", c_size_t), ("values", ctypes.c_int)]


class TraceOptions(ctypes.Structure):
    """kve_trace_options (no progress callback from the binding)."""
    _fields_ = [("allocator", c_ptr), ("flags", ctypes.c_int), ("progress", c_ptr),
                ("user", c_ptr)]


# kve_trace_callbacks: rows(user, t, rows, ld), keys(user, t, keys, ld), free(user)
TRACE_ROWS_FN = ctypes.CFUNCTYPE(c_status, c_ptr, c_size_t, ctypes.POINTER(ctypes.c_float),
                                 c_size_t)
TRACE_FREE_FN = ctypes.CFUNCTYPE(None, c_ptr)


class TraceCallbacks(ctypes.Structure):
    """kve_trace_callbacks."""
    _fields_ = [("rows", TRACE_ROWS_FN), ("keys", TRACE_ROWS_FN), ("free", TRACE_FREE_FN)]


class ScheduleOptions(ctypes.Structure):
    """kve_schedule_options."""
    _fields_ = [("kind", ctypes.c_int), ("floor", c_size_t), ("beta", ctypes.c_double),
                ("weights", ctypes.POINTER(ctypes.c_double))]


class PrefillOptions(ctypes.Structure):
    """kve_prefill_options (the binding leaves the allocator NULL)."""
    _fields_ = [("method", ctypes.c_int), ("window", c_size_t), ("kernel", c_size_t),
                ("pool", ctypes.c_int), ("allocator", c_ptr), ("queries", c_size_t),
                ("sinks", c_size_t), ("values", c_ptr), ("ld_values", c_size_t),
                ("budgets", ctypes.c_int), ("layer_heads", c_size_t), ("prefix", c_size_t),
                ("row_scale", c_ptr), ("key_scale", c_ptr), ("compression_ratio", ctypes.c_double)]


SCHEDULE = {"uniform": 0, "pyramid": 1, "weighted": 2}  # kve_schedule_kind
PREFILL = {"h2o": 0, "snapkv": 1, "kvzip": 2}  # kve_prefill_method
POOL = {"max": 0, "avg": 1}  # kve_pool


class EvalOptions(ctypes.Structure):
    """kve_eval_options (the callback is never set by the binding)."""
    _fields_ = [
        ("allocator", c_ptr),
        ("seed", c_uint64),
        ("topk", c_size_t),
        ("on_step", c_ptr),
        ("user", c_ptr),
        ("share", c_size_t),
        ("min_share", ctypes.c_double),
        ("score_after", c_size_t),
    ]


P = ctypes.POINTER

# name, result type, argument types[, optional]
_FUNCTIONS = (
    ("kve_version", c_str, ()),
    ("kve_version_number", ctypes.c_uint, ()),
    ("kve_status_name", c_str, (c_status,)),
    ("kve_last_error", c_str, ()),
    # variadic in C; the binding passes "%s" and one string, whose call is the
    # same as a fixed (int, char *, char *) one on the supported ABIs
    ("kve_set_error", c_status, (c_status, c_str, c_str)),
    ("kve_isa_name", c_str, ()),
    ("kve_rng_seed", None, (P(RngState), c_uint64)),
    ("kve_rng_next", c_uint64, (P(RngState),)),
    ("kve_rng_uniform", ctypes.c_double, (P(RngState),)),
    ("kve_rng_below", c_uint64, (P(RngState), c_uint64)),
    ("kve_policy_type_count", c_size_t, ()),
    ("kve_policy_type_name", c_str, (c_size_t,)),
    ("kve_policy_type_summary", c_str, (c_size_t,)),
    ("kve_spec_with", c_status, (c_str, c_str, c_str, ctypes.c_char_p, c_size_t)),
    ("kve_policy_new", c_status, (c_str, P(RngState), P(c_ptr))),
    ("kve_policy_default_options", PolicyOptions, ()),
    ("kve_policy_new_ex", c_status, (c_str, P(RngState), P(PolicyOptions), P(c_ptr))),
    ("kve_policy_step_keys", c_status, (c_ptr, c_int32, c_ptr, c_size_t, c_ptr)),
    ("kve_step_default_data", StepData, ()),
    ("kve_policy_step_data", c_status, (c_ptr, c_int32, P(StepData))),
    ("kve_bank_step_data", c_status, (c_ptr, c_size_t, c_size_t, c_int32, P(StepData))),
    ("kve_score_rule_default", ScoreRule, ()),
    ("kve_score_rule_register", c_status, (P(ScoreRule),)),
    ("kve_score_rule_unregister", c_status, (c_str,)),
    ("kve_set_error", c_status, (c_status, c_str, c_str)),
    ("kve_policy_reads", ctypes.c_uint, (c_ptr,)),
    ("kve_policy_key_dim", c_size_t, (c_ptr,)),
    ("kve_policy_type_reads", ctypes.c_uint, (c_size_t,)),
    ("kve_spec_min_budget", c_status, (c_str, P(c_size_t))),
    ("kve_policy_free", None, (c_ptr,)),
    ("kve_policy_step", c_status, (c_ptr, c_int32, c_ptr, c_size_t)),
    ("kve_policy_evict", c_status, (c_ptr, c_size_t, c_ptr, c_size_t, P(c_size_t))),
    ("kve_policy_size", c_size_t, (c_ptr,)),
    ("kve_policy_positions", c_ptr, (c_ptr,)),
    ("kve_policy_state_bytes", c_size_t, (c_ptr,)),
    ("kve_policy_spec", c_str, (c_ptr,)),
    ("kve_policy_name", c_str, (c_ptr,)),
    ("kve_policy_budget", c_size_t, (c_ptr,)),
    ("kve_bank_new", c_status, (c_str, c_size_t, P(RngState), P(c_ptr))),
    ("kve_bank_default_options", BankOptions, ()),
    ("kve_bank_new_ex", c_status, (c_str, c_size_t, P(RngState), P(BankOptions), P(c_ptr))),
    ("kve_bank_share", c_size_t, (c_ptr,)),
    ("kve_bank_same_positions", ctypes.c_int, (c_ptr,)),
    ("kve_bank_reads", ctypes.c_uint, (c_ptr,)),
    ("kve_bank_key_dim", c_size_t, (c_ptr,)),
    ("kve_bank_step_range", c_status,
     (c_ptr, c_size_t, c_size_t, c_int32, c_ptr, c_size_t, c_size_t, ctypes.c_int, c_ptr,
      c_size_t)),
    ("kve_bank_evict_shared", c_status,
     (c_ptr, c_size_t, c_size_t, c_size_t, c_ptr, c_size_t, c_ptr)),
    ("kve_bank_free", None, (c_ptr,)),
    ("kve_bank_heads", c_size_t, (c_ptr,)),
    ("kve_bank_size", c_size_t, (c_ptr, c_size_t)),
    ("kve_bank_sizes", c_status, (c_ptr, c_size_t, c_size_t, c_ptr, P(c_size_t))),
    ("kve_bank_positions", c_ptr, (c_ptr, c_size_t)),
    ("kve_bank_state_bytes", c_size_t, (c_ptr,)),
    ("kve_bank_spec", c_str, (c_ptr,)),
    ("kve_bank_budget", c_size_t, (c_ptr,)),
    ("kve_bank_step", c_status, (c_ptr, c_int32, c_ptr, c_size_t)),
    ("kve_bank_evict", c_status, (c_ptr, c_size_t, c_ptr, c_size_t, c_ptr)),
    ("kve_bank_evict_range", c_status,
     (c_ptr, c_size_t, c_size_t, c_size_t, c_ptr, c_size_t, c_ptr)),
    ("kve_policy_clone", c_status, (c_ptr, P(c_ptr))),
    ("kve_policy_copy", c_status, (c_ptr, c_ptr)),
    ("kve_policy_remove", c_status, (c_ptr, c_int32, c_int32, P(c_size_t))),
    ("kve_policy_reset", None, (c_ptr,)),
    ("kve_policy_save", c_status, (c_ptr, c_ptr, c_size_t, P(c_size_t))),
    ("kve_policy_load", c_status, (c_ptr, c_size_t, c_ptr, P(c_ptr))),
    ("kve_bank_min_share", ctypes.c_double, (c_ptr,)),
    ("kve_bank_clone", c_status, (c_ptr, P(c_ptr))),
    ("kve_bank_copy", c_status, (c_ptr, c_ptr)),
    ("kve_bank_remove", c_status, (c_ptr, c_int32, c_int32)),
    ("kve_bank_reset", None, (c_ptr,)),
    ("kve_bank_save", c_status, (c_ptr, c_ptr, c_size_t, P(c_size_t))),
    ("kve_bank_load", c_status, (c_ptr, c_size_t, c_ptr, P(c_ptr))),
    ("kve_schedule_default_options", ScheduleOptions, ()),
    ("kve_layer_budgets", c_status, (c_size_t, c_size_t, P(ScheduleOptions), c_ptr)),
    ("kve_prefill_default_options", PrefillOptions, ()),
    ("kve_prefill_rows", c_size_t, (c_size_t, P(PrefillOptions))),
    ("kve_prefill_scores", c_status,
     (c_size_t, c_ptr, c_size_t, c_size_t, ctypes.c_int, P(PrefillOptions), c_ptr)),
    ("kve_bank_prefill", c_status,
     (c_ptr, c_size_t, c_size_t, c_size_t, c_size_t, c_ptr, c_size_t, c_size_t, ctypes.c_int,
      P(PrefillOptions))),
    ("kve_attn_row", c_status,
     (c_ptr, c_size_t, c_ptr, c_size_t, c_size_t, ctypes.c_float, c_ptr)),
    ("kve_trace_default_options", TraceOptions, ()),
    ("kve_trace_open", c_status, (c_str, P(TraceOptions), P(c_ptr))),
    ("kve_trace_from_memory", c_status,
     (c_ptr, c_size_t, c_size_t, c_size_t, P(TraceOptions), P(c_ptr))),
    ("kve_trace_from_callback", c_status,
     (P(TraceCallbacks), c_ptr, c_size_t, c_size_t, c_size_t, c_size_t, P(TraceOptions),
      P(c_ptr))),
    ("kve_trace_free", None, (c_ptr,)),
    ("kve_trace_steps", c_size_t, (c_ptr,)),
    ("kve_trace_heads", c_size_t, (c_ptr,)),
    ("kve_trace_layers", c_size_t, (c_ptr,)),
    ("kve_trace_source", c_str, (c_ptr,)),
    ("kve_trace_row", c_status, (c_ptr, c_size_t, c_size_t, c_ptr, c_size_t)),
    ("kve_trace_key_dim", c_size_t, (c_ptr,)),
    ("kve_trace_key", c_status, (c_ptr, c_size_t, c_size_t, c_ptr, c_size_t)),
    ("kve_trace_write_npy", c_status, (c_ptr, c_size_t, c_str)),
    ("kve_trace_npy_bytes", c_uint64, (c_ptr,)),
    ("kve_eval_default_options", EvalOptions, ()),
    ("kve_eval", c_status,
     (c_ptr, c_size_t, c_size_t, P(EvalJob), c_size_t, P(EvalOptions), P(EvalResult),
      P(EvalResult))),
)


def _source_tree_build():
    """The build/ of the kvevict checkout this package sits in, if it does."""
    root = pathlib.Path(__file__).resolve().parent.parent.parent
    if (root / "include" / "kvevict.h").is_file() and (root / "python" / "kvevict").is_dir():
        return root / "build" / _SONAME
    return None


def _pkg_config_libdir():
    try:
        done = subprocess.run(["pkg-config", "--variable=libdir", "kvevict-eval"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    libdir = done.stdout.strip()
    return pathlib.Path(libdir) / _SONAME if done.returncode == 0 and libdir else None


def _beside_package():
    """The library in the package's directory or a lib/ above it."""
    here = pathlib.Path(__file__).resolve().parent
    found = [here / _SONAME]
    for up in list(here.parents)[:4]:
        found += [up / "lib" / _SONAME, up / "lib64" / _SONAME]
    return [p for p in found if p.is_file()]


def _recorded():
    """The library directory `cmake --install` recorded in _install.py."""
    try:
        from . import _install
    except ImportError:
        return []
    here = pathlib.Path(__file__).resolve().parent
    found = []
    rel = getattr(_install, "LIBDIR_FROM_PACKAGE", None)
    if rel:
        found.append(here / rel / _SONAME)
    absolute = getattr(_install, "LIBDIR", None)
    if absolute:
        found.append(pathlib.Path(absolute) / _SONAME)
    return [p for p in found if p.is_file()]


def _candidates():
    """(where, path or name) in the order they are tried."""
    env = os.environ.get("KVEVICT_LIBRARY")
    if env:
        return [("KVEVICT_LIBRARY", env)]
    found = []
    tree = _source_tree_build()
    if tree is not None:
        found.append(("the source tree's build", str(tree)))
    found += [("beside the package", str(p)) for p in _beside_package()]
    found += [("the prefix recorded at install (kvevict/_install.py)", str(p))
              for p in _recorded()]
    libdir = _pkg_config_libdir()
    if libdir is not None:
        found.append(("pkg-config", str(libdir)))
    name = ctypes.util.find_library("kvevict_eval")
    if name:
        found.append(("the dynamic linker (ldconfig)", name))
    return found


def _declare(lib, path):
    for entry in _FUNCTIONS:
        name, restype, argtypes = entry[:3]
        optional = len(entry) > 3 and entry[3]
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if optional:
                continue
            raise ImportError(f"kvevict: {path} has no {name}: it is an older or different "
                              f"library than this binding (install a matching libkvevict_eval, "
                              f"the harness library, which loads libkvevict)") from None
        fn.restype = restype
        fn.argtypes = argtypes


def load():
    """Loads the library; returns (ctypes.CDLL, path). ImportError names every
    place tried when none loads."""
    tried = []
    for where, path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            if where == "KVEVICT_LIBRARY":
                raise ImportError(f"kvevict: KVEVICT_LIBRARY={path}: {e}") from None
            tried.append(f"{where}: {path} ({e})")
            continue
        _declare(lib, path)
        return lib, path
    raise ImportError(
        "kvevict: cannot find libkvevict (libkvevict_eval, the harness library, and the "
        "core beside it). Build it (make) or install it "
        "(cmake --install build --prefix PREFIX, then pip install "
        "PREFIX/share/kvevict/python, which records PREFIX), or set KVEVICT_LIBRARY=/path/to/"
        f"{_SONAME}, or PKG_CONFIG_PATH=PREFIX/lib/pkgconfig. Tried: "
        + ("; ".join(tried) if tried else "KVEVICT_LIBRARY (unset), beside the package, the "
           "prefix recorded at install, pkg-config and ldconfig (kvevict not found)"))


lib, path = load()
