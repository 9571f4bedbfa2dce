"""Trains the model; writes WORK/ckpt.pt and MODELS/train-log.jsonl.

usage: train.py CONFIG MODELS_DIR WORK_DIR [STEPS]
(STEPS overrides the configured count, for smoke runs; the phases, curriculum
and schedule are scaled to it.)

Training runs in phases (config "phases"): each has its own window length
and mix (see mix.py); the learning-rate schedule spans all of them, the
curriculum restarts in each.

Reproducibility: the seed fixes the initial weights (torch) and every window
(numpy PCG64); the thread count is fixed, so on the same machine and the same
torch/OpenBLAS builds a rerun gives a bit-identical checkpoint. Different
thread counts, CPUs (OpenBLAS picks kernels by CPU) or library versions round
differently and give a different, equally good, model.
"""

import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import mix as M
import model as MD
import tasks
import tokenizer as T


def lr_at(step, c):
    if step < c["warmup_steps"]:
        return c["lr"] * (step + 1) / c["warmup_steps"]
    prog = (step - c["warmup_steps"]) / max(1, c["steps"] - c["warmup_steps"])
    return c["min_lr"] + 0.5 * (1 + math.cos(math.pi * min(1.0, prog))) * (c["lr"] - c["min_lr"])


def probe(model, seg, H, seq_len, distances, n):
    """Pass-key exact match on n held-out prompts per distance, and the mean
    loss on the first and second occurrence of a repeated held-out passage
    (distance 128) over n windows."""
    out = {}
    model.eval()
    with torch.no_grad():
        for d in distances:
            rows = [tasks.passkey_prompt(seg, H, seq_len, j, n, d) for j in range(n)]
            x = torch.tensor([r[0] for r in rows])
            logits = model(x)[:, -1, :]
            keys = torch.tensor([r[1] for r in rows])
            out[str(d)] = float((logits.argmax(-1) == keys).float().mean())
        rows = [tasks.repeat_window(H, seq_len, j, n, 128) for j in range(n)]
        logp = F.log_softmax(model(torch.tensor([w for w, _, _ in rows])), -1)
        nats = [0.0, 0.0]
        for b, (w, p1, p2) in enumerate(rows):
            for o, p in enumerate((p1, p2)):
                for i in range(1, tasks.REPEAT_SPAN):
                    nats[o] -= float(logp[b, p + i - 1, w[p + i]])
        cnt = n * (tasks.REPEAT_SPAN - 1)
        out["repeat128_first_nats"] = nats[0] / cnt
        out["repeat128_second_nats"] = nats[1] / cnt
    model.train()
    return out


def main(cfg_path, models, work, steps=None):
    cfg = json.load(open(cfg_path))
    c = dict(cfg["train"])
    phases = [dict(ph) for ph in c["phases"]]
    total = sum(ph["steps"] for ph in phases)
    if steps is not None:
        for ph in phases:
            ph["steps"] = max(1, ph["steps"] * int(steps) // total)
        total = sum(ph["steps"] for ph in phases)
    c["steps"] = total
    torch.set_num_threads(cfg["threads"])
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg["seed"])
    rng = np.random.default_rng(cfg["seed"])
    data = json.load(open(os.path.join(work, "data.json")))
    tok = T.Tokenizer.read(os.path.join(models, "tokenizer.bin"), data["vocab_size"])
    seg = tasks.Segments(tok, data["first_key"])
    train_ids = np.load(os.path.join(work, "train.npy")).astype(np.int64)
    H = [int(t) for t in np.load(os.path.join(work, "heldout.npy"))]
    mcfg = MD.Config(vocab_size=data["vocab_size"], **cfg["model"])
    model = MD.Transformer(mcfg)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
    mixers, starts, at = [], [], 0
    for ph in phases:
        if ph["seq_len"] > mcfg.seq_len:
            raise ValueError("phase window longer than the context")
        mixers.append(M.Mix(train_ids, seg, ph["seq_len"], {**c, **ph}))
        starts.append(at)
        at += ph["steps"]
    log = open(os.path.join(models, "train-log.jsonl"), "w")

    def emit(rec):
        log.write(json.dumps(rec) + "\n")
        log.flush()
        print(json.dumps(rec), flush=True)

    emit({"event": "start", "params": n_params, "steps": c["steps"],
          "phases": phases,
          "malloc_env": {k: os.environ.get(k) for k in
                         ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                          "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")},
          "threads": torch.get_num_threads(), "torch": torch.__version__})
    t_start = time.time()
    t_train = 0.0
    tokens = 0
    acc = {"loss": 0.0, "plain": 0.0, "answer_acc": 0.0, "n": 0}
    for step in range(c["steps"]):
        pi = max(i for i in range(len(phases)) if starts[i] <= step)
        mixer = mixers[pi]
        npl, npk = phases[pi]["n_plain"], phases[pi]["n_passkey"]
        t0 = time.time()
        lr = lr_at(step, c)
        for g in opt.param_groups:
            g["lr"] = lr
        w, wt = mixer.batch(rng, step - starts[pi])
        x = torch.from_numpy(w[:, :-1])
        y = torch.from_numpy(w[:, 1:])
        wt = torch.from_numpy(wt)
        logits = model(x)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                             reduction="none").view(y.shape)
        loss = (ce * wt).sum() / wt.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["grad_clip"])
        opt.step()
        with torch.no_grad():
            ans = wt[npl:npl + npk] > 1.0
            pred = logits[npl:npl + npk].argmax(-1)
            hit = (pred[ans] == y[npl:npl + npk][ans]).float().mean()
        t_train += time.time() - t0
        tokens += x.numel()
        acc["loss"] += float(loss)
        acc["plain"] += float(ce[:npl].mean())
        acc["answer_acc"] += float(hit)
        acc["n"] += 1
        last = step == c["steps"] - 1
        if (step + 1) % c["log_every"] == 0 or last:
            n = acc["n"]
            emit({"step": step + 1, "phase": pi, "lr": lr, "loss": acc["loss"] / n,
                  "plain_nats": acc["plain"] / n, "train_answer_acc": acc["answer_acc"] / n,
                  "tokens_per_s": tokens / t_train, "elapsed_s": time.time() - t_start})
            acc = {"loss": 0.0, "plain": 0.0, "answer_acc": 0.0, "n": 0}
        stop = time.time() - t_start > c["max_wall_s"] and not last
        if stop:
            emit({"event": "wall-clock guard", "step": step + 1,
                  "note": "stopped before the configured steps; not the configured run"})
        if (step + 1) % c["probe_every"] == 0 or last or stop:
            emit({"step": step + 1, "probe_passkey_acc":
                  probe(model, seg, H, mcfg.seq_len, [64, 256, 448], 32)})
        if stop:
            break
    wall = time.time() - t_start
    emit({"event": "end", "steps_done": step + 1, "wall_s": wall, "train_s": t_train,
          "tokens": tokens,
          "tokens_per_s": tokens / t_train})
    torch.save({"config": mcfg.as_dict(), "model": model.state_dict(),
                "train": c, "seed": cfg["seed"], "wall_s": wall, "steps_done": step + 1,
                "tokens_per_s": tokens / t_train, "tokens": tokens},
               os.path.join(work, "ckpt.pt"))


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__.strip())
    main(*sys.argv[1:])
