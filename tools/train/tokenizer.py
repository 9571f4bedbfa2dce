"""BPE vocabulary in llama2.c's tokenizer.bin, and run.c's encoder and decoder.

Vocabulary layout (ids):
    0            "<unk>"
    1            "<s>"    BOS
    2            "</s>"   EOS
    3 .. 258     "<0x00>" .. "<0xFF>"  byte fallback: byte b is id b + 3
    259 ..       one piece per character of the training text, in code point
                 order, then the learned merges in the order they were made
    last KEYS    "<key00>" .. "<keyNN>"  reserved single-token pass keys
Scores: the merge made at rank r (0, 1, ...) scores -r; every other piece
scores 0 (it is never the result of a merge, so its score is never read).

tokenizer.bin (little endian): int32 max_token_length (bytes of the longest
piece); then for each id in order: float32 score, int32 length, the piece's
bytes (no terminator).

encode() is run.c's algorithm, exactly (naive_encode() is a literal reading
of it, kept as the reference for tests): optional BOS; if the text is
non-empty the piece " " (the dummy prefix); then every UTF-8 code point
(run.c's reading: a leading or ASCII byte starts one, continuation bytes
extend it up to 4 bytes) is looked up as a piece, else each of its bytes
becomes id byte + 3; then, repeatedly, among adjacent pairs whose
concatenated piece strings are a piece, the one whose piece has the highest
score is merged, the leftmost on ties, until no pair qualifies; optional EOS.
encode() finds the same merges with a heap keyed by (-score, position of
the left token), which orders candidates exactly as run.c's left-to-right
scan with a strict '>' does.

Pass keys are unreachable from text: a merge result is a concatenation of
two pieces, and no piece other than the reserved ones starts with "<" except
the byte pieces ("<0x..>") and "<unk>", "<s>", "</s>", none of which is a
prefix of "<key". check_keys_unreachable() verifies it for every split.
"""

import heapq
import re
import struct
from collections import Counter, defaultdict

import numpy as np

UNK, BOS, EOS = 0, 1, 2
BYTE0 = 3
SPECIAL = ["<unk>", "<s>", "</s>"]

# Pre-tokenisation for training only: merges stay inside " word" chunks
# (an optional leading space and letters); every other character is a chunk
# of its own. The encoder itself never splits: it is run.c's algorithm.
_CHUNK = re.compile(r" ?[A-Za-z]+|[^A-Za-z]")


def key_name(i):
    return "<key%02d>" % i


