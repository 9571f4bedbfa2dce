# SPDX-License-Identifier: MIT
"""test_python_example.py SOURCE_DIR - the PyTorch example of README.md and
docs/python.md, run as written.

Each file's block marked `<!-- python-example -->` is executed with two
names defined, as the example expects them: `input_ids`, the first 256
tokens of models/heldout.txt ([1, 256]), and `model`, the repository's own
trained model (models/kjv.bin, through tools/train/export.py) behind the
interface of a Hugging Face causal LM: model(input_ids,
output_attentions=True).attentions is one [batch, heads, T, T] tensor per
layer, the softmax weights its attention computes. Checked: the example
prints one line per registered policy that reads no keys, each a
canonical spec and a mean retained mass in [0, 1]; full keeps everything
(1.0000); the figures equal kvevict.evaluate on the .npy file of the same
attention, which kvevict's CLI reads. Run by CTest with /usr/bin/python3; exits 77 (skipped, reason
printed) without numpy or torch.

Then the same model evaluated live (Trace.from_callback): a callable that
computes one decode step's attention of every layer and head from the
model's queries and keys (torch tensors, O(T) each, never [L, H, T, T]),
asked once per step in order by evaluate over every head, gives the
figures of the array of the rows it returns, bit for bit.
"""
import contextlib
import io
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import types

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import {e.name} (Debian: python3-numpy, "
          f"python3-torch); the example needs both")
    sys.exit(77)

SOURCE = pathlib.Path(sys.argv[1])
KVEVICT = sys.argv[2]
sys.path.insert(0, str(SOURCE / "tools" / "train"))
import export as E  # noqa: E402  tools/train: the checkpoint as a torch module
import model as MD  # noqa: E402
import tokenizer as TK  # noqa: E402

import kvevict  # noqa: E402


