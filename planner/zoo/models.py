"""Small models written in the project (no downloads) for tracing, tests and benchmarks."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.core.errors import InputError


class MLP(nn.Module):
    def __init__(
        self, in_features: int = 256, hidden: int = 512, depth: int = 4, classes: int = 10
    ):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU(), nn.Dropout(0.1)]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.body(x)), target)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-style CNN: a stem, stages of basic blocks, global pooling, a classifier."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), blocks: int = 2, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        layers: list[nn.Module] = []
        c = widths[0]
        for i, w in enumerate(widths):
            for b in range(blocks):
                layers.append(BasicBlock(c, w, stride=2 if (i > 0 and b == 0) else 1))
                c = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = self.layers(self.stem(x))
        return F.cross_entropy(self.fc(h.mean(dim=(2, 3))), target)


class DoubleConv(nn.Sequential):
    def __init__(self, c_in: int, c_out: int):
        super().__init__(
            nn.Conv2d(c_in, c_out, 3, padding=1),
            nn.GroupNorm(4, c_out),
            nn.SiLU(),
            nn.Conv2d(c_out, c_out, 3, padding=1),
            nn.GroupNorm(4, c_out),
            nn.SiLU(),
        )


class UNet(nn.Module):
    """U-Net: an encoder, a decoder, skip connections by concatenation."""

    def __init__(self, channels: int = 3, base: int = 16, depth: int = 3, classes: int = 2):
        super().__init__()
        widths = [base * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList()
        c = channels
        for w in widths[:-1]:
            self.down.append(DoubleConv(c, w))
            c = w
        self.bottom = DoubleConv(c, widths[-1])
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for w in reversed(widths[:-1]):
            self.up.append(nn.ConvTranspose2d(w * 2, w, 2, stride=2))
            self.dec.append(DoubleConv(w * 2, w))
        self.out = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        for up, dec, skip in zip(self.up, self.dec, reversed(skips), strict=True):
            x = dec(torch.cat([up(x), skip], dim=1))
        return F.cross_entropy(self.out(x), target)


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


class DenseLayer(nn.Module):
    """BN-ReLU-Conv1x1 (bottleneck), BN-ReLU-dropout-Conv3x3 on the concatenation of its inputs.

    The dropout call is unconditional, as many implementations write it: with p = 0 it is the
    identity in eager (and a clone in the joint graph)."""

    def __init__(self, c_in: int, growth: int, bottleneck: int = 4, dropout: float = 0.0):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, bottleneck * growth, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(bottleneck * growth)
        self.conv2 = nn.Conv2d(bottleneck * growth, growth, 3, padding=1, bias=False)
        self.dropout = dropout

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, dim=1)
        x = self.conv1(F.relu(self.bn1(x)))
        x = F.dropout(F.relu(self.bn2(x)), self.dropout, self.training)
        return self.conv2(x)


class DenseBlock(nn.Module):
    def __init__(self, c_in: int, layers: int, growth: int, dropout: float = 0.0):
        super().__init__()
        self.layers = nn.ModuleList(
            DenseLayer(c_in + i * growth, growth, dropout=dropout) for i in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, dim=1)


class Transition(nn.Sequential):
    def __init__(self, c_in: int, c_out: int):
        super().__init__(
            nn.BatchNorm2d(c_in), nn.ReLU(), nn.Conv2d(c_in, c_out, 1, bias=False),
            nn.AvgPool2d(2),
        )


class DenseNet(nn.Module):
    """DenseNet-like CNN: each layer of a dense block reads the concatenation of all earlier
    feature maps of the block; transitions halve channels and resolution."""

    def __init__(self, growth: int = 12, blocks: tuple[int, ...] = (4, 4, 4), stem: int = 24,
                 dropout: float = 0.0, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, stem, 3, padding=1, bias=False)
        stages: list[nn.Module] = []
        c = stem
        for i, n in enumerate(blocks):
            stages.append(DenseBlock(c, n, growth, dropout))
            c += n * growth
            if i < len(blocks) - 1:
                stages.append(Transition(c, c // 2))
                c //= 2
        self.features = nn.Sequential(*stages)
        self.bn = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.features(self.stem(x))))
        return F.cross_entropy(self.fc(h.mean(dim=(2, 3))), target)


class Bottleneck(nn.Module):
    """ResNet-50's bottleneck: 1×1 reduce, 3×3, 1×1 expand (×4), BatchNorm, ReLU, residual
    (projected when the shape changes)."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.down(x))


class ResNet50Like(nn.Module):
    """ResNet-50's layout (stages of 3, 4, 6, 3 bottlenecks) at a small base width."""

    def __init__(self, base: int = 8, stages: tuple[int, ...] = (3, 4, 6, 3), classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, base, 3, padding=1, bias=False), nn.BatchNorm2d(base), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        cin = base
        for i, count in enumerate(stages):
            width = base * 2**i
            for j in range(count):
                blocks.append(Bottleneck(cin, width, stride=2 if i and j == 0 else 1))
                cin = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return F.cross_entropy(self.fc(x.mean(dim=(2, 3))), target)


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


def resnet50_like(batch_size: int = 4, image: int = 32, base: int = 8
                  ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(model, inputs) of `ResNet50Like` at a small width."""
    torch.manual_seed(0)
    model = ResNet50Like(base)
    return model, (torch.randn(batch_size, 3, image, image), torch.randint(0, 10, (batch_size,)))
