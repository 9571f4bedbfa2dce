"""llama2.c checkpoints: writers, an independent reader, a numpy forward pass.

Legacy format (llama2.c export.py legacy_export, "version 0"), little endian:
  7 int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
           (vocab_size negative when an unshared classifier follows)
  float32, in order (L = n_layers, S = dim / n_heads, KV = n_kv_heads * S):
    token_embedding [V, dim]
    rms_att [L, dim]  wq [L, dim, dim]  wk [L, KV, dim]  wv [L, KV, dim]
    wo [L, dim, dim]  rms_ffn [L, dim]  w1 [L, hidden, dim]
    w2 [L, dim, hidden]  w3 [L, hidden, dim]  rms_final [dim]
    freq_cis_real [seq_len, S/2]  freq_cis_imag [seq_len, S/2]
    wcls [V, dim]   (only when untied)
Version 1 (llama2.c export.py version1_export):
  uint32 magic 0x616b3432 ("ak42"), int32 version 1, the 7 int32 above with
  vocab_size positive, uint8 shared_classifier, zeros up to byte 256; then
  float32: rms_att [L, dim], rms_ffn [L, dim], rms_final [dim],
  token_embedding [V, dim], wq, wk, wv, wo, w1, w2, w3 (each [L, ...] as
  above), wcls [V, dim] only when not shared. No rotary tables.

forward_numpy() is a second implementation of run.c's forward pass, one
position at a time with a key/value cache, written from the file's arrays
alone (it never touches torch), in float32.
"""

import struct

import numpy as np
import torch

import model as MD

MAGIC = 0x616B3432


def _layers(model, attr):
    out = []
    for layer in model.layers:
        obj = layer
        for a in attr.split("."):
            obj = getattr(obj, a)
        out.append(obj.detach().float().numpy())
    return out


def _f32(arrs):
    return b"".join(np.ascontiguousarray(a, dtype="<f4").tobytes() for a in arrs)


def _params(model):
    c = model.cfg
    return [c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len]


def _shared(model):
    return model.output.weight is model.tok_embeddings.weight or torch.equal(
        model.output.weight, model.tok_embeddings.weight)


