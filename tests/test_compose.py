"""The wired runtime: the shipped policy loads, engines train before the first decision, and
decisions made while the policy file changes each record one complete policy version."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from fastslow.api import build_runtime
from fastslow.policies import PolicyStore, load_policy
from fastslow.router import ConfigError, Router, Settings

from fakes.scripted import Chats, OneEngine, ScriptedEngine

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "policy.yaml"


def test_a_missing_policy_file_is_a_clear_config_error(tmp_path: Path) -> None:
    # Set on purpose but absent: never silently replaced by the built-in example.
    with pytest.raises(ConfigError, match="no such policy file") as raised:
        build_runtime(Settings(policy_file=tmp_path / "nope.yaml"))
    assert raised.value.key == "policy_file"


@pytest.mark.slow  # trains heads: out of make test-fast
async def test_the_shipped_policy_routes_offline_on_the_embedded_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSLOW_POLICY_FILE", str(EXAMPLE))
    runtime = build_runtime(Settings())
    try:
        decision = await runtime.router.route("support", [HumanMessage("I was charged twice this month")])
        assert decision.outcome == "billing"
        assert decision.policy_version == runtime.store.version
        result = await runtime.router.check("tool_safety", {"tool": "delete_file", "arguments": {"path": "*"}})
        assert result.verdict in ("deny", "review")
    finally:
        await runtime.aclose()


async def test_decisions_during_reloads_each_see_one_whole_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    shutil.copy(EXAMPLE, path)
    store = PolicyStore(path, loader=load_policy)
    versions = {store.version}
    engine = ScriptedEngine(lambda state, name, q: {o: 1.0 if o == "billing" else 0.0 for o in q.options})
    router = Router(lambda: store.current, OneEngine(engine), Chats(None))
    text = EXAMPLE.read_text()

    async def rewrite() -> None:
        for i in range(15):
            path.write_text(f"{text}\n# revision {i}\n")
            store.reload()
            versions.add(store.version)
            await asyncio.sleep(0)
        path.write_text("tasks: [this is not a policy")  # a bad change keeps the last good policy
        result = store.reload()
        assert not result.ok and result.error

    async def decide() -> list[str]:
        seen = []
        for _ in range(30):
            decision = await router.route("support", [HumanMessage("refund please")])
            seen.append(decision.policy_version)
            await asyncio.sleep(0)
        return seen

    _, *seen = await asyncio.gather(rewrite(), decide(), decide())
    assert {v for batch in seen for v in batch} <= versions
    assert len(versions) == 16
    assert store.current.tasks["support"].kind == "route"
