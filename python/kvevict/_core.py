# SPDX-License-Identifier: MIT
"""Status checks, argument and array validation, the generator, policies,
banks, score rules and attention rows.

Every array is validated here before the library sees it: a numpy ndarray,
dtype exactly float32 (native byte order; no silent conversion, which would
copy and hide a caller's mistake), aligned, C-contiguous, of the shape and
length the call needs. Integers are checked against the C type they become,
since ctypes would silently wrap a negative count into a huge size_t.
Handles are released by close() (or a with block), and otherwise when the
object is collected.
"""
import ctypes
import operator
import re
import threading

import numpy as np

from . import _errors
from ._lib import (KVE_MAX_RULE_STATE, KVE_POS_END, KVE_READS_ATTN, KVE_READS_KEYS,
                   KVE_READS_QUERIES, KVE_READS_VALUES, KVE_ROPE_UNSET, KVE_SPEC_MAX,
                   KVE_STEP_RESCORE, POOL, PREFILL, REDUCE, ROPE_PAIRS, ROPE_SCALINGS, SCHEDULE,
                   SCORE_FN, RngState, ScoreStep, c_size_t, lib)

SIZE_MAX = 2 ** (8 * ctypes.sizeof(c_size_t)) - 1
INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1


def _text(b):
    return b.decode("utf-8", "replace") if b is not None else None


# The library's words for a C caller, and the binding's for a Python one:
# what a message says about a C argument, function or flag becomes the
# Python argument, class or keyword that the caller actually wrote.
_PYTHON_WORDS = (
    (re.compile(r"needs an Rng, but rng is NULL"),
     "needs random numbers, but rng is None (pass rng=SEED or a kvevict.Rng)"),
    (re.compile(r"\(build it with kve_policy_new_ex or kve_bank_new_ex\)"),
     "(pass key_dim=d to kvevict.Policy or kvevict.Bank)"),
    (re.compile(r"\(build it with kve_bank_new_ex and a share\)"),
     "(build it with kvevict.Bank(spec, n_heads, share=N))"),
    (re.compile(r"pass KVE_TRACE_NORMALIZE"), "pass normalize=True"),
    (re.compile(r"made by kve_trace_from_memory"), "made by kvevict.Trace.from_array"),
    (re.compile(r"made by kve_trace_from_callback"), "made by kvevict.Trace.from_callback"),
    (re.compile(r"KVE_MAX_KEY_DIM"), "the largest key_dim"),
    (re.compile(r"KVE_MAX_BUDGET"), "the largest budget"),
)

# ... and those of a bank's calls: attn's rows, not a C stride.
_BANK_WORDS = (
    (re.compile(r"\bld (\d+) is smaller than the (\d+) kept positions"),
     r"attn: rows of \1 weights, but the head keeps \2 positions"),
    (re.compile(r"\bld (\d+) is smaller than n (\d+)"),
     r"rows: rows of \1 weights, fewer than the prompt's n = \2"),
)


def python_words(message, words=()):
    """`message` with the C names of _PYTHON_WORDS (and `words`) replaced."""
    for pattern, repl in words + _PYTHON_WORDS:
        message = pattern.sub(repl, message)
    return message


_pending = threading.local()  # .error: a rule's KeyboardInterrupt or SystemExit, to raise


def check(status, words=()):
    """Raises the exception of a non-zero kve_status, with the library's
    message in the binding's words (python_words); a KeyboardInterrupt or
    SystemExit a score rule raised during the call is raised as it was."""
    if status != 0:
        raised = getattr(_pending, "error", None)
        if raised is not None:
            _pending.error = None
            raise raised
        message = python_words(_text(lib.kve_last_error()), words)
        cls = _errors.BY_CODE.get(status)
        if cls is None:
            raise _errors.KvevictError(message, _text(lib.kve_status_name(status)), status)
        raise cls(message)


def refuse(message):
    """An argument refused by the binding before any call."""
    raise _errors.InvalidArgumentError(message)


def as_size(name, value, low=0, high=SIZE_MAX):
    """An int for a size_t (or a narrower range)."""
    try:
        v = operator.index(value)
    except TypeError:
        refuse(f"{name}: an integer is required, got {type(value).__name__}")
    if v < low or v > high:
        refuse(f"{name}: {v} is out of range [{low}, {high}]")
    return v


def as_pos(value):
    """A position: any int32 (the library refuses negatives with its own words)."""
    return as_size("pos", value, INT32_MIN, INT32_MAX)


def as_spec(spec, name="spec"):
    """A str for a C string."""
    if not isinstance(spec, str):
        refuse(f"{name}: a str is required, got {type(spec).__name__}")
    if "\0" in spec:
        refuse(f"{name}: contains a NUL character")
    return spec.encode("utf-8")


def f32_array(name, a, ndims):
    """Checks that `a` is a float32 ndarray, aligned and C-contiguous, with
    one of the dimension counts `ndims`; returns it."""
    if not isinstance(a, np.ndarray):
        refuse(f"{name}: a numpy.ndarray of float32 is required, got {type(a).__name__} "
               f"(use numpy.asarray(x, dtype=numpy.float32))")
    if a.dtype != np.float32:
        refuse(f"{name}: dtype {a.dtype.str}, want float32 in native byte order (convert with "
               f"numpy.ascontiguousarray(x, dtype=numpy.float32))")
    if a.ndim not in ndims:
        want = " or ".join(str(n) for n in ndims)
        refuse(f"{name}: {a.ndim} dimensions (shape {a.shape}), want {want}")
    if not a.flags.c_contiguous:
        refuse(f"{name}: not C-contiguous (strides {a.strides}); pass "
               f"numpy.ascontiguousarray({name})")
    if not a.flags.aligned:
        refuse(f"{name}: its data is not aligned for float32; pass a copy ({name}.copy())")
    return a


