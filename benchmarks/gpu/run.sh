#!/usr/bin/env bash
# The project's GPU check in one script, for the device machine (benchmarks/gpu/README.md):
# carried wheels installed into /tmp/site, the gpu-marked tests, then the fidelity benchmark.
# Run from the repository root:   bash benchmarks/gpu/run.sh [PHASES]
# PHASES: any of sanity pytest fidelity compiled units rankplan ranks (default: the first three).
# Each has a time limit (PYTEST_S, FIDELITY_S, ...) and writes as it goes, so a cut run still
# reports. Everything lands in $OUT (at most 8 files come back): log.txt, pytest.txt, fidelity.json,
# gpu_fidelity.md, graphs.tgz (the traced graphs with measured costs, for benchmarks/data/),
# compiled.txt and compiled_vs_torch_gpu.md (benchmarks/compiled_vs_torch.py on the GPU),
# units.txt (benchmarks/gpu/pipeline_units.py: per-module keep/recompute/offload on CUDA),
# ranks.txt and ranks.json (benchmarks/gpu/whole_job_ranks.py: whole-job plans, every rank on the
# one GPU; planned into RANKS_PLANS, default .gpu_plans, from a CPU trace here, or by the rankplan
# phase there from a CUDA trace: rankplan.txt, and rank_plans.tgz with the plans and graphs).
# FIDELITY_ARGS adds arguments to benchmarks/gpu_fidelity.py (e.g. "--models gpt"); UNITS_ARGS
# replaces the units phase's (default: a GPT of 4 blocks, dim 1024, context 1024, batch 4).
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
exec > >(tee -a "$O/log.txt") 2>&1
PHASES=${*:-sanity pytest fidelity}
WHEELS=${WHEELS:-.whl}
echo "== start $(date -u +%T) phases: $PHASES"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  echo "no wheels in $WHEELS: pydantic and ortools must already be installed"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
rc=0
for ph in $PHASES; do
  echo "== $ph $(date -u +%T)"
  case $ph in
    sanity)
      nvidia-smi -L
      python3 -c "import torch, pydantic, ortools; print('torch', torch.__version__, \
torch.cuda.get_device_name(), 'pydantic', pydantic.__version__, 'ortools', ortools.__version__)" \
        && python3 -c "import planner.engine.solve, planner.runtime.apply; print('imports ok')" \
        || rc=1 ;;
    pytest)
      timeout "${PYTEST_S:-170}" python3 -m pytest -p no:cacheprovider -m gpu -q -rs \
        tests/runtime/test_runtime_gpu.py tests/runtime/test_runtime_offload_gpu.py \
        $(ls tests/runtime/test_autocast.py 2>/dev/null) >"$O/pytest.txt" 2>&1
      code=$?
      grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|error" "$O/pytest.txt" | tail -30
      echo "pytest exit $code"; [ "$code" = 0 ] || rc=1 ;;
    fidelity)
      mkdir -p /tmp/graphs
      PYTHONWARNINGS=ignore timeout "${FIDELITY_S:-370}" python3 benchmarks/gpu_fidelity.py \
        --out "$O/fidelity.json" --docs "$O/gpu_fidelity.md" --graphs-dir /tmp/graphs --timeline \
        ${FIDELITY_ARGS:-}
      code=$?
      tar czf "$O/graphs.tgz" -C /tmp/graphs . && ls -l /tmp/graphs
      echo "fidelity exit $code"; [ "$code" = 0 ] || rc=1 ;;
    compiled)
      PYTHONWARNINGS=ignore timeout "${COMPILED_S:-240}" python3 benchmarks/compiled_vs_torch.py \
        --device cuda --write-docs ${COMPILED_ARGS:-} >"$O/compiled.txt" 2>&1
      code=$?
      tail -25 "$O/compiled.txt"; cp docs/compiled_vs_torch_gpu.md "$O/" 2>/dev/null
      echo "compiled exit $code"; [ "$code" = 0 ] || rc=1 ;;
    units)
      # a size whose kernels bound the step (at the script's default, dim 256, Python does
      # on an H100's host, and no per-op rule can hold: docs/whole_job.md)
      timeout "${UNITS_S:-120}" python3 benchmarks/gpu/pipeline_units.py \
        ${UNITS_ARGS:---layers 4 --dim 1024 --context 1024 --batch 4 --repeats 3} >"$O/units.txt" 2>&1
      code=$?
      tail -12 "$O/units.txt"; echo "units exit $code"; [ "$code" = 0 ] || rc=1 ;;
    rankplan)  # plan the ranks phase's rows here, from a CUDA trace (its op workspaces)
      export RANKS_PLANS=/tmp/rank_plans
      PYTHONWARNINGS=ignore timeout "${RANKPLAN_S:-150}" python3 benchmarks/gpu/whole_job_ranks.py \
        plan "$RANKS_PLANS" --trace-device cuda >"$O/rankplan.txt" 2>&1
      code=$?
      tar czf "$O/rank_plans.tgz" -C "$RANKS_PLANS" . 2>/dev/null  # plans and traced graphs
      tail -12 "$O/rankplan.txt"; echo "rankplan exit $code"; [ "$code" = 0 ] || rc=1 ;;
    ranks)
      python3 -c "import torch, torch.distributed.pipelining.schedules as s; \
print('torch', torch.__version__, '_add_reduce_grad', hasattr(s, '_add_reduce_grad'))"
      PYTHONWARNINGS=ignore timeout "${RANKS_S:-400}" python3 benchmarks/gpu/whole_job_ranks.py \
        run "${RANKS_PLANS:-.gpu_plans}" --out "$O/ranks.json" ${RANKS_ARGS:-} >"$O/ranks.txt" 2>&1
      code=$?
      grep -vE "schedules.py:[0-9]+\]" "$O/ranks.txt" | tail -120; echo "ranks exit $code"
      [ "$code" = 0 ] || rc=1 ;;
    *) echo "unknown phase $ph (use sanity, pytest, fidelity, compiled, units, rankplan, ranks)"
       rc=2 ;;
  esac
done
echo "== end $(date -u +%T) rc $rc"
exit $rc
