"""schemathesis against the running service's /openapi.json: no 5xx, and every response
conforms to the documented status codes, content types and schemas (bounded examples)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from api_server import ServerProcess, running_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir: Path = tmp_path_factory.mktemp("schema")
    with running_server(workdir, f"sqlite:///{workdir / 's.db'}", workers=1,
                        submissions_per_minute=100_000, max_time_limit_s=5,
                        default_time_limit_s=2) as srv:
        yield srv


def test_openapi_conformance(service: ServerProcess) -> None:
    """Every operation, positive and negative examples; one failure list at the end."""
    schema = schemathesis.openapi.from_url(service.url + "/openapi.json")
    failures: list[str] = []
    statuses: dict[int, int] = {}
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=st.one_of(operation.as_strategy(mode) for mode in schemathesis.GenerationMode))
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None, derandomize=True)
        def check(case) -> None:  # type: ignore[no-untyped-def]
            response = case.call_and_validate(checks=CHECKS)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        try:
            check()
        except Exception as e:  # collect, so one run reports every non-conforming operation
            failures.append(f"{operation.label}: {str(e)[:2000]}")
    print(f"schemathesis: {operations} operations, responses by status {sorted(statuses.items())}")
    assert operations >= 10 and sum(statuses.values()) >= 3 * operations
    assert not failures, "\n\n".join(failures)
