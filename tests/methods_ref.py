# SPDX-License-Identifier: MIT
"""methods_ref.py - an independent numpy reference for the methods of issue 20:
expected attention, value-aware scores (vnorm) and KVzip's prefill scores.

Written from the papers and from kvpress's code as read (ExpectedAttentionPress,
DecodingPress, KVzipPress), not from kvevict's C: dense matrices and numpy's own
reductions where the C library uses fixed summation orders and closed forms.
What it shares with the library is only the definitions the policy pages state
(docs/policies/expected_attention.md, vnorm.md, kvzip.md): which queries are
buffered, when a rescoring happens, how a newcomer is scored between rescorings,
how the sinks and the recent window are kept, how ties go.

    /usr/bin/python3 tests/methods_ref.py --write tests/vectors/methods.ref
    /usr/bin/python3 tests/methods_ref.py --check tests/vectors/methods.ref

--write makes the workloads (seeded, uniform draws only, so the stream does
not depend on numpy's distribution code) and what the reference does with
them; --check makes them again and requires the committed file to hold the
same workloads and the same victims, and every score within 1e-12 relative
(the file is what tests/test_methods.c replays, without Python). Exits 77
with the reason when numpy is missing.

File format, one directive a line:
    case SPEC                      a new policy (its canonical spec)
    facts K V G R BASE PAIRS       key_dim value_dim query_group rotary_dim
                                   (or "unset") base pairs (adjacent|half)
    s POS FLAGS                    a step at POS (FLAGS: KVE_STEP_*)
    a N W...  |  a -               its attention (N weights) or none
    k W... / q W... / v W...       its key, queries (G * key_dim), value
    x BUDGET N V...                evict to BUDGET: the N victims, ascending
    r N S...                       the scores of the N kept slots after it
    end
    prefill N G SINKS BUDGET R     a KVzip prefill of an N-token prompt,
                                   G query heads, R rows a query head
    w W...                         the R * N weights of one query head (G lines)
    p N S...                       kve_prefill_scores' N scores
    kept N P...                    the kept positions
"""
import math
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not available to /usr/bin/python3 (apt-get install python3-numpy)")
    sys.exit(77)

SINK_SCORE = 1e300  # a sink's score: above any other (the policy page)


def f32(x):
    return np.float32(x)


# ---- value norms and vnorm ----

def vnorm(v):
    """||v||: the square root of the sum of squares, in double."""
    v = np.asarray(v, dtype=np.float64)
    return math.sqrt(float(np.dot(v, v)))


# ---- the attention policies with vnorm (H2O, TOVA, A2SF, NORM_SUM, Scissorhands) ----

class AttnPolicy:
    """h2o, tova, h2o_decay, h2o_mean, scissorhands; score = rule score * ||v||
    with vnorm=1 (CriticalKV, VATP)."""

    def __init__(self, kind, budget, recent_window, vn, decay=0.99, history=0):
        self.kind, self.budget, self.rw, self.vn = kind, budget, recent_window, vn
        self.decay, self.history = decay, history
        self.pos, self.acc, self.count, self.votes, self.norm = [], [], [], [], []

    def rule_score(self, i):
        if self.kind == "h2o_mean":
            return self.acc[i] / self.count[i] if self.count[i] else 0.0
        if self.kind == "scissorhands" and self.history:
            return float(sum(self.votes[i][-self.history:]))
        return self.acc[i]

    def score(self, i):
        s = self.rule_score(i)
        return s * self.norm[i] if self.vn else s

    def step(self, pos, attn, value):
        if attn is not None:
            n = len(self.pos)
            fair = f32(1.0 / n) if n else f32(1.0)
            for i in range(n):
                a = float(attn[i])
                if self.kind in ("h2o", "h2o_mean"):
                    self.acc[i] += a
                elif self.kind == "tova":
                    self.acc[i] = a
                elif self.kind == "h2o_decay":
                    self.acc[i] = self.decay * self.acc[i] + a
                elif self.kind == "scissorhands":
                    vote = 1.0 if f32(attn[i]) > fair else 0.0
                    self.acc[i] += vote
                    self.votes[i].append(vote)
                self.count[i] += 1
        self.pos.append(pos)
        self.acc.append(0.0)
        self.count.append(0)
        self.votes.append([])
        self.norm.append(vnorm(value) if self.vn else 0.0)

    def evict(self, budget):
        return evict_sorted(self, budget)

    def remove(self, idx):
        for lst in (self.pos, self.acc, self.count, self.votes, self.norm):
            for i in sorted(idx, reverse=True):
                del lst[i]

    def scores(self):
        return [self.score(i) for i in range(len(self.pos))]


