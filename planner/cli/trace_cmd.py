"""`planner-cli trace MODULE:FACTORY`: one training step of a PyTorch model as graph.json."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from planner.cli.options import (
    BatchSizeOpt,
    ConfigOpt,
    FactoryArgsOpt,
    SeqLenOpt,
    parse_assignments,
)
from planner.cli.output import console, key_value_table, print_json
from planner.core.budget import format_bytes
from planner.core.errors import InputError
from planner.core.model_state import Optimizer

_INPUT_SPEC = re.compile(r"^\s*(\w+)\[([\d,\s]*)\](?::(\d+))?\s*$")
HF_PREFIX = "hf:"  # hf:MODEL_TYPE: a transformers model built from its config (planner.zoo.hf)
# Factory parameters --seq-len fills, in this order of preference (the zoo says `context`).
SEQ_LEN_PARAMETERS = ("seq_len", "context")


@dataclass(frozen=True)
class FactoryCall:
    """How `trace` sizes the model: --arg (factory keywords), --config (Hugging Face config
    fields), --batch-size and --seq-len."""

    args: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    seq_len: int | None = None

    def is_empty(self) -> bool:
        return not (self.args or self.config or self.batch_size or self.seq_len)


def register(app: typer.Typer) -> None:
    app.command("trace")(trace_cmd)


def parse_input_spec(spec: str) -> Any:
    """'float32[8,3,224,224]' -> random tensor; 'int64[8,128]:1000' -> integers in [0, 1000)."""
    import torch

    m = _INPUT_SPEC.match(spec)
    if not m:
        raise InputError(
            f"--input {spec!r}: expected DTYPE[D0,D1,...] such as float32[8,3,224,224] or "
            "int64[8,128]:1000 (integers below 1000)"
        )
    dtype_name, dims, high = m.groups()
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"--input {spec!r}: unknown dtype {dtype_name!r} (e.g. float32, int64)")
    shape = [int(d) for d in dims.split(",") if d.strip()]
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    return torch.randint(0, int(high or 100), shape, dtype=dtype)


def load_object(target: str, what: str) -> Any:
    if ":" not in target:
        raise InputError(f"{what} {target!r}: expected MODULE:NAME, e.g. planner.zoo:mlp")
    module_name, attr = target.split(":", 1)
    sys.path.insert(0, str(Path.cwd()))  # so a user's local module is found
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InputError(f"{what} {target!r}: cannot import {module_name!r} ({e})") from e
    finally:
        sys.path.pop(0)
    obj = getattr(module, attr, None)
    if obj is None:
        raise InputError(f"{what} {target!r}: {module_name!r} has no attribute {attr!r}")
    return obj


def resolve_model(
    target: str, input_specs: list[str], call: FactoryCall | None = None
) -> tuple[Any, tuple[Any, ...]]:
    """Build the model: hf:MODEL_TYPE from its config, else call MODULE:FACTORY with `call`'s
    keywords; --input specs replace the sample inputs it returns."""
    import torch

    call = call or FactoryCall()
    if target.startswith(HF_PREFIX):
        made = _hf_model(target, call)
    else:
        factory = load_object(target, "model")
        if isinstance(factory, torch.nn.Module) or not callable(factory):
            if not call.is_empty():
                raise InputError(
                    f"model {target!r} is a model, not a factory: --arg, --config, --batch-size "
                    "and --seq-len need MODULE:FACTORY"
                )
            made = factory
        else:
            kwargs = factory_kwargs(factory, target, call)
            try:
                made = factory(**kwargs)
            except Exception as e:  # the user's factory: its message, not our traceback
                raise InputError(f"model {target!r}: the factory raised "
                                 f"{type(e).__name__}: {e}") from None
    model, inputs = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(model, torch.nn.Module):
        raise InputError(
            f"model {target!r}: the factory returned {type(model).__name__}, "
            "not an nn.Module (or a (model, inputs) pair)"
        )
    if input_specs:
        inputs = tuple(parse_input_spec(s) for s in input_specs)
    if inputs is None:
        raise InputError(f"model {target!r}: give sample inputs with --input float32[8,3,224,224]")
    return model, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _hf_model(target: str, call: FactoryCall) -> Any:
    from planner.zoo.hf import DEFAULT_BATCH_SIZE, DEFAULT_SEQ_LEN, hf_model

    model_type = target[len(HF_PREFIX):].strip()
    if not model_type:
        raise InputError(f"model {target!r}: expected hf:MODEL_TYPE, e.g. hf:gpt2 or hf:llama")
    if call.args:
        raise InputError(
            f"--arg {next(iter(call.args))}: {target} is built from its config; give its "
            "fields with --config (e.g. --config n_layer=12)"
        )
    return hf_model(model_type, call.batch_size or DEFAULT_BATCH_SIZE,
                    call.seq_len or DEFAULT_SEQ_LEN, call.config)


def factory_kwargs(factory: Any, target: str, call: FactoryCall) -> dict[str, Any]:
    """The keywords for `factory` from --arg, --config (its `config_overrides`),
    --batch-size and --seq-len, each checked against its signature: a key it does not take
    is one line naming the key and the factory's parameters."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to check against: the call decides
        params = None
    named = {
        n: p for n, p in (params or {}).items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    takes_any = params is None or any(p.kind is p.VAR_KEYWORD for p in params.values())
    listing = ", ".join(named) or "none"

    def parameter(flag: str, *candidates: str) -> str:
        found = next((c for c in candidates if c in named), None)
        if found is None and takes_any:
            found = candidates[0]
        if found is None:
            raise InputError(
                f"{flag}: {target} has no parameter {' or '.join(candidates)}; "
                f"its parameters: {listing}"
            )
        return found

    kwargs = dict(call.args)
    for key, value in call.args.items():
        if key == "config_overrides":
            raise InputError("--arg config_overrides: give config fields with --config KEY=VALUE")
        parameter(f"--arg {key}", key)
        if key in named:
            _check_like_default(key, value, named[key].default, target)
    for flag, value, candidates in (
        ("--config", call.config or None, ("config_overrides",)),
        ("--batch-size", call.batch_size, ("batch_size",)),
        ("--seq-len", call.seq_len, SEQ_LEN_PARAMETERS),
    ):
        if value is None:
            continue
        key = parameter(flag, *candidates)
        if key in kwargs:
            raise InputError(f"{flag} and --arg {key} give the same parameter: keep one")
        kwargs[key] = value
    return kwargs


def _check_like_default(key: str, value: Any, default: Any, target: str) -> None:
    """A value of another kind than the parameter's default (text for a count) is refused
    here, in one line, rather than as a traceback from inside the factory."""
    if default is inspect.Parameter.empty or default is None or value is None:
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    fits = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: number,
        str: isinstance(value, str),
        tuple: isinstance(value, tuple | list),
        list: isinstance(value, tuple | list),
    }.get(type(default), True)
    if not fits:
        raise InputError(
            f"--arg {key}={value!r}: {target} expects {type(default).__name__} here "
            f"(default {default!r})"
        )
    if (type(default) is int and default > 0 and isinstance(value, int)
            and not isinstance(value, bool) and value < 0):
        # a size or count (layers=-1 traced a model without its blocks and exited 0)
        raise InputError(f"--arg {key}={value}: {target} expects a size or count here "
                         f"(default {default}); give 0 or more")


