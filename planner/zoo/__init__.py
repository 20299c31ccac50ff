"""Model zoo: factories returning (model, sample inputs), e.g. `planner-cli trace planner.zoo:mlp`.

Each factory takes `batch_size` and size keywords (`planner-cli trace planner.zoo:gpt --arg
layers=12`); the Hugging Face ones (`hf_model`, `hf_gpt2`, ...) also any config field as
`config_overrides` (`--config n_layer=12`). torch is imported only when one is called.
Models return their training loss, so the default loss (the output itself) applies.
"""

from __future__ import annotations

from typing import Any

ZOO = ("mlp", "resnet", "unet", "gpt", "vit", "mixer", "densenet", "llama_like", "resnet50_like",
       "llama", "resnet50", "densenet121")

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
    from planner.zoo.token_models import GPT

    model = GPT(vocab, dim, layers, heads=4, context=context, dropout=dropout)
    idx = torch.randint(0, vocab, (batch_size, context))
    return model, (idx, torch.roll(idx, -1, dims=1))


def llama(batch_size: int = 2, context: int = 32, dim: int = 64, layers: int = 2,
          heads: int = 4, kv_heads: int = 2, vocab: int = 32000, hidden: int | None = None,
          tie_embeddings: bool = False) -> Any:
    """Llama-style decoder written in the project (RMSNorm, rotary embeddings, grouped-query
    attention, SwiGLU); `hidden` None is Llama's 2/3 * 4 * dim rounded up to a multiple of 32;
    `tie_embeddings` shares the embedding's weight with the LM head."""
    torch = _seed()
    from planner.zoo.llama_model import Llama

    model = Llama(vocab, dim, layers, heads, kv_heads, hidden, tie_embeddings)
    idx = torch.randint(0, vocab, (batch_size, context))
    return model, (idx, torch.roll(idx, -1, dims=1))


def vit(batch_size: int = 8, image: int = 32, dim: int = 128, layers: int = 4) -> Any:
    torch = _seed()
    from planner.zoo.token_models import ViT

    model = ViT(image, 4, dim, layers)
    return model, (torch.randn(batch_size, 3, image, image), torch.randint(0, 10, (batch_size,)))


def mixer(batch_size: int = 8, image: int = 32, patch: int = 4, dim: int = 128,
          blocks: int = 4, dropout: float = 0.1) -> Any:
    """MLP-Mixer with dropout (token- and channel-mixing MLPs, LayerNorm, GELU, residuals)."""
    torch = _seed()
    from planner.zoo.token_models import Mixer

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


def resnet50(batch_size: int = 2, image: int = 64, width: int = 64, classes: int = 10) -> Any:
    """torchvision's ResNet-50 re-implemented (same modules and names; no torchvision needed);
    `width` scales every stage (64 is torchvision's)."""
    torch = _seed()
    from planner.zoo.vision_models import resnet50 as build

    model = build(num_classes=classes, width=width)
    return model, (torch.randn(batch_size, 3, image, image),
                   torch.randint(0, classes, (batch_size,)))


def densenet121(batch_size: int = 2, image: int = 64, classes: int = 10) -> Any:
    """torchvision's DenseNet-121 re-implemented (same modules and names; no torchvision)."""
    torch = _seed()
    from planner.zoo.vision_models import densenet121 as build

    model = build(num_classes=classes)
    return model, (torch.randn(batch_size, 3, image, image),
                   torch.randint(0, classes, (batch_size,)))


def llama_like(batch_size: int = 2, context: int = 32, dim: int = 64, layers: int = 32,
               vocab: int = 256, config_overrides: dict[str, Any] | None = None) -> Any:
    """A Llama-like decoder (RMSNorm, rotary embeddings, SwiGLU), 32 layers at a small width;
    `config_overrides` sets any LlamaConfig field (transformers installed)."""
    _seed()
    from planner.zoo import token_models

    return token_models.llama_like(batch_size=batch_size, context=context, dim=dim, layers=layers,
                             vocab=vocab, config_overrides=config_overrides)


def resnet50_like(batch_size: int = 4, image: int = 32, base: int = 8) -> Any:
    """A ResNet-50-like CNN (bottleneck blocks 3-4-6-3) at a small width."""
    _seed()
    from planner.zoo import models

    return models.resnet50_like(batch_size=batch_size, image=image, base=base)


def hf_model(model_type: str, batch_size: int = 1, seq_len: int = 128,
             config_overrides: dict[str, Any] | None = None) -> Any:
    """Any transformers LM from `AutoConfig.for_model(model_type, **config_overrides)` with
    random weights (no network): `hf_model("gpt2", 8, 1024, {"n_layer": 12})` is
    `planner-cli trace hf:gpt2 --batch-size 8 --seq-len 1024 --config n_layer=12`. The default
    sizes are planner.zoo.hf's (not imported here: it imports torch)."""
    from planner.zoo.hf import hf_model as build

    return build(model_type, batch_size, seq_len, config_overrides)


def hf_gpt2(batch_size: int = 4, context: int = 64, layers: int = 2, dim: int = 128,
            config_overrides: dict[str, Any] | None = None) -> Any:
    """transformers GPT-2 from a config with random weights (no network); `config_overrides`
    sets any GPT2Config field (n_head, vocab_size, ...) over these sizes."""
    sizes = dict(n_positions=context, n_embd=dim, n_layer=layers, n_head=4, bos_token_id=0,
                 eos_token_id=0)
    return _hf("gpt2", batch_size, context, sizes, config_overrides)


def hf_llama(batch_size: int = 4, context: int = 64, layers: int = 2, dim: int = 128,
             config_overrides: dict[str, Any] | None = None) -> Any:
    """transformers Llama from a config with random weights (no network); `config_overrides`
    sets any LlamaConfig field (num_key_value_heads, rope_theta, ...) over these sizes."""
    sizes = dict(hidden_size=dim, intermediate_size=4 * dim, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=context)
    return _hf("llama", batch_size, context, sizes, config_overrides)


def hf_bert(batch_size: int = 4, context: int = 64, layers: int = 2, dim: int = 128,
            config_overrides: dict[str, Any] | None = None) -> Any:
    """transformers BERT (masked LM) from a config with random weights (no network);
    `config_overrides` sets any BertConfig field over these sizes."""
    sizes = dict(hidden_size=dim, num_hidden_layers=layers, num_attention_heads=4,
                 intermediate_size=4 * dim, max_position_embeddings=max(context, 64))
    return _hf("bert", batch_size, context, sizes, config_overrides)


def _hf(kind: str, batch_size: int, context: int, sizes: dict[str, Any],
        config_overrides: dict[str, Any] | None) -> Any:
    from planner.zoo.hf import hf_model as build

    overrides = {"vocab_size": 1000, **sizes, **(config_overrides or {})}
    return build(kind, batch_size, context, overrides)
