"""Planning with host offloading (issue 15): plans with `O`/`P`/`D` actions judged by the event
simulator for a `Resources` with a host tier.

- `schedule`: offload windows of a compute/free plan and the plan with host copies;
- `search`: the simulator-in-the-loop judge and the window-selection engine;
- `heuristics`: offload-all (torchtune / save_on_cpu), offload-greedy (DeepCompile),
  Beaumont et al. 2020-style heuristics;
- `hybrid`: remat + offload on any graph, `improve_with_offload` for auto;
- `pofo` / `pofo_method`: the chain DP combining Rotor with offloading;
- `milp`: offloading and recomputation on Checkmate's stage grid;
- `methods`: the registry entry points.
"""
