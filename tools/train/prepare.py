"""Corpus and tokenizer: writes models/heldout.txt, models/tokenizer.bin and
the encoded streams under the work directory.

usage: prepare.py CONFIG MODELS_DIR WORK_DIR
"""

import json
import os
import sys

import numpy as np

import corpus
import tokenizer as T
import tasks


def main(cfg_path, models, work):
    cfg = json.load(open(cfg_path))
    os.makedirs(models, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    books = corpus.read_books()
    train_text, held_text, train_books = corpus.split(books)
    with open(os.path.join(models, "heldout.txt"), "w", encoding="ascii", newline="\n") as f:
        f.write(held_text)
    tc = cfg["tokenizer"]
    tok, n_merges = T.train_bpe(train_text, tc["vocab_size"], tc["n_keys"])
    first_key = tok.vocab_size - tc["n_keys"]
    tok.check_keys_unreachable(first_key, tc["n_keys"])
    tok.write(os.path.join(models, "tokenizer.bin"))
    # round trip of the file, then the streams through the file's tokenizer
    tok = T.Tokenizer.read(os.path.join(models, "tokenizer.bin"), tok.vocab_size)
    train_ids = tok.encode(train_text)
    held_ids = tok.encode(held_text)
    assert tok.decode(held_ids) == b" " + held_text.encode()
    np.save(os.path.join(work, "train.npy"), np.array(train_ids, dtype=np.uint16))
    np.save(os.path.join(work, "heldout.npy"), np.array(held_ids, dtype=np.uint16))
    seg = tasks.Segments(tok, first_key)
    info = {
        "vocab_size": tok.vocab_size, "merges": n_merges,
        "n_chars": tok.vocab_size - tc["n_keys"] - 259 - n_merges,
        "first_key": first_key, "n_keys": tc["n_keys"],
        "max_token_length": tok.max_token_length,
        "train_books": train_books, "heldout_books": list(corpus.HELDOUT_BOOKS),
        "train_bytes": len(train_text.encode()), "train_tokens": len(train_ids),
        "heldout_bytes": len(held_text.encode()), "heldout_tokens": len(held_ids),
        "train_bytes_per_token": (len(train_text.encode()) + 1) / len(train_ids),
        "heldout_bytes_per_token": (len(held_text.encode()) + 1) / len(held_ids),
        "intro_tokens": seg.intro, "after_tokens": seg.after,
        "question_tokens": seg.question,
    }
    json.dump(info, open(os.path.join(work, "data.json"), "w"), indent=1)
    print("prepare: %d pieces (%d merges), %d training tokens (%.3f bytes/token), "
          "%d held-out tokens (%.3f bytes/token)"
          % (tok.vocab_size, n_merges, len(train_ids), info["train_bytes_per_token"],
             len(held_ids), info["heldout_bytes_per_token"]))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip())
    main(*sys.argv[1:])