def key_arg(name, keys, key_dim, lead):
    """None, or `keys` checked as a float32 array of shape lead + (key_dim,)
    (one key, or one per head). With key_dim 0 only the dimension count is
    checked: the library refuses a key for an object built without keys,
    in its own words."""
    if keys is None:
        return None
    k = f32_array(name, keys, (len(lead) + 1,))
    if k.shape[:-1] != lead or (key_dim and k.shape[-1] != key_dim):
        dims = [str(n) for n in lead] + [str(key_dim) if key_dim else "d"]
        want = f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"
        refuse(f"{name}: shape {k.shape}, want {want} (key_dim {key_dim})")
    return k


def reads_name(bits):
    """kve_policy_reads as the command line's `policies` prints it: "nothing",
    "attention", "keys", or the '+'-joined list ("keys+queries+values")."""
    names = [n for bit, n in ((KVE_READS_ATTN, "attention"), (KVE_READS_KEYS, "keys"),
                              (KVE_READS_QUERIES, "queries"), (KVE_READS_VALUES, "values"))
             if bits & bit]
    return "+".join(names) if names else "nothing"


def rope_arg(rope):
    """kve_rope from None (unset) or a dict: rotary_dim (required), base
    (default 10000), pairs ("adjacent", the default, or "half"), and the
    scaling: scaling ("none", the default, "linear", "llama3" or "yarn")
    with factor, low_freq_factor, high_freq_factor, original_max_position,
    beta_fast, beta_slow and attention_factor (each 0 or absent: the
    library's default; the library checks their ranges)."""
    r = lib.kve_policy_default_options().rope
    if rope is None:
        return r
    if not isinstance(rope, dict):
        refuse(f"rope: a dict (rotary_dim, base, pairs) is required, got {type(rope).__name__}")
    unknown = set(rope) - {"rotary_dim", "base", "pairs", "scaling", "original_max_position",
                           *ROPE_REALS}
    if unknown:
        refuse(f"rope: unknown key {sorted(unknown)[0]!r} (rotary_dim, base, pairs, scaling, "
               f"original_max_position, {', '.join(ROPE_REALS)})")
    if "rotary_dim" not in rope:
        refuse("rope: rotary_dim is required (0 for a model without rotary embedding)")
    r.rotary_dim = as_size("rope rotary_dim", rope["rotary_dim"], 0, KVE_ROPE_UNSET - 1)
    try:
        r.base = float(rope.get("base", 10000.0))
    except (TypeError, ValueError):
        refuse(f"rope base: a real number is required, got {type(rope['base']).__name__}")
    pairs = rope.get("pairs", "adjacent")
    if pairs not in ROPE_PAIRS:
        refuse(f"rope pairs: {pairs!r}, want one of {', '.join(ROPE_PAIRS)}")
    r.pairs = ROPE_PAIRS[pairs]
    scaling = rope.get("scaling", "none")
    if scaling not in ROPE_SCALINGS:
        refuse(f"rope scaling: {scaling!r}, want one of {', '.join(ROPE_SCALINGS)}")
    r.scaling = ROPE_SCALINGS[scaling]
    for key in ROPE_REALS:
        if key in rope:
            try:
                setattr(r, key, float(rope[key]))
            except (TypeError, ValueError):
                refuse(f"rope {key}: a real number is required, got {type(rope[key]).__name__}")
    if "original_max_position" in rope:
        r.original_max_position = as_size("rope original_max_position",
                                          rope["original_max_position"], 0, 2**31 - 1)
    return r


# kve_rope's real-valued scaling fields (0: the library's default)
ROPE_REALS = ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
              "attention_factor")


def set_facts(options, key_dim, value_dim, query_group, rope):
    """The model facts of kve_policy_options / kve_bank_options."""
    options.key_dim = as_size("key_dim", key_dim)
    options.value_dim = as_size("value_dim", value_dim)
    options.query_group = as_size("query_group", query_group)
    options.rope = rope_arg(rope)


class _StepArrays:
    """Builds a kve_step_data from checked arrays, keeping them alive."""

    def __init__(self):
        self.data = lib.kve_step_default_data()

    def attn(self, a, ld, group, reduce):
        self.a = a
        self.data.attn = None if a is None else a.ctypes.data
        self.data.ld = ld
        self.data.group = group
        self.data.reduce = reduce

    def vectors(self, field, arr, ld):
        setattr(self, "_" + field, arr)
        setattr(self.data, field, None if arr is None else arr.ctypes.data)
        setattr(self.data, "ld_" + field, ld if arr is not None else 0)


def address(a):
    """The data address of a C-contiguous ndarray: through the buffer
    protocol when it is writable (a fraction of the cost of numpy's
    a.ctypes.data, which the step of a large bank would otherwise pay once
    per call), else through numpy."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def victims_arrays(count, k):
    """(victims, counts, victims address, counts address) for an eviction:
    victims int32 (count, k) of -1, counts intp (count,) of 0 (size_t's
    width, and below 2**63 its bits), over ctypes buffers, whose addresses
    are cheap to take."""
    cbuf = (c_size_t * count)()  # zeroed
    counts = np.frombuffer(cbuf, dtype=np.intp)
    if not k:
        return np.empty((count, 0), dtype=np.int32), counts, None, ctypes.addressof(cbuf)
    vbuf = (ctypes.c_int32 * (count * k))()
    victims = np.frombuffer(vbuf, dtype=np.int32).reshape(count, k)
    victims.fill(-1)
    return victims, counts, ctypes.addressof(vbuf), ctypes.addressof(cbuf)


def _copy_int32(ptr, n):
    """n int32 values at the library's pointer, copied into a fresh array."""
    out = np.empty(n, dtype=np.int32)
    if n:
        ctypes.memmove(out.ctypes.data, ptr, 4 * n)
    return out


def getter(cfn, doc, convert=None):
    """A read-only property: the library's getter `cfn` on the object's handle
    (through `convert`, e.g. _text for strings)."""
    if convert is None:
        return property(lambda self: cfn(self._handle()), doc=doc)
    return property(lambda self: convert(cfn(self._handle())), doc=doc)


