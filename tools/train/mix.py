"""Training windows: plain text, pass-key, repeated span (text and random).

Every window is seq_len + 1 tokens: [BOS] then seq_len tokens; the model
reads the first seq_len and is scored on the last seq_len (next token), each
target with a weight. All text comes from the training stream (the training
books encoded once); the held-out books never appear.

  plain     [BOS] + stream[o : o+L], o uniform.
  pass key  [BOS] F1 enc(INTRO) KEY enc(AFTER) F2 enc(QUESTION) KEY, then
            while it fits: G enc(QUESTION) KEY with G a gap of uniform
            [0, QUESTION_GAP_MAX] filler tokens; then filler to the end. The
            F's and G's are consecutive pieces of one stream slice; KEY
            uniform over the 64 keys; distance d (first question's last
            token minus the first KEY's position) uniform in [d_min,
            d_hi(step)]; len(F1) uniform in [0, f1_hi(step)], f1_hi rising
            from 0 to all that fits over the curriculum (short prompts
            first). Every answer KEY's target has weight ANSWER_WEIGHT,
            every other target 1.
  repeat    a plain window whose tokens at [p2, p2+P) are overwritten with a
            copy of [p1, p1+P); P uniform in [SPAN_MIN, SPAN_MAX], r = p2-p1
            uniform in [P, max(P, min(r_hi(step), L-P))], p1 uniform over the
            places that fit (p1 >= 1). Weights 1.
  random    the same, but both occurrences hold P tokens drawn uniformly
            from the learned pieces (ids RANDOM_LO .. first key - 1), P
            uniform in [RANDOM_SPAN_MIN, RANDOM_SPAN_MAX]: the first
            occurrence is unpredictable, the second is pure copying.
  d_hi and r_hi rise linearly from CURRICULUM_START to their maximum over
  the first CURRICULUM_FRACTION of the steps, then stay there.
"""

import numpy as np

import tasks


class Mix:
    def __init__(self, stream, seg, seq_len, cfg):
        self.stream = np.asarray(stream, dtype=np.int64)
        self.seg = seg
        self.L = seq_len
        self.c = cfg
        self.d_min, self.d_max = seg.d_range(seq_len)
        self.d_max = min(self.d_max, seq_len - 2 - len(seg.intro))

    def _hi(self, step, lo, top):
        c = self.c
        ramp = max(1, int(c["curriculum_fraction"] * c["steps"]))
        frac = min(1.0, step / ramp)
        return max(lo, min(top, int(round(c["curriculum_start"] + frac * (top - c["curriculum_start"])))))

    def _slice(self, rng, n):
        o = int(rng.integers(0, len(self.stream) - n + 1))
        return list(self.stream[o:o + n])

    def plain(self, rng):
        w = [1] + self._slice(rng, self.L)
        return w, [1.0] * self.L

    def passkey(self, rng, step):
        L, seg, c = self.L, self.seg, self.c
        a, b, q = len(seg.intro), len(seg.after), len(seg.question)
        d = int(rng.integers(self.d_min, self._hi(step, self.d_min, self.d_max) + 1))
        key = seg.first_key + int(rng.integers(0, tasks.N_KEYS))
        # F1 (text before the intro): uniform in [0, f1_hi], f1_hi rising from
        # 0 to everything that fits over the curriculum; then the first KEY
        # sits at window index k = 1 + f1 + a and its answer at k + d + 1 <= L.
        ramp = max(1, int(c["curriculum_fraction"] * c["steps"]))
        f1_fit = L - 2 - a - d
        f1_hi = min(f1_fit, int(round(min(1.0, step / ramp) * f1_fit)))
        f1 = int(rng.integers(0, f1_hi + 1))
        f2 = d - b - q
        fill = self._slice(rng, L)
        used = f1 + f2
        w = ([1] + fill[:f1] + seg.intro + [key] + seg.after + fill[f1:used]
             + seg.question + [key])
        answers = [len(w) - 1]
        assert w[1 + f1 + a] == key and answers[0] == 1 + f1 + a + d + 1
        # further questions, each after a gap of filler, while they fit
        while True:
            g = int(rng.integers(0, c["question_gap_max"] + 1))
            if len(w) + g + q + 1 > L + 1:
                break
            w += fill[used:used + g] + seg.question + [key]
            used += g
            answers.append(len(w) - 1)
        w += fill[used:used + (L + 1 - len(w))]
        assert len(w) == L + 1
        wt = [1.0] * L
        for i in answers:
            wt[i - 1] = c["answer_weight"]        # target index of window index i
        return w, wt

    def repeat(self, rng, step, random=False):
        L, c = self.L, self.c
        w = [1] + self._slice(rng, L)
        if random:
            P = int(rng.integers(c["random_span_min"], c["random_span_max"] + 1))
        else:
            P = int(rng.integers(c["span_min"], c["span_max"] + 1))
        r_hi = max(P, min(self._hi(step, P, L - P), L - P))
        r = int(rng.integers(P, r_hi + 1))
        p1 = int(rng.integers(1, L + 1 - P - r + 1))
        p2 = p1 + r
        if random:
            w[p1:p1 + P] = [int(t) for t in rng.integers(c["random_lo"], self.seg.first_key,
                                                          size=P)]
        for i in range(P):
            w[p2 + i] = w[p1 + i]
        return w, [1.0] * L

    def batch(self, rng, step):
        """Returns (tokens [B, L+1] int64, weights [B, L] float32); the
        composition of every batch is fixed: plain, pass key, repeat, random."""
        ws, wts = [], []
        for kind in ("plain", "passkey", "repeat", "random"):
            for _ in range(self.c["n_" + kind]):
                if kind == "plain":
                    w, wt = self.plain(rng)
                elif kind == "passkey":
                    w, wt = self.passkey(rng, step)
                else:
                    w, wt = self.repeat(rng, step, random=(kind == "random"))
                ws.append(w)
                wts.append(wt)
        return np.array(ws, dtype=np.int64), np.array(wts, dtype=np.float32)
