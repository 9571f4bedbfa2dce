"""Training windows: plain text, pass-key, repeated span.

Every window is seq_len + 1 tokens: [BOS] then seq_len tokens; the model
reads the first seq_len and is scored on the last seq_len (next token), each
target with a weight. All text comes from the training stream (the training
books encoded once); the held-out books never appear.

  plain     [BOS] + stream[o : o+L], o uniform.
  pass key  [BOS] F1 enc(INTRO) KEY enc(AFTER) F2 enc(QUESTION) KEY F3, the
            F's consecutive pieces of one stream slice; KEY uniform over the
            64 keys; distance d (question's last token minus the first KEY's
            position) uniform in [d_min, d_hi(step)]; first KEY position
            uniform over the places that fit. The answer KEY's target has
            weight ANSWER_WEIGHT, every other target 1.
  repeat    a plain window whose tokens at [p2, p2+P) are overwritten with a
            copy of [p1, p1+P); P uniform in [SPAN_MIN, SPAN_MAX], r = p2-p1
            uniform in [P, max(P, min(r_hi(step), L-P))], p1 uniform over the
            places that fit (p1 >= 1). Weights 1.
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
        L, seg = self.L, self.seg
        a, b, q = len(seg.intro), len(seg.after), len(seg.question)
        d = int(rng.integers(self.d_min, self._hi(step, self.d_min, self.d_max) + 1))
        key = seg.first_key + int(rng.integers(0, tasks.N_KEYS))
        # window index of the first KEY: k; of the answer KEY: k + d + 1 <= L
        k = int(rng.integers(1 + a, L - d - 1 + 1))
        f1, f2 = k - 1 - a, d - b - q
        f3 = L - (k + d + 1)
        fill = self._slice(rng, f1 + f2 + f3)
        w = ([1] + fill[:f1] + seg.intro + [key] + seg.after + fill[f1:f1 + f2]
             + seg.question + [key] + fill[f1 + f2:])
        assert len(w) == L + 1 and w[k] == key and w[k + d + 1] == key
        wt = [1.0] * L
        wt[k + d] = self.c["answer_weight"]       # target index of window index k+d+1
        return w, wt

    def repeat(self, rng, step):
        L, c = self.L, self.c
        w = [1] + self._slice(rng, L)
        P = int(rng.integers(c["span_min"], c["span_max"] + 1))
        r_hi = max(P, min(self._hi(step, P, L - P), L - P))
        r = int(rng.integers(P, r_hi + 1))
        p1 = int(rng.integers(1, L + 1 - P - r + 1))
        p2 = p1 + r
        for i in range(P):
            w[p2 + i] = w[p1 + i]
        return w, [1.0] * L

    def batch(self, rng, step):
        """Returns (tokens [B, L+1] int64, weights [B, L] float32); the
        composition of every batch is fixed: plain, then pass key, then repeat."""
        ws, wts = [], []
        for kind, n in (("plain", self.c["n_plain"]), ("passkey", self.c["n_passkey"]),
                        ("repeat", self.c["n_repeat"])):
            for _ in range(n):
                w, wt = (self.plain(rng) if kind == "plain" else
                         self.passkey(rng, step) if kind == "passkey" else
                         self.repeat(rng, step))
                ws.append(w)
                wts.append(wt)
        return np.array(ws, dtype=np.int64), np.array(wts, dtype=np.float32)