class Rng:
    """kve_rng: xoshiro256** seeded through splitmix64 (kvevict.h, "Random
    numbers"). Passing one Rng to several policies or banks advances it as
    the C API does, so they draw independent streams."""

    def __init__(self, seed=0):
        self._state = RngState()
        lib.kve_rng_seed(self._state, as_size("seed", seed, 0, 2 ** 64 - 1))

    def next(self):
        """The next 64-bit output."""
        return lib.kve_rng_next(self._state)

    def uniform(self):
        """A float uniform in [0, 1)."""
        return lib.kve_rng_uniform(self._state)

    def below(self, bound):
        """A uniform int in [0, bound) (0 when bound is 0)."""
        return lib.kve_rng_below(self._state, as_size("bound", bound, 0, 2 ** 64 - 1))

    @property
    def state(self):
        """The four state words, a tuple of ints."""
        return tuple(self._state.s)


def as_unchecked(unchecked):
    """The options' unchecked field from a bool."""
    if not isinstance(unchecked, bool):
        refuse(f"unchecked: True or False is required, got {type(unchecked).__name__}")
    return int(unchecked)


def bank_options(key_dim=0, share=0, min_share=0.2, value_dim=0, query_group=1, rope=None,
                 unchecked=False, same_positions=False):
    """kve_bank_options from keyword values (the library validates them)."""
    options = lib.kve_bank_default_options()
    set_facts(options, key_dim, value_dim, query_group, rope)
    options.share = as_size("share", share)
    options.unchecked = as_unchecked(unchecked)
    if not isinstance(same_positions, bool):
        refuse(f"same_positions: True or False is required, got "
               f"{type(same_positions).__name__}")
    options.same_positions = int(same_positions)
    try:
        options.min_share = float(min_share)
    except (TypeError, ValueError):
        refuse(f"min_share: a real number is required, got {type(min_share).__name__}")
    return options


def _choice(name, value, table):
    """The C value of the name `value` in `table` (a dict of names)."""
    if not isinstance(value, str) or value not in table:
        refuse(f"{name}: {value!r}, want one of {', '.join(table)}")
    return table[value]


def prefill_options(method="h2o", window=32, kernel=5, pool="max"):
    """kve_prefill_options from keyword values (the library validates the
    numbers: window >= 1, kernel odd)."""
    options = lib.kve_prefill_default_options()
    options.method = _choice("method", method, PREFILL)
    options.window = as_size("window", window)
    options.kernel = as_size("kernel", kernel)
    options.pool = _choice("pool", pool, POOL)
    return options


def prompt_rows(rows, n, group, r, method, heads):
    """A prompt's attention rows as the prefill calls read them: `rows`
    float32 (heads, group, r, ld) (heads None: (group, r, ld)) or its 2-D
    form (heads * group * r, ld); returns (the 2-D array, group)."""
    lead = 0 if heads is None else 1
    a = f32_array("rows", rows, (2, 3 + lead))
    if a.ndim == 3 + lead:
        if group is not None and as_size("group", group) != a.shape[lead]:
            refuse(f"group: {group}, but rows' shape {a.shape} has groups of {a.shape[lead]}")
        if a.shape[lead + 1] != r:
            refuse(f"rows: shape {a.shape}: {a.shape[lead + 1]} rows a query head, want {r} "
                   f"(the rows {method} reads of a {n}-token prompt: prefill_rows)")
        group = a.shape[lead]
        a = a.reshape(-1, a.shape[-1])
    group = 1 if group is None else as_size("group", group, 1)
    want = (1 if heads is None else heads) * group * r
    if a.shape[0] != want:
        refuse(f"rows: {a.shape[0]} rows, want {want} ({1 if heads is None else heads} heads x "
               f"group {group} x {r} rows a query head)")
    return a, group


def rng_arg(rng):
    """None, an int seed (a fresh generator) or an Rng; the C argument."""
    if rng is None:
        return None
    if not isinstance(rng, Rng):
        rng = Rng(rng)
    return rng._state


def image_arg(data):
    """bytes of a state image: bytes, bytearray or a contiguous buffer of bytes."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    refuse(f"image: bytes are required, got {type(data).__name__}")
    return None


def image_facts(b):
    """(value_dim, query_group) of an image load accepted: version 2's
    methods' block after the spec (docs/api.md, "State images"), else 0, 1."""
    if int.from_bytes(b[8:12], "little") != 2:
        return 0, 1
    ext = 72 + int.from_bytes(b[68:72], "little")
    return int.from_bytes(b[ext:ext + 8], "little"), int.from_bytes(b[ext + 8:ext + 16], "little")


def range_args(p0, p1):
    """(p0, p1) of a remove as int32: p1 None is the end (KVE_POS_END)."""
    return as_pos(p0), KVE_POS_END if p1 is None else as_pos(p1)


