"""A Llama-style decoder written in the project (no transformers): RMSNorm, rotary position
embeddings, grouped-query attention through scaled_dot_product_attention, a SwiGLU MLP and an
optionally tied LM head. Attribute names follow Hugging Face's Llama where natural. Built by
the factory planner.zoo.llama (this module is not named llama.py: importing it would replace
that factory, an attribute of the package, with the module)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def llama_hidden(dim: int, multiple_of: int = 32) -> int:
    """The Llama MLP width: 2/3 of 4*dim (SwiGLU's three matrices cost what two 4*dim ones
    would), rounded up to a multiple of `multiple_of`."""
    hidden = 2 * 4 * dim // 3
    return multiple_of * -(-hidden // multiple_of)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope(t: int, head_dim: int, device: torch.device, theta: float = 10000.0
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of shape (t, head_dim), computed from the positions in forward (no buffer,
    so any sequence length works and the model's state is its parameters only)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(t, device=device).float(), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half form, as Hugging Face's Llama."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Causal grouped-query attention: `kv_heads` key/value heads, each shared by
    heads // kv_heads query heads."""

    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        if dim % heads or heads % kv_heads:
            raise ValueError(f"dim {dim}, heads {heads}, kv_heads {kv_heads} do not divide")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Repeat each kv head for its group of query heads (explicit, not enable_gqa, so
        # the traced graph is the same on every torch version and backend).
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm x), then x + mlp(norm x)."""

    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, eps: float):
        super().__init__()
        self.attn_norm = RMSNorm(dim, eps)
        self.attn = Attention(dim, heads, kv_heads)
        self.mlp_norm = RMSNorm(dim, eps)
        self.mlp = MLP(dim, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Llama-style decoder; forward(idx, targets) returns the language-model loss."""

    def __init__(self, vocab: int = 32000, dim: int = 64, layers: int = 2, heads: int = 4,
                 kv_heads: int = 2, hidden: int | None = None, tie_embeddings: bool = False,
                 eps: float = 1e-6):
        super().__init__()
        self.head_dim = dim // heads
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            Block(dim, heads, kv_heads, hidden or llama_hidden(dim), eps) for _ in range(layers)
        )
        self.norm = RMSNorm(dim, eps)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tie_embeddings:
            self.head.weight = self.embed.weight  # one Parameter, gradients from both uses

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        cos, sin = rope(idx.shape[1], self.head_dim, idx.device)
        x = self.embed(idx)
        for block in self.layers:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
