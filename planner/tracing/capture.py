"""Op-level capture of one training step's joint forward+backward graph (AOTAutograd).

`torch.compile(fullgraph=True)` with an `aot_autograd` backend hands us the joint graph at
partition time: functionalised aten ops, fake-tensor metadata on every node, forward/backward
tags and sequence numbers that tie backward ops to the forward op they differentiate.
A graph break (data-dependent control flow) becomes a `CaptureError` naming the cause.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from planner.core.errors import InputError


class CaptureError(InputError):
    """Op-level capture failed; the message is one line with the cause and a suggestion."""


class _JointCaptured(Exception):  # noqa: N818 - a signal, not an error
    """Raised by the partitioner once it holds the joint graph: AOTAutograd's second stage
    (runtime wrappers), dynamo's guards and bytecode, and running the compiled forward are
    work the tracer does not use (about a third of a capture's time)."""


@dataclass
class JointCapture:
    """The captured joint graph and what its placeholders and outputs are."""

    gm: torch.fx.GraphModule
    num_fwd_outputs: int
    primal_kinds: dict[str, str] = field(default_factory=dict)  # fx name -> parameter/buffer/input
    primal_names: dict[str, str] = field(default_factory=dict)  # fx name -> FQN or input index
    loss_node: str = ""
    gradient_nodes: dict[str, str] = field(default_factory=dict)  # param FQN -> fx node name
    tangent_nodes: list[str] = field(default_factory=list)


class LossWrapper(nn.Module):
    """model(*inputs) followed by the loss, as one module returning a scalar."""

    def __init__(self, model: nn.Module, loss_fn: Any = None) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *inputs: Any) -> torch.Tensor:
        out = self.model(*inputs)
        return compute_loss(out, self.loss_fn)


def compute_loss(out: Any, loss_fn: Any = None) -> torch.Tensor:
    """loss_fn(out); else the model's own `.loss` / 'loss' entry; else the sum of the output."""
    if loss_fn is not None:
        return loss_fn(out)
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    tensor = first_tensor(out)
    if tensor is None:
        raise InputError("the model returned no tensor: give a loss function (--loss)")
    return tensor.float().sum()


def first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "to_tuple"):  # transformers ModelOutput
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for item in out:
            t = first_tensor(item)
            if t is not None:
                return t
    return None


_SOURCE_PART = re.compile(
    r"\._(?:modules|parameters|buffers)\['([^']*)'\]|\['([^']*)'\]|\.(\w+)|\[(\d+)\]"
)


def source_to_fqn(source: str) -> str:
    """"L['self']._modules['model']._parameters['weight']" -> 'model.weight'."""
    body = re.sub(r"^L\['[^']*'\]", "", source)
    parts = [a or b or c or d for a, b, c, d in _SOURCE_PART.findall(body)]
    return ".".join(parts)


def module_path_from_stack(stack: dict[str, Any] | None) -> str:
    """Innermost module of an fx node's nn_module_stack, relative to the traced model."""
    if not stack:
        return ""
    entry = list(stack.values())[-1]
    path = entry[0] if isinstance(entry, tuple) else str(entry)
    fqn = source_to_fqn(path) if path.startswith("L[") else path
    return fqn[len("model.") :] if fqn.startswith("model.") else ("" if fqn == "model" else fqn)


