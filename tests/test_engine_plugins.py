"""Engine plugins: an engine from a package built and installed here, named in a policy, answering
through the router, the command line and the API.

The package (``fastslow-toy-engine``) is written to a temporary folder and installed with pip,
offline, into a folder put on ``sys.path``: what ``importlib.metadata`` finds there is what it finds
in a real site-packages. It registers two engines in the ``fastslow.engines`` entry-point group:
``toy``, the plugin docs/architecture.md shows (the first option at ``top``, 0.9 unless its settings
say otherwise, the others sharing the rest), and ``old-toy``, written for engine-API version 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from pydantic import ValidationError
from typer.testing import CliRunner

from fastslow.api import build_runtime
from fastslow.api.cli import app
from fastslow.engines import EnginePool, build_engine
from fastslow.policies import load_policy
from fastslow.router import ConfigError, Settings, installed_engines
from fastslow.router.engine_api import ENGINE_API_VERSION

from fakes.api_server import api_client, running_api, test_settings

SHIPPED = ("embedded", "sparrow", "examples", "jev", "openai-decisions", "logprob")
PLUGIN_MODULES = ("toy_engine", "toy_engine_old")

PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "fastslow-toy-engine"
version = "0.1.0"
dependencies = ["fastslow"]

[project.entry-points."fastslow.engines"]
toy = "toy_engine:plugin"
old-toy = "toy_engine_old:plugin"

[tool.setuptools]
py-modules = ["toy_engine", "toy_engine_old"]
"""

ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
"""Its "Writing an engine plugin" section holds the toy engine's module: the one built here."""

TOY_ENGINE_OLD = '''\
"""The toy engine as it was for an older fastslow."""

from fastslow.router.engine_api import EnginePlugin

from toy_engine import ToyEngine

plugin = EnginePlugin(name="old-toy", api_version=0, build=ToyEngine)
'''

POLICY = """\
version: 1
defaults:
  engine: {engine}
  thresholds: {{min_confidence: 0.7, min_margin: 0.1}}
tasks:
  support:
    kind: route
    instructions: Which team should handle the customer's latest message?
    routes:
      billing: {{description: Charges and refunds}}
      technical: {{description: Bugs and errors}}
  triage:
    kind: classify
    questions:
      sentiment:
        type: choice
        instructions: How does the customer feel?
        criteria: {{positive: pleased, negative: annoyed}}
  tool_safety:
    kind: check
    rules:
      destructive:
        instructions: Would this tool call delete or overwrite data?
        deny_at: 0.7
        allow_at: 0.2
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy package, built and installed offline once for the module; its folder is not on the path yet."""
    source = tmp_path_factory.mktemp("toy-src")
    (source / "pyproject.toml").write_text(PYPROJECT)
    documented = ARCHITECTURE.read_text().split("```python\n# toy_engine.py\n", 1)[1].split("```", 1)[0]
    (source / "toy_engine.py").write_text(documented)
    (source / "toy_engine_old.py").write_text(TOY_ENGINE_OLD)
    target = tmp_path_factory.mktemp("toy-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--disable-pip-version-check", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
    )
    return target


