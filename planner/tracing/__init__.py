"""Tracing PyTorch training steps into graph.json (torch is imported only when used).

Stable interface (the runtime executes plans on these graphs):

    from planner.tracing import trace
    result = trace(model, inputs, loss_fn=None, level="op" | "module", block_pattern=None,
                   costs="estimate" | "measure", device_profile="cpu", optimizer="sgd",
                   fuse=True, autocast=None | "bf16" | "fp16")

`result.graph` is a `planner.core.graph.Graph` with node ids 0..n-1 in execution order
(`graph.order`), forward then backward. Fixed memory: parameters, one gradient per trainable
parameter, optimizer state (sgd 0, adam/adamw 2 tensors per parameter), inputs, buffers.
`graph.outputs`: the loss node and the nodes producing parameter gradients.

Level "op" (AOTAutograd joint graph, via torch.compile(fullgraph=True)):
- `result.joint`: the `torch.fx.GraphModule` of the joint forward+backward. Its placeholders are
  primals (in order: what `result.primal_kinds` / `result.primal_names` say: parameter,
  buffer or input, with the FQN or "inputs.K") then tangents (`result.tangent_fx_names`: the
  gradient of the loss, ones). Its outputs: forward outputs (the loss, `result.loss_fx_name`)
  then one gradient per primal (`result.gradient_fx_names`: parameter FQN -> fx node).
- `result.node_fx_names[node_id]`: the fx nodes fused into graph node `node_id`, in fx order
  (the first non-trivial one names the node). Views, detach and in-place ops join the node whose
  storage they share; a view of a primal joins its first consumer (later consumers get no edge:
  it holds no memory and is free to redo). A multi-output op owns no bytes; each `getitem` of
  it is a node owning its element, so elements are freed independently. Dropout with p = 0 is
  the identity in eager; its joint-graph clone is sized as a view
  (`result.details["identity_dropout_fx_names"]`).
- Node fields: `output_bytes` (storage of its outputs, real sizes), `alias_of` (unfused views),
  `random` (ops tagged nondeterministic_seeded, e.g. dropout: replay RNG when recomputing),
  `module_path` (forward: nn_module_stack; backward: the forward op with the same seq_nr),
  phase forward / loss / backward.
- A graph break (data-dependent control flow) or another capture failure raises
  `planner.tracing.capture.CaptureError` (an InputError): one line naming the cause and
  suggesting `--level module`.

Level "module": nodes F:<unit> and B:<unit> per leaf module or block (`block_pattern`, fnmatch
on module paths), edges from measured data flow; `result.details["chain"]` is a chain.json
(schema chain-1, solvers/chain) with the Rotor quantities per stage: forward_ms, backward_ms,
output_bytes (x), saved_bytes (x̄), forward_tmp_bytes, backward_tmp_bytes, grad_input_bytes;
`details["is_chain"]` is False when units read outputs of non-adjacent units (skip edges).

Mixed precision (`autocast`, or `trace` called inside a `torch.autocast` block): the joint
graph holds the casts, `graph.metadata.extra["autocast"]` the setting (planner.tracing.autocast).

Progress (`progress=fn(stage, done, total)`): the phases in words, as they start: "capture:
forward (dynamo)", "capture: backward (AOTAutograd; ...)", "capture: joint forward+backward
graph (N fx nodes), partitioning", "op graph: records of N joint-graph ops" (counted),
"costs: roofline estimate ... of N ops" or "timing N ops: run k/R" (counted), "workspace: ...",
"op graph: fusing ..."; `total` 0 for a phase without a count.

Recorded captures (op level): every trace records its model's fingerprint
(`graph.trace_options["fingerprint"]`, planner.tracing.fingerprint: parameter and buffer names,
shapes, dtypes; module settings and source files; input shapes; loss; autocast; torch's
version) and keeps its capture in the capture store (planner.tracing.capture_store;
PLANNER_TRACE_CACHE, default ~/.cache/planner/captures, "off" keeps none). `reuse_capture=`
a fingerprint (what `planner.runtime.apply` passes: the plan's) or True uses the kept capture
of a model with that fingerprint instead of capturing again: the same graph, without dynamo or
AOTAutograd; `result.details["capture_source"]` says "recorded" or "captured", and
`details["capture_note"]` why a capture asked for was not used.

Memory measurement: `planner.tracing.memory.measure_step_memory(fn)` (live storage bytes during
fn on CPU, exact at op boundaries; the allocator's peak on CUDA), `measure_training_step`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["trace", "TraceResult"]


def __getattr__(name: str) -> Any:
    if name in ("trace", "TraceResult"):
        from planner.tracing import api

        return getattr(api, name)
    raise AttributeError(f"module 'planner.tracing' has no attribute {name!r}")
