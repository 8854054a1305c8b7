"""Schemathesis against `/openapi.json`: every operation, with a key, without one and with a wrong one.

Requests are generated from the document the app serves, sent over HTTP to the real app on a
loopback port; a few dozen examples per operation keep it quick. Every response must be no 5xx
and match the schema (status, content type, body, headers):

* the operations come from the schema, and the schema must list every route the app serves (a new
  endpoint, or one hidden from the schema, fails here rather than go unfuzzed);
* with a valid key, valid and invalid requests (the success paths are reached by pointing some
  generated requests at things that exist);
* without a key and with a wrong one, every operation under `/v1/` is a 401, before its body is read;
* stateful: the app's schema has no OpenAPI links (FastAPI declares none), so the run adds the
  ones its responses imply to its own copy of the schema (a check's and a route's decision id to
  `GET /v1/decisions/{id}` and its outcome) and lets schemathesis' state machine follow them.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any, ClassVar

import httpx2
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.routing import Mount

from fastslow.api.app import RateLimit
from fastslow.api.app._docs import ASSETS_URL, DOCS_URL, REDOC_URL
from fastslow.api.console import CONSOLE_URL

from fakes.api_server import SEEN_RESPONSES, RunningApi, api_client, create_key, running_api, test_settings

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
EXAMPLES_PER_OPERATION = 30
AUTH_EXAMPLES = 10
"""Per operation, mode and kind of missing key: a 401 comes before any work, so a few suffice."""
STATEFUL_SCENARIOS = 30
STATEFUL_STEPS = 6

KNOWN_OPERATIONS = {
    ("POST", "/v1/policy-check"),
    ("POST", "/v1/policy-check/batch"),
    ("POST", "/v1/route"),
    ("POST", "/v1/systemone"),
    ("GET", "/v1/decisions/{decision_id}"),
    ("POST", "/v1/decisions/{decision_id}/outcome"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
}
"""The operations fuzzed when this was written; the run takes whatever the schema lists, at least these."""
OUTSIDE_THE_SCHEMA = {("GET", "/")}
"""Routes for people, not operations: the root redirects to the console (the console's own pages are skipped)."""
PROBES = {"/healthz", "/readyz", "/metrics"}
"""The only paths that need no key."""
DECISION = "/v1/decisions/{decision_id}"
OUTCOME = "/v1/decisions/{decision_id}/outcome"
LINKS = {
    ("POST", "/v1/policy-check"): "$response.body#/decision_id",
    ("POST", "/v1/policy-check/batch"): "$response.body#/results/0/decision_id",
    ("POST", "/v1/route"): "$response.body#/decision/id",
}
"""Where each response names a decision (its 200 body), for the links the stateful run adds."""


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    # Limits no run reaches: 429s are tested elsewhere, here they would only hide other answers.
    settings = test_settings(tmp_path_factory.mktemp("api"), auth_throttle={"failures": 1_000_000})
    with running_api(settings, rate_limit=RateLimit(requests=1_000_000)) as running:
        yield running


@pytest.fixture(scope="module")
def key(api: RunningApi) -> str:
    return create_key(api.settings, "fuzz")


@pytest.fixture(scope="module")
def document(api: RunningApi) -> dict[str, Any]:
    """The OpenAPI document the app serves."""
    response = httpx2.get(f"{api.url}/openapi.json", timeout=60)
    assert response.status_code == 200
    doc: dict[str, Any] = response.json()
    return doc


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def _labels(operations: list[Any]) -> set[tuple[str, str]]:
    return {(operation.method.upper(), operation.path) for operation in operations}


def _realistic(case: Any, decision_ids: list[str]) -> None:
    """Point some generated requests at things that exist, so the success paths are fuzzed too.

    Random policy and task names are all 422s; the rest of each generated body (texts, tool calls,
    conversations, labels) stays as generated. With ``decision_ids``, half the decision ids stay
    random (404s) and the rest name real decisions; without, path parameters stay as they are.
    """
    body = case.body
    if isinstance(body, dict):
        listed = body.get("items")
        items: list[Any] = listed if isinstance(listed, list) else [body]
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
        if case.operation.path == OUTCOME and isinstance(body.get("label"), str) and len(body["label"]) % 2 == 0:
            body["label"] = "allow"  # a verdict: the outcome of a check's decision
            body.pop("system2_correct", None)  # System 2 answered none of them: a 422 otherwise
    params = case.path_parameters or {}
    if decision_ids and isinstance(params.get("decision_id"), str) and len(params["decision_id"]) % 2 == 0:
        params["decision_id"] = decision_ids[len(params["decision_id"]) % len(decision_ids)]


def _keep(case: Any, response: Any) -> None:
    headers = {name: ", ".join(values) for name, values in response.headers.items()}
    SEEN_RESPONSES.add_raw(case.method, str(response.request.url), response.status_code, headers, response.content)


def _fuzz(
    operation: Any,
    api: RunningApi,
    headers: dict[str, str] | None,
    decision_ids: list[str],
    mode: GenerationMode,
    *,
    examples: int = EXAMPLES_PER_OPERATION,
    status: int | None = None,
) -> None:
    """``examples`` generated requests to ``operation``: with ``headers`` (None: no Authorization at all).

    With ``status``, every response must have that status too, or 413 for a body over
    ``max_body_bytes``: the declared size is checked before the key (docs/limits.md, "HTTP server").
    """

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,  # no .hypothesis/ folder in the checkout
        # The same requests on every run, so a failure here is the app's, reproducible, never the
        # luck of one run (a rare body that reaches another check first, say); breadth comes from
        # the operations and modes, and each change to the test draws new ones.
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        _realistic(case, decision_ids)
        if headers is None and case.headers:
            # Schemathesis fills the bearer scheme's header with random tokens: take it out.
            case.headers = {k: v for k, v in case.headers.items() if k.lower() != "authorization"}
        response = case.call(base_url=api.url, headers=headers, timeout=60)
        _keep(case, response)
        case.validate_response(response, checks=CHECKS)
        if status is not None:
            sent = response.request.body or b""
            oversize = {413} if len(sent) > api.settings.max_body_bytes else set()
            got = response.status_code
            assert got in {status} | oversize, (case.method, case.path, got, response.text)

    run()


async def _decisions(api: RunningApi, key: str) -> list[str]:
    """Decisions of the key's tenant: a route (System 1), and the rules of a policy check."""
    async with api_client(api.url, key) as client:
        route = await client.post(
            "/v1/route", json={"task": "support", "messages": [{"role": "user", "content": "refund please"}]}
        )
        check = await client.post("/v1/policy-check", json={"policies": ["tool_safety"], "text": "git: status"})
    return [route.json()["decision"]["id"], *(r["decision_id"] for r in check.json()["rules"])]


def test_the_schema_lists_every_route_the_app_serves(api: RunningApi, document: dict[str, Any]) -> None:
    app = api.server.config.app
    assert isinstance(app, FastAPI)
    in_schema = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    docs = {app.openapi_url, DOCS_URL, REDOC_URL, app.swagger_ui_oauth2_redirect_url}
    served: set[tuple[str, str]] = set()
    # Routes of included routers too, with their prefixes, as FastAPI's own schema builder walks them.
    for route in iter_route_contexts(app.routes):
        if route.path in docs:  # the documentation pages live outside the schema
            continue
        if route.path == ASSETS_URL and isinstance(route.original_route, Mount):  # and the files they load
            continue
        if str(route.path).startswith(CONSOLE_URL):  # the console's pages and stylesheet, for people
            continue
        assert isinstance(route.original_route, APIRoute), route  # no mount or bare route escapes the schema
        served |= {(method, str(route.path)) for method in route.methods or ()}
    assert OUTSIDE_THE_SCHEMA <= served and not OUTSIDE_THE_SCHEMA & in_schema
    assert served - OUTSIDE_THE_SCHEMA == in_schema
    assert KNOWN_OPERATIONS <= in_schema
    for method, path in in_schema:  # every operation but the probes declares the key, and only those
        security = document["paths"][path][method.lower()].get("security")
        assert (security == [{"ApiKey": []}]) == (path not in PROBES), (method, path, security)


@pytest.mark.slow
def test_the_api_keeps_its_openapi_contract(api: RunningApi, key: str, document: dict[str, Any]) -> None:
    # One test walking the operations: schemathesis' pytest fixture loader does not work with pytest 9.
    schema = schemathesis.openapi.from_dict(copy.deepcopy(document))
    operations = _operations(schema)
    assert _labels(operations) == {(m.upper(), p) for p, item in document["paths"].items() for m in item}
    decision_ids = asyncio.run(_decisions(api, key))
    auth = {"Authorization": f"Bearer {key}"}
    for operation in operations:
        _fuzz(operation, api, auth, decision_ids, GenerationMode.POSITIVE)
    # Invalid requests too, where there is input to get wrong (a body or a path parameter).
    for operation in operations:
        if operation.method.upper() == "POST" or "{" in operation.path:
            _fuzz(operation, api, auth, decision_ids, GenerationMode.NEGATIVE)


@pytest.mark.slow
def test_every_operation_needs_a_key(api: RunningApi, key: str, document: dict[str, Any]) -> None:
    schema = schemathesis.openapi.from_dict(copy.deepcopy(document))
    secured = [operation for operation in _operations(schema) if operation.path not in PROBES]
    assert {label for label in KNOWN_OPERATIONS if label[1] not in PROBES} <= _labels(secured)
    decision_ids = asyncio.run(_decisions(api, key))
    wrong = [None, {"Authorization": "Bearer fs_not-a-key"}, {"Authorization": f"Basic {key}"}]
    for operation in secured:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for headers in wrong:
                _fuzz(operation, api, headers, decision_ids, mode, examples=AUTH_EXAMPLES, status=401)


def _with_links(document: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``document`` with links from each response naming a decision to that decision's operations."""
    doc = copy.deepcopy(document)
    assert not [
        response
        for item in doc["paths"].values()
        for operation in item.values()
        for response in operation.get("responses", {}).values()
        if response.get("links")
    ], "the app's schema has links of its own now: drop the ones added here"
    targets = {
        name: doc["paths"][path][method]["operationId"]
        for name, (method, path) in {"Get": ("get", DECISION), "Outcome": ("post", OUTCOME)}.items()
    }
    for (method, path), expression in LINKS.items():
        response = doc["paths"][path][method.lower()]["responses"]["200"]
        response["links"] = {
            f"{name}Decision": {"operationId": operation_id, "parameters": {"decision_id": expression}}
            for name, operation_id in targets.items()
        }
    return doc


@pytest.mark.slow
def test_the_state_machine_follows_decision_links(api: RunningApi, key: str, document: dict[str, Any]) -> None:
    schema = schemathesis.openapi.from_dict(_with_links(document))
    schema.config.update(base_url=api.url)
    followed: list[tuple[str, int]] = []

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        headers: ClassVar[dict[str, str]] = {"Authorization": f"Bearer {key}"}

        def before_call(self, case: Any) -> None:
            _realistic(case, [])  # decision ids come from the links
            if case.operation.path == OUTCOME and isinstance(case.body, dict) and case.body.get("label") is None:
                # Most outcomes the walk reaches then record one: the links' last step is tested too.
                case.body["label"] = "allow"
                case.body.pop("system2_correct", None)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            del case
            return {"headers": self.headers, "timeout": 60}

        def after_call(self, response: Any, case: Any) -> None:
            _keep(case, response)
            if case.operation.path in (DECISION, OUTCOME):
                followed.append((case.operation.path, response.status_code))

        def validate_response(self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any) -> None:
            del additional_checks, kwargs
            case.validate_response(response, checks=CHECKS)

    Workflow.run(
        settings=settings(
            max_examples=STATEFUL_SCENARIOS,
            stateful_step_count=STATEFUL_STEPS,
            deadline=None,
            database=None,
            derandomize=True,  # the assertions below need the same walk every run
            suppress_health_check=list(HealthCheck),
        )
    )
    # The links were followed: decisions read back, and outcomes recorded, by the ids responses gave.
    assert (DECISION, 200) in followed
    assert (OUTCOME, 201) in followed