class WithAttentions(torch.nn.Module):
    """tools/train's Transformer with a Hugging Face-style forward: returns
    .logits and, with output_attentions=True, .attentions, the weights of
    every layer's attention, recomputed as model.Attention computes them."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, output_attentions=False):
        m = self.m
        B, T = input_ids.shape
        h = m.tok_embeddings(input_ids)
        cos, sin = m.freqs_cos[:T], m.freqs_sin[:T]
        attentions = []
        for layer in m.layers:
            a, z = layer.attention, layer.attention_norm(h)
            q = MD.rotate(a.wq(z).view(B, T, a.h, a.s), cos, sin).transpose(1, 2)
            k = MD.rotate(a.wk(z).view(B, T, a.k, a.s), cos, sin)
            k = k.repeat_interleave(a.h // a.k, dim=2).transpose(1, 2)
            scores = (q * (1.0 / math.sqrt(a.s))) @ k.transpose(2, 3) + m.mask[:T, :T]
            attentions.append(F.softmax(scores, dim=-1))
            h = layer(h, cos, sin, m.mask)
        return types.SimpleNamespace(logits=m.output(m.norm(h)),
                                     attentions=tuple(attentions) if output_attentions else None)


def model_qk(model, input_ids):
    """Every layer's queries and keys of input_ids (batch 0), after the rotary
    embedding, the keys repeated to the query heads: [L, H, T, S] each."""
    m, (B, T) = model.m, input_ids.shape
    qs, ks = [], []
    with torch.no_grad():
        h = m.tok_embeddings(input_ids)
        cos, sin = m.freqs_cos[:T], m.freqs_sin[:T]
        for layer in m.layers:
            a, z = layer.attention, layer.attention_norm(h)
            q = MD.rotate(a.wq(z).view(B, T, a.h, a.s), cos, sin).transpose(1, 2)
            k = MD.rotate(a.wk(z).view(B, T, a.k, a.s), cos, sin)
            qs.append(q[0])
            ks.append(k.repeat_interleave(a.h // a.k, dim=2).transpose(1, 2)[0])
            h = layer(h, cos, sin, m.mask)
    return torch.stack(qs), torch.stack(ks)


def live_check(model, input_ids):
    """The model's attention as a live trace: the figures of the array of
    the same rows, one call per step, in order."""
    q, k = model_qk(model, input_ids)
    L, H, T, S = q.shape
    asked = []

    def step_attention(t):  # what decode step t computes: [L, H, t + 1]
        asked.append(t)
        logits = torch.einsum("lhs,lhks->lhk", q[:, :, t], k[:, :, :t + 1]) / math.sqrt(S)
        return torch.softmax(logits, dim=-1)

    rows = np.zeros((L, H, T, T), dtype=np.float32)
    for t in range(T):
        rows[:, :, t, :t + 1] = step_attention(t).numpy()
    asked.clear()
    specs = ["h2o:budget=64", "tova:budget=64", "streaming:budget=64"]
    with kvevict.Trace.from_callback(step_attention, H, T, layers=L, normalize=True) as live, \
            kvevict.Trace.from_array(rows, normalize=True) as mem:
        got = kvevict.evaluate(live, specs, heads=L * H, per_head=True)
        want = kvevict.evaluate(mem, specs, heads=L * H, per_head=True)
    drop = ("ns_per_step", "trace")
    clean = lambda rs: repr([{k: (v if k != "per_head" else [
        {a: b for a, b in x.items() if a not in drop} for x in v]) for k, v in r.items()
        if k not in drop} for r in rs])
    if clean(got) != clean(want):
        print(f"FAIL: live trace: {got} differs from the array's {want}")
        return 1
    if asked != list(range(T)):
        print(f"FAIL: live trace: the steps asked were {asked[:10]}..., want 0 .. {T - 1} once")
        return 1
    print(f"live trace: {L} x {H} heads of {T} steps, {len(specs)} policies, the array's figures, "
          f"one call per step")
    return 0


def example(path):
    text = path.read_text()
    found = re.search(r"<!-- python-example[^\n]*-->\n```python\n(.*?)\n```", text, re.S)
    if not found:
        sys.exit(f"{path}: no block marked <!-- python-example -->")
    return found.group(1)


def main():
    tok = TK.Tokenizer.read(str(SOURCE / "models" / "tokenizer.bin"), 1088)
    text = (SOURCE / "models" / "heldout.txt").read_text()[:4000]
    input_ids = torch.tensor([tok.encode(text, bos=True)[:256]])
    model = WithAttentions(E.to_torch(str(SOURCE / "models" / "kjv.bin")))
    # the policies that read keys (queries, values) need a q/K trace: attention alone has none
    names = [p["name"] for p in kvevict.policies() if p["reads"] in ("attention", "nothing")]
    fails = 0
    for doc in (SOURCE / "README.md", SOURCE / "docs" / "python.md"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            scope = {"model": model, "input_ids": input_ids}
            exec(compile(example(doc), str(doc), "exec"), scope)
        lines = out.getvalue().splitlines()
        printed = dict(line.split() for line in lines)
        print(f"{doc.name}: the example printed {len(lines)} lines")
        if sorted(p.split(":")[0] for p in printed) != sorted(names):
            print(f"FAIL: {doc.name}: want a line per policy {names}, got {lines}")
            fails += 1
            continue
        full = [v for p, v in printed.items() if p.startswith("full:")]
        if full != ["1.0000"]:
            print(f"FAIL: {doc.name}: full should keep every weight, got {full}")
            fails += 1
        # The same figures from the .npy file of the same attention, which is
        # what `kvevict eval --trace FILE` reads.
        with torch.no_grad():
            attentions = model(input_ids, output_attentions=True).attentions
        attn = np.ascontiguousarray(torch.stack(attentions)[:, 0].numpy())
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "attn.npy")
            np.save(path, attn)
            for spec, shown in printed.items():
                with kvevict.Trace.open(path, normalize=True) as tr:
                    rows = kvevict.evaluate(tr, [spec], head=None)
                mean = sum(r["retained_mass"] for r in rows) / len(rows)
                if f"{mean:.4f}" != shown or not 0.0 <= mean <= 1.0:
                    print(f"FAIL: {doc.name}: {spec}: printed {shown}, the .npy gives {mean:.4f}")
                    fails += 1
            cli = subprocess.run([KVEVICT, "eval", "--trace", path, "--normalize", "--policy",
                                  "h2o:budget=64", "--json"], capture_output=True, text=True,
                                 check=True).stdout
            mass = re.search(r'"retained_mass": ([-+0-9.e]+)', cli)
            h2o = printed.get("h2o:budget=64,recent_window=32")
            if not mass or f"{float(mass.group(1)):.4f}" != h2o:
                print(f"FAIL: {doc.name}: kvevict eval gives {cli.strip()}, the example {h2o}")
                fails += 1
    fails += live_check(model, input_ids)
    print(f"test_python_example: {fails} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
