"""fastslow's ready graphs under LangGraph's own server: `langgraph dev` with the shipped langgraph.json.

One server process for the module, started from .venv-langgraph (``make langgraph``; langgraph-api
cannot share .venv with the test tools) on a loopback port, offline: tracing off, no analytics, no
version check, and System 2 is a scripted OpenAI-compatible server on loopback. Every call goes
through the server's HTTP API, as a LangGraph client's would.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import REPO_ROOT
from langchain_core.messages import HumanMessage
from starlette.applications import Starlette

from fastslow.graphs import GRAPHS
from fastslow.policies import policy_version

from fakes.openai_server import Reply, ScriptedServer, openai_server, text, tool_calls

LANGGRAPH = REPO_ROOT / ".venv-langgraph" / "bin" / "langgraph"
CONFIG = REPO_ROOT / "langgraph.json"
BUILT = "fastslow runtime built"
_START_S = 90.0

# The shipped support routes, and a tool-safety rule whose bands leave every call to a person:
# the embedded engine's probability is never exactly 0 or 1.
POLICY = """\
version: 1
tasks:
  support:
    kind: route
    instructions: Which team should handle the customer's latest message?
    routes:
      billing:
        description: Charges, invoices, refunds, payment methods and subscription plans.
        examples:
          - I was charged twice for my subscription this month
          - Can I get a refund for the annual plan I bought yesterday?
          - My card keeps getting declined when I try to pay
      technical:
        description: The product does not work as expected - errors, crashes, slowness, integrations.
        examples:
          - The app crashes every time I open the reports page
          - Your API returns a 502 error since this morning
          - Sync with Google Drive stopped working after the update
      account:
        description: Signing in, passwords, two-factor authentication, profile and team membership.
        examples:
          - I forgot my password and the reset email never arrives
          - How do I add a new teammate to our workspace?
          - Please change the email address on my account
    none_of_these: other
  tool_safety:
    kind: check
    rules:
      destructive_action:
        instructions: Would this tool call delete, overwrite or irreversibly change data?
        deny_at: 1.0
        allow_at: 0.0
        examples:
          yes: ['shell: rm -rf /srv/data', 'delete_file: ledger.db', 'run_sql: DROP TABLE customers;']
          no: ['shell: ls -la', 'read_file: notes.txt', 'list_files: {}']