@pytest.fixture(autouse=True)
def installed(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The package installed for this test: its folder on ``sys.path``, its modules forgotten after."""
    monkeypatch.syspath_prepend(str(site))
    yield site
    for name in PLUGIN_MODULES:
        sys.modules.pop(name, None)


def _policy(tmp_path: Path, engine: str = "toy") -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(engine=engine))
    return path


def test_installed_plugins_are_listed_after_the_shipped_engines_from_metadata_alone() -> None:
    assert installed_engines() == (*SHIPPED, "old-toy", "toy")
    assert not [name for name in PLUGIN_MODULES if name in sys.modules]


async def test_a_policy_naming_the_plugin_routes_classifies_and_checks_through_it(tmp_path: Path) -> None:
    runtime = build_runtime(Settings(policy_file=_policy(tmp_path)))
    try:
        router = runtime.router
        decision = await router.route("support", [HumanMessage("I was charged twice this month")])
        assert (decision.outcome, decision.system, decision.engine, decision.model) == ("billing", 1, "toy", "toy-1")
        assert decision.confidence == pytest.approx(0.9)
        [sentiment] = (await router.classify("triage", "Thanks, the export works great")).values()
        assert (sentiment.outcome, sentiment.engine) == ("positive", "toy")
        result = await router.check("tool_safety", {"name": "shell", "arguments": {"command": "rm -rf /data"}})
        assert result.verdict == "deny"  # "yes" (violated) is the first option, at 0.9 >= deny_at
        assert [d.engine for d in result.decisions.values()] == ["toy"]
    finally:
        await runtime.aclose()


async def test_the_api_answers_through_the_plugin(tmp_path: Path) -> None:
    settings = test_settings(tmp_path, engine="toy", policy_file=_policy(tmp_path))
    with running_api(settings) as api:
        key = await api.key("acme")
        async with api_client(api.url, key) as client:
            call = {"name": "shell", "arguments": {"command": "rm -rf /var/lib/postgresql/data"}}
            check = await client.post("/v1/policy-check", json={"policies": ["tool_safety"], "tool_call": call})
            route = await client.post(
                "/v1/route", json={"task": "support", "messages": [{"role": "user", "content": "Refund me"}]}
            )
            ready = await client.get("/readyz")
    assert check.status_code == 200, check.text
    assert check.json()["verdict"] == "deny"
    [rule] = check.json()["rules"]
    assert rule["system"] == 1 and rule["probability"] == pytest.approx(0.9)
    assert route.status_code == 200, route.text
    assert route.json()["route"] == "billing" and route.json()["decision"]["engine"] == "toy"
    assert ready.status_code == 200 and ready.json()["engines"] == {"toy": True}


def test_the_command_line_decides_with_the_plugin() -> None:
    body = json.dumps({"state": "Refund me", "questions": {"q": {"type": "noul", "instructions": "Billing?"}}})
    result = CliRunner().invoke(app, ["decide", "--engine", "toy"], input=body)
    assert result.exit_code == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["model"] == "toy-1"
    assert reply["answers"]["q"]["type"] == "noul" and reply["answers"]["q"]["noul"] == pytest.approx(0.9)


def test_the_plugins_settings_namespace_reaches_its_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FASTSLOW_ENGINES__TOY__TOP", "0.8")
    monkeypatch.setenv("FASTSLOW_ENGINES__TOY__MODEL", "toy-from-env")
    monkeypatch.setenv("FASTSLOW_ENGINES__OLD_TOY__TOP", "0.6")  # another plugin's namespace, "-" as "_"
    engine = build_engine(Settings(), "toy")
    assert engine.settings.top == 0.8 and engine.settings.model == "toy-from-env"  # type: ignore[attr-defined]
    context = engine.context  # type: ignore[attr-defined]
    assert (context.name, context.max_reply_bytes) == ("toy", Settings().limits.max_engine_reply_bytes)
    assert context.data_dir == tmp_path / "data"

    settings_file = tmp_path / "fastslow.toml"
    settings_file.write_text('[engines.toy]\ntop = 0.75\nmodel = "toy-from-file"\n')
    monkeypatch.setenv("FASTSLOW_SETTINGS_FILE", str(settings_file))
    monkeypatch.delenv("FASTSLOW_ENGINES__TOY__TOP")
    engine = build_engine(Settings(), "toy")
    # The environment wins key by key, as for every other setting.
    assert engine.settings.top == 0.75 and engine.settings.model == "toy-from-env"  # type: ignore[attr-defined]


def test_a_setting_the_plugin_refuses_is_a_config_error_naming_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSLOW_ENGINES__TOY__TOP", "lots")
    with pytest.raises(ConfigError, match="settings of engine plugin 'toy'") as raised:
        build_engine(Settings(), "toy")
    assert raised.value.key == "engines.toy.top"


def test_a_policy_naming_an_engine_not_installed_lists_the_installed_ones(tmp_path: Path) -> None:
    path = _policy(tmp_path, engine="toyy")
    with pytest.raises(ConfigError) as raised:
        load_policy(path)
    error = raised.value
    assert (error.path, error.line, error.key) == (str(path), 3, "defaults.engine")
    installed = ", ".join((*SHIPPED, "old-toy", "toy"))
    assert (
        error.message
        == f"unknown engine 'toyy'; expected one of the installed engines: {installed}; did you mean 'toy'?"
    )


def test_settings_or_code_naming_an_engine_not_installed_list_the_installed_ones() -> None:
    installed = ", ".join((*SHIPPED, "old-toy", "toy"))
    with pytest.raises(
        ValidationError, match=f"unknown engine 'toyy'; expected one of the installed engines: {installed}"
    ):
        Settings(engine="toyy")
    with pytest.raises(ValidationError, match="unknown engine 'nope'"):
        Settings(engine_fallbacks={"toy": ["nope"]})
    with pytest.raises(ConfigError, match=f"unknown engine 'toyy'; expected one of the installed engines: {installed}"):
        build_engine(Settings(), "toyy")
    result = CliRunner().invoke(app, ["decide", "--engine", "toyy"], input="{}")
    assert result.exit_code == 2
    assert f"--engine: unknown engine 'toyy'; expected one of the installed engines: {installed}" in result.stderr


def test_a_plugin_written_for_another_engine_api_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="written for engine-API version 0") as raised:
        build_runtime(Settings(policy_file=_policy(tmp_path, engine="old-toy")))
    message = str(raised.value)
    assert f"this fastslow speaks version {ENGINE_API_VERSION}" in message
    assert "'old-toy' (toy_engine_old:plugin, from fastslow-toy-engine 0.1.0)" in message
    assert raised.value.key == "engine"


async def test_a_reload_naming_a_plugin_that_cannot_load_keeps_the_last_good_policy(tmp_path: Path) -> None:
    runtime = build_runtime(Settings(policy_file=_policy(tmp_path)))
    try:
        before = runtime.store.version
        _policy(tmp_path, engine="old-toy")
        result = runtime.store.reload()
        assert not result.ok and result.error is not None and "engine-API version 0" in result.error
        assert runtime.store.version == before
        decision = await runtime.router.route("support", [HumanMessage("Refund me")])
        assert (decision.outcome, decision.engine) == ("billing", "toy")
    finally:
        await runtime.aclose()


def test_a_plugin_cannot_replace_a_shipped_engine(tmp_path: Path) -> None:
    # An entry point under a shipped name is ignored: "jev" is still fastslow's Jev client.
    other = tmp_path / "site"
    info = other / "shadow_jev-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow-jev\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fastslow.engines]\njev = no_such_module:plugin\n")
    sys.path.insert(0, str(other))
    try:
        assert installed_engines().count("jev") == 1
        engine = EnginePool(Settings(engine="jev")).engine_for(None, load_policy(_policy(tmp_path, engine="jev")))
        # Coalescing, then the breaker, then the span wrapper around the shipped engine.
        assert type(engine.inner.inner.inner).__name__ == "JevEngine"  # type: ignore[attr-defined]
    finally:
        sys.path.remove(str(other))


def test_no_plugin_code_is_imported_until_its_engine_is_built(tmp_path: Path) -> None:
    # Listing, checking a policy and settings that name it read metadata only.
    def loaded() -> list[str]:
        return [name for name in PLUGIN_MODULES if name in sys.modules]

    assert loaded() == []  # the fixture forgot what earlier tests imported
    assert "toy" in installed_engines()
    pool = EnginePool(Settings(engine="toy"))
    policy = load_policy(_policy(tmp_path))
    assert loaded() == []
    pool.engine_for(None, policy)
    assert loaded() == ["toy_engine"]  # the one named; old-toy's module stays unread