class _Handle:
    """An owned library object, released once by close() or on collection.

    The lifecycle of kvevict.h is shared by policies and banks: clone(),
    copy_from(), remove(), reset(), save() and the class method load(), each
    the library's kve_<object>_<verb> (subclasses name the object); pickling
    goes through save() and load()."""

    _free = None  # the library's *_free, set by subclasses
    _kind = "object"

    def __init__(self):
        self._h = None

    @classmethod
    def _adopt(cls, handle, value_dim, query_group):
        """An object over a handle the library made (clone, load), with the
        model facts the library has no accessor for (value_dim,
        query_group: the source's, or the image's)."""
        self = cls.__new__(cls)
        _Handle.__init__(self)
        self._h = handle
        self._value_dim = value_dim
        self._query_group = query_group
        self._adopted()
        return self

    def _adopted(self):
        """What a subclass reads back from a handle it did not construct."""

    def _fn(self, verb):
        return getattr(lib, f"kve_{self._kind}_{verb}")

    def clone(self):
        """A new, independent object in exactly this one's state (kept sets,
        scores, random streams, options): the same calls then give the same
        victims and scores."""
        h = ctypes.c_void_p()
        check(self._fn("clone")(self._handle(), h))
        return type(self)._adopt(h.value, self._value_dim, self._query_group)

    def copy_from(self, other):
        """Takes other's exact state (kve_*_copy). other must have the same
        canonical spec and options; nothing is allocated when this object
        has room for what other keeps (a checkpoint copied back and forth)."""
        if not isinstance(other, type(self)):
            refuse(f"copy_from: a {type(self).__name__} is required, got {type(other).__name__}")
        check(self._fn("copy")(self._handle(), other._handle()))

    def reset(self):
        """Back to the state of a new object of the same spec and options
        (random streams at their start); the memory stays allocated."""
        self._fn("reset")(self._handle())

    def save(self):
        """The state image (kvevict.h, "Lifecycle"; docs/api.md), as bytes:
        self-contained, versioned, little-endian, the same on every machine."""
        h = self._handle()
        n = c_size_t()
        check(self._fn("save")(h, None, 0, n))
        buf = ctypes.create_string_buffer(n.value)
        check(self._fn("save")(h, buf, n.value, n))
        return buf.raw[:n.value]

    @classmethod
    def load(cls, data):
        """A new object from an image save() made (here or on another
        machine). Every byte is validated; a refusal raises
        InvalidArgumentError naming the field."""
        b = image_arg(data)
        h = ctypes.c_void_p()
        check(getattr(lib, f"kve_{cls._kind}_load")(b, len(b), None, h))
        return cls._adopt(h.value, *image_facts(b))

    def __reduce__(self):
        return (_load, (type(self), self.save()))

    def _handle(self):
        if self._h is None:
            refuse(f"{self._kind}: used after close()")
        return self._h

    def close(self):
        """Releases the library object; the Python object is unusable after.
        Refused (InvalidArgumentError) from inside the object's own score
        rule, which the library calls while it steps this object."""
        h = self._h
        if h is None:
            return
        lib.kve_set_error(0, None, None)
        type(self)._free(h)
        if "free called from inside" in _text(lib.kve_last_error()):
            refuse(f"{self._kind}: close() called from inside one of its own score rule's "
                   "calls: the library is stepping it")
        self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            self.close()


class Policy(_Handle):
    """One attention head's kept set and eviction decisions (kve_policy).

    Policy(spec, rng=None, key_dim=0, value_dim=0, query_group=1, rope=None,
    unchecked=False): spec "name[:key=value,...]", e.g.
    "h2o:budget=256,recent_window=64". rng: None, an int seed or an Rng; the
    `random` policy requires one, the others ignore it. The model facts
    (kve_policy_options): key_dim, d, the floats of the key every step
    carries (the policies that read keys, knorm, keydiff and
    expected_attention, require it); value_dim, the floats of a value (a
    policy with vnorm=1 requires it); query_group, the query heads whose
    queries a step carries (key_dim floats each); rope, the rotary embedding
    of queries and keys, a dict of rotary_dim (0 for none), base (default
    10000) and pairs ("adjacent" or "half"), which expected_attention
    requires. unchecked: True promises finite weights >= 0 and skips their
    validation at every step (the header's "Unchecked steps": garbage
    scores, never a crash, if the promise breaks).
    """

    _free = lib.kve_policy_free
    _kind = "policy"

    def __init__(self, spec, rng=None, key_dim=0, value_dim=0, query_group=1, rope=None,
                 unchecked=False):
        super().__init__()
        options = lib.kve_policy_default_options()
        set_facts(options, key_dim, value_dim, query_group, rope)
        options.unchecked = as_unchecked(unchecked)
        h = ctypes.c_void_p()
        check(lib.kve_policy_new_ex(as_spec(spec), rng_arg(rng), options, h))
        self._h = h.value
        self._value_dim = options.value_dim
        self._query_group = options.query_group

    def step(self, pos, attn=None, key=None, *, query=None, value=None, rescore=False):
        """The query at `pos` paid `attn` (float32, one weight per kept
        position in kept order, len == size) to the kept positions; then
        `pos` is admitted. attn=None: no information this step. key: the
        key of `pos`, float32 of key_dim floats (None: no key); a policy
        that reads keys requires it and needs no attn. query: the queries at
        `pos` after the rotary embedding, float32 (query_group, key_dim)
        (or (key_dim,) with query_group 1); value: the value of `pos`,
        float32 (value_dim,); rescore: rescore now (KVE_STEP_RESCORE)."""
        h = self._handle()
        pos = as_pos(pos)
        d = lib.kve_policy_key_dim(h)
        k = key_arg("key", key, d, ())
        if query is not None and self._query_group == 1 and getattr(query, "ndim", 0) == 1:
            query = query.reshape(1, -1)
        q = key_arg("query", query, d, (self._query_group,))
        v = key_arg("value", value, self._value_dim, ())
        s = _StepArrays()
        if attn is None:
            s.attn(None, 0, 1, 0)
        else:
            a = f32_array("attn", attn, (1,))
            n = lib.kve_policy_size(h)
            if a.shape[0] != n:
                refuse(f"attn: length {a.shape[0]}, want {n} (the policy's size: one weight per "
                       f"kept position)")
            s.attn(a, n, 1, 0)
        s.vectors("keys", k, d)
        s.vectors("queries", q, d)
        s.vectors("values", v, self._value_dim)
        s.data.flags = KVE_STEP_RESCORE if rescore else 0
        check(lib.kve_policy_step_data(h, pos, s.data))

    def remove(self, p0, p1=None):
        """Removes every kept position in [p0, p1) (p1 None: through the
        end) and returns how many went (kve_policy_remove). The next step may
        use any position above those still kept: remove(p) rewinds to p.
        What the removed positions' queries added to the others' scores
        stays; an exact rewind is copy_from() a checkpoint (clone())."""
        p0, p1 = range_args(p0, p1)
        n = c_size_t()
        check(lib.kve_policy_remove(self._handle(), p0, p1, n))
        return n.value

    def evict(self, budget):
        """Evicts down to `budget`; returns the victims, ascending, as int32."""
        h = self._handle()
        budget = as_size("budget", budget)
        size = lib.kve_policy_size(h)
        cap = size if size > budget else 0  # pages may take more than size - budget
        out = np.empty(cap, dtype=np.int32)
        n = c_size_t()
        check(lib.kve_policy_evict(h, budget, out.ctypes.data if cap else None, cap, n))
        return out[:n.value]

    size = getter(lib.kve_policy_size, "The number of kept positions.")
    state_bytes = getter(lib.kve_policy_state_bytes, "Bytes of per-slot state held now.")
    spec = getter(lib.kve_policy_spec, "The canonical spec, every parameter spelled out.", _text)
    name = getter(lib.kve_policy_name, "The policy's name.", _text)
    budget = getter(lib.kve_policy_budget, "The spec's budget parameter.")
    reads = getter(lib.kve_policy_reads, 'What a step reads: "attention", "keys", "nothing" or '
                   'a "+"-joined list ("keys+queries+values").', reads_name)
    key_dim = getter(lib.kve_policy_key_dim, "d, the floats of a step's key (0: no keys).")

    @property
    def value_dim(self):
        """The floats of a step's value (0: no values)."""
        return self._value_dim

    @property
    def query_group(self):
        """The queries a step carries (query heads of the KV head)."""
        return self._query_group

    @property
    def positions(self):
        """The kept positions, ascending (int32, a copy)."""
        h = self._handle()
        return _copy_int32(lib.kve_policy_positions(h), lib.kve_policy_size(h))

    def __repr__(self):
        if self._h is None:
            return "<kvevict.Policy (closed)>"
        return f"<kvevict.Policy {self.spec} size={self.size}>"


