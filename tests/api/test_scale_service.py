"""The service answers with a plan when a method overruns its time limit (issue 14): the
engine's fallback, not a killed job without a plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_server import ServerProcess, assert_valid_plan, wait_finished

from planner.core.synthetic import training_graph
from planner.engine.deadline import ANSWER_MARGIN_S

GRAPH = training_graph(40, skip=3, seed=3)


@pytest.mark.slow
def test_an_overrunning_method_still_gets_a_plan(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, f"sqlite:///{tmp_path / 's.db'}", workers=1).start()
    try:
        with server.client() as c:
            r = c.post("/v1/plans", json={"graph": GRAPH.model_dump(mode="json"), "budget": 0.9,
                                          "method": "slow-test", "options": {"sleep_s": 60},
                                          "time_limit": 1})
            assert r.status_code == 202, r.text
            answer = wait_finished(c, r.json()["id"], timeout_s=30)
        assert answer["status"] == "done", answer
        assert answer["plan"]["backend"].startswith("fallback:baseline:")
        assert "did not answer within its time limit" in answer["plan"]["notes"][0]
        assert answer["solve_seconds"] <= 1 + ANSWER_MARGIN_S + 1  # + the process's start
        assert_valid_plan(GRAPH, answer)
    finally:
        server.stop()
