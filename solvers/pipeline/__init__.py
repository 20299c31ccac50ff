"""Pipeline partitioning: contiguous stages over P devices, schedules as data (torch-free).

`units` turns a graph into an ordered chain of units (layers) with exact range costs;
`schedules` makes per-rank action lists (GPipe, 1F1B, interleaved 1F1B, ZB-H1/H2);
`dp`, `ilp` and `baselines` choose the stage boundaries.
"""
