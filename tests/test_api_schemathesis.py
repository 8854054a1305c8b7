"""A short schemathesis run against `/openapi.json`, with a key: no 5xx, and every response matches the schema.

Requests are generated from the document the app serves, sent over HTTP to the real app on a
loopback port; a few dozen examples per operation keep it quick.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from fastslow.api.app import RateLimit

from fakes.api_server import SEEN_RESPONSES, RunningApi, api_client, create_key, running_api, test_settings

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


def _realistic(case: Any, decision_ids: list[str]) -> None:
    """Point some generated requests at things that exist, so the success paths are fuzzed too.

    Random policy and task names are all 422s; the rest of each generated body (texts, tool calls,
    conversations, labels) stays as generated. Half the decision ids stay random (404s).
    """
    body = case.body
    if isinstance(body, dict):
        items = body.get("items") if isinstance(body.get("items"), list) else [body]
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("policies"), list):
                item["policies"] = ["tool_safety"]
                # The schema cannot say "exactly one of text and tool_call"; keep one.
                if item.get("tool_call") is not None:
                    item.pop("text", None)
                elif item.get("text") is None:
                    item["text"] = "git: status"
        if isinstance(body.get("task"), str):
            body["task"] = "support"
    params = case.path_parameters or {}
    if isinstance(params.get("decision_id"), str) and len(params["decision_id"]) % 2 == 0:
        params["decision_id"] = decision_ids[len(params["decision_id"]) % len(decision_ids)]


def _fuzz(operation: Any, api: RunningApi, key: str, decision_ids: list[str], mode: GenerationMode) -> None:
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,  # no .hypothesis/ folder in the checkout
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        _realistic(case, decision_ids)
        response = case.call(base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        headers = {name: ", ".join(values) for name, values in response.headers.items()}
        SEEN_RESPONSES.add_raw(case.method, str(response.request.url), response.status_code, headers, response.content)
        case.validate_response(response, checks=CHECKS)

    run()


async def _decisions(api: RunningApi, key: str) -> list[str]:
    """Decisions of the key's tenant: a route (System 1), and the rules of a policy check."""
    async with api_client(api.url, key) as client:
        route = await client.post(
            "/v1/route", json={"task": "support", "messages": [{"role": "user", "content": "refund please"}]}
        )
        check = await client.post("/v1/policy-check", json={"policies": ["tool_safety"], "text": "git: status"})
    return [route.json()["decision"]["id"], *(r["decision_id"] for r in check.json()["rules"])]


@pytest.mark.slow
def test_the_api_keeps_its_openapi_contract(api: RunningApi, key: str) -> None:
    # One test walking the operations: schemathesis' pytest fixture loader does not work with pytest 9.
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9
    decision_ids = asyncio.run(_decisions(api, key))
    for operation in operations:
        _fuzz(operation, api, key, decision_ids, GenerationMode.POSITIVE)
    # Invalid requests too, where there is input to get wrong (a body or a path parameter).
    for operation in operations:
        if operation.method.upper() == "POST" or "{" in operation.path:
            _fuzz(operation, api, key, decision_ids, GenerationMode.NEGATIVE)
