"""The Llama-architecture model the trainer fits, written to match sieve's and llama.cpp's
`llama` forward pass: RMSNorm, RoPE in the interleaved-pairs layout (llama.cpp's "normal" mode,
so no Q/K permutation at export), grouped-query attention, SwiGLU feed-forward, untied output.
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 4096
    dim: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 768
    context: int = 32768
    rope_base: float = 1e9
    norm_eps: float = 1e-5

    @property
    def head_dim(self):
        return self.dim // self.heads

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_angles(cfg, positions):
    """Angles (batch, T, head_dim / 2) for integer positions (batch, T)."""
    inv = cfg.rope_base ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    return (positions.to(torch.float64)[..., None] * inv).to(torch.float32)


def apply_rope(x, angles):
    """x: (batch, T, heads, head_dim); rotates the pairs (2i, 2i + 1)."""
    cos = angles.cos()[:, :, None, :]
    sin = angles.sin()[:, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.wq = nn.Linear(cfg.dim, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, cfg.dim, bias=False)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w_gate = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w_down = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def attention(self, x, angles, mask, return_weights=False):
        cfg = self.cfg
        b, t, _ = x.shape
        hd = cfg.head_dim
        group = cfg.heads // cfg.kv_heads
        h = self.attn_norm(x)
        q = apply_rope(self.wq(h).view(b, t, cfg.heads, hd), angles)
        k = apply_rope(self.wk(h).view(b, t, cfg.kv_heads, hd), angles)
        v = self.wv(h).view(b, t, cfg.kv_heads, hd)
        # The query heads of one KV head stacked as rows: (b * kv_heads, group * t, hd), so K and V
        # are not copied per query head; the causal mask is repeated per group.
        q = q.view(b, t, cfg.kv_heads, group, hd).permute(0, 2, 3, 1, 4).reshape(b * cfg.kv_heads, group * t, hd)
        k = k.permute(0, 2, 3, 1).reshape(b * cfg.kv_heads, hd, t)
        v = v.permute(0, 2, 1, 3).reshape(b * cfg.kv_heads, t, hd)
        scores = torch.baddbmm(mask.repeat(group, 1), q, k, alpha=1.0 / math.sqrt(hd))
        weights = scores.softmax(-1)
        out = (weights @ v).view(b, cfg.kv_heads, group, t, hd).permute(0, 3, 1, 2, 4).reshape(b, t, cfg.heads * hd)
        if return_weights:
            weights = weights.view(b, cfg.kv_heads * group, t, t)
        return self.wo(out), (weights if return_weights else None)

    def forward(self, x, angles, mask, return_weights=False):
        a, w = self.attention(x, angles, mask, return_weights)
        x = x + a
        h = self.ffn_norm(x)
        x = x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))
        return x, w


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens, positions, return_weights=False):
        t = tokens.shape[1]
        mask = torch.full((t, t), float("-inf")).triu(1)
        angles = rope_angles(self.cfg, positions)
        x = self.embed(tokens)
        all_weights = []
        for block in self.blocks:
            x, w = block(x, angles, mask, return_weights)
            all_weights.append(w)
        logits = self.output(self.norm(x))
        return (logits, all_weights) if return_weights else logits
