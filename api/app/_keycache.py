"""Recently authenticated API keys, kept a few seconds so a request does not read the key table.

Each request used to look its key up in the database before anything else (an index read, and on
SQLite a connection from the pool, on every call). A live key found there is kept here for
``ttl_s`` (``Settings.auth_cache_s``, 5 s by default), by its sha256 (the raw key is never a
dictionary key), in a bounded least-recently-used map. Only live keys are kept: an unknown or
revoked key is looked up every time, so a spray of guesses still costs the guesser a lookup each.

A revocation empties it at once: a ``RevocationWatch`` (``_revocations``) gives a generation that
changes whenever a key is revoked anywhere, read before each cached answer; while the watch cannot
tell (``None``), nothing cached is trusted. A key read live from the table under one generation is
not kept if a revocation came in meanwhile. 0 turns the cache off.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from fastslow.api.store import ApiKey, hash_key

from ._revocations import Generation, RevocationWatch

__all__ = ["KeyCache"]

_ENTRIES = 10_000


class KeyCache:
    """Live API keys for ``ttl_s`` seconds each; at most ``entries`` of them.

    Not thread-safe: one event loop uses it.
    """

    def __init__(
        self,
        ttl_s: float,
        *,
        watch: RevocationWatch | None = None,
        entries: int = _ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s < 0 or entries < 1:
            raise ValueError("need ttl_s >= 0 and entries >= 1")
        self.ttl_s = ttl_s
        self._watch = watch
        self._entries = entries
        self._clock = clock
        self._keys: OrderedDict[str, tuple[float, ApiKey]] = OrderedDict()
        self._seen: Generation | None = None

    def generation(self) -> Generation | None:
        """The revocation generation now: pass it to ``put`` for a key about to be read from the table."""
        return self._watch.generation() if self._watch is not None else 0

    def _current(self) -> bool:
        """Whether what is cached may be trusted now; empties the cache after a revocation."""
        generation = self.generation()
        if generation is None:
            return False
        if generation != self._seen:
            self._keys.clear()
            self._seen = generation
        return True

    def get(self, key: str) -> ApiKey | None:
        """The record of ``key`` when it was found live less than ``ttl_s`` ago, and nothing was revoked since."""
        if not self.ttl_s or not self._current():
            return None
        digest = hash_key(key)
        found = self._keys.get(digest)
        if found is None:
            return None
        expires, record = found
        if expires <= self._clock():
            del self._keys[digest]
            return None
        self._keys.move_to_end(digest)
        return record

    def put(self, key: str, record: ApiKey, *, seen: Generation | None = 0) -> None:
        """Keep a key just found live, read under generation ``seen`` (``generation()`` before the read)."""
        if not self.ttl_s or seen is None or not self._current() or seen != self._seen:
            return  # a revocation may have come in while the key was read
        digest = hash_key(key)
        self._keys[digest] = (self._clock() + self.ttl_s, record)
        self._keys.move_to_end(digest)
        while len(self._keys) > self._entries:
            self._keys.popitem(last=False)