class Bank(_Handle):
    """n_heads instances of one spec behind one handle (kve_bank): head h
    behaves as the h-th of n_heads policies built one after another from the
    same generator.

    Bank(spec, n_heads, rng=None, key_dim=0, share=0, min_share=0.2,
    value_dim=0, query_group=1, rope=None, unchecked=False,
    same_positions=False), rng, the model facts (key_dim, value_dim,
    query_group, rope) and unchecked as for Policy (kve_bank_options).
    share: heads per shared-budget group (Ada-KV), dividing n_heads; 0, the
    default, gives every head its own budget. min_share: the floor of a
    shared eviction, a fraction of an even share in [0, 1]. Only the scored
    policies without pages can share. same_positions=True: every head keeps
    the same positions, one eviction for all of them by the heads' scores
    added together (an engine whose cache drops a position from every head
    at once); evict the whole bank, not with share.
    """

    _free = lib.kve_bank_free
    _kind = "bank"

    def __init__(self, spec, n_heads, rng=None, key_dim=0, share=0, min_share=0.2, value_dim=0,
                 query_group=1, rope=None, unchecked=False, same_positions=False):
        super().__init__()
        options = bank_options(key_dim, share, min_share, value_dim, query_group, rope, unchecked,
                               same_positions)
        h = ctypes.c_void_p()
        check(lib.kve_bank_new_ex(as_spec(spec), as_size("n_heads", n_heads), rng_arg(rng),
                                  options, h))
        self._h = h.value
        self._value_dim = options.value_dim
        self._query_group = options.query_group
        self._adopted()

    def _adopted(self):
        self._heads = lib.kve_bank_heads(self._h)
        self._most = c_size_t()
        self._most_ref = ctypes.byref(self._most)

    def remove(self, p0, p1=None):
        """Removes every kept position in [p0, p1) (p1 None: through the
        end) from every head (kve_bank_remove); as Policy.remove."""
        p0, p1 = range_args(p0, p1)
        check(lib.kve_bank_remove(self._handle(), p0, p1))

    def _range(self, first, count):
        """first and count as sizes (count None: the heads from first on);
        the library refuses a range past the bank, in its own words."""
        first = as_size("first", first)
        if count is None:
            if first > self._heads:
                refuse(f"first: {first} is out of range (the bank has {self._heads} heads)")
            return first, self._heads - first
        return first, as_size("count", count)

    def step(self, pos, attn=None, keys=None, *, group=None, reduce="mean", first=0,
             count=None, queries=None, values=None, rescore=False):
        """One decode step for heads [first, first + count) (default: all).

        attn: float32 of shape (count * group, n) or (count, group, n), n at
        least the largest kept set of those heads; row r = j * group + g is
        query head g of KV head first + j; each KV head reduces its group's
        rows with `reduce` ("mean", "sum" or "max"). group defaults to 1 for
        a 2-D array and to the middle dimension of a 3-D one. None: no
        information this step.
        keys: float32 (count, key_dim), row j the key of `pos` in KV head
        first + j (a bank built with key_dim); None: no keys. The policies
        that read keys require them and need no attn.
        queries: float32 (count, query_group, key_dim), the queries at `pos`
        after the rotary embedding; values: float32 (count, value_dim), the
        values of `pos`; rescore: rescore now (KVE_STEP_RESCORE). With any
        of the three the step is kve_bank_step_data.

        The binding checks only what the library cannot see (the array's
        type, layout and number of rows); the library refuses the rest
        (positions, row widths, weights, ranges) before any head changes.
        """
        h = self._handle()
        pos = as_pos(pos)
        if (keys is None and group is None and first == 0 and count is None
                and queries is None and values is None and not rescore
                and type(attn) is np.ndarray and attn.ndim == 2):
            # the common step, every head one row: one call, no per-head work
            a = f32_array("attn", attn, (2,))
            if a.shape[0] != self._heads:
                refuse(f"attn: {a.shape[0]} rows, want {self._heads} ({self._heads} heads x "
                       f"group 1)")
            st = lib.kve_bank_step(h, pos, address(a), a.shape[1])
            if st:
                check(st, _BANK_WORDS)
            return
        first, count = self._range(first, count)
        if reduce not in REDUCE:
            refuse(f"reduce: {reduce!r}, want one of {', '.join(REDUCE)}")
        mode = REDUCE[reduce]
        k = key_arg("keys", keys, lib.kve_bank_key_dim(h), (count,))
        if queries is not None or values is not None or rescore:
            return self._step_data(pos, attn, k, queries, values, rescore, group, mode, first,
                                   count)
        kptr, kld = (None, 0) if k is None else (k.ctypes.data, k.shape[1])
        if attn is None:
            check(lib.kve_bank_step_range(h, first, count, pos, None, 0, 1, mode, kptr, kld),
                  _BANK_WORDS)
            return
        a, group = self._attn_rows(attn, group, count)
        check(lib.kve_bank_step_range(h, first, count, pos, a.ctypes.data, a.shape[1], group,
                                      mode, kptr, kld), _BANK_WORDS)

    def _attn_rows(self, attn, group, count):
        """attn checked and flattened to (count * group, ld); (array, group).
        Row widths and weights are the library's to refuse."""
        a = f32_array("attn", attn, (2, 3))
        if a.ndim == 3:
            if group is not None and as_size("group", group) != a.shape[1]:
                refuse(f"group: {group}, but attn's shape {a.shape} has groups of {a.shape[1]}")
            group = a.shape[1]
            a = a.reshape(a.shape[0] * a.shape[1], a.shape[2])
        group = 1 if group is None else as_size("group", group, 1)
        rows = a.shape[0]
        if rows != count * group:
            refuse(f"attn: {rows} rows, want {count * group} ({count} heads x group {group})")
        return a, group

    def _step_data(self, pos, attn, k, queries, values, rescore, group, mode, first, count):
        h = self._handle()
        d = lib.kve_bank_key_dim(h)
        q = key_arg("queries", queries, d, (count, self._query_group))
        v = key_arg("values", values, self._value_dim, (count,))
        s = _StepArrays()
        if attn is None:
            s.attn(None, 0, 1 if group is None else as_size("group", group, 1), mode)
        else:
            a, group = self._attn_rows(attn, group, count)
            s.attn(a, a.shape[1], group, mode)
        s.vectors("keys", k, d)
        s.vectors("queries", q, d)
        s.vectors("values", v, self._value_dim)
        s.data.flags = KVE_STEP_RESCORE if rescore else 0
        check(lib.kve_bank_step_data(h, first, count, pos, s.data), _BANK_WORDS)

    def _largest(self, first, count):
        """The largest kept set of heads [first, first + count), in one call
        (kve_bank_sizes; the library refuses a range past the bank)."""
        st = lib.kve_bank_sizes(self._h, first, count, None, self._most_ref)
        if st:
            check(st, _BANK_WORDS)
        return self._most.value

    def evict(self, budget, *, first=0, count=None):
        """Evicts heads [first, first + count) (default: all) to `budget`.

        Returns (victims, counts): victims is int32 of shape (count, k), row j
        holding head first + j's victims, ascending, in its first counts[j]
        entries and -1 after them; k is the most any head evicts.
        """
        h = self._handle()
        budget = as_size("budget", budget)
        # a head over the budget loses at most what it holds (pages may take
        # more than size - budget)
        if first == 0 and count is None:
            count = self._heads
            most = self._largest(0, count)
            k = most if most > budget else 0
            victims, counts, vptr, cptr = victims_arrays(count, k)
            st = lib.kve_bank_evict(h, budget, vptr, k, cptr)
        else:
            first, count = self._range(first, count)
            most = self._largest(first, count)
            k = most if most > budget else 0
            victims, counts, vptr, cptr = victims_arrays(count, k)
            st = lib.kve_bank_evict_range(h, first, count, budget, vptr, k,
                                          cptr if count else None)
        if st:
            check(st, _BANK_WORDS)
        most = int(counts.max(initial=0))
        return (victims if most == k else np.ascontiguousarray(victims[:, :most])), counts

    def evict_shared(self, budget, *, first=0, count=None):
        """Evicts each shared group of heads [first, first + count) (default:
        all; whole groups) to `budget` positions for all
        its heads together (kve_bank_evict_shared): the group's lowest scores
        go, wherever they are, no head going below its floor. A bank built
        with share > 0 only. Returns (victims, counts) as evict does; the
        heads' sizes then differ, and a group's add up to at most budget.
        """
        h = self._handle()
        first, count = self._range(first, count)
        budget = as_size("budget", budget)
        k = self._largest(first, count)  # a head can lose at most what it holds
        victims, counts, vptr, cptr = victims_arrays(count, k)
        check(lib.kve_bank_evict_shared(h, first, count, budget, vptr, k,
                                        cptr if count else None), _BANK_WORDS)
        most = int(counts.max(initial=0))
        return np.ascontiguousarray(victims[:, :most]), counts

    def prefill(self, n, budget, rows, *, group=None, reduce="mean", first=0, count=None,
                method="h2o", window=32, kernel=5, pool="max"):
        """Compresses heads [first, first + count) (default: all), which hold
        nothing yet, to the prefill of an n-token prompt (kve_bank_prefill):
        each head keeps at most `budget` of positions 0 .. n-1, chosen by
        `method` from the prompt's attention (kvevict.h, "Prefill
        compression"; docs/prefill.md).

        rows: float32 of shape (count, group, r, ld) or (count * group * r,
        ld) with r = prefill_rows(n, method, window) and ld >= n: row k of
        query head g of KV head first + j is the attention of query
        n - r + k over keys 0 .. n - r + k (entries past it are not read).
        group defaults to the second dimension of a 4-D array, else 1.
        method: "h2o" (every prompt row) or "snapkv" (the last `window`
        rows, pooled over `kernel` positions with `pool`, "max" or "avg").
        After it, positions(h) is what head h's cache keeps.
        """
        h = self._handle()
        n = as_size("n", n)
        budget = as_size("budget", budget)
        first, count = self._range(first, count)
        options = prefill_options(method, window, kernel, pool)
        a, group = prompt_rows(rows, n, group, lib.kve_prefill_rows(n, options), method, count)
        if reduce not in REDUCE:
            refuse(f"reduce: {reduce!r}, want one of {', '.join(REDUCE)}")
        check(lib.kve_bank_prefill(h, first, count, n, budget, a.ctypes.data, a.shape[1], group,
                                   REDUCE[reduce], options), _BANK_WORDS)

    @property
    def heads(self):
        return self._heads

    @property
    def sizes(self):
        """Each head's number of kept positions (an intp array), in one call."""
        out = np.empty(self._heads, dtype=np.intp)
        check(lib.kve_bank_sizes(self._handle(), 0, self._heads, out.ctypes.data, None))
        return out

    def size(self, head):
        """Head `head`'s number of kept positions."""
        return lib.kve_bank_size(self._handle(), as_size("head", head, 0, self._heads - 1))

    def positions(self, head):
        """Head `head`'s kept positions, ascending (int32, a copy)."""
        h = self._handle()
        head = as_size("head", head, 0, self._heads - 1)
        return _copy_int32(lib.kve_bank_positions(h, head), lib.kve_bank_size(h, head))

    state_bytes = getter(lib.kve_bank_state_bytes, "Bytes of per-slot state, every head's.")
    spec = getter(lib.kve_bank_spec, "The canonical spec every head shares.", _text)
    budget = getter(lib.kve_bank_budget, "The spec's budget parameter.")
    share = getter(lib.kve_bank_share, "Heads per shared-budget group (0: no sharing).")
    same_positions = getter(lib.kve_bank_same_positions,
                            "Whether every head keeps the same positions.", bool)
    reads = getter(lib.kve_bank_reads, 'What a step reads: "attention", "keys", "nothing" or a '
                   '"+"-joined list ("keys+queries+values").', reads_name)
    key_dim = getter(lib.kve_bank_key_dim, "d, the floats of a head's key (0: no keys).")

    min_share = getter(lib.kve_bank_min_share,
                       "The floor of a shared eviction, a fraction of an even share.")

    @property
    def value_dim(self):
        """The floats of a head's value (0: no values)."""
        return self._value_dim

    @property
    def query_group(self):
        """The queries a step carries per KV head."""
        return self._query_group

    def __repr__(self):
        if self._h is None:
            return "<kvevict.Bank (closed)>"
        extra = f" share={self.share}" if self.share else ""
        return f"<kvevict.Bank {self.spec} heads={self._heads}{extra}>"