def write_legacy(model, path):
    shared = _shared(model)
    p = _params(model)
    if not shared:
        p[5] = -p[5]
    cos, sin = MD.rope_tables(model.cfg.seq_len, model.cfg.dim // model.cfg.n_heads)
    parts = [model.tok_embeddings.weight.detach().numpy()]
    for name in ("attention_norm.weight", "attention.wq.weight", "attention.wk.weight",
                 "attention.wv.weight", "attention.wo.weight", "ffn_norm.weight",
                 "feed_forward.w1.weight", "feed_forward.w2.weight",
                 "feed_forward.w3.weight"):
        parts += _layers(model, name)
    parts += [model.norm.weight.detach().numpy(), cos, sin]
    if not shared:
        parts.append(model.output.weight.detach().numpy())
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", *p))
        f.write(_f32(parts))


def write_v1(model, path):
    shared = _shared(model)
    head = struct.pack("<Ii", MAGIC, 1) + struct.pack("<7i", *_params(model))
    head += struct.pack("<B", int(shared))
    head += b"\0" * (256 - len(head))
    parts = _layers(model, "attention_norm.weight") + _layers(model, "ffn_norm.weight")
    parts += [model.norm.weight.detach().numpy(), model.tok_embeddings.weight.detach().numpy()]
    for name in ("attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
                 "attention.wo.weight", "feed_forward.w1.weight",
                 "feed_forward.w2.weight", "feed_forward.w3.weight"):
        parts += _layers(model, name)
    if not shared:
        parts.append(model.output.weight.detach().numpy())
    with open(path, "wb") as f:
        f.write(head)
        f.write(_f32(parts))


def read(path):
    """Parses either format from the bytes alone: (config dict, weights dict)."""
    data = open(path, "rb").read()
    if len(data) >= 8 and struct.unpack_from("<I", data, 0)[0] == MAGIC:
        version = struct.unpack_from("<i", data, 4)[0]
        if version != 1:
            raise ValueError("version %d not supported" % version)
        dim, hid, L, H, K, V, T = struct.unpack_from("<7i", data, 8)
        shared = bool(data[36])
        off = 256
    else:
        version = 0
        dim, hid, L, H, K, V, T = struct.unpack_from("<7i", data, 0)
        shared = V > 0
        V = abs(V)
        off = 28
    S = dim // H
    KV = K * S
    f = np.frombuffer(data, dtype="<f4", offset=off)
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        if pos + n > f.size:
            raise ValueError("file too short")
        a = f[pos:pos + n].reshape(shape).astype(np.float32)
        pos += n
        return a

    w = {}
    if version == 0:
        w["emb"] = take(V, dim)
        w["rms_att"] = take(L, dim)
        w["wq"] = take(L, dim, dim)
        w["wk"] = take(L, KV, dim)
        w["wv"] = take(L, KV, dim)
        w["wo"] = take(L, dim, dim)
        w["rms_ffn"] = take(L, dim)
        w["w1"] = take(L, hid, dim)
        w["w2"] = take(L, dim, hid)
        w["w3"] = take(L, hid, dim)
        w["rms_final"] = take(dim)
        w["freq_real"] = take(T, S // 2)
        w["freq_imag"] = take(T, S // 2)
    else:
        w["rms_att"] = take(L, dim)
        w["rms_ffn"] = take(L, dim)
        w["rms_final"] = take(dim)
        w["emb"] = take(V, dim)
        w["wq"] = take(L, dim, dim)
        w["wk"] = take(L, KV, dim)
        w["wv"] = take(L, KV, dim)
        w["wo"] = take(L, dim, dim)
        w["w1"] = take(L, hid, dim)
        w["w2"] = take(L, dim, hid)
        w["w3"] = take(L, hid, dim)
    w["wcls"] = w["emb"] if shared else take(V, dim)
    if pos != f.size or (len(data) - off) % 4:
        raise ValueError("%d bytes left over in %s" % (len(data) - off - 4 * pos, path))
    cfg = dict(dim=dim, hidden_dim=hid, n_layers=L, n_heads=H, n_kv_heads=K,
               vocab_size=V, seq_len=T, shared=shared, version=version)
    return cfg, w


def _rms(x, g):
    ss = np.float32(np.mean(x.astype(np.float64) ** 2)) + np.float32(1e-5)
    return (g * (x / np.sqrt(ss))).astype(np.float32)


def forward_numpy(cfg, w, tokens):
    """Logits [len(tokens), V] (float32), position by position as run.c."""
    dim, L, H, K = cfg["dim"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"]
    S = dim // H
    rep = H // K
    if "freq_real" in w:
        fr, fi = w["freq_real"], w["freq_imag"]
    else:
        fr, fi = MD.rope_tables(cfg["seq_len"], S)
    kc = np.zeros((L, len(tokens), K, S), np.float32)
    vc = np.zeros((L, len(tokens), K, S), np.float32)
    out = np.zeros((len(tokens), cfg["vocab_size"]), np.float32)
    for t, tok in enumerate(tokens):
        x = w["emb"][tok].copy()
        for l in range(L):
            h = _rms(x, w["rms_att"][l])
            q = (w["wq"][l] @ h).reshape(H, S // 2, 2)
            k = (w["wk"][l] @ h).reshape(K, S // 2, 2)
            v = (w["wv"][l] @ h).reshape(K, S)
            c, s = fr[t], fi[t]
            q = np.stack([q[..., 0] * c - q[..., 1] * s, q[..., 0] * s + q[..., 1] * c], -1).reshape(H, S)
            k = np.stack([k[..., 0] * c - k[..., 1] * s, k[..., 0] * s + k[..., 1] * c], -1).reshape(K, S)
            kc[l, t], vc[l, t] = k, v
            att_out = np.zeros((H, S), np.float32)
            for hh in range(H):
                sc = (kc[l, :t + 1, hh // rep] @ q[hh]) / np.float32(np.sqrt(S))
                sc = np.exp(sc - sc.max())
                sc /= sc.sum()
                att_out[hh] = sc @ vc[l, :t + 1, hh // rep]
            x = x + w["wo"][l] @ att_out.reshape(dim)
            h = _rms(x, w["rms_ffn"][l])
            a = w["w1"][l] @ h
            b = w["w3"][l] @ h
            x = x + w["w2"][l] @ ((a / (np.float32(1) + np.exp(-a))) * b)
        out[t] = w["wcls"] @ _rms(x, w["rms_final"])
    return out


def torch_logits(model, tokens):
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([tokens]))[0].numpy()


def validate(model, path, tokens):
    """Max |numpy(file) - torch| over the logits of tokens; raises when the
    file's header or arrays disagree with the model."""
    cfg, w = read(path)
    c = model.cfg
    if (cfg["dim"], cfg["hidden_dim"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"],
            cfg["vocab_size"], cfg["seq_len"], cfg["shared"]) != (
            c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
            c.seq_len, _shared(model)):
        raise ValueError("header of %s disagrees with the model" % path)
    ref = torch_logits(model, tokens)
    got = forward_numpy(cfg, w, tokens)
    return float(np.max(np.abs(ref - got))), float(np.max(np.abs(ref)))


def format_logits_jsonl(tokens, logits):
    """The lines of `kvevict lm logits`: {"pos": t, "token": id, "logits": [...]},
    each value the shortest decimal that reads back as the same float32."""
    lines = []
    for t, tok in enumerate(tokens):
        vals = ", ".join(repr_f32(v) for v in logits[t])
        lines.append('{"pos": %d, "token": %d, "logits": [%s]}' % (t, int(tok), vals))
    return "\n".join(lines) + "\n"


def repr_f32(v):
    v = np.float32(v)
    if not np.isfinite(v):
        raise ValueError("non-finite logit")
    s = np.format_float_positional(v, unique=True, trim="-") if 1e-4 <= abs(v) < 1e16 or v == 0 \
        else np.format_float_scientific(v, unique=True, trim="-")
    assert np.float32(float(s)) == v
    return s


def to_torch(path):
    """A torch Transformer holding the weights of a checkpoint file."""
    cfg, w = read(path)
    m = MD.Transformer(MD.Config(dim=cfg["dim"], hidden_dim=cfg["hidden_dim"],
                                 n_layers=cfg["n_layers"], n_heads=cfg["n_heads"],
                                 n_kv_heads=cfg["n_kv_heads"], vocab_size=cfg["vocab_size"],
                                 seq_len=cfg["seq_len"], tied=cfg["shared"]))
    with torch.no_grad():
        m.tok_embeddings.weight.copy_(torch.from_numpy(w["emb"]))
        if not cfg["shared"]:
            m.output.weight.copy_(torch.from_numpy(w["wcls"]))
        m.norm.weight.copy_(torch.from_numpy(w["rms_final"]))
        for l, layer in enumerate(m.layers):
            layer.attention_norm.weight.copy_(torch.from_numpy(w["rms_att"][l]))
            layer.ffn_norm.weight.copy_(torch.from_numpy(w["rms_ffn"][l]))
            for name, mod in (("wq", layer.attention.wq), ("wk", layer.attention.wk),
                              ("wv", layer.attention.wv), ("wo", layer.attention.wo),
                              ("w1", layer.feed_forward.w1), ("w2", layer.feed_forward.w2),
                              ("w3", layer.feed_forward.w3)):
                mod.weight.copy_(torch.from_numpy(w[name][l]))
    return m.eval()
