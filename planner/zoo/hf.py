"""Hugging Face transformers models from a config: random weights, nothing downloaded.

`hf_model("gpt2", batch_size=8, seq_len=1024, config_overrides={"n_layer": 12})` is what
`planner-cli trace hf:gpt2 --config n_layer=12 --batch-size 8 --seq-len 1024` traces: the config
is `AutoConfig.for_model(model_type, **overrides)` (any field of that config class, or one of its
aliases such as gpt2's `hidden_size`), the model `AutoModelForMaskedLM.from_config` where
transformers has one for the type (encoders such as bert), else `AutoModelForCausalLM`, the
inputs random token ids; the wrapped model returns its own loss (labels = inputs).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from planner.core.errors import InputError

DEFAULT_BATCH_SIZE = 1
DEFAULT_SEQ_LEN = 128
# Eager attention is plain aten ops: the tracer captures it without a graph break.
TRACEABLE_CONFIG: dict[str, Any] = {"attn_implementation": "eager"}


def hf_model(
    model_type: str,
    batch_size: int = DEFAULT_BATCH_SIZE,
    seq_len: int = DEFAULT_SEQ_LEN,
    config_overrides: Mapping[str, Any] | None = None,
) -> tuple[Any, tuple[Any, ...]]:
    """(model, (input_ids,)) of transformers model type `model_type` ("gpt2", "llama", ...)
    built from its default config with `config_overrides`; random weights (seed 0)."""
    config = hf_config(model_type, {**TRACEABLE_CONFIG, **(config_overrides or {})})
    return model_from_config(config, model_type, batch_size, seq_len)


def hf_config(model_type: str, overrides: Mapping[str, Any]) -> Any:
    """`AutoConfig.for_model(model_type, **overrides)`; an unknown model type, an unknown field
    or a value the config refuses is an InputError (one line)."""
    _offline()
    from transformers import AutoConfig

    base = _default_config(model_type)
    try:
        with _quiet_transformers():
            config = AutoConfig.for_model(model_type, **overrides)
    except _refusals() as e:
        raise InputError(f"hf:{model_type}: {_one_line(e)}", field="config_overrides") from e
    # transformers keeps an unknown keyword as a new attribute: a field it does not know.
    unknown = [k for k in overrides if k in vars(config) and k not in vars(base)]
    if unknown:
        raise InputError(_unknown_field(unknown[0], model_type, base), field="config_overrides")
    return config


def config_fields(config_class: type) -> list[str]:
    """The fields of a transformers config class of its own (not those every config has),
    then its aliases (gpt2: hidden_size for n_embd)."""
    import dataclasses

    from transformers import PreTrainedConfig

    common = {f.name for f in dataclasses.fields(PreTrainedConfig)}
    own = [f.name for f in dataclasses.fields(config_class) if f.name not in common]
    return own + [a for a in getattr(config_class, "attribute_map", {}) if a not in own]


def model_from_config(
    config: Any, model_type: str, batch_size: int, seq_len: int
) -> tuple[Any, tuple[Any, ...]]:
    """The LM head model of `config` in training mode and random token ids for it."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_MASKED_LM_MAPPING,
    )

    _check_sizes(config, model_type, batch_size, seq_len)
    if type(config) in MODEL_FOR_MASKED_LM_MAPPING:
        auto: Any = AutoModelForMaskedLM
    elif type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        auto = AutoModelForCausalLM
    else:
        raise InputError(
            f"hf:{model_type}: transformers has no causal or masked language-model head for "
            f"{type(config).__name__}; trace it with a factory of your own (MODULE:FACTORY)"
        )
    torch.manual_seed(0)
    try:
        with _quiet_transformers():
            model = auto.from_config(config)
    except _refusals() as e:  # e.g. a width not divisible by the head count
        raise InputError(f"hf:{model_type}: {_one_line(e)}", field="config_overrides") from e
    model.train()
    ids = torch.randint(0, int(config.vocab_size), (batch_size, seq_len))
    return LMLoss(model), (ids,)


class LMLoss(nn.Module):
    """Calls a transformers language model with labels = inputs: the model returns its loss."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=input_ids, labels=input_ids, use_cache=False).loss


def _check_sizes(config: Any, model_type: str, batch_size: int, seq_len: int) -> None:
    # No field named: the same sizes come from --batch-size / --seq-len or a factory's own.
    for what, value in (("batch size", batch_size), ("sequence length", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"hf:{model_type}: {what} {value!r} is not a positive whole number")
    longest = getattr(config, "max_position_embeddings", None)
    if isinstance(longest, int) and seq_len > longest:
        field = type(config).attribute_map.get("max_position_embeddings", "max_position_embeddings")
        raise InputError(
            f"hf:{model_type}: a sequence of {seq_len} tokens exceeds the config's {field} "
            f"{longest}: set config field {field}={seq_len} or use shorter sequences"
        )


def _default_config(model_type: str) -> Any:
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "e.g. gpt2, llama, bert"
        raise InputError(f"hf:{model_type}: not a transformers model type ({hint})")
    with _quiet_transformers():
        return AutoConfig.for_model(model_type)


def _unknown_field(name: str, model_type: str, base: Any) -> str:
    fields = config_fields(type(base))
    close = difflib.get_close_matches(name, fields, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (
        f"{name!r} is not a field of {type(base).__name__} (hf:{model_type}){hint}; "
        f"its fields: {', '.join(fields)}"
    )


def _refusals() -> tuple[type[Exception], ...]:
    """What transformers raises for a value its config refuses (a str for an int field: the
    config classes are huggingface_hub strict dataclasses)."""
    from huggingface_hub.errors import StrictDataclassError

    return (ValueError, TypeError, StrictDataclassError)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def _offline() -> None:
    # Building from a config needs no Hub; a stray hub call must fail fast, never download.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Without transformers' warnings about a random model (special tokens outside a small
    vocabulary, untied heads): they say nothing about tracing."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
