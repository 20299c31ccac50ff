"""The simulator, the single judge of every plan: one-stream replay, copy streams, pipeline ranks,
and the memory accounting every solver shares. Imports only planner.core."""