class Tokenizer:
    def __init__(self, pieces, scores):
        """pieces: list of bytes; scores: list of float (stored as float32)."""
        if len(pieces) != len(scores):
            raise ValueError("pieces and scores differ in length")
        self.pieces = [bytes(p) for p in pieces]
        self.scores = [float(np.float32(s)) for s in scores]
        self.lookup = {}
        for i, p in enumerate(self.pieces):
            if not p:
                raise ValueError("empty piece %d" % i)
            if p in self.lookup:
                raise ValueError("duplicate piece %r" % p)
            self.lookup[p] = i
        self.max_token_length = max(len(p) for p in self.pieces)

    @property
    def vocab_size(self):
        return len(self.pieces)

    def id_of(self, piece):
        if isinstance(piece, str):
            piece = piece.encode("utf-8")
        return self.lookup[piece]

    # -- file format -------------------------------------------------------
    def write(self, path):
        with open(path, "wb") as f:
            f.write(struct.pack("<i", self.max_token_length))
            for p, s in zip(self.pieces, self.scores):
                f.write(struct.pack("<fi", s, len(p)))
                f.write(p)

    @staticmethod
    def read(path, vocab_size):
        """Reads vocab_size pieces, as run.c does (the size comes from the model)."""
        with open(path, "rb") as f:
            data = f.read()
        (max_len,) = struct.unpack_from("<i", data, 0)
        off, pieces, scores = 4, [], []
        for _ in range(vocab_size):
            s, n = struct.unpack_from("<fi", data, off)
            off += 8
            pieces.append(data[off:off + n])
            scores.append(s)
            off += n
        if off != len(data):
            raise ValueError("%d trailing bytes in %s" % (len(data) - off, path))
        t = Tokenizer(pieces, scores)
        if t.max_token_length != max_len:
            raise ValueError("max_token_length %d, longest piece %d"
                             % (max_len, t.max_token_length))
        return t

    # -- run.c encode --------------------------------------------------------
    def _initial(self, text, bos):
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        if b"\0" in data:
            raise ValueError("text contains a NUL byte (run.c stops there)")
        ids = [BOS] if bos else []
        if data:
            ids.append(self.lookup[b" "])
        buf = bytearray()
        n = len(data)
        for i, c in enumerate(data):
            if (c & 0xC0) != 0x80:
                buf.clear()
            buf.append(c)
            nxt = data[i + 1] if i + 1 < n else 0
            if (nxt & 0xC0) == 0x80 and len(buf) < 4:
                continue
            tid = self.lookup.get(bytes(buf))
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(b + BYTE0 for b in buf)
            buf.clear()
        return ids

    def _merge_of(self, a, b):
        tid = self.lookup.get(self.pieces[a] + self.pieces[b])
        if tid is None or not self.scores[tid] > -1e10:
            return None
        return tid

    def encode(self, text, bos=False, eos=False):
        ids = self._initial(text, bos)
        # The BOS token takes part in merges in run.c too ("<s>" + x is never a
        # piece here, but the general algorithm is kept).
        n = len(ids)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1:] = [-1] if n else []
        alive = [True] * n
        version = [0] * n
        heap = []

        def push(i):
            j = nxt[i]
            if j < 0:
                return
            tid = self._merge_of(ids[i], ids[j])
            if tid is not None:
                heapq.heappush(heap, (-self.scores[tid], i, version[i], j,
                                      version[j], tid))

        for i in range(n - 1):
            push(i)
        while heap:
            _, i, vi, j, vj, tid = heapq.heappop(heap)
            if not (alive[i] and alive[j] and version[i] == vi
                    and version[j] == vj and nxt[i] == j):
                continue
            ids[i] = tid
            version[i] += 1
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prev[nxt[j]] = i
            if prev[i] >= 0:
                push(prev[i])
            push(i)
        out = [ids[i] for i in range(n) if alive[i]]
        if eos:
            out.append(EOS)
        return out

    def naive_encode(self, text, bos=False, eos=False):
        """run.c's merge loop read literally: O(n^2); the reference for tests."""
        ids = self._initial(text, bos)
        while True:
            best_score, best_idx, best_id = -1e10, -1, -1
            for i in range(len(ids) - 1):
                tid = self.lookup.get(self.pieces[ids[i]] + self.pieces[ids[i + 1]])
                if tid is not None and self.scores[tid] > best_score:
                    best_score, best_idx, best_id = self.scores[tid], i, tid
            if best_idx < 0:
                break
            ids[best_idx:best_idx + 2] = [best_id]
        if eos:
            ids.append(EOS)
        return ids

    # -- run.c decode ----------------------------------------------------------
    _BYTE = re.compile(rb"<0x([0-9A-Fa-f]{1,2})")

    def decode_piece(self, prev, tok):
        piece = self.pieces[tok]
        if prev == BOS and piece[:1] == b" ":
            piece = piece[1:]
        m = self._BYTE.match(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        return piece

    def decode(self, ids):
        out, prev = bytearray(), -1
        for t in ids:
            out += self.decode_piece(prev, t)
            prev = t
        return bytes(out)

    def check_keys_unreachable(self, first_key, n_keys):
        """Raises unless no key piece is the concatenation of two pieces."""
        for k in range(first_key, first_key + n_keys):
            p = self.pieces[k]
            for cut in range(1, len(p)):
                if p[:cut] in self.lookup and p[cut:] in self.lookup:
                    raise ValueError("key %r = %r + %r is reachable"
                                     % (p, p[:cut], p[cut:]))
            for text in (p, b"x" + p, p + b"."):
                if any(first_key <= t < first_key + n_keys
                       for t in self.encode(text)):
                    raise ValueError("encoding %r yields a key" % text)


def train_bpe(text, vocab_size, n_keys):
    """Learns merges on text until the vocabulary (with keys) has vocab_size
    + n_keys pieces. Returns (Tokenizer, number of merges).

    Word types are the chunks of _CHUNK with their counts; each step merges
    the most frequent adjacent pair (ties: the smaller pair of piece ids).
    A pair whose concatenation is already a piece (reached by another split)
    is merged into that piece without a new entry, as the encoder would."""
    chars = sorted(set(text))
    pieces = [s.encode() for s in SPECIAL]
    pieces += [("<0x%02X>" % b).encode() for b in range(256)]
    pieces += [c.encode("utf-8") for c in chars]
    scores = [0.0] * len(pieces)
    lookup = {p: i for i, p in enumerate(pieces)}
    counts = Counter(_CHUNK.findall(text))
    words = [[lookup[c.encode("utf-8")] for c in w] for w in counts]
    freq = [counts[w] for w in counts]
    pair_count = Counter()
    where = defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freq[wi]
            where[(a, b)].add(wi)
    rank = 0
    while len(pieces) < vocab_size:
        best = None
        for pr, c in pair_count.items():
            if c > 0 and (best is None or c > best[0] or
                          (c == best[0] and pr < best[1])):
                best = (c, pr)
        if best is None:
            break
        pair = best[1]
        s = pieces[pair[0]] + pieces[pair[1]]
        if s in lookup:
            new = lookup[s]
        else:
            new = len(pieces)
            pieces.append(s)
            scores.append(-float(rank))
            lookup[s] = new
            rank += 1
        for wi in list(where[pair]):
            w = words[wi]
            f = freq[wi]
            for a, b in zip(w, w[1:]):
                pair_count[(a, b)] -= f
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == pair:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for a, b in zip(out, out[1:]):
                pair_count[(a, b)] += f
                where[(a, b)].add(wi)
        del pair_count[pair]
        where.pop(pair, None)
    pieces += [key_name(i).encode() for i in range(n_keys)]
    scores += [0.0] * n_keys
    return Tokenizer(pieces, scores), rank