def evict_sorted(p, budget):
    """Evicts down to budget: the unprotected slots (all but the newest
    recent_window) SORTED by (score, position), the lowest first."""
    n = len(p.pos)
    if n <= budget:
        return []
    cands = sorted(range(n - p.rw), key=lambda i: (p.score(i), p.pos[i]))
    gone = sorted(cands[:n - budget])
    victims = [p.pos[i] for i in gone]
    p.remove(gone)
    return victims


# ---- expected attention (Devoto et al. 2025; kvpress ExpectedAttentionPress) ----

def rotation(d, r, base, pairs, p):
    """The RoPE rotation of position p as a dense d x d matrix: pair j of the
    r rotated dimensions turned by p * base^(-2j/r); the rest untouched."""
    R = np.eye(d)
    for j in range(r // 2):
        a, b = (j, j + r // 2) if pairs == "half" else (2 * j, 2 * j + 1)
        ang = p * base ** (-2.0 * j / r)
        c, s = math.cos(ang), math.sin(ang)
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


class ExpectedAttention:
    def __init__(self, budget, rw, d, G, r, base, pairs, F, n_sink, cov, vn, eps, interval, B):
        self.budget, self.rw, self.d, self.G = budget, rw, d, G
        self.r, self.base, self.pairs = r, base, pairs
        self.F, self.n_sink, self.cov, self.vn, self.eps = F, n_sink, cov, vn, eps
        self.interval, self.B = interval, B
        self.pos, self.keys, self.norm, self.sc = [], [], [], []
        self.ring = []           # the buffered pre-RoPE queries, oldest first: (G, d) float32
        self.steps = self.since = 0
        self.held = None         # (mu (G, d), sigma (G, d, d) or None, zmax (G), zsum (G))

    def score(self, i):
        return self.sc[i]

    def logit(self, k, g):
        mu, sigma = self.held[0][g], self.held[1]
        k = np.asarray(k, dtype=np.float64)
        z = float(mu @ k) / math.sqrt(self.d)
        if sigma is not None:
            z += float(k @ sigma[g] @ k) / (2.0 * self.d)
        return z

    def value_aware(self, s, norm):
        return (s + self.eps) * norm if self.vn else s

    def step(self, pos, key, queries, value, flags):
        self.pos.append(pos)
        self.keys.append(np.asarray(key, dtype=np.float32))
        self.norm.append(vnorm(value) if self.vn else 0.0)
        self.sc.append(0.0)
        if self.steps >= self.n_sink:  # the sinks' own queries are left out
            Rt = rotation(self.d, self.r, self.base, self.pairs, pos).T
            q = np.asarray(queries, dtype=np.float64).reshape(self.G, self.d)
            self.ring.append((q @ Rt.T).astype(np.float32))  # R(pos)^T q, rounded to float32
            self.ring = self.ring[-self.B:]
        self.steps += 1
        self.since += 1
        N = len(self.pos)
        S = min(self.n_sink, N)
        if self.since >= self.interval or flags & 1:
            self.since = 0
            self.rescore(pos, N, S)
        elif N - 1 < self.n_sink:
            self.sc[-1] = SINK_SCORE
        elif self.held is None:
            self.sc[-1] = 0.0
        else:
            w = []
            for g in range(self.G):
                z = self.logit(self.keys[-1], g)
                zmax, zsum = self.held[2][g], self.held[3][g]
                if zsum == 0.0:
                    w.append(1.0)
                elif z <= zmax:
                    e = math.exp(z - zmax)
                    w.append(e / (zsum + e))
                else:
                    w.append(1.0 / (1.0 + zsum * math.exp(zmax - z)))
            self.sc[-1] = self.value_aware(float(np.mean(w)), self.norm[-1])

    def rescore(self, pos, N, S):
        if not self.ring:
            self.held = None
            self.sc = [SINK_SCORE if i < self.n_sink else 0.0 for i in range(N)]
            return
        X = np.stack(self.ring).astype(np.float64)  # (m, G, d)
        Rbar = np.mean([rotation(self.d, self.r, self.base, self.pairs, p)
                        for p in range(pos + 1, pos + 1 + self.F)], axis=0)
        mu = X.mean(axis=0)  # (G, d)
        sigma = None
        if self.cov:
            C = X - mu
            sigma = np.einsum("mgi,mgj->gij", C, C) / X.shape[0]
            sigma = np.einsum("ab,gbc,dc->gad", Rbar, sigma, Rbar)
        mu = mu @ Rbar.T
        self.held = [mu, sigma, np.zeros(self.G), np.zeros(self.G)]
        K = np.stack(self.keys[S:]).astype(np.float64) if N > S else np.zeros((0, self.d))
        p = np.zeros(N - S)
        for g in range(self.G):
            if N == S:
                break
            z = K @ mu[g] / math.sqrt(self.d)
            if sigma is not None:
                z = z + np.einsum("ni,ij,nj->n", K, sigma[g], K) / (2.0 * self.d)
            zmax = z.max()
            e = np.exp(z - zmax)
            self.held[2][g], self.held[3][g] = zmax, e.sum()
            p = p + e / e.sum()
        p = p / self.G
        self.sc = [SINK_SCORE] * S + [self.value_aware(float(p[i - S]), self.norm[i])
                                      for i in range(S, N)]

    def evict(self, budget):
        return evict_sorted(self, budget)

    def remove(self, idx):
        for lst in (self.pos, self.keys, self.norm, self.sc):
            for i in sorted(idx, reverse=True):
                del lst[i]

    def scores(self):
        return list(self.sc)


# ---- KVzip (Kim et al. 2025; kvpress KVzipPress.score_kvzip) ----

def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def kvzip_rows(u, n, G, d, chunk, n_sink, repeat_len):
    """The reconstruction rows of one KV head of a toy model: a prompt of n
    keys and, per chunk of `chunk` prompt positions, a reconstruction pass of
    repeat_len + len(chunk) queries ("repeat the context" then the chunk
    teacher-forced) whose keys are random too. As kvpress: each pass's
    queries attend, causally among themselves, to the sinks (the first
    min(n_sink, start) prompt keys), the chunk's keys and their own; the
    softmax is over those; the chunk's slice is kept. Returns rows (G, R, n)
    float32, zero outside each query's chunk, and the scores kvpress computes
    (amax over the group and the queries of the chunk slice)."""
    keys = u((n, d))
    rows, score = [], np.zeros(n)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        q_len = repeat_len + (end - start)
        Q = u((G, q_len, d))
        Krep = u((q_len, d))
        sink = min(n_sink, start)
        K = np.concatenate([keys[:sink], keys[start:end], Krep])  # keys_subsampled
        logits = Q @ K.T / math.sqrt(d)  # (G, q_len, sink + ctx + q_len)
        mask = np.triu(np.full((q_len, q_len), -np.inf), 1)
        logits[:, :, -q_len:] += mask
        w = softmax(logits)[:, :, sink:sink + (end - start)].astype(np.float32)
        score[start:end] = w.astype(np.float64).max(axis=(0, 1))
        r = np.zeros((G, q_len, n), dtype=np.float32)
        r[:, :, start:end] = w
        rows.append(r)
    return np.concatenate(rows, axis=1), score


def kvzip_keep(score, n, sinks, budget):
    """The first `sinks` positions and, of the others, the budget - sinks of
    highest score, ties to the lower position."""
    if n <= budget:
        return list(range(n))
    s = min(sinks, n)
    rest = sorted(range(s, n), key=lambda i: (-score[i], i))[:budget - s]
    return sorted(list(range(s)) + rest)


# ---- the workloads ----

def fmt32(a):
    """float32 values, each in the shortest form that reads back exactly."""
    return " ".join("%.9g" % float(x) for x in a)


def fmt64(a):
    return " ".join("%.17g" % float(x) for x in a)


def attn_cases():
    """(spec, kind, params) of the vnorm cases."""
    return [
        ("h2o:budget=12,recent_window=3,vnorm=1", "h2o", {}),
        ("h2o:budget=10,recent_window=0,vnorm=1", "h2o", {}),
        ("tova:budget=9,recent_window=1,vnorm=1", "tova", {}),
        ("h2o_decay:budget=11,recent_window=2,decay=0.9,vnorm=1", "h2o_decay", {"decay": 0.9}),
        ("h2o_mean:budget=12,recent_window=2,vnorm=1", "h2o_mean", {}),
        ("scissorhands:budget=10,recent_window=2,history=0,vnorm=1", "scissorhands", {}),
        ("scissorhands:budget=10,recent_window=2,history=5,vnorm=1", "scissorhands",
         {"history": 5}),
    ]


def ea_cases():
    """(spec, facts, params) of the expected_attention cases: the facts are
    (key_dim, value_dim, query_group, rotary_dim, base, pairs)."""
    base = dict(F=512, n_sink=4, cov=1, vn=1, eps=0.0, interval=1, B=256, rw=0)
    return [
        ("expected_attention:budget=16", (8, 6, 2, 8, 10000.0, "half"), dict(base)),
        ("expected_attention:budget=14,n_sink=2,n_queries=12,epsilon=0.01,recent_window=2",
         (8, 6, 2, 6, 500.0, "adjacent"), dict(base, n_sink=2, B=12, eps=0.01, rw=2)),
        ("expected_attention:budget=12,n_sink=1,interval=5,n_future_positions=7,n_queries=20",
         (6, 5, 3, 6, 10000.0, "adjacent"), dict(base, n_sink=1, interval=5, F=7, B=20)),
        ("expected_attention:budget=13,n_sink=3,use_covariance=0,vnorm=0,n_queries=9",
         (8, 4, 1, 4, 10000.0, "half"), dict(base, n_sink=3, cov=0, vn=0, B=9)),
        ("expected_attention:budget=10,n_sink=0,interval=4,n_queries=7,recent_window=1",
         (5, 3, 2, 0, 10000.0, "adjacent"), dict(base, n_sink=0, interval=4, B=7, rw=1)),
    ]


def generate():
    """Yields the lines of the reference file."""
    rng = np.random.Generator(np.random.PCG64(20261201))

    def u(shape, lo=-1.0, hi=1.0):
        return rng.random(shape) * (hi - lo) + lo

    yield "# generated by tests/methods_ref.py (--write); tests/test_methods.c replays it"
    steps = 70
    for spec, kind, extra in attn_cases():
        budget = int(spec.split("budget=")[1].split(",")[0])
        rw = int(spec.split("recent_window=")[1].split(",")[0])
        V = 4
        p = AttnPolicy(kind, budget, rw, True, **extra)
        yield f"case {spec}"
        yield f"facts 0 {V} 1 unset 10000 adjacent"
        for t in range(steps):
            n = len(p.pos)
            attn = None if t % 11 == 5 else u(n, 0.0, 1.0).astype(np.float32)
            value = u(V).astype(np.float32)
            if t % 17 == 3:
                value[:] = 0.0  # a zero value: norm 0
            yield f"s {t} 0"
            yield "a -" if attn is None else f"a {n} {fmt32(attn)}".rstrip()
            yield f"v {fmt32(value)}"
            p.step(t, attn, value)
            victims = p.evict(budget)
            yield f"x {budget} {len(victims)} {' '.join(map(str, victims))}".rstrip()
            if t % 7 == 0:
                yield f"r {len(p.pos)} {fmt64(p.scores())}".rstrip()
        yield "end"
    steps = 60
    for spec, (d, V, G, r, base_, pairs), k in ea_cases():
        budget = int(spec.split("budget=")[1].split(",")[0])
        p = ExpectedAttention(budget, k["rw"], d, G, r, base_, pairs, k["F"], k["n_sink"],
                              k["cov"], k["vn"], k["eps"], k["interval"], k["B"])
        yield f"case {spec}"
        yield f"facts {d} {V} {G} {r} {base_:g} {pairs}"
        # a common direction of the queries, so the statistics mean something
        drift = u(d)
        pos = 0
        for t in range(steps):
            pos += 1 + (t % 3 == 2)  # positions need not be consecutive
            key = u(d).astype(np.float32)
            q = (u((G, d)) * 0.5 + drift).astype(np.float32)
            value = u(V).astype(np.float32)
            flags = 1 if t % 13 == 12 else 0
            yield f"s {pos} {flags}"
            yield "a -"
            yield f"k {fmt32(key)}"
            yield f"q {fmt32(q.ravel())}"
            yield f"v {fmt32(value)}"
            p.step(pos, key, q, value, flags)
            victims = p.evict(budget)
            yield f"x {budget} {len(victims)} {' '.join(map(str, victims))}".rstrip()
            if t % 5 == 0 or t == steps - 1:
                yield f"r {len(p.pos)} {fmt64(p.scores())}".rstrip()
        yield "end"
    for n, G, sinks, budget, chunk, rep in ((30, 2, 4, 12, 30, 4), (48, 2, 4, 16, 16, 4),
                                            (33, 1, 0, 10, 11, 3), (12, 3, 4, 20, 12, 4)):
        rows, score = kvzip_rows(u, n, G, 8, chunk, sinks, rep)
        R = rows.shape[1]
        yield f"prefill {n} {G} {sinks} {budget} {R}"
        for g in range(G):
            yield f"w {fmt32(rows[g].ravel())}"
        yield f"p {n} {fmt64(score)}"
        kept = kvzip_keep(score, n, sinks, budget)
        yield f"kept {len(kept)} {' '.join(map(str, kept))}"
        yield "end"


def same(line, want):
    """Whether a generated line matches the committed one: tokens equal, or
    both reals within 1e-12 relative (r and p lines)."""
    if line == want:
        return True
    a, b = line.split(), want.split()
    if len(a) != len(b) or a[0] != b[0] or a[0] not in ("r", "p"):
        return False
    for x, y in zip(a[1:], b[1:]):
        fx, fy = float(x), float(y)
        if not (fx == fy or abs(fx - fy) <= 1e-12 * max(abs(fx), abs(fy))):
            return False
    return True


def main(argv):
    if len(argv) != 3 or argv[1] not in ("--write", "--check"):
        print("usage: methods_ref.py --write|--check FILE", file=sys.stderr)
        return 2
    lines = list(generate())
    if argv[1] == "--write":
        with open(argv[2], "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{argv[2]}: {len(lines)} lines")
        return 0
    with open(argv[2], encoding="utf-8") as f:
        want = f.read().splitlines()
    if len(want) != len(lines):
        print(f"FAIL: {argv[2]} has {len(want)} lines, the reference makes {len(lines)}")
        return 1
    for i, (a, b) in enumerate(zip(lines, want)):
        if not same(a, b):
            print(f"FAIL: {argv[2]}:{i + 1}: the reference makes\n  {a[:200]}\nthe file holds\n"
                  f"  {b[:200]}")
            return 1
    print(f"{argv[2]}: the reference makes every line again ({len(lines)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