def resolve_loss(spec: str | None) -> Any:
    if spec is None:
        return None
    if spec in ("sum", "mean"):
        return _sum_loss if spec == "sum" else _mean_loss
    return load_object(spec, "--loss")


def _sum_loss(out: Any) -> Any:  # named functions: a plan records its loss by name
    return _first(out).float().sum()


def _mean_loss(out: Any) -> Any:
    return _first(out).float().mean()


def _first(out: Any) -> Any:
    from planner.tracing.capture import first_tensor

    t = first_tensor(out)
    if t is None:
        raise InputError("the model returned no tensor for --loss sum/mean")
    return t


def trace_summary(result: Any) -> dict[str, Any]:
    from planner.core.graph import Phase
    from planner.solvers.baselines import store_all_peak_bytes

    g = result.graph
    fwd = sum(n.compute_ms for n in g.nodes if n.phase is not Phase.backward)
    bwd = sum(n.compute_ms for n in g.nodes if n.phase is Phase.backward)
    acts = sorted(
        (n for n in g.nodes if n.phase is not Phase.backward and n.alias_of is None),
        key=lambda n: -n.output_bytes,
    )[:10]
    return {
        "level": result.level,
        "nodes": len(g.nodes),
        "edges": len(g.edges),
        "nodes_before_fusion": g.metadata.extra.get("nodes_before_fusion"),
        "forward_ms": round(fwd, 4),
        "backward_ms": round(bwd, 4),
        "cost_source": g.nodes[0].cost_source.value,
        "autocast": g.metadata.extra.get("autocast"),
        "fixed_bytes": g.fixed_bytes,
        "store_all_peak_bytes": store_all_peak_bytes(g),
        "largest_activations": [
            {"node": n.id, "name": n.name, "module": n.module_path, "bytes": n.output_bytes}
            for n in acts
        ],
    }


