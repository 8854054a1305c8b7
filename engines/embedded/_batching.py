"""Cross-request micro-batches: short texts from concurrent reads embedded in one model call.

Concurrent requests read different states; each read embeds a short text or two from a worker
thread (``run_blocking``). ``BatchingEmbedder`` sends the first read straight to the model, and
reads that arrive while it runs wait, then go to the model together in one ``embed`` call, up to
one step of the inner embedder (``BATCH_TEXTS`` texts and ``STEP_TOKENS`` tokens, so a batch
takes as long as the one step a reader would have waited for anyway at the embedder's lock).
Longer reads (a policy check's windows, a long state) are not batched: they take the embedder's
lock step by step as before, so one tenant's long text still delays another's short one by at
most one step.

A reader that stops (its deadline passed, its caller left) leaves the queue, or stops waiting for
a batch already running; the batch itself stops only when every reader in it has stopped. The
thread that runs a batch is its first reader's: it finishes the batch for the others even after
its own caller has gone (in async code, ``run_blocking`` has already returned to that caller). Each
reader gets the same vectors it would have got alone, up to float rounding of the model's
padded batch.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from opentelemetry.trace import SpanContext

from fastslow.router.engine_api import Abandoned, StopToken, current_span_context, link_current

from ._embedders import BATCH_TEXTS, STEP_TOKENS, Embedder

__all__ = ["BatchingEmbedder"]

_POLL_S = 0.05
"""How often a waiting reader looks at its stop token."""


class _Read:
    __slots__ = ("batch", "done", "error", "lead", "link", "result", "stop", "texts", "tokens")

    def __init__(self, texts: list[str], tokens: int, stop: StopToken | None) -> None:
        self.texts = texts
        self.tokens = tokens
        self.stop = stop
        self.done = threading.Event()
        """Set when the vectors (or an error) are in, or when this reader is to run ``batch``."""
        self.lead = False
        self.batch: list[_Read] = []
        self.result: NDArray[np.float32] | None = None
        self.error: BaseException | None = None
        self.link: SpanContext | None = None
        """The span of the call that embedded this reader's texts with others' (its leader's trace)."""


class _EveryoneStopped(StopToken):
    """Stops a shared batch only once every reader in it has stopped."""

    def __init__(self, stops: Sequence[StopToken | None]) -> None:
        super().__init__()
        self._stops = stops

    @property
    def stopped(self) -> bool:
        return all(s is not None and s.stopped for s in self._stops)

    def check(self) -> None:
        if self.stopped:
            raise Abandoned("every reader of the batch stopped waiting")


class BatchingEmbedder:
    """``inner`` with concurrent short reads embedded together; an ``Embedder`` itself.

    Args:
        inner: the model; its name, ``model_id`` and ``dim`` are this one's.
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.batches = 0
        """Model calls that carried more than one reader's texts."""
        self._lock = threading.Lock()
        self._busy = False
        self._queue: deque[_Read] = deque()

    @property
    def texts_embedded(self) -> int:
        return self.inner.texts_embedded

    @texts_embedded.setter
    def texts_embedded(self, value: int) -> None:
        self.inner.texts_embedded = value

    @property
    def tokens_embedded(self) -> int:
        return self.inner.tokens_embedded

    @tokens_embedded.setter
    def tokens_embedded(self, value: int) -> None:
        self.inner.tokens_embedded = value

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def embed(self, texts: Sequence[str], *, stop: StopToken | None = None) -> NDArray[np.float32]:
        if not texts or len(texts) > BATCH_TEXTS:
            return self.inner.embed(texts, stop=stop)
        tokens = sum(self.inner.count_tokens(t) for t in texts)
        if tokens > STEP_TOKENS:
            return self.inner.embed(texts, stop=stop)
        read = _Read(list(texts), tokens, stop)
        with self._lock:
            if self._busy:
                self._queue.append(read)
            else:
                self._busy = True
                read.lead, read.batch = True, [read]
        if not read.lead:
            self._wait(read)
            link_current(read.link)  # embedded in another reader's batch: its span is in that reader's trace
        if read.lead:
            try:
                self._run(read.batch)
            finally:
                self._hand_on()
        if read.error is not None:
            raise read.error
        assert read.result is not None
        return read.result

    def _wait(self, read: _Read) -> None:
        """Until ``read`` has its vectors or is to lead a batch; ``Abandoned`` when it stops first."""
        while not read.done.wait(_POLL_S if read.stop is not None else None):
            if read.stop is not None and read.stop.stopped:
                with self._lock:
                    if read.done.is_set():
                        return
                    if read in self._queue:
                        self._queue.remove(read)
                read.stop.check()  # a batch running this read goes on for the others

    def _run(self, batch: list[_Read]) -> None:
        texts = [t for r in batch for t in r.texts]
        stop = batch[0].stop if len(batch) == 1 else _EveryoneStopped([r.stop for r in batch])
        if len(batch) > 1:
            self.batches += 1
            shared = current_span_context()  # the leader's engine call span
            for r in batch:
                r.link = shared
        try:
            vectors = self.inner.embed(texts, stop=stop)
        except BaseException as exc:
            for r in batch:
                r.error = exc
                r.done.set()
            raise
        start = 0
        for r in batch:
            r.result = vectors[start : start + len(r.texts)]
            start += len(r.texts)
            if not r.lead:
                r.done.set()

    def _hand_on(self) -> None:
        """The next batch of waiting readers, led by its first; or the model is free."""
        with self._lock:
            batch: list[_Read] = []
            count = tokens = 0
            while self._queue:
                nxt = self._queue[0]
                if nxt.stop is not None and nxt.stop.stopped:
                    self._queue.popleft()
                    nxt.error = Abandoned("the caller stopped waiting")
                    nxt.done.set()
                    continue
                if batch and (count + len(nxt.texts) > BATCH_TEXTS or tokens + nxt.tokens > STEP_TOKENS):
                    break
                batch.append(self._queue.popleft())
                count += len(nxt.texts)
                tokens += nxt.tokens
            if not batch:
                self._busy = False
                return
            leader = batch[0]
            leader.lead, leader.batch = True, batch
            leader.done.set()
