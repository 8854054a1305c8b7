"""A bounded, time-limited cache of System-1 answers, one entry per question asked about a state.

Off unless ``Settings.coalesce.cache_ttl_s`` is above 0. A key names everything an answer depends
on: the engine and its model, the policy version (calibration included), the state, the images,
the read options and the question itself (and its violation option, for policy checks). Model
thoughts are never part of an answer, so they can never be cached. Only ``Answer`` values are kept:
a ``NoAnswer`` may say something transient (a refusal, a null answer) that the next call would not.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from ._answers import Answer

__all__ = ["AnswerCache"]


class AnswerCache:
    """Least recently used answers, each kept for ``ttl_s`` seconds; at most ``entries`` of them.

    Not thread-safe: one event loop uses it.
    """

    def __init__(self, *, ttl_s: float, entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0 or entries < 1:
            raise ValueError("need ttl_s > 0 and entries >= 1")
        self._clock = clock
        self.ttl_s = ttl_s
        self.entries = entries
        self._items: OrderedDict[Hashable, tuple[float, Answer]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> Answer | None:
        found = self._items.get(key)
        if found is None:
            return None
        expires, answer = found
        if expires <= self._clock():
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return answer

    def put(self, key: Hashable, answer: Answer) -> None:
        self._items[key] = (self._clock() + self.ttl_s, answer)
        self._items.move_to_end(key)
        while len(self._items) > self.entries:
            self._items.popitem(last=False)