def capture_joint(
    model: nn.Module, inputs: tuple[Any, ...], loss_fn: Any = None, autocast: str | None = None,
    progress: Any = None,
) -> JointCapture:
    """Compile one step on `inputs` and return its joint graph; raise CaptureError. The step
    itself is not run (the capture stops when AOTAutograd hands over the joint graph): the
    model's buffers (batch-norm statistics) and the RNG are as they were.

    `autocast` ("bf16", "fp16"): the step runs under `torch.autocast` of the model's device
    type, so the joint graph holds the casts (planner.tracing.autocast)."""
    if progress is not None:
        progress("capture: importing dynamo and AOTAutograd", 0, 0)
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition

    from planner.tracing.autocast import autocast_on, device_type_of

    wrapper = LossWrapper(model, loss_fn)
    seen: dict[str, Any] = {}

    def partition(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        if "joint" in seen:
            raise CaptureError("the model compiled into more than one graph")
        seen["joint"] = joint
        seen["num_fwd_outputs"] = kwargs.get("num_fwd_outputs", 1)
        if progress is not None:
            progress(f"capture: joint forward+backward graph ({len(joint.graph.nodes)} fx "
                     "nodes), partitioning", 0, 0)
        # The default partitioner still runs: it tags the joint graph's nodes as the compiled
        # step would see them; what follows it is not needed.
        default_partition(joint, joint_inputs, **kwargs)
        raise _JointCaptured

    def passthrough(gm: torch.fx.GraphModule, _example: Any) -> Any:
        return gm

    import torch._dynamo

    dropout_backward = torch.ops.aten.native_dropout_backward.default
    aot = aot_autograd(
        fw_compiler=passthrough, bw_compiler=passthrough, partition_fn=partition,
        decompositions={dropout_backward: eager_cpu_dropout_backward},
    )

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        if progress is not None:
            calls = sum(1 for n in gm.graph.nodes if n.op == "call_function")
            progress(f"capture: backward (AOTAutograd; forward graph of {calls} torch calls)",
                     0, 0)
        sources = []
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                arg = node.meta.get("grapharg")
                sources.append(arg.source.name if arg is not None and arg.source else node.name)
        seen["sources"] = sources
        return aot(gm, example_inputs)

    torch._dynamo.reset()
    if progress is not None:
        progress("capture: forward (dynamo)", 0, 0)
    compiled = torch.compile(wrapper, backend=backend, fullgraph=True, dynamic=False)
    # Library warnings (transformers' logger.warning_once) are not part of the step.
    quiet = {
        logging.Logger.debug, logging.Logger.info, logging.Logger.warning,
        logging.Logger.warn, logging.Logger.error, logging.Logger.exception,
    }
    quiet |= {logging.Logger.warning_once} if hasattr(logging.Logger, "warning_once") else set()
    try:
        with torch._dynamo.config.patch(
            ignore_logging_functions=torch._dynamo.config.ignore_logging_functions | quiet
        ), autocast_on(autocast, device_type_of(model, inputs)):
            loss = compiled(*inputs)
    except InputError:  # CaptureError, or an autocast the device cannot do
        raise
    except Exception as e:  # dynamo/AOT errors are long; keep the first meaningful line
        if "joint" in seen and _is_captured(e):
            return _describe(seen["joint"], seen["num_fwd_outputs"], seen.get("sources", []))
        raise CaptureError(f"op-level capture failed: {_one_line(e)}; try --level module") from e
    finally:
        torch._dynamo.reset()
    if "joint" not in seen:
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise CaptureError("the loss does not require grad: the model has no trainable path")
        raise CaptureError("op-level capture produced no joint graph; try --level module")
    return _describe(seen["joint"], seen["num_fwd_outputs"], seen.get("sources", []))


def _is_captured(e: BaseException | None) -> bool:
    """Whether `e` is (dynamo's wrapper of) the partitioner's `_JointCaptured`."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, _JointCaptured):
            return True
        seen.add(id(e))
        inner = getattr(e, "inner_exception", None)
        e = inner if isinstance(inner, BaseException) else (e.__cause__ or e.__context__)
    return False


def eager_cpu_dropout_backward(grad: torch.Tensor, mask: torch.Tensor, scale: float) -> Any:
    """Dropout's backward as CPU eager computes it for 16-bit tensors (else: no change).

    CPU eager dropout multiplies by a noise tensor of the input's dtype, 0 or 1/(1-p) rounded
    to that dtype, and its backward by the same noise; `native_dropout_backward` scales by the
    exact 1/(1-p). In fp32 the two agree bit for bit, in bf16/fp16 they do not, so a step
    traced under autocast would not replay the eager step's gradients exactly."""
    if grad.device.type != "cpu" or grad.dtype not in (torch.bfloat16, torch.float16):
        return NotImplemented
    noise = mask.to(grad.dtype).div(1.0 / scale)  # eager: bernoulli noise, then div_(1 - p)
    return grad * noise


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    cause = lines[0] if lines else type(e).__name__
    for ln in lines[1:6]:  # dynamo puts the real reason ("Explanation:") on a later line
        if ln.startswith(("Explanation:", "Hint:")) and "data-dependent" in ln.lower():
            cause += " — " + ln
            break
    return cause[:300]


def _describe(gm: torch.fx.GraphModule, num_fwd_outputs: int, sources: list[str]) -> JointCapture:
    cap = JointCapture(gm=gm, num_fwd_outputs=num_fwd_outputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in placeholders:
        desc = node.meta.get("desc")
        if node.name.startswith("tangents") or "Tangent" in type(desc).__name__:
            cap.tangent_nodes.append(node.name)
            continue
        idx = getattr(desc, "idx", None)
        source = sources[idx] if isinstance(idx, int) and idx < len(sources) else node.name
        if "_parameters[" in source:
            kind = "parameter"
        elif "_buffers[" in source:
            kind = "buffer"
        else:
            kind = "input"
        cap.primal_kinds[node.name] = kind
        name = source_to_fqn(source)
        name = name[len("model.") :] if name.startswith("model.") else name
        if kind == "input":
            digits = [p for p in name.split(".") if p.isdigit()]
            name = f"inputs.{digits[0]}" if digits else name
        cap.primal_names[node.name] = name
    output = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(output.args[0])
    descs = output.meta.get("desc") or [None] * len(outs)
    fwd = [(o, d) for o, d in zip(outs[:num_fwd_outputs], descs, strict=False) if o is not None]
    # Mutated inputs (e.g. BatchNorm running stats) come first; the user's output is "Plain".
    plain = [o for o, d in fwd if type(d).__name__ == "PlainAOTOutput"]
    if plain or fwd:
        cap.loss_node = (plain or [o for o, _ in fwd])[-1].name
    primal_order = [n.name for n in placeholders if n.name in cap.primal_kinds]
    grads = zip(outs[num_fwd_outputs:], descs[num_fwd_outputs:], strict=False)
    for k, (out, desc) in enumerate(grads):
        if out is None:
            continue
        grad_of = getattr(desc, "grad_of", None)
        idx = getattr(grad_of, "idx", None)
        idx = k if not isinstance(idx, int) else idx
        if idx < len(primal_order):
            cap.gradient_nodes[cap.primal_names[primal_order[idx]]] = out.name
    return cap