def prefill_rows(n, method="h2o", window=32):
    """The number of rows r the prefill `method` reads of an n-token prompt
    (kve_prefill_rows): n for "h2o", min(window, n) for "snapkv"; row k of
    a query head is the attention of query n - r + k."""
    return lib.kve_prefill_rows(as_size("n", n), prefill_options(method, window))


def prefill_scores(rows, n, *, group=None, reduce="mean", method="h2o", window=32, kernel=5,
                   pool="max"):
    """One KV head's prompt scores (kve_prefill_scores): float64 (n,), what
    `method` ranks position i by. rows: float32 (group, r, ld) or
    (group * r, ld), r = prefill_rows(n, method, window), ld >= n, as
    Bank.prefill reads one head."""
    n = as_size("n", n)
    options = prefill_options(method, window, kernel, pool)
    a, group = prompt_rows(rows, n, group, lib.kve_prefill_rows(n, options), method, None)
    out = np.empty(max(n, 1), dtype=np.float64)  # never NULL: n 0 is refused
    check(lib.kve_prefill_scores(n, a.ctypes.data, a.shape[1], group,
                                 _choice("reduce", reduce, REDUCE), options, out.ctypes.data),
          _BANK_WORDS)
    return out[:n]


def layer_budgets(total, n_layers, schedule="uniform", *, floor=0, beta=20.0, weights=None):
    """Per-layer budgets adding up to `total` (kve_layer_budgets; kvevict.h,
    "Budgets across layers"): schedule "uniform", "pyramid" (PyramidKV,
    beta >= 1) or "weighted" (in proportion to `weights`, n_layers floats
    >= 0), every layer at least `floor`. Returns an intp array (n_layers,)."""
    options = lib.kve_schedule_default_options()
    options.kind = _choice("schedule", schedule, SCHEDULE)
    options.floor = as_size("floor", floor)
    try:
        options.beta = float(beta)
    except (TypeError, ValueError):
        refuse(f"beta: a real number is required, got {type(beta).__name__}")
    n_layers = as_size("n_layers", n_layers)
    w = None
    if weights is not None:
        w = np.ascontiguousarray(weights, dtype=np.float64)
        if w.ndim != 1 or w.shape[0] != n_layers:
            refuse(f"weights: shape {w.shape}, want ({n_layers},): one weight a layer")
        options.weights = w.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
    elif options.kind == SCHEDULE["weighted"]:
        refuse('weights: None, but schedule "weighted" needs one weight a layer')
    out = np.empty(max(n_layers, 1), dtype=np.intp)  # never NULL: n_layers 0 is refused
    check(lib.kve_layer_budgets(as_size("total", total), n_layers, options, out.ctypes.data))
    return out[:n_layers]


