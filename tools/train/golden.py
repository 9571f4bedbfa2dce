"""Exports the trained model and writes the files the C decoder is tested on.

usage: golden.py CONFIG MODELS_DIR WORK_DIR FIXTURES_DIR

MODELS/kjv.bin            the checkpoint, llama2.c legacy format
MODELS/golden.jsonl       torch logits of the golden prompt, `kvevict lm logits` lines
MODELS/golden.json        the golden prompt (text, tokens) and the export checks
FIXTURES/tiny-*.bin       tiny random models: tied/untied x legacy/v1
FIXTURES/tiny-{tied,untied}.logits.jsonl   their torch logits for TINY_TOKENS
FIXTURES/tiny-tokenizer.bin, tiny-tokenizer.jsonl   a hand-made vocabulary and
                          run.c encodings ({"text", "tokens"}, no BOS, no EOS)
FIXTURES/kjv-encodings.jsonl  encodings with MODELS/tokenizer.bin, same form
Every exported file is read back by export.read() and run through the numpy
forward pass; the largest difference from torch is recorded and must stay
below 1e-4 (it is float rounding, about 1e-6 here).
"""

import json
import os
import sys

import numpy as np
import torch

import export as E
import model as MD
import tokenizer as T

# Ruth 1:16, a held-out verse; encoded with BOS (run.c encode(text, 1, 0)).
GOLDEN_TEXT = ("And Ruth said, Intreat me not to leave thee, or to return from "
               "following after thee: for whither thou goest, I will go")
TINY = dict(dim=16, hidden_dim=40, n_layers=2, n_heads=4, n_kv_heads=2,
            vocab_size=64, seq_len=32)
TINY_SEED = 7
# 32 tokens (the whole context): BOS, then (11 + 37 i) mod 64.
TINY_TOKENS = [1] + [(11 + 37 * i) % 64 for i in range(1, 32)]
TOLERANCE = 1e-4


def tiny_model(tied):
    g = torch.Generator().manual_seed(TINY_SEED + (0 if tied else 1))
    m = MD.Transformer(MD.Config(tied=tied, **TINY))
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            else:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    return m.eval()


def tiny_tokenizer():
    """A hand-made vocabulary exercising every rule of run.c's encoder:
    scores that disagree with ids, ties (leftmost wins), merges through a
    non-ASCII piece, code points missing from the vocabulary (byte
    fallback of 1 to 4 bytes) and an unreachable reserved piece."""
    pieces = [s.encode() for s in T.SPECIAL] + [("<0x%02X>" % b).encode() for b in range(256)]
    scores = [0.0] * len(pieces)
    for ch in [" ", "a", "b", "c", "e", "f", "h", "l", "o", "s", "t", "é", "€"]:
        pieces.append(ch.encode())
        scores.append(0.0)
    merges = [(" t", -20.0), ("he", -2.0), (" the", -3.0), ("ca", -4.0), ("caf", -5.0),
              ("fé", -6.0), ("café", -7.0), ("ab", -8.0), ("bc", -8.0), ("aa", -9.0),
              (" a", -10.0), (" c", -11.0), ("€€", -12.0), ("lo", -13.0), ("ol", -13.0),
              ("lol", -14.0)]
    for s, sc in merges:
        pieces.append(s.encode())
        scores.append(sc)
    pieces.append(b"<key00>")
    scores.append(0.0)
    return T.Tokenizer(pieces, scores)


TINY_TEXTS = ["", "the", " the the", "abc", "aaa", "aaaa", "café", "cafés", "lolol",
              "€€€", "€5", "naïve", "😀 a", "a\nb", "<key00>", "  c", "b\té", "ñé€😀"]

