"""The schedule grid of a pipeline plan: ranks x time, F/B/I/W coloured, idle time left blank.

Times are the event simulator's (planner.sim.pipeline_ranks.simulate_pipeline_spans), so the
picture shows the same step the plan predicts. matplotlib is imported only here (Agg backend).
"""

from __future__ import annotations

from pathlib import Path

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.plan import Plan, PlanKind
from planner.engine.figures import save_figure
from planner.sim.pipeline_ranks import ActionSpan, simulate_pipeline_spans

COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#55A868"}


def schedule_spans(graph: Graph, plan: Plan) -> list[ActionSpan]:
    if plan.kind is not PlanKind.pipeline or plan.partition is None or plan.rank_actions is None:
        raise InputError("the plan is not a pipeline plan: nothing to draw as a schedule grid")
    return simulate_pipeline_spans(graph, plan.partition, plan.rank_actions, plan.resources)[1]


def plot_schedule(graph: Graph, plan: Plan, path: str | Path, title: str = "") -> Path:
    """Write the grid picture (PNG, SVG or PDF by the file's suffix) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    spans = schedule_spans(graph, plan)
    ranks = 1 + max(s.rank for s in spans)
    end = max(s.end_ms for s in spans)
    fig, ax = plt.subplots(figsize=(max(8.0, min(24.0, len(spans) / ranks / 2)), 0.6 * ranks + 1.4))
    ax.barh(range(ranks), [end] * ranks, left=0, height=0.8, color="#EEEEEE", edgecolor="none")
    for s in spans:
        op = s.action.op.value
        ax.barh(s.rank, s.end_ms - s.start_ms, left=s.start_ms, height=0.8,
                color=COLOURS.get(op, "#999999"), edgecolor="white", linewidth=0.5)
        width = s.end_ms - s.start_ms
        if width > end / 80:
            ax.text(s.start_ms + width / 2, s.rank, f"{s.action.microbatch_index}",
                    ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_xlim(0, end)
    ax.set_xlabel("time (ms)")
    p = plan.predicted
    bubble = f", bubble {100 * p.bubble_fraction:.1f}%" if p and p.bubble_fraction is not None \
        else ""
    label = title or (f"{plan.details.get('schedule', 'pipeline')}: "
                      f"{plan.details.get('microbatches', '?')} micro-batches, "
                      f"step {end:.3g} ms{bubble}")
    ax.set_title(label, loc="left", fontsize=10)
    used = sorted({s.action.op.value for s in spans}, key="FBIW".index)
    handles = [Patch(color=COLOURS[o], label=o) for o in used]
    handles.append(Patch(color="#EEEEEE", label="idle"))
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7,
              ncol=len(handles), frameon=False)
    fig.tight_layout()
    return save_figure(fig, path, 120)
