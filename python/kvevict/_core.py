# SPDX-License-Identifier: MIT
"""Status checks, argument and array validation, the generator, policies,
banks and attention rows.

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

import numpy as np

from . import _errors
from ._lib import (KVE_POS_END, KVE_READS_ATTN, KVE_READS_KEYS, KVE_SPEC_MAX, REDUCE, RngState,
                   c_size_t, lib)

SIZE_MAX = 2 ** (8 * ctypes.sizeof(c_size_t)) - 1
INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1


def _text(b):
    return b.decode("utf-8", "replace") if b is not None else None


def check(status):
    """Raises the exception of a non-zero kve_status, with the library's message."""
    if status != 0:
        message = _text(lib.kve_last_error())
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
    """kve_policy_reads as the command line's `policies` prints it."""
    if bits & KVE_READS_KEYS:
        return "keys"
    return "attention" if bits & KVE_READS_ATTN else "nothing"


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


def bank_options(key_dim=0, share=0, min_share=0.2):
    """kve_bank_options from keyword values (the library validates them)."""
    options = lib.kve_bank_default_options()
    options.key_dim = as_size("key_dim", key_dim)
    options.share = as_size("share", share)
    try:
        options.min_share = float(min_share)
    except (TypeError, ValueError):
        refuse(f"min_share: a real number is required, got {type(min_share).__name__}")
    return options


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
    def _adopt(cls, handle):
        """An object over a handle the library made (clone, load)."""
        self = cls.__new__(cls)
        _Handle.__init__(self)
        self._h = handle
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
        return type(self)._adopt(h.value)

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
        return cls._adopt(h.value)

    def __reduce__(self):
        return (_load, (type(self), self.save()))

    def _handle(self):
        if self._h is None:
            refuse(f"{self._kind}: used after close()")
        return self._h

    def close(self):
        """Releases the library object; the Python object is unusable after."""
        h, self._h = self._h, None
        if h is not None:
            type(self)._free(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            self.close()


class Policy(_Handle):
    """One attention head's kept set and eviction decisions (kve_policy).

    Policy(spec, rng=None, key_dim=0): spec "name[:key=value,...]", e.g.
    "h2o:budget=256,recent_window=64". rng: None, an int seed or an Rng;
    the `random` policy requires one, the others ignore it. key_dim: d, the
    floats of the key every step carries (kve_policy_options.key_dim); the
    policies that read keys (knorm, keydiff: reads == "keys") require it.
    """

    _free = lib.kve_policy_free
    _kind = "policy"

    def __init__(self, spec, rng=None, key_dim=0):
        super().__init__()
        options = lib.kve_policy_default_options()
        options.key_dim = as_size("key_dim", key_dim)
        h = ctypes.c_void_p()
        check(lib.kve_policy_new_ex(as_spec(spec), rng_arg(rng), options, h))
        self._h = h.value

    def step(self, pos, attn=None, key=None):
        """The query at `pos` paid `attn` (float32, one weight per kept
        position in kept order, len == size) to the kept positions; then
        `pos` is admitted. attn=None: no information this step. key: the
        key of `pos`, float32 of key_dim floats (None: no key); a policy
        that reads keys requires it and needs no attn."""
        h = self._handle()
        pos = as_pos(pos)
        k = key_arg("key", key, lib.kve_policy_key_dim(h), ())
        kptr = None if k is None else k.ctypes.data
        if attn is None:
            check(lib.kve_policy_step_keys(h, pos, None, 0, kptr))
            return
        a = f32_array("attn", attn, (1,))
        n = lib.kve_policy_size(h)
        if a.shape[0] != n:
            refuse(f"attn: length {a.shape[0]}, want {n} (the policy's size: one weight per "
                   f"kept position)")
        check(lib.kve_policy_step_keys(h, pos, a.ctypes.data, n, kptr))

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
    reads = getter(lib.kve_policy_reads, 'What a step reads: "attention", "keys" or "nothing".',
                   reads_name)
    key_dim = getter(lib.kve_policy_key_dim, "d, the floats of a step's key (0: no keys).")

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

    Bank(spec, n_heads, rng=None, key_dim=0, share=0, min_share=0.2), rng
    and key_dim as for Policy (kve_bank_options.key_dim). share: heads per
    shared-budget group (Ada-KV), dividing n_heads; 0, the default, gives
    every head its own budget. min_share: the floor of a shared eviction, a
    fraction of an even share in [0, 1]. Only the scored policies without
    pages can share.
    """

    _free = lib.kve_bank_free
    _kind = "bank"

    def __init__(self, spec, n_heads, rng=None, key_dim=0, share=0, min_share=0.2):
        super().__init__()
        options = bank_options(key_dim, share, min_share)
        h = ctypes.c_void_p()
        check(lib.kve_bank_new_ex(as_spec(spec), as_size("n_heads", n_heads), rng_arg(rng),
                                  options, h))
        self._h = h.value
        self._adopted()

    def _adopted(self):
        self._heads = lib.kve_bank_heads(self._h)

    def remove(self, p0, p1=None):
        """Removes every kept position in [p0, p1) (p1 None: through the
        end) from every head (kve_bank_remove); as Policy.remove."""
        p0, p1 = range_args(p0, p1)
        check(lib.kve_bank_remove(self._handle(), p0, p1))

    def _range(self, first, count):
        first = as_size("first", first, 0, self._heads)
        count = self._heads - first if count is None else as_size("count", count)
        if first + count > self._heads:
            refuse(f"heads [{first}, {first + count}) are out of range (the bank has "
                   f"{self._heads} heads)")
        return first, count

    def step(self, pos, attn=None, keys=None, *, group=None, reduce="mean", first=0,
             count=None):
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
        """
        h = self._handle()
        pos = as_pos(pos)
        first, count = self._range(first, count)
        if reduce not in REDUCE:
            refuse(f"reduce: {reduce!r}, want one of {', '.join(REDUCE)}")
        mode = REDUCE[reduce]
        k = key_arg("keys", keys, lib.kve_bank_key_dim(h), (count,))
        kptr, kld = (None, 0) if k is None else (k.ctypes.data, k.shape[1])
        whole = first == 0 and count == self._heads and k is None
        if attn is None:
            if whole:
                check(lib.kve_bank_step(h, pos, None, 0))
            else:
                check(lib.kve_bank_step_range(h, first, count, pos, None, 0, 1, mode, kptr, kld))
            return
        a = f32_array("attn", attn, (2, 3))
        if a.ndim == 3:
            if group is not None and as_size("group", group) != a.shape[1]:
                refuse(f"group: {group}, but attn's shape {a.shape} has groups of {a.shape[1]}")
            group = a.shape[1]
            a = a.reshape(a.shape[0] * a.shape[1], a.shape[2])
        group = 1 if group is None else as_size("group", group, 1)
        rows, ld = a.shape
        if rows != count * group:
            refuse(f"attn: {rows} rows, want {count * group} ({count} heads x group {group})")
        widest = max((lib.kve_bank_size(h, first + j) for j in range(count)), default=0)
        if ld < widest:
            refuse(f"attn: rows of {ld} weights, but a head keeps {widest} positions")
        if whole and group == 1:
            check(lib.kve_bank_step(h, pos, a.ctypes.data, ld))
        else:
            check(lib.kve_bank_step_range(h, first, count, pos, a.ctypes.data, ld, group, mode,
                                          kptr, kld))

    def _victims(self, first, count, most):
        """(victims, counts, victims pointer): victims int32 (count, k) of -1,
        k the most of `most(j)` over the range."""
        k = max((max(most(first + j), 0) for j in range(count)), default=0)
        victims = np.full((count, k), -1, dtype=np.int32)
        counts = np.zeros(count, dtype=np.uintp)
        return victims, counts, victims.ctypes.data if k else None

    def evict(self, budget, *, first=0, count=None):
        """Evicts heads [first, first + count) (default: all) to `budget`.

        Returns (victims, counts): victims is int32 of shape (count, k), row j
        holding head first + j's victims, ascending, in its first counts[j]
        entries and -1 after them; k is the most any head evicts.
        """
        h = self._handle()
        budget = as_size("budget", budget)
        first, count = self._range(first, count)
        # a head over the budget loses at most what it holds (pages may take
        # more than size - budget)
        victims, counts, vptr = self._victims(
            first, count,
            lambda head: lib.kve_bank_size(h, head) if lib.kve_bank_size(h, head) > budget else 0)
        k = victims.shape[1]
        if first == 0 and count == self._heads:
            check(lib.kve_bank_evict(h, budget, vptr, k, counts.ctypes.data))
        else:
            check(lib.kve_bank_evict_range(h, first, count, budget, vptr, k,
                                           counts.ctypes.data if count else None))
        k = int(counts.max(initial=0))
        return np.ascontiguousarray(victims[:, :k]), counts.astype(np.intp)

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
        # a head can lose at most what it holds
        victims, counts, vptr = self._victims(first, count,
                                              lambda head: lib.kve_bank_size(h, head))
        check(lib.kve_bank_evict_shared(h, first, count, budget, vptr, victims.shape[1],
                                        counts.ctypes.data if count else None))
        k = int(counts.max(initial=0))
        return np.ascontiguousarray(victims[:, :k]), counts.astype(np.intp)

    @property
    def heads(self):
        return self._heads

    @property
    def sizes(self):
        """Each head's number of kept positions (an intp array)."""
        h = self._handle()
        return np.array([lib.kve_bank_size(h, j) for j in range(self._heads)], dtype=np.intp)

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
    reads = getter(lib.kve_bank_reads, 'What a step reads: "attention", "keys" or "nothing".',
                   reads_name)
    key_dim = getter(lib.kve_bank_key_dim, "d, the floats of a head's key (0: no keys).")

    min_share = getter(lib.kve_bank_min_share,
                       "The floor of a shared eviction, a fraction of an even share.")

    def __repr__(self):
        if self._h is None:
            return "<kvevict.Bank (closed)>"
        extra = f" share={self.share}" if self.share else ""
        return f"<kvevict.Bank {self.spec} heads={self._heads}{extra}>"


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
