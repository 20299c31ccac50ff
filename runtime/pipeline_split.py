"""Split a user's unmodified nn.Module into pipeline stage modules by module names.

The rule (which models qualify):
- The model's `forward` must be traceable by `torch.fx` with the modules a stage names treated
  as opaque calls (no Python control flow on tensor values outside those modules). Named modules
  may be any submodule paths (`tok`, `h.0`, `h` for a whole ModuleList, `body.3`); a stage
  owns each call of a named module and of everything inside it.
- Code outside every named module (glue: `tok(idx) + pos(arange(t))`, a dropout, `view`, the
  loss) is placed by data flow: an operation that reads the output of a named module goes to the
  latest stage among its inputs; one that reads only model inputs, constants or attributes goes
  to the earliest stage that uses it. A parameter or buffer used by two stages (tied weights) is
  refused: stages cannot share weights.
- The stages must be contiguous in the order the forward runs: every call of stage s's modules
  comes before every call of stage s + 1's.
- Model inputs read by stage 0 are stage 0's positional arguments; the others (e.g. the targets
  of a model that computes its own loss) reach the stages that read them as keyword arguments
  (`torch.distributed.pipelining` hands a step's kwargs, split into micro-batches, to every
  stage). Values needed beyond the next stage are passed on by the stages in between, so each
  stage sends one tuple of tensors to the next. A non-tensor value crossing stages is refused.
- The last stage returns what the model returns: its loss (a scalar), or an output for a loss
  function given to the runtime.

Every stage module is a `torch.fx.GraphModule` that shares the model's submodules and
parameters: gradients land in the user's model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from planner.core.errors import InputError
from planner.core.pipeline_actions import Partition
from planner.core.plan import Plan


class PipelineSplitError(InputError):
    """The partition does not fit the model (names the stage and module)."""


@dataclass
class StageProgram:
    """One stage: its module, what it receives and what it sends on."""

    stage_index: int
    module: fx.GraphModule
    inputs: list[str]  # positional: model inputs (stage 0) or the previous stage's values
    keyword_inputs: list[str]  # model inputs it reads as keyword arguments
    outputs: list[str]  # values sent to the next stage (the model's output on the last)
    modules: list[str] = field(default_factory=list)  # named modules it calls, in order


@dataclass
class SplitModel:
    stages: list[StageProgram]
    positional_inputs: list[str]  # model inputs stage 0 reads, in signature order
    keyword_inputs: list[str]  # model inputs only later stages read
    input_names: list[str]  # every model input, in signature order
    returns_loss: bool  # the model's output is a scalar tensor


class _Tracer(fx.Tracer):
    def __init__(self, named: Sequence[str]) -> None:
        super().__init__()
        self.named = tuple(named)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if owner_of(module_qualified_name, self.named) is not None:
            return True
        return super().is_leaf_module(m, module_qualified_name)


def owner_of(path: str, named: Sequence[str]) -> str | None:
    """The named module path that is `path` or contains it."""
    for name in named:
        if path == name or path.startswith(name + "."):
            return name
    return None


def _module_stage(partition: Partition, model: nn.Module) -> dict[str, int]:
    modules = dict(model.named_modules())
    out: dict[str, int] = {}
    for s in sorted(partition.stages, key=lambda st: st.stage_index):
        if s.nodes and not s.modules:
            raise PipelineSplitError(
                f"partition: stage {s.stage_index} names graph nodes only; the runtime splits "
                "the model by module names (stages[].modules)"
            )
        for name in s.modules:
            if not name or name not in modules:
                near = sorted(k for k in modules if k and k.count(".") == name.count("."))
                raise PipelineSplitError(
                    f"partition: stage {s.stage_index} names module {name!r}, which the model "
                    f"({type(model).__name__}) does not have (modules at that depth: "
                    f"{', '.join(near[:8])}{', ...' if len(near) > 8 else ''})"
                )
            for other, t in out.items():
                if owner_of(name, [other]) or owner_of(other, [name]):
                    raise PipelineSplitError(
                        f"partition: module {name!r} (stage {s.stage_index}) overlaps "
                        f"{other!r} (stage {t}): a module belongs to one stage"
                    )
            out[name] = s.stage_index
    return out


def check_plan_model(plan: Plan, model: nn.Module) -> None:
    """Refuse, in one line naming the model the plan is for, a plan made for another model,
    before any torch.fx tracing: by its graph summary (parameter tensors and bytes) when the
    plan has one, else when its stages name some blocks of a container (`h.0`, `h.1`) and not
    others that hold parameters (`h.2` .. `h.7`: a deeper model)."""
    if plan.partition is None:
        return
    params = dict(model.named_parameters())
    summary = plan.graph_summary
    if summary is not None and summary.parameters is not None:
        count = len(params)
        size = sum(p.numel() * p.element_size() for p in params.values())
        same_bytes = summary.precision != "fp32" or summary.parameters_bytes == size
        if summary.parameters != count or not same_bytes:
            raise PipelineSplitError(
                f"plan: this plan is for {summary.describe()}, not for this model "
                f"({type(model).__name__}, {count} parameter tensors of {size} bytes): trace "
                "this model and partition its graph"
            )
    named = [m for s in plan.partition.stages for m in s.modules]
    for parent, missing, total in _unnamed_blocks(model, named, params):
        plan_for = f" ({summary.describe()})" if summary is not None else ""
        raise PipelineSplitError(
            f"plan: this plan is for another model{plan_for}: its stages name "
            f"{total - len(missing)} of this model's {total} blocks {parent}.* "
            f"({type(model).__name__}), not "
            f"{_span(parent, missing)}: trace this model and partition its graph"
        )


def _unnamed_blocks(
    model: nn.Module, named: Sequence[str], params: dict[str, Any]
) -> list[tuple[str, list[str], int]]:
    """(container, its indexed children holding parameters that no stage names, how many it
    has) for each container some of whose indexed children a stage names."""
    out = []
    for parent in sorted({n.rpartition(".")[0] for n in named if n.rpartition(".")[2].isdigit()}):
        children = [k for k, _ in model.get_submodule(parent).named_children() if k.isdigit()]
        paths = [f"{parent}.{k}" if parent else k for k in children]
        missing = [
            p for p in paths
            if owner_of(p, named) is None and any(owner_of(q, [p]) for q in params)
        ]
        if missing:
            out.append((parent, missing, len(paths)))
    return out


def _span(parent: str, missing: list[str]) -> str:
    if len(missing) <= 2:
        return " and ".join(missing)
    return f"{missing[0]} .. {missing[-1]} ({len(missing)})"


def trace_model(model: nn.Module, named: Sequence[str]) -> fx.GraphModule:
    tracer = _Tracer(named)
    try:
        graph = tracer.trace(model)
    except Exception as e:  # fx raises many kinds; the first line says what
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PipelineSplitError(
            f"model {type(model).__name__}: its forward cannot be traced by torch.fx with the "
            f"stage modules as leaves ({first}); see planner.runtime.pipeline_split for which "
            "models qualify"
        ) from None
    return fx.GraphModule(model, graph)


def split_model(
    model: nn.Module, partition: Partition, example_inputs: tuple[Any, ...]
) -> SplitModel:
    """Stage programs of `model` for `partition` (runs one forward on `example_inputs` without
    autograd to learn which values are tensors; RNG state is restored)."""
    module_stage = _module_stage(partition, model)
    named = list(module_stage)
    gm = trace_model(model, named)
    _propagate(gm, example_inputs)
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(example_inputs) != len(placeholders):
        raise PipelineSplitError(
            f"inputs: {len(example_inputs)} given, the model's forward takes "
            f"{len(placeholders)} ({', '.join(n.name for n in placeholders)})"
        )
    stage = _place(gm, module_stage, partition.stage_count)
    output = next(n for n in nodes if n.op == "output")
    returned = output.args[0]
    value = returned.meta.get("value") if isinstance(returned, fx.Node) else None
    returns_loss = isinstance(value, torch.Tensor) and value.dim() == 0
    readers = {
        p.name: sorted({stage[u] for u in p.users if u.op != "output"}) for p in placeholders
    }
    positional = [p.name for p in placeholders if 0 in readers[p.name]]
    keyword = [p.name for p in placeholders if readers[p.name] and 0 not in readers[p.name]]
    programs = _build(gm, stage, partition.stage_count, positional, module_stage)
    return SplitModel(programs, positional, keyword, [p.name for p in placeholders], returns_loss)


def _propagate(gm: fx.GraphModule, inputs: tuple[Any, ...]) -> None:
    """Record each node's value (meta['value']) by running the traced forward once."""
    values: dict[str, Any] = {}

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            values[n.name] = out
            return out

    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        buffers = {k: v.detach().clone() for k, v in gm.named_buffers()}
        try:
            _Recorder(gm).run(*inputs)
        finally:
            for k, v in gm.named_buffers():
                v.copy_(buffers[k])
    for n in gm.graph.nodes:
        if n.name in values:
            v = values[n.name]
            n.meta["value"] = v if not isinstance(v, torch.Tensor) else _meta_of(v)


