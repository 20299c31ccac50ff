"""The fidelity suite's one-device rows at a CI size (benchmarks/fidelity_suite.py; issue 47):
a Llama-style decoder with tied embeddings and a 32k vocabulary and a DenseNet, 1 and 4
micro-batches, store-all / `auto` at the least remat budget and midway / an offload planner,
each run by planner.runtime.apply and measured by the allocator's own records."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from planner import zoo

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fidelity_suite_device import DeviceCase, device_rows  # noqa: E402

CASES = [
    DeviceCase("llama tied vocab 32k", lambda: zoo.llama(batch_size=1, context=16, dim=32,
                                                          layers=1, vocab=32000,
                                                          tie_embeddings=True)),
    DeviceCase("densenet", lambda: zoo.densenet(batch_size=2, image=16, growth=8,
                                                 blocks=(2, 2), stem=8), offload=False),
]


@pytest.mark.slow  # traces, solves and runs 14 plans
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("microbatches", [1, 4])
def test_every_row_measures_at_most_its_prediction_and_within_2_percent(
        case: DeviceCase, microbatches: int) -> None:
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    device_rows(case, microbatches, 4.0, rows.append)
    assert {r["method"] for r in rows} >= {"store-all", "auto"}
    for r in rows:
        assert "error" not in r, r
        assert r["meas_bytes"] <= r["pred_bytes"] <= 1.02 * r["meas_bytes"], r
        assert r["grad_rel_diff"] <= 1e-5, r
