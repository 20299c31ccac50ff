"""FSDP plans: each block's activation policy and reshard-after-forward flag and the prefetch
depth, chosen together for the fastest simulated step within a per-rank budget
(`planner.solvers.fsdp.search.solve_fsdp`; the judge is `planner.sim.fsdp.simulate_fsdp`)."""
