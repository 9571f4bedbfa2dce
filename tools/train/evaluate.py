"""Full-cache measurements of models/kjv.bin (plain causal attention, torch).

usage: evaluate.py CONFIG MODELS_DIR WORK_DIR

Writes MODELS/eval.json:
  heldout     bits per byte and per token of heldout.txt, and of each held-out
              book on its own, by the windowing convention of models/README.md:
              encode the text once (dummy prefix, no BOS/EOS), cut the stream
              into consecutive chunks of seq_len-1 tokens (the last shorter),
              window = [BOS] + chunk, loss summed over the chunk tokens;
              bits/byte = nats / ln 2 / (UTF-8 bytes + 1), bits/token = nats /
              ln 2 / tokens.
  passkey     exact-match accuracy by distance over the prompts of tasks.py,
              with the mean probability of the key, the accuracy of the argmax
              over the 64 keys only, chance (1/64), and per layer and query
              head the mean attention weight of the last position on the key.
  repeat      mean loss (nats/token) on the first and the second occurrence
              of a repeated held-out passage, by distance.
"""

import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import corpus
import export as E
import model as MD
import tasks
import tokenizer as T


def load(models, work):
    """The committed checkpoint (models/kjv.bin) as a torch module, and the
    training record."""
    ck = torch.load(os.path.join(work, "ckpt.pt"))
    m = E.to_torch(os.path.join(models, "kjv.bin"))
    ref = MD.Transformer(MD.Config(**ck["config"]))
    ref.load_state_dict(ck["model"])
    for a, b in zip(m.state_dict().values(), ref.state_dict().values()):
        if not torch.equal(a, b):
            raise SystemExit("models/kjv.bin is not the trained checkpoint")
    return m, ck


def last_row_attention(model, x):
    """Attention weights of the last position, [layers][B, heads, T]: the same
    computation as model.Attention, kept apart so the model stays plain."""
    B, T = x.shape
    h = model.tok_embeddings(x)
    cos, sin = model.freqs_cos[:T], model.freqs_sin[:T]
    out = []
    for layer in model.layers:
        a = layer.attention
        z = layer.attention_norm(h)
        q = MD.rotate(a.wq(z).view(B, T, a.h, a.s), cos, sin)
        k = MD.rotate(a.wk(z).view(B, T, a.k, a.s), cos, sin)
        k = k.repeat_interleave(a.h // a.k, dim=2)
        sc = torch.einsum("bhs,bths->bht", q[:, -1] / math.sqrt(a.s), k)
        out.append(F.softmax(sc, -1))
        h = layer(h, cos, sin, model.mask)
    return out


def windows(ids, seq_len):
    step = seq_len - 1
    return [[1] + ids[i:i + step] for i in range(0, len(ids), step)]


def text_nats(model, ids, seq_len, batch=8):
    """Total nats over the stream by the windowing convention."""
    total = 0.0
    ws = windows(ids, seq_len)
    with torch.no_grad():
        for i in range(0, len(ws), batch):
            group = ws[i:i + batch]
            same = [w for w in group if len(w) == len(group[0])]
            rest = [w for w in group if len(w) != len(group[0])]
            for g in (same, rest):
                for w in ([g] if g is same else [[w] for w in g]):
                    if not w:
                        continue
                    x = torch.tensor([v[:-1] for v in w])
                    y = torch.tensor([v[1:] for v in w])
                    lg = model(x)
                    total += float(F.cross_entropy(lg.reshape(-1, lg.shape[-1]),
                                                   y.reshape(-1), reduction="sum").double())
    return total


def bits(nats, n_bytes, n_tokens):
    return {"nats": nats, "bytes": n_bytes, "tokens": n_tokens,
            "bits_per_byte": nats / math.log(2) / n_bytes,
            "bits_per_token": nats / math.log(2) / n_tokens}


def main(cfg_path, models, work):
    cfg = json.load(open(cfg_path))
    torch.set_num_threads(cfg["threads"])
    data = json.load(open(os.path.join(work, "data.json")))
    tok = T.Tokenizer.read(os.path.join(models, "tokenizer.bin"), data["vocab_size"])
    model, ck = load(models, work)
    L = model.cfg.seq_len
    text = open(os.path.join(models, "heldout.txt"), encoding="ascii").read()
    H = tok.encode(text)
    res = {"heldout": bits(text_nats(model, H, L), len(text.encode()) + 1, len(H))}
    per_book = {}
    for name, btext in corpus.heldout_books(corpus.read_books()):
        ids = tok.encode(btext)
        per_book[name] = bits(text_nats(model, ids, L), len(btext.encode()) + 1, len(ids))
    res["heldout_books"] = per_book
    print("held-out: %.4f bits/byte, %.4f bits/token"
          % (res["heldout"]["bits_per_byte"], res["heldout"]["bits_per_token"]), flush=True)

    seg = tasks.Segments(tok, data["first_key"])
    e = cfg["eval"]
    n = e["passkey_trials"]
    keys = torch.arange(seg.first_key, seg.first_key + tasks.N_KEYS)
    pk = []
    with torch.no_grad():
        for d in e["passkey_distances"]:
            rows = [tasks.passkey_prompt(seg, H, L, j, n, d) for j in range(n)]
            x = torch.tensor([r[0] for r in rows])
            key = torch.tensor([r[1] for r in rows])
            logits = model(x)[:, -1, :]
            prob = F.softmax(logits, -1)
            hit = (logits.argmax(-1) == key).float()
            in_keys = (keys[logits[:, keys].argmax(-1)] == key).float()
            acc = float(hit.mean())
            att = last_row_attention(model, x)
            on_key = [[float(a[:, hh, L - 1 - d].mean()) for hh in range(a.shape[1])]
                      for a in att]
            pk.append({"distance": d, "trials": n, "accuracy": acc,
                       "attention_on_key": on_key,
                       "stderr": math.sqrt(acc * (1 - acc) / n),
                       "accuracy_among_keys": float(in_keys.mean()),
                       "mean_key_probability": float(prob[torch.arange(n), key].mean()),
                       "chance": 1.0 / tasks.N_KEYS})
            print("pass key d=%d: %.3f" % (d, acc), flush=True)
    res["passkey"] = pk
    rp = []
    n = e["repeat_trials"]
    P = tasks.REPEAT_SPAN
    with torch.no_grad():
        for r in e["repeat_distances"]:
            rows = [tasks.repeat_window(H, L, j, n, r) for j in range(n)]
            x = torch.tensor([w for w, _, _ in rows])
            logp = F.log_softmax(model(x), -1)
            first, second = [], []
            for b, (w, p1, p2) in enumerate(rows):
                for i in range(1, P):
                    first.append(-float(logp[b, p1 + i - 1, w[p1 + i]]))
                    second.append(-float(logp[b, p2 + i - 1, w[p2 + i]]))
            rp.append({"distance": r, "trials": n, "span": P,
                       "first_nats": float(np.mean(first)),
                       "second_nats": float(np.mean(second)),
                       "second_stderr": float(np.std(second) / math.sqrt(len(second)))})
            print("repeat r=%d: first %.3f second %.3f nats" % (r, rp[-1]["first_nats"],
                  rp[-1]["second_nats"]), flush=True)
    res["repeat"] = rp
    res["training"] = {"wall_s": ck["wall_s"], "tokens": ck["tokens"], "steps_done": ck["steps_done"],
                       "tokens_per_s": ck["tokens_per_s"], "steps": ck["train"]["steps"]}
    json.dump(res, open(os.path.join(models, "eval.json"), "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip())
    main(*sys.argv[1:])
