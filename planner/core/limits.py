"""Time limits: one validation for every CLI command, the REST API and the engine.

A limit must be a finite number of seconds, more than 0 and at most `MAX_TIME_LIMIT_S` (one
day): `inf` would overflow the solver back-ends' integer clocks, `nan` compares false with
everything (so no deadline would ever pass), and 0 leaves no time to find any plan.

The default when a request gives none is one constant per plan kind, all of them here (every
entry point and the solvers read them; `planner.engine.request.default_time_limit_s` picks by
the method). A remat or offload method searches until its limit, its exact models proving a
bound as they go: `DEFAULT_TIME_LIMIT_S`. A pipeline partitioner's limit is a budget of counted
work that decides which splits it tries (the same request gives the same plan), its search
settles within seconds and `partition` is interactive: `DEFAULT_PIPELINE_TIME_LIMIT_S` (one
60 s default would make a partition that uses its whole budget six times slower and change the
plans that requests without a time limit get today). A sweep solves many budgets:
`DEFAULT_SWEEP_TIME_LIMIT_S` each. The training-loop agent and the trainer callbacks plan while
the job waits to start: `DEFAULT_AGENT_TIME_LIMIT_S`.
"""

from __future__ import annotations

import math

from planner.core.errors import InputError

__all__ = ["DEFAULT_AGENT_TIME_LIMIT_S", "DEFAULT_PIPELINE_TIME_LIMIT_S",
           "DEFAULT_SWEEP_TIME_LIMIT_S",
           "DEFAULT_TIME_LIMIT_S", "MAX_TIME_LIMIT_S", "check_time_limit"]

MAX_TIME_LIMIT_S = 86_400.0  # one day; a server may cap it lower (max_time_limit_s)
DEFAULT_TIME_LIMIT_S = 60.0  # a plan of kind remat, offload or remat+offload
DEFAULT_PIPELINE_TIME_LIMIT_S = 10.0  # a plan of kind pipeline (a partition)
DEFAULT_SWEEP_TIME_LIMIT_S = 20.0  # each budget of a sweep (many solves, jobs at a time)
DEFAULT_AGENT_TIME_LIMIT_S = 30.0  # plan_for and the trainer callbacks (the job waits on it)


def check_time_limit(value: object, name: str = "time_limit") -> float:
    """`value` as seconds, or InputError whose field is `name` (`time_limit`; the CLI says
    `--time-limit`)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputError(f"{value!r}: expected a number of seconds", field=name)
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        raise InputError(f"{value!r}: expected a number of seconds, e.g. 30", field=name) from None
    shown = value if isinstance(value, str) else f"{seconds:g}"
    if not math.isfinite(seconds):
        raise InputError(
            f"{shown}: must be a finite number of seconds (at most {MAX_TIME_LIMIT_S:g}, one "
            "day)", field=name,
        )
    if seconds <= 0:
        raise InputError(f"{shown}: must be more than 0 seconds", field=name)
    if seconds > MAX_TIME_LIMIT_S:
        raise InputError(
            f"{shown}: over the largest time limit of {MAX_TIME_LIMIT_S:g} s (one day)",
            field=name,
        )
    return seconds
