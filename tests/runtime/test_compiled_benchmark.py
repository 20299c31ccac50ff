"""benchmarks/compiled_vs_torch.py cannot rot: its measurement, policy and verdict pieces run
fast here; the whole row building runs (slow) on a tiny GPT with the
`aot_eager_decomp_partition` backend (inductor's decompositions and min-cut partitioner, which
read the memory budget, without code generation)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from planner import zoo  # noqa: E402
from planner.runtime.measure import measure_step, training_step  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compiled_vs_torch.py"


@pytest.fixture(scope="module")
def bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compiled_vs_torch", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def tiny_bench(m: ModuleType) -> Any:
    model, inputs = zoo.gpt(**m.SIZES["tiny"], dropout=0.0)
    return m.Bench(model, inputs, torch.device("cpu"), "aot_eager_decomp_partition",
                   repeats=1, time_limit_s=1.0)


def test_profiler_peak_matches_storage_accounting_on_eager(bench_module: ModuleType) -> None:
    bench = tiny_bench(bench_module)
    step = training_step(bench.model, bench.inputs)
    profiled = bench.peak_bytes(step)
    bench.model.zero_grad(set_to_none=True)
    exact = measure_step(step, bench.model).peak_bytes
    # The profiler sees every allocation (a few bytes of scalars more than the dispatch mode).
    assert exact <= profiled <= exact * 1.01 + 1024


def test_grad_diff_zero_against_itself_and_positive_when_perturbed(
        bench_module: ModuleType) -> None:
    bench = tiny_bench(bench_module)
    step = training_step(bench.model, bench.inputs)
    bench.eager_grads = bench.grads(step)
    assert bench.grad_diff(step) == 0.0
    with torch.no_grad():  # the head's weight: every other gradient depends on it
        bench.model.head.weight.mul_(2.0)
    assert bench.grad_diff(step) > bench_module.GRAD_TOLERANCE


def test_matmul_policy_saves_every_other_matmul(bench_module: ModuleType) -> None:
    from torch.utils.checkpoint import CheckpointPolicy as P

    aten = torch.ops.aten

    class Ctx:
        is_recompute = False

    policy = bench_module.MatmulPolicy(every_other=True)
    got = [policy(Ctx(), op) for op in (aten.mm.default, aten.gelu.default, aten.addmm.default,
                                         aten.mm.default)]
    assert got == [P.MUST_SAVE, P.PREFER_RECOMPUTE, P.PREFER_RECOMPUTE, P.MUST_SAVE]
    every = bench_module.MatmulPolicy(every_other=False)
    assert every(Ctx(), aten.addmm.default) is P.MUST_SAVE


def test_verdict_says_fits_or_exceeds(bench_module: ModuleType) -> None:
    m = bench_module
    mib = m.MIB
    rows = [
        m.Row("inductor budget", "0.5 (dp)", peak_bytes=10 * mib, step_ms=20.0, eager_ms=10.0),
        m.Row("inductor budget", "0.2 (dp)", peak_bytes=4 * mib, step_ms=25.0, eager_ms=10.0),
        m.Row("Planner compiled", "≤ 10.00 MiB", peak_bytes=9 * mib, step_ms=18.0,
              eager_ms=10.0),
        m.Row("Planner compiled", "≤ 4.00 MiB", peak_bytes=5 * mib, step_ms=30.0,
              eager_ms=10.0),
    ]
    lines = m.verdict(rows)
    assert "fits" in lines[0] and "0.90×" in lines[0]
    assert "EXCEEDS" in lines[1] and "1.20×" in lines[1]
    assert all("|" in m.line(r) for r in rows)


def test_one_line_reports_the_innermost_cause(bench_module: ModuleType) -> None:
    try:
        try:
            raise RuntimeError("need scipy\nmore")
        except RuntimeError as inner:
            raise ValueError("backend raised:") from inner
    except ValueError as e:
        assert bench_module.one_line(e) == "failed: RuntimeError: need scipy"


def test_sac_ilp_row_says_why_on_cpu(bench_module: ModuleType) -> None:
    reason = bench_module.sac_ilp_reason(tiny_bench(bench_module))
    assert reason.startswith("not run:") and "\n" not in reason


@pytest.mark.slow
def test_rows_built_without_code_generation(bench_module: ModuleType,
                                            tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    args = bench_module.parse(["--tiny", "--backend", "aot_eager_decomp_partition",
                               "--repeats", "1", "--time-limit", "1", "--levels", "0.5",
                               "--solvers", "dp"])
    rows, _ = bench_module.run(args)
    methods = [r.method for r in rows]
    for expected in ("eager", "inductor default", "inductor budget",
                     "torch checkpoint every block", "Planner compiled", "Planner op-by-op (auto)",
                     "Planner compiled, selective-matmul plan"):
        assert expected in methods
    measured = [r for r in rows if r.peak_bytes is not None]
    assert len(measured) >= len(rows) - 1  # all but sac_ilp's row on CPU
    for r in measured:
        assert r.grad_diff is not None and r.grad_diff <= bench_module.GRAD_TOLERANCE, r
        assert r.step_ms and r.eager_ms and r.compile_s is not None
    planner = [r for r in rows if r.method == "Planner compiled"]
    assert planner and all(r.predicted_bytes for r in planner)
    assert bench_module.verdict(rows)