def _meta_of(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _place(gm: fx.GraphModule, module_stage: dict[str, int], count: int) -> dict[fx.Node, int]:
    """Stage of every computing node (see the module docstring for the rule)."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    named = list(module_stage)
    anchored: dict[fx.Node, int] = {}
    order: list[tuple[int, str]] = []  # (stage, module) of each named call, in forward order
    for n in nodes:
        if n.op == "call_module" and (owner := owner_of(str(n.target), named)) is not None:
            anchored[n] = module_stage[owner]
            order.append((anchored[n], str(n.target)))
            continue
        ins = [anchored[u] for u in n.all_input_nodes if u in anchored]
        if ins:
            anchored[n] = max(ins)
    called = {owner_of(m, named) for _, m in order}
    for name, s in module_stage.items():
        if name not in called:
            raise PipelineSplitError(
                f"partition: stage {s} names module {name!r}, which the model's forward never "
                "calls (a module used only through its attributes cannot be a stage's)"
            )
    for (s, m), (t, later) in zip(order, order[1:], strict=False):
        if t < s:
            raise PipelineSplitError(
                f"partition: stages are not contiguous in the forward: {later!r} (stage {t}) "
                f"runs after {m!r} (stage {s}); each stage's modules must run before the next "
                "stage's"
            )
    stage = dict(anchored)
    last = count - 1
    for n in reversed(nodes):  # free nodes: at the earliest stage that uses them
        if n in stage:
            continue
        users = [stage[u] for u in n.users if u.op != "output"]
        stage[n] = min(users) if users else last
    _check_shared_tensors(gm, nodes, stage, module_stage)
    for p in gm.graph.nodes:
        if p.op == "placeholder":
            users = [stage[u] for u in p.users if u.op != "output"]
            stage[p] = min(users) if users else 0
    present = set(stage[n] for n in nodes)
    for s in range(count):
        if s not in present:
            raise PipelineSplitError(f"partition: stage {s} runs nothing of the model")
    return stage


def _check_shared_tensors(
    gm: fx.GraphModule, nodes: list[fx.Node], stage: dict[fx.Node, int],
    module_stage: dict[str, int],
) -> None:
    """A parameter or buffer read directly (get_attr) must belong to one stage only."""
    named = list(module_stage)
    for n in nodes:
        if n.op != "get_attr" or not isinstance(_attr(gm, str(n.target)), torch.Tensor):
            continue
        users = {stage[u] for u in n.users if u.op != "output"}
        owner = owner_of(str(n.target), named)
        if owner is not None:
            users.add(module_stage[owner])
        if len(users) > 1:
            first, last = min(users), max(users)
            raise PipelineSplitError(
                f"partition: {n.target!r} is used by stages {first} and {last} (tied weights?):"
                " stages cannot share a parameter or buffer; put its users in one stage"
            )


def _attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _build(
    gm: fx.GraphModule,
    stage: dict[fx.Node, int],
    count: int,
    positional: list[str],
    module_stage: dict[str, int],
) -> list[StageProgram]:
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    producers = {n for n in nodes} | {
        p for p in gm.graph.nodes if p.op == "placeholder" and p.name in positional
    }
    # crossing[s]: values made at a stage <= s (or stage-0 inputs) that a stage > s reads.
    crossing: list[list[fx.Node]] = [[] for _ in range(count)]
    for v in gm.graph.nodes:
        if v not in producers:
            continue
        made = 0 if v.op == "placeholder" else stage[v]
        readers = [stage[u] for u in v.users if u.op != "output"]
        if output in v.users:
            readers.append(count - 1)
        for s in range(made, max(readers, default=made)):
            crossing[s].append(v)
    for s in range(count - 1):
        for v in crossing[s]:
            if not isinstance(v.meta.get("value"), torch.Tensor):
                raise PipelineSplitError(
                    f"partition: {v.name} (a {type(v.meta.get('value')).__name__}) made by "
                    f"stage {stage[v]} is read by a later stage: only tensors can be sent "
                    "between stages; move the boundary"
                )
    programs: list[StageProgram] = []
    named = list(module_stage)
    for s in range(count):
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        received = [gm.graph.find_nodes(op="placeholder", target=n)[0] for n in positional] \
            if s == 0 else crossing[s - 1]
        inputs = []
        for v in received:
            env[v] = g.placeholder(v.name)
            inputs.append(v.name)
        keyword: list[str] = []
        mine = [n for n in nodes if stage[n] == s]
        for p in gm.graph.nodes:
            if p.op == "placeholder" and p not in env and any(stage.get(u) == s for u in p.users):
                env[p] = g.placeholder(p.name)
                keyword.append(p.name)
        lookup = env.__getitem__
        for n in mine:
            env[n] = g.node_copy(n, lookup)
        if s == count - 1:
            g.output(fx.map_arg(output.args[0], lookup))
        else:
            g.output(tuple(env[v] for v in crossing[s]))
        module = fx.GraphModule(gm, g, class_name=f"Stage{s}")
        calls = [str(n.target) for n in mine
                 if n.op == "call_module" and owner_of(str(n.target), named) is not None]
        outs = [v.name for v in crossing[s]] if s < count - 1 else ["output"]
        programs.append(StageProgram(s, module, inputs, keyword, outs, calls))
    return programs
