"""The long-range recall tasks: pass-key prompts and repeated passages.

Both are built from token ids only, so the C side rebuilds them from
tokenizer.bin, the held-out text and the strings below. enc(s) is run.c's
encode(s, bos=0, eos=0): it starts with the dummy-prefix space, so each
segment begins a new word. H is the held-out stream: heldout.txt encoded
once, as for evaluation (dummy prefix, no BOS, no EOS).

Pass-key prompt for trial j (0 <= j < N) at distance d, context L = seq_len:
    [BOS] F1 enc(INTRO) KEY enc(AFTER) F2 enc(QUESTION)
  exactly L tokens (positions 0 .. L-1). KEY is the piece "<keyNN>" with
  NN = j mod 64, at position k = L-1-d; the model's prediction at the last
  position L-1 is scored (exact match: argmax over the whole vocabulary is
  KEY; chance is 1/64). With a, b, q the token lengths of the three
  segments: f1 = k-1-a, f2 = d-b-q, m = f1+f2 = L-2-a-b-q;
  s = floor(j * (len(H) - m) / N) (integer arithmetic);
  F1 = H[s : s+f1], F2 = H[s+f1 : s+m]. Valid distances: b+q <= d <= L-2-a.

Repeated passage for trial j at distance r, span length P (P = 32):
    W = [BOS] + H[s : s+L-1], s = floor(j * (len(H) - (L-1)) / N);
    then W[L-P+i] = W[L-P-r+i] for i in 0..P-1 (copied in increasing i;
    r >= P, so the source is never overwritten), r <= L-1-P.
  Scored: the mean loss (nats) over the span tokens i = 1..P-1 of the first
  occurrence (positions L-P-r+i) and of the second (positions L-P+i), each
  predicted from the position before it. The span's first token is not
  scored (nothing before it says the copy begins).
"""

INTRO = "The pass key is #"
AFTER = "Remember it."
QUESTION = "What is the pass key? The pass key is #"
N_KEYS = 64
REPEAT_SPAN = 32


class Segments:
    def __init__(self, tok, first_key):
        self.intro = tok.encode(INTRO)
        self.after = tok.encode(AFTER)
        self.question = tok.encode(QUESTION)
        self.first_key = first_key

    def d_range(self, seq_len):
        a, b, q = len(self.intro), len(self.after), len(self.question)
        return b + q, seq_len - 2 - a

    def key_id(self, j):
        return self.first_key + j % N_KEYS


def passkey_prompt(seg, H, seq_len, j, n_trials, d):
    """(tokens, key id) for trial j at distance d; len(tokens) == seq_len."""
    a, b, q = len(seg.intro), len(seg.after), len(seg.question)
    lo, hi = seg.d_range(seq_len)
    if not lo <= d <= hi:
        raise ValueError("distance %d outside [%d, %d]" % (d, lo, hi))
    k = seq_len - 1 - d
    f1 = k - 1 - a
    m = seq_len - 2 - a - b - q
    s = j * (len(H) - m) // n_trials
    key = seg.key_id(j)
    toks = ([1] + list(H[s:s + f1]) + seg.intro + [key] + seg.after
            + list(H[s + f1:s + m]) + seg.question)
    assert len(toks) == seq_len and toks[k] == key
    return toks, key


def repeat_window(H, seq_len, j, n_trials, r, span=REPEAT_SPAN):
    """(tokens, first-occurrence start, second-occurrence start)."""
    if not span <= r <= seq_len - 1 - span:
        raise ValueError("repeat distance %d outside [%d, %d]"
                         % (r, span, seq_len - 1 - span))
    s = j * (len(H) - (seq_len - 1)) // n_trials
    w = [1] + list(H[s:s + seq_len - 1])
    p2 = seq_len - span
    p1 = p2 - r
    for i in range(span):
        w[p2 + i] = w[p1 + i]
    return w, p1, p2
