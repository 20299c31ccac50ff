"""Model zoo: factories returning (model, sample inputs), e.g. `planner-cli trace planner.zoo:mlp`.

Each factory takes `batch_size` and size keywords; torch is imported only when one is called.
Models return their training loss, so the default loss (the output itself) applies.
"""

from __future__ import annotations

from typing import Any

ZOO = ("mlp", "resnet", "unet", "gpt", "vit", "mixer", "densenet", "llama_like", "resnet50_like")

# Sizes small enough for tests (a trace in a second or two on one CPU core).
TINY: dict[str, dict[str, Any]] = {
    "mlp": dict(batch_size=16, in_features=32, hidden=64, depth=2),
    "resnet": dict(batch_size=4, image=16, widths=(8, 16), blocks=1),
    "unet": dict(batch_size=2, image=32, base=8, depth=2),
    "gpt": dict(batch_size=4, context=16, dim=32, layers=2, vocab=64),
    "vit": dict(batch_size=4, image=16, dim=32, layers=2),
    "mixer": dict(batch_size=4, image=16, patch=4, dim=32, blocks=2),
    "densenet": dict(batch_size=4, image=16, growth=4, blocks=(3, 3), stem=8),
    "llama_like": dict(batch_size=2, context=8, dim=16, layers=2, vocab=32),
    "resnet50_like": dict(batch_size=2, image=16, base=4),
}


def tiny(name: str, **overrides: Any) -> Any:
    """(model, inputs) of zoo model `name` at test size."""
    return globals()[name](**{**TINY[name], **overrides})


def _seed() -> Any:
    import torch

    torch.manual_seed(0)
    return torch


def mlp(batch_size: int = 64, in_features: int = 256, hidden: int = 512, depth: int = 4) -> Any:
    torch = _seed()
    from planner.zoo.models import MLP

    model = MLP(in_features, hidden, depth)
    return model, (torch.randn(batch_size, in_features), torch.randint(0, 10, (batch_size,)))


def resnet(batch_size: int = 8, image: int = 32, widths: tuple[int, ...] = (16, 32, 64),
           blocks: int = 2) -> Any:
    torch = _seed()
    from planner.zoo.models import ResNet

    model = ResNet(tuple(widths), blocks)
    return model, (torch.randn(batch_size, 3, image, image), torch.randint(0, 10, (batch_size,)))


def unet(batch_size: int = 4, image: int = 64, base: int = 16, depth: int = 3) -> Any:
    torch = _seed()
    from planner.zoo.models import UNet

    model = UNet(3, base, depth)
    target = torch.randint(0, 2, (batch_size, image, image))
    return model, (torch.randn(batch_size, 3, image, image), target)


def gpt(batch_size: int = 8, context: int = 64, dim: int = 128, layers: int = 4,
        vocab: int = 512, dropout: float = 0.1) -> Any:
    torch = _seed()
    from planner.zoo.models import GPT

    model = GPT(vocab, dim, layers, heads=4, context=context, dropout=dropout)
    idx = torch.randint(0, vocab, (batch_size, context))
    return model, (idx, torch.roll(idx, -1, dims=1))


def vit(batch_size: int = 8, image: int = 32, dim: int = 128, layers: int = 4) -> Any:
    torch = _seed()
    from planner.zoo.models import ViT

    model = ViT(image, 4, dim, layers)
    return model, (torch.randn(batch_size, 3, image, image), torch.randint(0, 10, (batch_size,)))


def mixer(batch_size: int = 8, image: int = 32, patch: int = 4, dim: int = 128,
          blocks: int = 4, dropout: float = 0.1) -> Any:
    """MLP-Mixer with dropout (token- and channel-mixing MLPs, LayerNorm, GELU, residuals)."""
    torch = _seed()
    from planner.zoo.models import Mixer

    model = Mixer(image, patch, dim, blocks, dropout)
    return model, (torch.randn(batch_size, 3, image, image), torch.randint(0, 10, (batch_size,)))


def densenet(batch_size: int = 8, image: int = 32, growth: int = 12,
             blocks: tuple[int, ...] = (4, 4, 4), stem: int = 24, dropout: float = 0.0) -> Any:
    """DenseNet-like CNN: dense blocks concatenating every earlier feature map (BN-ReLU-
    dropout-Conv layers; dropout 0 by default, the identity), transitions with pooling."""
    torch = _seed()
    from planner.zoo.models import DenseNet

    model = DenseNet(growth, tuple(blocks), stem, dropout)
    return model, (torch.randn(batch_size, 3, image, image), torch.randint(0, 10, (batch_size,)))


def llama_like(batch_size: int = 2, context: int = 32, dim: int = 64, layers: int = 32,
               vocab: int = 256) -> Any:
    """A Llama-like decoder (RMSNorm, rotary embeddings, SwiGLU), 32 layers at a small width."""
    _seed()
    from planner.zoo import models

    return models.llama_like(batch_size=batch_size, context=context, dim=dim, layers=layers,
                             vocab=vocab)


def resnet50_like(batch_size: int = 4, image: int = 32, base: int = 8) -> Any:
    """A ResNet-50-like CNN (bottleneck blocks 3-4-6-3) at a small width."""
    _seed()
    from planner.zoo import models

    return models.resnet50_like(batch_size=batch_size, image=image, base=base)


def hf_gpt2(batch_size: int = 4, context: int = 64, layers: int = 2, dim: int = 128) -> Any:
    """transformers GPT-2 from a config with random weights (no network)."""
    return _hf("gpt2", batch_size, context, layers, dim)


def hf_llama(batch_size: int = 4, context: int = 64, layers: int = 2, dim: int = 128) -> Any:
    """transformers Llama from a config with random weights (no network)."""
    return _hf("llama", batch_size, context, layers, dim)


def hf_bert(batch_size: int = 4, context: int = 64, layers: int = 2, dim: int = 128) -> Any:
    """transformers BERT (masked LM) from a config with random weights (no network)."""
    return _hf("bert", batch_size, context, layers, dim)


def _hf(kind: str, batch_size: int, context: int, layers: int, dim: int) -> Any:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = _seed()
    import transformers as tf

    vocab = 1000
    common: dict[str, Any] = {"vocab_size": vocab, "attn_implementation": "eager"}
    model: Any
    if kind == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(
            n_positions=context, n_embd=dim, n_layer=layers, n_head=4, bos_token_id=0,
            eos_token_id=0, **common,
        ))
    elif kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            hidden_size=dim, intermediate_size=4 * dim, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=context,
            **common,
        ))
    else:
        model = tf.BertForMaskedLM(tf.BertConfig(
            hidden_size=dim, num_hidden_layers=layers, num_attention_heads=4,
            intermediate_size=4 * dim, max_position_embeddings=max(context, 64), **common,
        ))
    ids = torch.randint(0, vocab, (batch_size, context))
    return _LabelsWrapper(model), (ids,)


def _LabelsWrapper(model: Any) -> Any:  # noqa: N802 - a factory for a Module subclass
    """Calls model(input_ids, labels=input_ids) so the model computes its own loss."""
    from torch import nn

    class HFWithLabels(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any) -> Any:
            return self.inner(input_ids=input_ids, labels=input_ids, use_cache=False).loss

    return HFWithLabels(model)