def _load(cls, data):
    """Unpickling: cls.load(data)."""
    return cls.load(data)


def attn_row(q, keys, scale):
    """The softmax over the n keys (rows of `keys`, float32 (n, d)) of the
    logits scale * dot(q, key) for a float32 query q of d floats (kvevict.h,
    "Attention rows"): float32 (n,)."""
    q = f32_array("q", q, (1,))
    k = f32_array("keys", keys, (2,))
    n, d = k.shape
    if q.shape[0] != d:
        refuse(f"q: {q.shape[0]} floats, but keys have rows of {d}")
    out = np.empty(n, dtype=np.float32)
    check(lib.kve_attn_row(q.ctypes.data, d, k.ctypes.data, d, n, float(scale),
                           out.ctypes.data))
    return out


def version():
    """The library's version, "MAJOR.MINOR.PATCH"."""
    return _text(lib.kve_version())


def version_number():
    return lib.kve_version_number()


def isa():
    """The instruction set of the library's kernels: avx512, avx2 or scalar."""
    return _text(lib.kve_isa_name())


def spec_with(spec, key=None, value=None):
    """The canonical form of `spec`, with parameter `key` set to `value`
    when given; validated as Policy() would."""
    if (key is None) != (value is None):
        refuse("spec_with: key and value go together")
    buf = ctypes.create_string_buffer(KVE_SPEC_MAX)
    k = None if key is None else as_spec(key, "key")
    v = None if value is None else as_spec(str(value), "value")
    check(lib.kve_spec_with(as_spec(spec), k, v, buf, KVE_SPEC_MAX))
    return _text(buf.value)


