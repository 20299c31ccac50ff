"""Rematerialization solvers: Checkmate MILP (any backend), LP rounding, CP-SAT intervals,
heuristics (DTR-style eviction, greedy checkpointing, memory-aware orders) and `auto`."""
