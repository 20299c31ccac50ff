"""Chain solvers: the Rotor DP, Revolve, Chen √n on chains, and block-level plans.

See `model` (the chain and chain.json), `layout` (chains as graphs), `linearize` (graphs as
chains), `sequence` (operations and their accounting), `rotor`, `revolve`, `translate` (to plan
actions), `blocks` (block-level plans for the runtime) and `methods` (planner methods).
"""
