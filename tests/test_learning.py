"""Learning from escalations: the policy switch, the table's rules, the learner and the engine swap."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from typer.testing import CliRunner

from fastslow.api._learning import Learner, example_text
from fastslow.api.cli import app
from fastslow.api.store import DecisionStore
from fastslow.engines import EnginePool, LearnedExampleText, LearnedSet, examples_for
from fastslow.engines.embedded import EmbeddedModels
from fastslow.policies import parse_policy
from fastslow.router import ConfigError, Decision, PolicySet, Router, Settings
from fastslow.router.engine_api import ChatResult
from fastslow.router.settings import EmbeddedSettings

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)
from fakes.scripted import Chats, ScriptedChat

runner = CliRunner()

ROUTES = {
    "billing": ["I was charged twice this month", "refund my last invoice", "why is my bill so high"],
    "shipping": ["where is my parcel", "my package has not arrived", "change my delivery address"],
}


def _policy_text(*, learn: str = "{retrain_after: 2}", store_state: str = "true", extra: str = "") -> str:
    routes = "".join(f"      {name}:\n        examples: {json.dumps(texts)}\n" for name, texts in ROUTES.items())
    return (
        "tasks:\n"
        "  support:\n"
        "    kind: route\n"
        f"    store_state: {store_state}\n"
        f"    learn: {learn}\n"
        "    thresholds: {min_confidence: 0.99}\n"
        f"{extra}"
        "    routes:\n"
        f"{routes}"
    )


def _policy(**kwargs: Any) -> PolicySet:
    return parse_policy(_policy_text(**kwargs), source="policy.yaml")


# -- the policy -------------------------------------------------------------------------------------


def test_learning_without_store_state_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="store_state: true") as raised:
        _policy(store_state="false")
    assert raised.value.key == "tasks.support.learn"
    assert raised.value.line == 5


def test_learning_on_an_engine_that_does_not_train_on_examples_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="engine 'jev' does not train on examples"):
        parse_policy(_policy_text(extra="    engine: jev\n"), source="policy.yaml", needs_examples=_needs)


def _needs(engine: str | None) -> frozenset[str]:
    return frozenset() if engine == "jev" else frozenset({"noul"})


def test_policy_checks_do_not_learn_and_the_error_says_why() -> None:
    text = (
        "tasks:\n  tools:\n    kind: check\n    store_state: true\n    learn: true\n"
        "    rules:\n      destructive:\n        type: noul\n        examples: {yes: [rm -rf /], no: [ls]}\n"
    )
    with pytest.raises(ConfigError, match="policy checks do not learn"):
        parse_policy(text, source="policy.yaml")


def test_learn_true_takes_the_defaults_and_bad_values_name_their_key() -> None:
    learn = _policy(learn="true").tasks["support"].learn
    assert learn is not None and learn.max_examples == 1000 and learn.sources == {"system2", "outcomes"}
    with pytest.raises(ConfigError) as raised:
        _policy(learn="{max_examples: 0}")
    assert raised.value.key == "tasks.support.learn.max_examples"


# -- the table --------------------------------------------------------------------------------------


async def _store(url: str) -> DecisionStore:
    return await DecisionStore.open(url)


async def _decided(store: DecisionStore, outcome: str, text: str) -> Decision:
    decision = Decision(
        task="support", question="support", outcome=outcome, system=2, reason="low_confidence", model="frontier-1"
    )
    await store.record(decision, tenant="acme", state=text, store_state=True)
    return decision


async def _add(store: DecisionStore, option: str, text: str, *, source: Any = "system2", **kwargs: Any) -> str:
    decision = kwargs.pop("decision", None)
    return await store.learned.add(
        task="support",
        question="support",
        option=option,
        text=text,
        source=source,
        tenant="acme",
        decision_id=decision.id if decision is not None else None,
        max_examples=kwargs.pop("max_examples", 100),
    )


async def test_the_table_deduplicates_ranks_outcomes_over_system_2_and_withdraws_conflicts(database_url: str) -> None:  # noqa: F811
    store = await _store(database_url)
    try:
        assert await _add(store, "billing", "charged twice") == "added"
        assert await _add(store, "billing", "charged twice") == "duplicate"
        # System 2 answering the same text another way: it is not sure, so neither answer stays.
        assert await _add(store, "shipping", "charged twice") == "withdrawn"
        assert [e.text for e in await store.learned.list()] == []
        # ...and the answer it was withdrawn for is not taken again; a recorded label is.
        assert await _add(store, "shipping", "charged twice") == "refused"
        assert await _add(store, "billing", "charged twice", source="outcome") == "added"
        assert await _add(store, "shipping", "charged twice") == "refused"  # a label outranks System 2
        assert await _add(store, "shipping", "charged twice", source="outcome") == "relabelled"
        [example] = await store.learned.list()
        assert (example.option, example.source) == ("shipping", "outcome")
    finally:
        await store.aclose()


async def test_the_table_is_bounded_and_system_2_examples_leave_first(database_url: str) -> None:  # noqa: F811
    store = await _store(database_url)
    try:
        assert await _add(store, "billing", "a label", source="outcome", max_examples=3) == "added"
        for i in range(4):
            assert await _add(store, "billing", f"system two {i}", max_examples=3) == "added"
        kept = await store.learned.list()
        assert sorted(e.text for e in kept) == ["a label", "system two 2", "system two 3"]
        withdrawn = [e for e in await store.learned.list(withdrawn=True) if e.retracted_at is not None]
        assert {e.retracted_why for e in withdrawn} == {"over max_examples (3)"}
    finally:
        await store.aclose()


async def test_nothing_is_learned_from_a_decision_an_outcome_says_was_wrong(database_url: str) -> None:  # noqa: F811
    store = await _store(database_url)
    try:
        wrong = await _decided(store, "billing", "where is my parcel now")
        await store.record_outcome(wrong.id, tenant="acme", system2_correct=False)
        assert await _add(store, "billing", "where is my parcel now", decision=wrong) == "refused"
        relabelled = await _decided(store, "billing", "parcel stuck in customs")
        await store.record_outcome(relabelled.id, tenant="acme", label="shipping")
        assert await _add(store, "billing", "parcel stuck in customs", decision=relabelled) == "refused"
        assert await store.learned.list() == []
    finally:
        await store.aclose()


# -- the learner, with the real embedded engine -----------------------------------------------------------


def _system2(answers: dict[str, str]) -> ScriptedChat:
    def respond(messages: Any, schema: Any) -> ChatResult:
        prompt = str(messages[-1].content)
        text = next(t for t in answers if t in prompt)
        return ChatResult(content="", model="frontier-1", structured={"answer": answers[text]})

    return ScriptedChat(respond=respond)


class _Clock:
    """Stands in for the policy store: the policy in force."""

    def __init__(self, policy: PolicySet) -> None:
        self.policy = policy

    def __call__(self) -> PolicySet:
        return self.policy


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedModels:
    return EmbeddedModels(EmbeddedSettings(embedder="minilm"), cache_dir=tmp_path_factory.mktemp("embeddings"))


LEARNED = {
    "my card payment bounced at checkout": "billing",
    "the invoice shows a fee I never agreed to": "billing",
    "the courier left my box at the wrong door": "shipping",
    "tracking says delivered but nothing came": "shipping",
}


@pytest.mark.slow
async def test_system_2_answers_are_learned_retrained_off_the_loop_and_withdrawn_by_outcomes(
    database_url: str,  # noqa: F811
    models: EmbeddedModels,
) -> None:
    store = await _store(database_url)
    policy = _Clock(_policy())
    pool = EnginePool(Settings(), models=models)
    learner = Learner(store, pool, policy, max_wait_s=3600.0)
    chat = _system2(LEARNED)
    router = Router(policy, pool, Chats(chat), sink=learner.sink(store.sink("acme", store_state=True), tenant="acme"))
    try:
        first: list[Decision] = []
        for text in LEARNED:
            messages: list[BaseMessage] = [HumanMessage(text)]
            first.append(await router.route("support", messages))
        assert all(d.system == 2 and d.examples_version == "" for d in first)  # nothing learned yet
        assert sorted((e.text, e.option) for e in await store.learned.list()) == sorted(LEARNED.items())

        threads: list[threading.Thread] = []
        train = pool.train

        def recorded_train(*args: Any) -> None:
            threads.append(threading.current_thread())
            train(*args)

        pool.train = recorded_train  # type: ignore[method-assign]
        assert await learner.refresh()  # 4 new examples >= retrain_after 2
        assert threads and threads[0] is not threading.main_thread()  # trained off the event loop
        version = pool.learned.versions["support"]
        assert version.startswith("4-")
        trained = pool.engine_for(None, policy())
        heads = trained.examples.examples.questions["support"].examples  # type: ignore[attr-defined]
        assert "the courier left my box at the wrong door" in heads["shipping"]
        again = await router.route("support", [HumanMessage("the courier left my box at the wrong door")])
        assert again.examples_version == version
        assert not await learner.refresh()  # nothing new

        # An outcome says System 2 was wrong about one: it is withdrawn, the label learned, and
        # the engines retrain at once (a withdrawal does not wait for retrain_after).
        wrong = next(d for d in first if d.outcome == "billing")
        stored = await store.get(wrong.id, tenant="acme")
        outcome = await store.record_outcome(wrong.id, tenant="acme", label="shipping")
        assert stored is not None and outcome is not None
        assert await learner.on_outcome(stored, outcome) == "added"  # withdrawn, then learned with the label
        [relabelled] = [e for e in await store.learned.list() if e.decision_id == wrong.id]
        assert (relabelled.option, relabelled.source) == ("shipping", "outcome")
        assert await learner.refresh()
        assert pool.learned.versions["support"] != version
        retrained = pool.engine_for(None, policy()).examples.examples  # type: ignore[attr-defined]
        assert (
            example_text(policy().tasks["support"], stored.state_text and json.loads(stored.state_text))
            in (retrained.questions["support"].examples["shipping"])
        )
        assert learner.retrains == 2
    finally:
        await pool.aclose()
        await store.aclose()


async def test_only_system_2_answers_the_task_opted_into_are_learned(database_url: str) -> None:  # noqa: F811
    store = await _store(database_url)
    policy = _Clock(_policy(learn="{sources: [outcomes], tenants: [acme]}"))
    learner = Learner(store, EnginePool(Settings()), policy)
    try:
        decision = await _decided(store, "billing", "charged twice")
        assert await learner.learn_from(decision, "charged twice", tenant="acme") is None  # not a source
        policy.policy = _policy(learn="{tenants: [acme]}")
        assert (
            await learner.learn_from(decision, "charged twice", tenant="other") is None
        )  # not a tenant it learns from
        kept = Decision(task="support", question="support", outcome="billing", system=1, reason="confident")
        assert await learner.learn_from(kept, "charged twice", tenant="acme") is None  # System 1's own answer
        assert await learner.learn_from(decision, "x" * 2001, tenant="acme") is None  # over max_text_chars
        assert await learner.learn_from(decision, "charged   twice", tenant="acme") == "added"
        assert [e.text for e in await store.learned.list()] == ["charged twice"]
    finally:
        await store.aclose()


# -- the engines -------------------------------------------------------------------------------------


def test_learned_examples_join_the_policys_own_and_never_override_them() -> None:
    policy = _policy()
    learned = LearnedSet.of(
        [
            LearnedExampleText(task="support", question="support", option="billing", text="refund my last invoice"),
            LearnedExampleText(task="support", question="support", option="shipping", text="refund my last invoice"),
            LearnedExampleText(task="support", question="support", option="shipping", text="box never came"),
            LearnedExampleText(task="support", question="support", option="gone", text="a route removed since"),
        ],
        tasks=["support"],
    )
    merged = examples_for(Settings(), policy, learned)
    assert merged is not None
    examples = merged.questions["support"].examples
    assert examples["billing"] == tuple(ROUTES["billing"])
    assert examples["shipping"] == (*ROUTES["shipping"], "box never came")
    assert "gone" not in examples
    assert merged.versions == {"support": learned.versions["support"]}
    assert learned.versions["support"].startswith("4-")


def test_a_retrain_keeps_the_old_engines_serving_until_the_new_ones_are_ready(tmp_path: Path) -> None:
    pool = EnginePool(Settings(), models=EmbeddedModels(cache_dir=tmp_path))
    built: list[str] = []
    release = threading.Event()
    started = threading.Event()

    def build(name: Any, policy: PolicySet, learned: LearnedSet) -> Any:
        if learned.key:
            started.set()
            assert release.wait(10)
        built.append(learned.key)
        return object()

    pool._build = build  # type: ignore[method-assign]
    policy = _policy()
    old = pool.engine_for(None, policy)
    learned = LearnedSet.of(
        [LearnedExampleText(task="support", question="support", option="billing", text="t")], tasks=["support"]
    )
    trainer = threading.Thread(target=pool.train, args=(policy, learned))
    trainer.start()
    assert started.wait(10)
    assert pool.engine_for(None, policy) is old  # training: the old engine still answers
    release.set()
    trainer.join(10)
    new = pool.engine_for(None, policy)
    assert new is not old and pool.learned is learned
    assert built == ["", learned.key]


async def test_operators_list_and_withdraw_learned_examples(
    database_url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = await _store(database_url)
    try:
        assert await _add(store, "billing", "charged twice") == "added"
        [example] = await store.learned.list()
    finally:
        await store.aclose()
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)
    listed = await asyncio.to_thread(runner.invoke, app, ["learned", "list", "--task", "support"])
    assert listed.exit_code == 0, listed.output
    assert f"{example.id}\tsupport\tsupport\tbilling\tsystem2\t'charged twice'" in listed.stdout
    gone = await asyncio.to_thread(runner.invoke, app, ["learned", "withdraw", example.id, "--why", "a test"])
    assert gone.exit_code == 0, gone.output
    again = await asyncio.to_thread(runner.invoke, app, ["learned", "withdraw", example.id])
    assert again.exit_code == 2 and "no learned example" in again.stderr
    shown = await asyncio.to_thread(runner.invoke, app, ["learned", "list", "--withdrawn"])
    assert "withdrawn: a test" in shown.stdout
