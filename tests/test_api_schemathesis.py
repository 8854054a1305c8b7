"""A short schemathesis run against `/openapi.json`, with a key: no 5xx, and every response matches the schema.

Requests are generated from the document the app serves, sent over HTTP to the real app on a
loopback port; a few dozen examples per operation keep it quick.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import RateLimit
from tests.fakes.api_server import SEEN_RESPONSES, RunningApi, create_key, running_api, test_settings

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
EXAMPLES_PER_OPERATION = 30


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    # A limit no run reaches: 429s are tested elsewhere, here they would only hide other answers.
    with running_api(
        test_settings(tmp_path_factory.mktemp("api")), rate_limit=RateLimit(requests=1_000_000)
    ) as running:
        yield running


@pytest.fixture(scope="module")
def key(api: RunningApi) -> str:
    return create_key(api.settings, "fuzz")


def _fuzz(operation: Any, api: RunningApi, key: str) -> None:
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,  # no .hypothesis/ folder in the checkout
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def run(case: Any) -> None:
        response = case.call(base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        headers = {name: ", ".join(values) for name, values in response.headers.items()}
        SEEN_RESPONSES.add_raw(case.method, str(response.request.url), response.status_code, headers, response.content)
        case.validate_response(response, checks=CHECKS)

    run()


@pytest.mark.slow
def test_the_api_keeps_its_openapi_contract(api: RunningApi, key: str) -> None:
    # One test walking the operations: schemathesis' pytest fixture loader does not work with pytest 9.
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9
    for operation in operations:
        _fuzz(operation, api, key)
