"""Pipeline partitioning: contiguous stages over P devices, schedules as data (torch-free).

`units` turns a graph into an ordered chain of units (layers) with exact range costs;
`schedules` holds one class per schedule (GPipe, 1F1B, interleaved 1F1B, ZB-H1/H2) in one
registry, each owning its checks, in-flight limits and per-rank action lists (`zero_bubble`
schedules the split-backward lists, `action_lists` adds the SEND/RECV);
`dp`, `ilp` and `baselines` choose the stage boundaries; `methods` declares them as planning
methods (`pipeline-dp`, `pipeline-ilp`, `pipeline-<baseline>`).
"""