KJV_TEXTS = ["In the beginning God created the heaven and the earth.",
             "The pass key is", "Remember it.", "What is the pass key? The pass key is",
             "<key07>", "And Ruth said, Intreat me not to leave thee,\nor to return",
             "Naïve café 😀", "Xerxes 1611", ""]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def check_export(model, path, tokens, report):
    diff, scale = E.validate(model, path, tokens)
    report[os.path.basename(path)] = {"max_abs_diff": diff, "max_abs_logit": scale}
    if not diff < TOLERANCE:
        raise SystemExit("export check failed for %s: %g" % (path, diff))


def main(cfg_path, models, work, fixtures):
    cfg = json.load(open(cfg_path))
    torch.set_num_threads(cfg["threads"])
    os.makedirs(fixtures, exist_ok=True)
    report = {}
    ck = torch.load(os.path.join(work, "ckpt.pt"))
    model = MD.Transformer(MD.Config(**ck["config"]))
    model.load_state_dict(ck["model"])
    model.eval()
    data = json.load(open(os.path.join(work, "data.json")))
    tok = T.Tokenizer.read(os.path.join(models, "tokenizer.bin"), data["vocab_size"])
    tokens = tok.encode(GOLDEN_TEXT, bos=True)
    E.write_legacy(model, os.path.join(models, "kjv.bin"))
    check_export(model, os.path.join(models, "kjv.bin"), tokens, report)
    E.write_v1(model, os.path.join(work, "kjv-v1.bin"))
    check_export(model, os.path.join(work, "kjv-v1.bin"), tokens, report)
    with open(os.path.join(models, "golden.jsonl"), "w") as f:
        f.write(E.format_logits_jsonl(tokens, E.torch_logits(model, tokens)))
    json.dump({"text": GOLDEN_TEXT, "bos": True, "tokens": tokens,
               "pieces": [tok.pieces[t].decode("utf-8") for t in tokens],
               "exports": report, "tolerance": TOLERANCE},
              open(os.path.join(models, "golden.json"), "w"), indent=1)

    fx = {}
    for tied in (True, False):
        m = tiny_model(tied)
        name = "tiny-tied" if tied else "tiny-untied"
        E.write_legacy(m, os.path.join(fixtures, name + ".bin"))
        E.write_v1(m, os.path.join(fixtures, name + "-v1.bin"))
        check_export(m, os.path.join(fixtures, name + ".bin"), TINY_TOKENS, fx)
        check_export(m, os.path.join(fixtures, name + "-v1.bin"), TINY_TOKENS, fx)
        with open(os.path.join(fixtures, name + ".logits.jsonl"), "w") as f:
            f.write(E.format_logits_jsonl(TINY_TOKENS, E.torch_logits(m, TINY_TOKENS)))
    tt = tiny_tokenizer()
    tt.write(os.path.join(fixtures, "tiny-tokenizer.bin"))
    tt = T.Tokenizer.read(os.path.join(fixtures, "tiny-tokenizer.bin"), tt.vocab_size)
    rows = []
    for s in TINY_TEXTS:
        ids = tt.encode(s)
        if ids != tt.naive_encode(s):
            raise SystemExit("heap and naive encoders disagree on %r" % s)
        rows.append({"text": s, "tokens": ids})
    write_jsonl(os.path.join(fixtures, "tiny-tokenizer.jsonl"), rows)
    rows = []
    for s in KJV_TEXTS:
        ids = tok.encode(s)
        if ids != tok.naive_encode(s):
            raise SystemExit("heap and naive encoders disagree on %r" % s)
        rows.append({"text": s, "tokens": ids})
    write_jsonl(os.path.join(fixtures, "kjv-encodings.jsonl"), rows)
    json.dump({"tiny_vocab_size": tt.vocab_size, "tiny_tokens": TINY_TOKENS,
               "exports": fx}, open(os.path.join(work, "fixtures.json"), "w"), indent=1)
    print("golden: %d-token prompt; export max |numpy - torch|: %s"
          % (len(tokens), ", ".join("%s %.2g" % (k, v["max_abs_diff"])
                                     for k, v in {**report, **fx}.items())))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__.strip())
    main(*sys.argv[1:])
