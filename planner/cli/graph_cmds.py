"""Commands on graphs and plans: schema, import-checkmate, info, validate, simulate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer

from planner.cli.options import ResourcesOpt, resolve_resources
from planner.cli.output import bytes_text, console, key_value_table, print_json
from planner.core.budget import format_bytes
from planner.core.errors import InputError

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)
    app.command("import-checkmate")(import_checkmate)
    app.command("info")(info)
    app.command("validate")(validate)
    app.command("simulate")(simulate_cmd)


def schema(
    which: Annotated[Literal["graph", "plan", "resources"],
                     typer.Argument(metavar="WHICH", help="Which document's schema")],
) -> None:
    """Print the JSON Schema of graph.json, plan.json or resources.json."""
    from pydantic import BaseModel

    from planner.core.graph import Graph
    from planner.core.plan import Plan
    from planner.core.resources import Resources

    models: dict[str, type[BaseModel]] = {"graph": Graph, "plan": Plan, "resources": Resources}
    print(json.dumps(models[which].model_json_schema(), indent=1))


def import_checkmate(
    source: Annotated[Path, typer.Argument(help="Checkmate/Moccasin node-link JSON")],
    output: Annotated[Path, typer.Option("-o", "--output", help="graph.json to write")],
    as_json: JsonFlag = False,
) -> None:
    """Convert a Checkmate/Moccasin node-link graph to graph.json (node ids kept)."""
    from planner.core.importers.checkmate import import_checkmate_file
    from planner.core.io import write_json

    graph = import_checkmate_file(source)
    write_json(output, graph)
    summary = {"output": str(output), "nodes": len(graph.nodes), "edges": len(graph.edges),
               "hash": graph.content_hash()}
    if as_json:
        print_json(summary)
    else:
        console.print(f"wrote {output}: {len(graph.nodes)} nodes, {len(graph.edges)} edges")


def graph_info(graph_path: Path) -> dict[str, object]:
    from planner.engine.inputs import load_graph
    from planner.sim.lower_bound import peak_lower_bound_node
    from planner.sim.simulator import lower_bound_peak_bytes
    from planner.sim.step_memory import model_state_breakdown, step_memory
    from planner.solvers.baselines import store_all_peak_bytes

    graph = load_graph(graph_path)
    state = model_state_breakdown(graph)
    held = step_memory(graph)
    store_all, lower = store_all_peak_bytes(graph), lower_bound_peak_bytes(graph)
    at = peak_lower_bound_node(graph)
    phases: dict[str, int] = {}
    for n in graph.nodes:
        phases[n.phase.value] = phases.get(n.phase.value, 0) + 1
    return {
        "graph": str(graph_path),
        "model_name": graph.metadata.model_name,
        "hash": graph.content_hash(),
        "nodes": len(graph.nodes),
        "edges": len(graph.edges),
        "phases": phases,
        "total_compute_cost": graph.total_compute_ms,
        "store_all_peak_bytes": store_all,
        "lower_bound_peak_bytes": lower,
        # where the bound is met and what share of store-all it is: below it nothing fits
        "lower_bound_at": None if at is None else graph.describe(at),
        "lower_bound_of_store_all": round(lower / store_all, 4) if store_all else None,
        "fixed_bytes": graph.fixed_bytes,
        "model_state": {
            "source": "model_state" if state.derived else "fixed memory",
            "optimizer": state.optimizer or None,
            "precision": state.precision or None,
            "zero_stage": state.zero_stage,
            "data_parallel_degree": state.data_parallel_degree,
            "gradient_lifetime": state.gradient_lifetime,
            "parameters_bytes": state.parameters_bytes,
            "gradients_bytes": state.gradients_bytes,
            "optimizer_bytes": state.optimizer_bytes,
            "master_weights_bytes": state.master_weights_bytes,
            "total_bytes": state.total_bytes,
            "gradients_held_from_backward_bytes": sum(held.held_from_node.values()),
            "per_module": {m or "(root)": b.total_bytes for m, b in state.per_module.items()},
        },
    }


def info(
    graph_path: Annotated[Path, typer.Argument(metavar="GRAPH")], as_json: JsonFlag = False
) -> None:
    """Node and edge counts, compute cost, store-all peak, a lower bound on any peak."""
    data = graph_info(graph_path)
    if as_json:
        print_json(data)
        return
    state = data.pop("model_state")
    assert isinstance(state, dict)
    per_module = state.pop("per_module")
    rows = [(k, _shown(k, v)) for k, v in data.items()]
    rows += [(f"model state: {k}", _shown(k, v)) for k, v in state.items() if v is not None]
    console.print(key_value_table(str(graph_path), rows))
    if per_module:
        table = key_value_table("model-state bytes per module (one device)",
                                [(m, _shown("bytes", b)) for m, b in per_module.items()])
        console.print(table)


def _shown(key: str, value: object) -> object:
    """A value of `info` in units: bytes as 'MiB (exact B)', the compute cost in ms (the
    graph's node costs are milliseconds), a phase count as 'forward 12, backward 14'."""
    if key.endswith("bytes") and isinstance(value, int):
        return bytes_text(value)
    if key == "total_compute_cost" and isinstance(value, (int, float)):
        return f"{value:.6g} ms"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return value


def validate(
    graph_path: Annotated[Path, typer.Argument(metavar="GRAPH")],
    plan_path: Annotated[Path | None, typer.Argument(metavar="[PLAN]")] = None,
    resources: ResourcesOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Check a graph.json, and a plan.json against it (exit 2 with the first problem)."""
    from planner.core.io import load_plan
    from planner.engine.inputs import load_graph
    from planner.sim.simulator import PlanError, simulate

    graph = load_graph(graph_path)
    result: dict[str, object] = {
        "graph": str(graph_path),
        "graph_valid": True,
        "nodes": len(graph.nodes),
        "edges": len(graph.edges),
    }
    plan_line = ""
    if plan_path is not None:
        plan = load_plan(plan_path)
        try:
            sim = simulate(graph, plan, resolve_resources(resources))
        except PlanError as e:
            raise InputError(f"{plan_path}: {e}") from None
        within = plan.budget_bytes is None or sim.peak_bytes <= plan.budget_bytes
        result.update(
            plan=str(plan_path),
            plan_valid=True,
            peak_bytes=sim.peak_bytes,
            compute_cost=sim.compute_cost,
            within_budget=within,
        )
        plan_line = (
            f"{plan_path}: valid plan, peak {format_bytes(sim.peak_bytes)}, "
            f"within budget: {within}"
        )
    if as_json:
        print_json(result)
    else:
        console.print(
            f"{graph_path}: valid graph ({len(graph.nodes)} nodes, {len(graph.edges)} edges)"
        )
        if plan_line:
            console.print(plan_line)


def simulate_cmd(
    graph_path: Annotated[Path, typer.Argument(metavar="GRAPH")],
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN")],
    plot: Annotated[
        Path | None, typer.Option(
            "--plot",
            help="Write the memory timeline as PNG (plans with host copies: device and host "
            "memory over time and the compute/d2h/h2d streams as a Gantt timeline)",
        )
    ] = None,
    resources: ResourcesOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Replay a plan: peak memory, compute cost and the memory timeline."""
    from planner.core.io import load_plan
    from planner.core.out_files import check_figure_path
    from planner.engine.inputs import load_graph
    from planner.sim.simulator import PlanError, simulate

    check_figure_path(plot, "memory timeline")
    graph = load_graph(graph_path)
    plan = load_plan(plan_path)
    machine = resolve_resources(resources) or plan.resources
    try:
        sim = simulate(graph, plan, resolve_resources(resources))
    except PlanError as e:
        raise InputError(f"{plan_path}: {e}") from None
    if plot is not None:
        from planner.engine.timeline_plot import plot_timeline

        title = f"{graph.metadata.model_name or graph_path.name}: {plan.method}"
        # a path that cannot take it is one line (planner.engine.figures.save_figure)
        plot_timeline(sim, plot, title=title, budget_bytes=plan.budget_bytes, graph=graph,
                      resources=machine)
    from planner.engine.transfer_report import simulated_transfer_figures

    moved = simulated_transfer_figures(
        sim, graph, plan.actions, machine.host_memory_bytes if machine is not None else None
    )
    data = {
        "peak_bytes": sim.peak_bytes,
        "peak_action_index": sim.peak_action_index,
        "budget_bytes": plan.budget_bytes,
        "compute_cost": sim.compute_cost,
        "overhead": sim.overhead,
        "computations": sim.computations,
        "recomputations": sim.recomputations,
        "timeline": [[p.action_index, p.action, p.live_bytes] for p in sim.timeline],
        **(moved.as_dict() if moved is not None else {}),
    }
    if as_json:
        print_json(data)
        return
    from rich.table import Table

    table = Table(title="memory timeline", title_justify="left")
    for col in ("#", "action", "live bytes", ""):
        table.add_column(col)
    peak = max(sim.peak_bytes, 1)
    shown = shown_timeline(len(sim.timeline), sim.peak_action_index)
    previous = -1
    for k in shown:
        if k != previous + 1:
            table.add_row("…", f"{k - previous - 1} actions", "", "")
        p = sim.timeline[k]
        bar = "█" * round(30 * p.live_bytes / peak)
        table.add_row(str(p.action_index), p.action, format_bytes(p.live_bytes), bar)
        previous = k
    if previous != len(sim.timeline) - 1:
        table.add_row("…", f"{len(sim.timeline) - previous - 1} actions (--json: all)", "", "")
    console.print(table)
    console.print(
        f"peak {format_bytes(sim.peak_bytes)} at action {sim.peak_action_index}; "
        f"budget {format_bytes(plan.budget_bytes)}; compute {sim.compute_cost:g} ms "
        f"({100 * sim.overhead:+.3f}%), {sim.recomputations} recomputations"
        + (f"; plot written to {plot}" if plot else "")
    )
    if moved is not None:
        console.print(f"transfers: {moved}")


TIMELINE_ROWS = 200  # a table longer than this shows its start, the peak's surroundings, its end


def shown_timeline(length: int, peak_index: int, rows: int = TIMELINE_ROWS) -> list[int]:
    """Positions of the timeline the table shows: all of a short one; else the first and last
    quarter of `rows` and half of them around the peak (a table of every action of a 20,000-node
    plan takes minutes to draw and nobody reads it)."""
    if length <= rows:
        return list(range(length))
    edge, middle = rows // 4, rows // 2
    peak = min(max(peak_index, 0), length - 1)
    low = max(0, min(peak - middle // 2, length - middle))
    picked = {*range(edge), *range(low, low + middle), *range(length - edge, length)}
    return sorted(picked)
