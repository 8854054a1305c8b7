"""The engine pool builds every engine through the registry, and refuses names it does not know."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastslow.engines import ENGINES, EnginePool, build_engine, examples_for
from fastslow.engines.embedded import EmbeddedEngine, EmbeddedModels, ExampleEngine, SparrowEngine
from fastslow.engines.jev import JevEngine
from fastslow.router import ConfigError, PolicySet, Route, RouteTask, Settings
from fastslow.router.engine_api import BreakerEngine, CoalescingEngine, DecisionEngine, TracedEngine
from fastslow.router.settings import EmbeddedSettings, JevSettings

ROUTES = {
    "billing": Route(name="billing", description="Money", examples=("I was charged twice", "refund my order")),
    "technical": Route(name="technical", description="Bugs", examples=("the app crashes", "login page errors")),
}


def _bare(engine: DecisionEngine) -> DecisionEngine:
    """The engine inside the pool's coalescing wrapper and its span wrapper."""
    assert isinstance(engine, CoalescingEngine)
    inner = engine.inner
    return inner.inner if isinstance(inner, TracedEngine) else inner


def _policy(version: str, engine: str | None = None) -> PolicySet:
    task = RouteTask(name="support", routes=ROUTES, engine=engine)  # type: ignore[arg-type]
    return PolicySet(tasks={"support": task}, version=version)


def test_an_unknown_engine_name_is_a_config_error_naming_the_key() -> None:
    pool = EnginePool(Settings())
    with pytest.raises(ConfigError, match="unknown engine 'nope'") as raised:
        pool.engine_for("nope", _policy("v1"))  # type: ignore[arg-type]
    assert raised.value.key == "engine"
    with pytest.raises(ConfigError, match="unknown engine"):
        build_engine(Settings(), "nope")  # type: ignore[arg-type]


def test_every_engine_name_has_a_factory() -> None:
    from typing import get_args

    from fastslow.router import EngineName

    assert set(ENGINES) == set(get_args(EngineName))


async def test_network_engines_are_built_once_and_shared_across_policy_versions() -> None:
    pool = EnginePool(Settings(engine="jev", jev=JevSettings(base_url="http://127.0.0.1:9")))
    first = pool.engine_for(None, _policy("v1"))
    # Coalescing outside the breaker, so one shared call counts once; one breaker per engine name.
    assert isinstance(first, CoalescingEngine) and isinstance(first.inner, BreakerEngine)
    assert isinstance(first.inner.inner, TracedEngine) and isinstance(first.inner.inner.inner, JevEngine)
    assert pool.engine_for("jev", _policy("v2")) is first
    assert list(pool.breakers()) == ["jev"] and pool.breakers()["jev"].state == "closed"
    await pool.aclose()


def test_breakers_can_be_turned_off() -> None:
    off = EnginePool(Settings(engine="jev", jev=JevSettings(base_url="http://127.0.0.1:9"), breaker={"enabled": False}))
    engine = off.engine_for(None, _policy("v1"))
    assert isinstance(engine, CoalescingEngine) and isinstance(engine.inner, TracedEngine) and off.breakers() == {}
    assert isinstance(engine.inner.inner, JevEngine)


@pytest.mark.slow
async def test_engines_that_learn_share_one_set_of_models_and_train_per_policy(tmp_path: Path) -> None:
    models = EmbeddedModels(EmbeddedSettings(embedder="minilm"), cache_dir=tmp_path)
    pool = EnginePool(Settings(), models=models)
    v1 = _bare(pool.engine_for(None, _policy("v1")))
    assert isinstance(v1, EmbeddedEngine) and v1.examples is not None
    assert set(v1.examples.heads) == {"support"}
    assert _bare(pool.engine_for("embedded", _policy("v1"))) is v1
    v2 = _bare(pool.engine_for("embedded", _policy("v2")))
    assert v2 is not v1 and v2.embedder is v1.embedder  # retrained, on the models loaded once
    examples = _bare(pool.engine_for("examples", _policy("v2")))
    assert isinstance(examples, ExampleEngine) and examples.embedder is v1.embedder
    sparrow = _bare(pool.engine_for("sparrow", _policy("v2")))
    assert isinstance(sparrow, SparrowEngine) and sparrow is v1.sparrow
    pool.warm(_policy("v3"))
    await pool.aclose()


def test_the_examples_engine_without_examples_is_a_config_error(tmp_path: Path) -> None:
    bare = PolicySet(tasks={"q": RouteTask(name="q", routes={"a": Route(name="a"), "b": Route(name="b")})}, version="v")
    pool = EnginePool(Settings(), models=EmbeddedModels(cache_dir=tmp_path))
    with pytest.raises(ConfigError, match="needs examples") as raised:
        pool.engine_for("examples", bare)
    assert raised.value.key == "embedded.examples"


def test_policy_examples_override_the_examples_file_question_by_question(tmp_path: Path) -> None:
    file = tmp_path / "examples.yaml"
    file.write_text(
        "questions:\n"
        "  support:\n    examples: {billing: [from the file], technical: [also the file]}\n"
        "  urgent:\n    examples: {yes: [now!], no: [whenever]}\n"
    )
    settings = Settings(embedded=EmbeddedSettings(examples=file))
    merged = examples_for(settings, _policy("v1"))
    assert merged is not None
    assert set(merged.questions) == {"support", "urgent"}
    assert merged.questions["support"].examples["billing"] == ("I was charged twice", "refund my order")
    assert merged.questions["urgent"].examples["yes"] == ("now!",)
    assert examples_for(Settings(), None) is None


async def test_warming_trains_the_fallbacks_of_the_engines_a_policy_uses(tmp_path: Path) -> None:
    """An outage's first requests must not pay for training the fallback inside their budget."""
    models = EmbeddedModels(EmbeddedSettings(embedder="minilm"), cache_dir=tmp_path)
    settings = Settings(
        engine="jev", jev=JevSettings(base_url="http://127.0.0.1:9/v1"), engine_fallbacks={"jev": ["embedded"]}
    )
    pool = EnginePool(settings, models=models)
    policy = _policy("v1")
    pool.warm(policy)
    warmed = dict(pool._engines)
    assert {name for name, _version, _learned in warmed} == {"jev", "embedded"}
    pool.engine_for(None, policy)  # the chain reuses what warming built: nothing new is trained
    assert pool._engines == warmed
    await pool.aclose()
