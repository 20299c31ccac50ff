"""Small sequence models written in the project (no downloads) for tracing, tests and
benchmarks: a GPT, a ViT, an MLP-Mixer and a Llama-like decoder (transformers' own where
installed). The convolutional ones are planner.zoo.models."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.core.errors import InputError


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = self.attn_drop(att.masked_fill(~mask, float("-inf")).softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.resid_drop(self.proj(y))


class DecoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-style decoder with dropout; returns the language-model loss."""

    def __init__(
        self,
        vocab: int = 512,
        dim: int = 128,
        layers: int = 4,
        heads: int = 4,
        context: int = 64,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(DecoderBlock(dim, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for block in self.h:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """A Vision Transformer: patch embedding, class token, encoder blocks, a classifier."""

    def __init__(
        self,
        image: int = 32,
        patch: int = 4,
        dim: int = 128,
        layers: int = 4,
        heads: int = 4,
        classes: int = 10,
    ):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(ViTBlock(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.ln(x[:, 0])), target)


class MixerBlock(nn.Module):
    """Token mixing (an MLP across patches) then channel mixing, each pre-norm and residual."""

    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int,
                 dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(
            nn.Linear(tokens, token_hidden), nn.GELU(), nn.Dropout(dropout),
            nn.Linear(token_hidden, tokens), nn.Dropout(dropout),
        )
        self.ln2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(
            nn.Linear(dim, channel_hidden), nn.GELU(), nn.Dropout(dropout),
            nn.Linear(channel_hidden, dim), nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.ln1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.ln2(x))


class Mixer(nn.Module):
    """MLP-Mixer with dropout: patch embedding, mixer blocks, pooling, a classifier."""

    def __init__(self, image: int = 32, patch: int = 4, dim: int = 128, blocks: int = 4,
                 dropout: float = 0.1, classes: int = 10):
        super().__init__()
        tokens = (image // patch) ** 2
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.blocks = nn.ModuleList(
            MixerBlock(tokens, dim, tokens * 2, dim * 4, dropout) for _ in range(blocks)
        )
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.ln(x).mean(dim=1)), target)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (the rotate-half form Llama uses)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: RMSNorm, causal attention with rotary embeddings, RMSNorm,
    SwiGLU MLP, residuals."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.attn_norm(x)
        q, k, v = (
            z(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for z in (self.q, self.k, self.v)
        )
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class LlamaLike(nn.Module):
    """A Llama-style decoder written in the project (RMSNorm, rotary embeddings, SwiGLU), for
    when transformers is not installed; returns the language-model loss."""

    def __init__(self, vocab: int = 256, dim: int = 64, layers: int = 32, heads: int = 4,
                 hidden: int = 172, context: int = 32):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.h = nn.ModuleList(LlamaBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(context).float(), inv)
        self.register_buffer("cos", torch.cat((angles, angles), dim=-1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), dim=-1).sin(), persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        cos: torch.Tensor = self.cos  # type: ignore[assignment]
        sin: torch.Tensor = self.sin  # type: ignore[assignment]
        cos, sin = cos[:t], sin[:t]
        x = self.tok(idx)
        for block in self.h:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def llama_like(batch_size: int = 2, context: int = 32, dim: int = 64, layers: int = 32,
               vocab: int = 256, config_overrides: dict[str, Any] | None = None
               ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(model, inputs) of a 32-layer Llama-like decoder at a small width: transformers'
    LlamaForCausalLM from a LlamaConfig (random weights, no download; `config_overrides` sets
    any LlamaConfig field over these sizes) when transformers is installed, else `LlamaLike`
    (the same structure written here)."""
    torch.manual_seed(0)
    idx = torch.randint(0, vocab, (batch_size, context))
    try:
        import transformers
    except ImportError:
        if config_overrides:
            raise InputError(
                "config overrides need transformers (pip install transformers)",
                field="config_overrides",
            ) from None
        return LlamaLike(vocab, dim, layers, 4, int(8 * dim / 3), context), (idx, idx.roll(-1, 1))
    from planner.zoo.hf import TRACEABLE_CONFIG, LMLoss, hf_config

    config = hf_config("llama", {
        "vocab_size": vocab, "hidden_size": dim, "intermediate_size": int(8 * dim / 3),
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": context, **TRACEABLE_CONFIG, **(config_overrides or {}),
    })
    return LMLoss(transformers.LlamaForCausalLM(config)), (idx,)
