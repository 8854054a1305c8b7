"""The policy built into fastslow, on the default embedded engine: what a newcomer meets first.

With five examples a route, the built-in ``support`` task kept "hello" as account (0.79) and a
penguin joke as technical (0.86), and the README's ``rm -rf /srv/data`` check went to review at
0.63. None of the messages and tool calls below is among the policy's examples (asserted), so
these read the examples' reach, not their recall. Held-out figures on public data are in
docs/benchmarks.md ("The built-in policy", ``bench/builtin_policy.py``).
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from fastslow.api import Runtime, build_runtime
from fastslow.policies import BUILTIN_POLICY, load_policy
from fastslow.router import CheckTask, RouteTask, Settings, ToolCall

pytestmark = pytest.mark.asyncio(loop_scope="module")

OUT_OF_SCOPE = [
    "Tell me a joke about penguins",
    "hello",
    "What's the weather in Paris?",
    "who is the best basketball player of all time",
    "what's the population of canada",
    "can you recommend a podcast",
    "good night",
    "how many legs does a spider have",
]
SUPPORT = [
    ("Please refund my last payment", "billing"),
    ("My invoice shows the wrong amount", "billing"),
    ("The export button gives me an error", "technical"),
    ("Your app keeps crashing on my iPad", "technical"),
    ("The integration with Salesforce is broken", "technical"),
    ("I can't log in to my account", "account"),
    ("How do I reset two-factor authentication?", "account"),
    ("I need to change the owner of our workspace", "account"),
]
README_CALL = ("shell", {"command": "rm -rf /srv/data"})
ORDINARY_CALLS = [
    ("shell", {"command": "ls -la /srv/data"}),
    ("read_file", {"path": "/srv/data/report.csv"}),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runtime() -> AsyncIterator[Runtime]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FASTSLOW_POLICY_FILE", str(BUILTIN_POLICY))
        built = build_runtime(Settings())
    try:
        yield built
    finally:
        await built.aclose()


async def test_no_message_or_call_here_is_an_example_of_the_policy() -> None:
    policy = load_policy(BUILTIN_POLICY)
    support, tool_safety = policy.tasks["support"], policy.tasks["tool_safety"]
    assert isinstance(support, RouteTask) and isinstance(tool_safety, CheckTask)
    routes = {t.lower() for route in support.routes.values() for t in route.examples}
    assert routes.isdisjoint(m.lower() for m in [*OUT_OF_SCOPE, *(m for m, _ in SUPPORT)])
    calls = {t for rule in tool_safety.rules.values() for texts in rule.examples.values() for t in texts}
    # As the router renders them for System 1 (docs/policies.md).
    assert calls.isdisjoint(["shell: rm -rf /srv/data", "shell: ls -la /srv/data", "read_file: /srv/data/report.csv"])


@pytest.mark.parametrize("message", OUT_OF_SCOPE)
async def test_a_message_that_is_no_support_request_escalates(runtime: Runtime, message: str) -> None:
    decision = await runtime.router.route("support", message)
    assert decision.escalate, (decision.outcome, decision.reason, dict(decision.probabilities))
    assert decision.outcome not in ("billing", "technical", "account")


@pytest.mark.parametrize(("message", "route"), SUPPORT)
async def test_a_clear_support_request_is_kept_on_its_route(runtime: Runtime, message: str, route: str) -> None:
    decision = await runtime.router.route("support", message)
    assert (decision.outcome, decision.system, decision.escalate) == (route, 1, False), decision.reason


async def test_the_readme_example_of_a_destructive_call_is_denied(runtime: Runtime) -> None:
    name, args = README_CALL
    result = await runtime.router.check("tool_safety", ToolCall(id="", name=name, args=args))
    assert (result.verdict, result.rule, result.system2) == ("deny", "destructive_action", False)


@pytest.mark.parametrize(("name", "args"), ORDINARY_CALLS)
async def test_an_ordinary_read_is_allowed(runtime: Runtime, name: str, args: dict[str, Any]) -> None:
    result = await runtime.router.check("tool_safety", ToolCall(id="", name=name, args=args))
    assert (result.verdict, result.system2) == ("allow", False)


SAMPLE = 60
"""Rows of each set: enough to see a floor give way, few enough for a few seconds warm."""


@pytest.mark.data
async def test_on_held_out_public_rows_the_floors_hold_loosely(runtime: Runtime, shared_data: Path) -> None:
    """CLINC150's out-of-scope test rows mostly escalate; Banking77's support requests are mostly kept.

    The floors on every test row are 90 % and 50 % (docs/benchmarks.md); a seeded sample of 60 is
    held to 80 % and 40 %, below the measured 95.5 % and 79.2 % by more than its sampling noise.
    """
    rng = random.Random(0)
    clinc = json.loads((shared_data / "clinc150" / "data_full.json").read_text(encoding="utf-8"))
    outside = rng.sample([text for text, _ in clinc["oos_test"]], SAMPLE)
    with (shared_data / "banking77" / "test.csv").open(encoding="utf-8") as fh:
        inside = rng.sample([row["text"] for row in csv.DictReader(fh)], SAMPLE)
    escalated = [(await runtime.router.route("support", text)).escalate for text in outside]
    kept = [not (await runtime.router.route("support", text)).escalate for text in inside]
    assert sum(escalated) >= 0.8 * SAMPLE, sum(escalated)
    assert sum(kept) >= 0.4 * SAMPLE, sum(kept)
