"""Small models several test files build: imports no torch until a model is made, so torch-free
tests may import this module."""

from __future__ import annotations

from typing import Any

# The tiny GPT most tests trace: 2 sequences of 8 tokens, width 16, 1 block, 32 tokens.
TINY_GPT: dict[str, Any] = {"batch_size": 2, "context": 8, "dim": 16, "layers": 1, "vocab": 32}


def tiny_gpt(**overrides: Any) -> Any:
    """`planner.zoo.gpt` at TINY_GPT's sizes, any of them (or `dropout`) overridden: (model,
    inputs). Without `dropout` the zoo's default (0.1) applies."""
    from planner import zoo

    return zoo.gpt(**{**TINY_GPT, **overrides})


def attention(dropout: float | None) -> Any:
    """softmax -> dropout -> matmul: both the softmax output and the matmul input are saved.
    `dropout=None`: no dropout call at all; 0.0: an identity dropout."""
    from torch import nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qk = nn.Linear(16, 32)
            self.dropout = dropout

        def forward(self, x: Any) -> Any:
            q, k = self.qk(x).split(16, dim=-1)
            p = (q @ k.transpose(-2, -1)).softmax(dim=-1)
            if self.dropout is not None:
                p = nn.functional.dropout(p, self.dropout, self.training)
            return (p @ x).sum()

    return Attention()
