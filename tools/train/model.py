"""The transformer of llama2.c's model.py / run.c, in torch, for training.

Shapes: B batch, T positions, D = dim, H query heads, K key/value heads,
S = head size = D / H, F = hidden_dim, V = vocab_size.

Forward pass, exactly as run.c computes it (float32):
  x = embedding[token]
  per layer:  h = rmsnorm(x) * attention_norm          (eps 1e-5, mean of squares)
              q = h Wq^T (H*S), k = h Wk^T (K*S), v = h Wv^T (K*S)
              rotate q and k: in each head, pair (2j, 2j+1) by the angle
                  pos * freq_j, freq_j = 1 / 10000^(2j / S)   (float32, as run.c)
              query head i attends over key/value head i / (H / K), causal,
                  scores q.k / sqrt(S), softmax
              x += (concat of heads) Wo^T
              h = rmsnorm(x) * ffn_norm
              x += W2 (silu(W1 h) * W3 h)
  logits = (rmsnorm(x) * norm) Wcls^T, Wcls = embedding when tied.
"""

import math
from dataclasses import dataclass, asdict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    dim: int = 128
    hidden_dim: int = 384
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 1088
    seq_len: int = 512
    tied: bool = True

    def as_dict(self):
        return asdict(self)


def rope_tables(seq_len, head_size):
    """(cos, sin), each float32 [seq_len, head_size/2], by run.c's formula:
    freq = 1.0f / powf(10000.0f, head_dim / (float)head_size) with head_dim
    the even index 2j, angle = pos * freq in float32, then cosf / sinf.
    These are also the freq_cis_real / freq_cis_imag tables of the legacy
    checkpoint."""
    j2 = np.arange(0, head_size, 2, dtype=np.float32)
    expo = j2 / np.float32(head_size)
    freq = (np.float32(1.0) /
            np.power(10000.0, expo.astype(np.float64)).astype(np.float32))
    pos = np.arange(seq_len, dtype=np.float32)[:, None]
    ang = (pos * freq[None, :]).astype(np.float32)
    return (np.cos(ang.astype(np.float64)).astype(np.float32),
            np.sin(ang.astype(np.float64)).astype(np.float32))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate(x, cos, sin):
    """x [B, T, heads, S]; rotates pairs (2j, 2j+1) by cos/sin [T, S/2]."""
    xr = x.reshape(*x.shape[:-1], -1, 2)
    x0, x1 = xr[..., 0], xr[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.h, self.k = cfg.n_heads, cfg.n_kv_heads
        self.s = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, self.h * self.s, bias=False)
        self.wk = nn.Linear(cfg.dim, self.k * self.s, bias=False)
        self.wv = nn.Linear(cfg.dim, self.k * self.s, bias=False)
        self.wo = nn.Linear(self.h * self.s, cfg.dim, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = rotate(self.wq(x).view(B, T, self.h, self.s), cos, sin)
        k = rotate(self.wk(x).view(B, T, self.k, self.s), cos, sin)
        v = self.wv(x).view(B, T, self.k, self.s)
        rep = self.h // self.k
        k = k.repeat_interleave(rep, dim=2)          # query head i -> kv head i / rep
        v = v.repeat_interleave(rep, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        # q is scaled before the product (cheaper on [B, H, T, T] than dividing
        # the scores, as run.c does; the two differ by float rounding only)
        att = (q * (1.0 / math.sqrt(self.s))) @ k.transpose(2, 3) + mask[:T, :T]
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.h * self.s)
        return self.wo(y)


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.dim % cfg.n_heads or cfg.n_heads % cfg.n_kv_heads or (cfg.dim // cfg.n_heads) % 2:
            raise ValueError("dim, n_heads and n_kv_heads do not divide")
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tied:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(cfg.seq_len, cfg.dim // cfg.n_heads)
        self.register_buffer("freqs_cos", torch.from_numpy(cos), persistent=False)
        self.register_buffer("freqs_sin", torch.from_numpy(sin), persistent=False)
        mask = torch.full((cfg.seq_len, cfg.seq_len), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)
        # llama2.c's initialisation: N(0, 0.02), residual projections scaled.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("wo.weight") or name.endswith("w3.weight"):
                    std = 0.02 / math.sqrt(2 * cfg.n_layers)
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, tokens):
        """tokens [B, T] (T <= seq_len, position 0 first) -> logits [B, T, V]."""
        T = tokens.shape[1]
        x = self.tok_embeddings(tokens)
        cos, sin = self.freqs_cos[:T], self.freqs_sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin, self.mask)
        return self.output(self.norm(x))