def min_budget(spec):
    """The smallest budget `spec` accepts (kve_spec_min_budget): 33 for
    "h2o", 5 for "streaming", 1 for "window"."""
    out = c_size_t()
    check(lib.kve_spec_min_budget(as_spec(spec), out))
    return out.value


def policies():
    """The registered policies in their fixed order: a list of dicts with
    name, policy (the default canonical spec), reads (what a step reads:
    "attention", "keys" or "nothing"; the policies that read keys need a
    key_dim and keys, i.e. a q/K trace to be evaluated) and summary: the
    rows of `kvevict policies --json`."""
    out = []
    for i in range(lib.kve_policy_type_count()):
        name = _text(lib.kve_policy_type_name(i))
        out.append({"name": name, "policy": spec_with(name),
                    "reads": reads_name(lib.kve_policy_type_reads(i)),
                    "summary": _text(lib.kve_policy_type_summary(i))})
    return out


# ---- score rules (kvevict.h, "Score rules") ----

_rules = {}  # name -> (the C callback, fn): alive while registered, so C never calls freed code


def _view(ptr, n, ctype, dtype):
    """n values of ctype at the library's pointer, as a numpy array (no copy)."""
    if n == 0 or not ptr:
        return np.zeros(0, dtype=dtype)
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctype)), shape=(n,))


def _copy(ptr, n, ctype, dtype, writeable=False):
    """n values at the library's pointer, copied into an array of the rule's
    own (which it may keep: nothing of the library's is left in it)."""
    a = _view(ptr, n, ctype, dtype).copy()
    a.flags.writeable = writeable
    return a


def _trampoline(name, fn, values):
    """The kve_score_fn that calls fn(scores, attn, state, vnorm) with copies
    of the step's arrays; an exception becomes a refusal with its message,
    and KeyboardInterrupt or SystemExit (any exception that is not an
    Exception) is raised again by the call that stepped (check)."""

    def call(user, step):
        del user
        s = step.contents
        n, k = s.n, s.n_state
        try:
            scores = _copy(s.score, n, ctypes.c_double, np.float64)
            attn = _copy(s.attn, n, ctypes.c_float, np.float32)
            state = _copy(s.new_state, n * k, ctypes.c_double, np.float64, True).reshape(n, k)
            vnorm = _copy(s.vnorm, n, ctypes.c_double, np.float64) if values else None
            out = np.asarray(fn(scores, attn, state, vnorm), dtype=np.float64)
            if out.shape != (n,):
                raise ValueError(f"returned an array of shape {out.shape}, want ({n},)")
            if state.shape != (n, k):
                raise ValueError(f"resized its state to {state.shape}, want ({n}, {k})")
            _view(s.new_score, n, ctypes.c_double, np.float64)[:] = out
            if n * k:
                _view(s.new_state, n * k, ctypes.c_double, np.float64)[:] = state.reshape(-1)
            return 0
        except BaseException as e:  # noqa: BLE001 (nothing may unwind into C)
            if not isinstance(e, Exception):
                _pending.error = e  # KeyboardInterrupt, SystemExit: check() raises it
            message = f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:240]
            code = _errors.InvalidArgumentError.code
            lib.kve_set_error(code, b"%s", message)
            return code

    return SCORE_FN(call)


def register_rule(name, fn, *, state=0, recent_window=32, summary=None, values=False):
    """Registers fn as the score rule `name` (kve_score_rule_register): from
    now on a spec "name[:budget=...,recent_window=...,block=...,vnorm=1]"
    builds a scored policy whose scores fn computes, in a Policy or a Bank.

    At every step with attention, for each head: fn(scores, attn, state,
    vnorm) with scores (float64, n: the rule's scores after its previous
    step, read-only), attn (float32, n: this step's weights over the kept
    positions, a group's rows reduced), state (float64 (n, state): the
    per-slot state, to be updated in place) and vnorm (float64, n: the
    norms of the kept positions' values, with values=True; else None);
    it returns the n new scores (finite). A newcomer starts with score 0
    and zero state. An exception refuses the step with its message (an
    InvalidArgumentError), every head unchanged; KeyboardInterrupt and
    SystemExit refuse it too and are raised as they were by the call that
    stepped. The arrays are fn's own copies (the state is copied back after
    the call): keeping one writes nothing of the library's. A call into the
    object being stepped from inside fn (step, evict, save, close, ...) is
    refused (kvevict.h, "Calls from callbacks"). fn is called from the
    thread that steps (with the GIL).
    """
    if not callable(fn):
        refuse(f"register_rule: fn is not callable ({type(fn).__name__})")
    rule = lib.kve_score_rule_default()
    key = as_spec(name, "name")
    text = None if summary is None else as_spec(summary, "summary")
    rule.name = key
    rule.summary = text
    rule.state = as_size("state", state, 0, KVE_MAX_RULE_STATE)
    rule.recent_window = as_size("recent_window", recent_window)
    rule.values = 1 if values else 0
    callback = _trampoline(name, fn, bool(values))
    rule.observe = callback
    check(lib.kve_score_rule_register(rule))
    _rules[name] = (callback, fn)


def unregister_rule(name):
    """Removes the score rule `name` (kve_score_rule_unregister); refused
    while a Policy or Bank built from it is open (close them first)."""
    check(lib.kve_score_rule_unregister(as_spec(name, "name")))
    _rules.pop(name, None)
