"""The options of the offload methods (their specs' dataclasses, planner.solvers.spec), in a
module of their own so that the planners (milp, pofo_method) read them without importing the
method table that imports them."""

from __future__ import annotations

from dataclasses import dataclass

from planner.solvers.spec import option

# torchtune's min_offload_size, as `heuristics.DEFAULT_MIN_BYTES`
# (tests/tracing/test_torch_side_speed.py holds the two equal): said here so that the specs load
# without the heuristics.
DEFAULT_MIN_BYTES = 1024

# The offload MILP's solvers and the largest graph its model is built for by default.
MILP_BACKENDS = ("scip", "highs", "cbc", "cpsat")
MILP_MAX_NODES = 400


@dataclass(frozen=True)
class OffloadAllOptions:
    min_bytes: int = option(DEFAULT_MIN_BYTES, "offload only tensors of at least this many "
                            "bytes (torchtune's default)", minimum=0)


@dataclass(frozen=True)
class OffloadMilpOptions:
    backend: str = option("scip", "solver (cpsat: on integer grids)", choices=MILP_BACKENDS)
    max_nodes: int = option(MILP_MAX_NODES, "largest graph the model is built for", minimum=1)


@dataclass(frozen=True)
class PofoOptions:
    slots: int = option(200, "memory discretisation", minimum=1)