def trace_cmd(
    target: Annotated[
        str,
        typer.Argument(
            help="MODULE:FACTORY returning a model or (model, inputs), e.g. planner.zoo:gpt; "
            "or hf:MODEL_TYPE, a Hugging Face transformers language model built from its "
            "config with random weights (nothing downloaded), e.g. hf:gpt2, hf:llama"
        ),
    ],
    factory_args: FactoryArgsOpt = None,
    config: ConfigOpt = None,
    batch_size: BatchSizeOpt = None,
    seq_len: SeqLenOpt = None,
    input_spec: Annotated[
        list[str] | None,
        typer.Option("--input", help="Sample input DTYPE[dims][:high], repeatable."),
    ] = None,
    loss: Annotated[
        str | None,
        typer.Option(
            help="sum, mean or MODULE:FN (default: the model's loss, else the output's sum)."
        ),
    ] = None,
    level: Annotated[
        Literal["op", "module"],
        typer.Option(help="op (joint aten graph) or module (leaf modules / blocks)."),
    ] = "op",
    block_pattern: Annotated[
        str | None, typer.Option(help="Module level: blocks as one node, e.g. 'transformer.h.*'.")
    ] = None,
    costs: Annotated[
        Literal["estimate", "measure"],
        typer.Option(help="estimate (roofline) or measure (run each node)."),
    ] = "estimate",
    device_profile: Annotated[
        str, typer.Option(help="h100, h200, a100, cpu or a JSON file.")
    ] = "cpu",
    optimizer: Annotated[
        Optimizer, typer.Option(help="The optimizer (the graph's model state).")
    ] = "sgd",
    gradient_lifetime: Annotated[
        Literal["backward", "step"] | None,
        typer.Option(
            help="backward (default): gradients created in backward and released by "
            "zero_grad(set_to_none=True), torch's default; step: held all step (gradient "
            "accumulation, zero_grad(set_to_none=False)).",
        ),
    ] = None,
    grad_accumulation_steps: Annotated[
        int,
        typer.Option(
            help="Micro-steps per optimizer step; above 1 the gradients are held all step "
            "(--gradient-lifetime step).",
        ),
    ] = 1,
    autocast: Annotated[
        Literal["bf16", "fp16"] | None,
        typer.Option(
            help="Trace the step under torch.autocast(bfloat16 | float16) of the model's "
            "device (weights stay fp32; op level): as the training loop runs it.",
        ),
    ] = None,
    fuse: Annotated[
        bool, typer.Option("--fuse/--no-fuse", help="Fuse views, getitem, metadata ops.")
    ] = True,
    repeats: Annotated[int, typer.Option(min=1, help="Timed repeats for --costs measure.")] = 5,
    clock: Annotated[
        Literal["wall", "cpu"],
        typer.Option(help="--costs measure on CPU: wall, or cpu (this thread's CPU time)."),
    ] = "wall",
    dropout_masks: Annotated[
        Literal["eager", "graph"],
        typer.Option(help="eager (CPU eager keeps float masks) or graph (bool masks)."),
    ] = "eager",
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write graph.json here.")
    ] = None,
    chain_out: Annotated[
        Path | None, typer.Option(help="Module level: write chain.json here.")
    ] = None,
    fsdp_ranks: Annotated[
        str | None,
        typer.Option(
            "--fsdp-ranks",
            help="Also profile the model's blocks for FSDP2 plans over these rank counts, e.g. "
            "2,4 (the inputs are one rank's batch): stored in the graph for `solve --fsdp N`.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable summary.")] = False,
) -> None:
    """Trace one training step (forward, loss, backward) of a PyTorch model into graph.json."""
    import os

    from planner.cli.progress_view import work_status

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with work_status("trace", detail="starting") as status:
        status.update("importing torch", phase=True)
        import torch  # noqa: F401 - imported here, so that this phase is where its time shows

        from planner.core.io import write_json
        from planner.tracing import trace
        from planner.tracing.api import resolve_gradient_lifetime

        # a contradictory --gradient-lifetime / --grad-accumulation-steps pair: one line, no work
        resolve_gradient_lifetime(gradient_lifetime, grad_accumulation_steps)
        worlds = _fsdp_ranks(fsdp_ranks)
        call = FactoryCall(
            parse_assignments(factory_args or [], "--arg"),
            parse_assignments(config or [], "--config"), batch_size, seq_len,
        )
        status.update(f"building the model ({target})", phase=True)
        model, inputs = resolve_model(target, input_spec or [], call)
        result = trace(
            model, inputs, progress=_progress_of(status), loss_fn=resolve_loss(loss),
            level=level, block_pattern=block_pattern, costs=costs,
            device_profile=device_profile, optimizer=optimizer, fuse=fuse,
            dropout_masks=dropout_masks, clock=clock, repeats=repeats,
            model_name=target.split(":")[-1], gradient_lifetime=gradient_lifetime,
            grad_accumulation_steps=grad_accumulation_steps, autocast=autocast,
        )
        graph = result.graph
        if worlds:
            from planner.tracing.fsdp_blocks import graph_with_fsdp_model

            status.update(f"profiling the blocks for FSDP over {fsdp_ranks} ranks", phase=True)
            graph = graph_with_fsdp_model(graph, model, inputs, worlds, resolve_loss(loss),
                                          repeats=repeats)
        if output is not None:
            status.update(f"writing {output} ({len(graph.nodes)} nodes)", phase=True)
            write_json(output, graph)
        if chain_out is not None:
            if result.level != "module":
                raise InputError("--chain-out needs --level module")
            write_json(chain_out, result.details["chain"])
        status.update("summary", phase=True)
        summary = trace_summary(result)
    if as_json:
        print_json(summary)
    else:
        _print_trace(summary, result, target, output)