"""


def _scripted_model(body: Mapping[str, Any]) -> Reply:
    """The tool agent deletes a.txt, then reports; the support specialists answer in one line."""
    if not body.get("tools"):
        last = body["messages"][-1]
        return text("Deleted a.txt as you asked." if last["role"] == "tool" else "We will refund the duplicate charge.")
    if body["messages"][-1]["role"] == "tool":
        return text("Deleted a.txt as you asked.")
    return tool_calls(("delete_file", {"path": "a.txt"}))


@dataclass(frozen=True, slots=True)
class Served:
    client: httpx2.Client
    log: Path
    sandbox: Path
    policy: Path
    model: ScriptedServer
    database: Path
    """The decision log the server records into (SQLite under its data directory)."""

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def recorded(self, where: str = "1 = 1", *args: Any) -> list[tuple[Any, ...]]:
        """``(id, tenant, task, question, outcome, system)`` of the logged decisions matching ``where``."""
        if not self.database.exists():
            return []
        with sqlite3.connect(f"file:{self.database}?mode=ro", uri=True) as db:
            query = f"SELECT id, tenant, task, question, outcome, system FROM decisions WHERE {where} ORDER BY id"
            return db.execute(query, args).fetchall()

    def recorded_once_settled(self, where: str, *args: Any, at_least: int = 1) -> list[tuple[Any, ...]]:
        """The matching decisions once at least ``at_least`` are there (the log is written behind the
        run) and a moment more has added none: what the run recorded, not what was still queued."""
        deadline = time.monotonic() + 10.0
        rows = self.recorded(where, *args)
        while len(rows) < at_least and time.monotonic() < deadline:
            time.sleep(0.1)
            rows = self.recorded(where, *args)
        time.sleep(0.5)  # several batches of the writer: anything recorded twice would be here by now
        return self.recorded(where, *args)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment(tmp: Path, model_url: str, embeddings: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FASTSLOW_", "OPENAI_", "ANTHROPIC_", "LANGSMITH_", "LANGCHAIN_"))
    }
    (tmp / "policy.yaml").write_text(POLICY)
    env.update(
        LANGGRAPH_CLI_NO_ANALYTICS="1",  # read by the CLI before it reads langgraph.json
        LANGSMITH_TRACING="false",
        FASTSLOW_DATA_DIR=str(tmp / "data"),
        FASTSLOW_SETTINGS_FILE=str(tmp / "no-settings.toml"),
        FASTSLOW_EMBEDDED__CACHE_DIR=str(embeddings),
        FASTSLOW_POLICY_FILE=str(tmp / "policy.yaml"),
        FASTSLOW_SYSTEM2__OPENAI_BASE_URL=model_url,
        FASTSLOW_SYSTEM2__OPENAI_API_KEY="sk-test",
        FASTSLOW_SYSTEM2__MAX_RETRIES="0",
        FASTSLOW_LANGGRAPH_SANDBOX=str(tmp / "sandbox"),
    )
    return env


def _wait_ready(process: subprocess.Popen[bytes], client: httpx2.Client, log: Path) -> None:
    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"langgraph dev exited with {process.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            if client.get("/ok").status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail(f"langgraph dev did not answer /ok in {_START_S:.0f} s:\n{log.read_text(errors='replace')[-4000:]}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, _embedding_cache: Path) -> Iterator[Served]:
    if not LANGGRAPH.exists():
        pytest.skip(f"{LANGGRAPH} not found: `make langgraph` builds LangGraph's server in its own virtualenv")
    tmp = tmp_path_factory.mktemp("langgraph")
    sandbox = tmp / "sandbox"
    sandbox.mkdir()
    port = _free_port()
    log = tmp / "server.log"
    with openai_server(respond=_scripted_model) as (model_url, model), log.open("wb") as out:
        command = [str(LANGGRAPH), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--config", str(CONFIG)]
        # Its own working directory: the in-memory server keeps its files (.langgraph_api/) there.
        process = subprocess.Popen(
            command,
            cwd=tmp,
            env=_environment(tmp, model_url, _embedding_cache),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0) as client:
                _wait_ready(process, client, log)
                yield Served(
                    client=client,
                    log=log,
                    sandbox=sandbox,
                    policy=tmp / "policy.yaml",
                    model=model,
                    database=tmp / "data" / "fastslow.sqlite3",
                )
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _ok(response: httpx2.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def _thread(served: Served) -> str:
    thread_id: str = _ok(served.client.post("/threads", json={}))["thread_id"]
    return thread_id


def _run(served: Served, thread_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = _ok(served.client.post(f"/threads/{thread_id}/runs/wait", json=payload))
    # A run that raised still answers 200, with the error in place of its state.
    assert "__error__" not in state, f"{state['__error__']}\n{served.log_text()[-4000:]}"
    status = _ok(served.client.get(f"/threads/{thread_id}"))["status"]
    assert status in ("idle", "interrupted"), f"the thread is {status} after its run: {state}"
    return state


def _ask(graph: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"assistant_id": graph, "input": {"messages": [{"role": "user", "content": message}]}, **extra}


def test_langgraph_json_names_every_ready_graph_by_its_factory() -> None:
    # Runs where .venv-langgraph is absent too: the file's graphs are fastslow's, factory by factory.
    config = json.loads(CONFIG.read_text())
    assert set(config["graphs"]) == {*GRAPHS, "create-agent"}
    for name, entry in config["graphs"].items():
        module, _, attribute = entry["path"].partition(":")
        factory = getattr(importlib.import_module(module), attribute)
        # No parameters: the server calls it with none and awaits what it returns.
        assert inspect.iscoroutinefunction(factory) and not inspect.signature(factory).parameters
        if name in GRAPHS:
            assert entry["description"] == GRAPHS[name].description
    # The custom app whose lifespan builds the runtime once, watches the policy and closes it.
    module, _, attribute = config["http"]["app"].partition(":")
    app = getattr(importlib.import_module(module), attribute)
    assert isinstance(app, Starlette) and app.routes == []
    assert config["env"]["LANGSMITH_TRACING"] == "false"


@pytest.mark.slow
def test_the_server_offers_the_ready_graphs_with_a_json_context(served: Served) -> None:
    assistants = _ok(served.client.post("/assistants/search", json={"limit": 50}))
    assert {a["graph_id"] for a in assistants} == {"support-triage", "guarded-tools", "draft-validate", "create-agent"}
    tools = next(a for a in assistants if a["graph_id"] == "guarded-tools")
    schemas = _ok(served.client.get(f"/assistants/{tools['assistant_id']}/schemas"))
    # What a caller may choose; the chat source, draft worker and sandbox are the server's own.
    assert set(schemas["context_schema"]["properties"]) == {"agent_model", "frontier_model"}


@pytest.mark.slow
def test_support_triage_runs_on_a_thread_and_keeps_the_routers_decision(served: Served) -> None:
    thread_id = _thread(served)
    state = _run(served, thread_id, _ask("support-triage", "I was charged twice for my subscription this month"))
    assert state["route"] == "billing" and state["outcome"] == "answered"
    decision = state["decision"]
    assert decision["task"] == "support" and decision["outcome"] == "billing" and decision["system"] == 1
    assert decision["engine"] == "embedded" and decision["policy_version"].startswith("sha256:")
    assert state["messages"][-1]["content"] == "We will refund the duplicate charge."
    # The server's own persistence kept the thread's state.
    kept = _ok(served.client.get(f"/threads/{thread_id}/state"))
    assert kept["values"]["decision"]["id"] == decision["id"] and kept["next"] == []
    # And fastslow's decision log has it, for the server's tenant, once.
    logged = served.recorded_once_settled("id = ?", decision["id"])
    assert logged == [(decision["id"], "langgraph", "support", "support", "billing", 1)]


@pytest.mark.slow
def test_a_run_context_chooses_the_agent_model(served: Served) -> None:
    before = len(served.model.requests)
    payload = _ask("support-triage", "The app crashes every time I open the reports page")
    state = _run(served, _thread(served), payload | {"context": {"agent_model": "openai:support-small"}})
    assert state["route"] == "technical" and state["steps"][-1]["status"] == "done"
    assert [r["model"] for r in served.model.requests[before:]] == ["support-small"]


@pytest.mark.slow
def test_guarded_tools_pauses_for_review_and_a_person_approves(served: Served) -> None:
    target = served.sandbox / "a.txt"
    target.write_text("hello")
    thread_id = _thread(served)
    before = len(served.recorded("task = 'tool_safety'"))
    paused = _run(served, thread_id, _ask("guarded-tools", "delete a.txt"))
    assert target.exists()  # nothing ran before the review
    kept = _ok(served.client.get(f"/threads/{thread_id}/state"))
    assert kept["next"] == ["gate"]
    (question,) = [i["value"] for task in kept["tasks"] for i in task["interrupts"]]
    assert question["tool_call"]["name"] == "delete_file" and question["tool_call"]["args"] == {"path": "a.txt"}
    assert question["rule"] == "destructive_action" and question["resume_with"] == ["allow", "deny"]
    # The run's own answer carries the same question, and no outcome: the run is not over.
    assert [i["value"] for i in paused["__interrupt__"]] == [question] and "outcome" not in paused

    done = _run(served, thread_id, {"assistant_id": "guarded-tools", "command": {"resume": "allow"}})
    assert not target.exists()
    assert done["gate"][-1]["verdict"] == "allow" and done["gate"][-1]["by"] == "a person"
    assert done["outcome"] == "answered" and done["messages"][-1]["content"] == "Deleted a.txt as you asked."
    # One check, recorded once: the resumed run reused the reviewed verdict instead of asking again.
    checks = served.recorded_once_settled("task = 'tool_safety'", at_least=before + 1)
    assert len(checks) == before + 1, checks


@pytest.mark.slow
def test_the_runtime_is_built_once_per_server_process(served: Served) -> None:
    for message in ("Where do I download last month's invoice?", "How do I add a new teammate?"):
        _run(served, _thread(served), _ask("support-triage", message))
    builds = [line for line in served.log_text().splitlines() if BUILT in line]
    assert len(builds) == 1, builds


@pytest.mark.slow
def test_the_example_create_agent_agent_routes_the_turn_and_pauses_for_review(served: Served) -> None:
    thread_id = _thread(served)
    paused = _run(served, thread_id, _ask("create-agent", "I was charged twice for my subscription this month"))
    route = paused["fastslow_route"]
    assert route["route"] == "billing" and route["decision"]["system"] == 1  # the small model's turn
    (review,) = [i["value"] for i in paused["__interrupt__"]]
    (request,) = review["action_requests"]  # as LangChain's HumanInTheLoopMiddleware asks
    assert request["name"] == "read_file" and request["fastslow"]["rule"] == "destructive_action"

    approve = {"decisions": [{"type": "approve"}]}
    done = _run(served, thread_id, {"assistant_id": "create-agent", "command": {"resume": approve}})
    assert "__interrupt__" not in done
    assert done["messages"][-1]["content"].startswith("[small] success: /srv/app/logs/billing.log")


@pytest.mark.slow
def test_the_server_puts_a_changed_policy_file_in_force(served: Served) -> None:
    # Only a comment changes, so other runs decide as before; the version, the file's hash, does change.
    changed = served.policy.read_text() + "# reloaded\n"
    served.policy.write_text(changed)
    version = policy_version(changed.encode())
    seen: list[str] = []
    deadline = time.monotonic() + 30.0  # the watcher polls each second and loads what it read twice
    while time.monotonic() < deadline and version not in seen:
        state = _run(served, _thread(served), _ask("support-triage", "My card keeps getting declined"))
        seen.append(state["decision"]["policy_version"])
        time.sleep(0.5)
    assert seen[-1] == version, seen
    builds = [line for line in served.log_text().splitlines() if BUILT in line]
    assert len(builds) == 1, builds  # a reload swaps the policy, not the runtime


@pytest.mark.parametrize(("tenant", "logged"), [(None, "langgraph"), ("acme", "acme"), ("", None)])
def test_the_lifespan_records_the_served_decisions_for_its_tenant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tenant: str | None, logged: str | None
) -> None:
    # In this process, without the server: the lifespan the server runs, then a decision through
    # the router the served graphs get. Unset, the tenant is `langgraph`; empty, nothing is logged.
    from fastslow.api import langgraph_server as served

    if tenant is not None:
        monkeypatch.setenv(served.TENANT_ENV, tenant)

    async def decide() -> str:
        async with served.lifespan(served.app):
            runtime = await served.server_runtime()
            router = served._process.router(runtime)
            decision = await router.route("support", [HumanMessage("I was charged twice this month")])
            return decision.id
        # Closing the lifespan committed what the router queued behind it.

    decision_id = asyncio.run(decide())
    database = tmp_path / "data" / "fastslow.sqlite3"
    if logged is None:
        assert not database.exists()
        return
    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT id, tenant, task FROM decisions").fetchall()
    assert rows == [(decision_id, logged, "support")]