def _fsdp_ranks(text: str | None) -> tuple[int, ...]:
    """--fsdp-ranks '2,4' -> (2, 4); InputError naming the flag otherwise."""
    if text is None:
        return ()
    try:
        worlds = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        worlds = ()
    if not worlds or min(worlds) < 1:
        raise InputError(f"{text!r}: give rank counts ≥ 1, comma-separated (e.g. 2,4)",
                         field="--fsdp-ranks")
    return worlds


def _progress_of(status: Any) -> Any:
    """The tracer's progress callback shown on `status`: each new phase (the words before the
    counts) as it starts, counts as they change."""
    last: list[str] = [""]

    def progress(stage: str, done: int, total: int) -> None:
        text = f"{stage} {done}/{total}" if total else stage
        status.update(text, phase=stage != last[0])
        last[0] = stage

    return progress


def _print_trace(summary: dict[str, Any], result: Any, target: str, output: Path | None) -> None:
    rows = [(k, v) for k, v in summary.items() if k != "largest_activations"]
    rows = [(k, format_bytes(v) if k.endswith("_bytes") else v) for k, v in rows]
    if output is not None:
        rows.append(("written", str(output)))
    console.print(key_value_table(f"trace {target}", rows))
    if result.level == "module" and not result.details.get("is_chain", True):
        console.print(f"not a chain: skip edges {result.details['skip_edges'][:4]}")
    console.print("largest activations:")
    for a in summary["largest_activations"]:
        console.print(f"  {format_bytes(a['bytes']):>10}  {a['name']}  ({a['module'] or '-'})")
