"""Hot reload: a policy file that changes is validated and swapped in without a restart.

``PolicyStore.current`` is one attribute holding one complete, immutable ``PolicySet``; a reload
builds the new policy fully and then rebinds that attribute, so a reader (thread or asyncio task)
always gets either the old policy or the new one, never a mixture. An invalid change keeps the last
good policy and says why. Each replica watches its own file; nothing here is shared across processes.

What a new policy needs (engines trained on its examples) is readied by ``activate`` before the
swap, on the reloading thread, while the old policy keeps serving: a request never sees the new
policy before its engines are ready. The watcher loads a changed file only once it has read the
same content twice in a row (a settle delay of one poll), so a file written in two steps is not put
in force half-written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from fastslow.router import ConfigError, PolicySet, polling

from ._load import load_policy, policy_version

__all__ = ["Activate", "FailureListener", "Listener", "PolicyStore", "ReloadResult"]

log = logging.getLogger("fastslow.policies")

Listener = Callable[[PolicySet, PolicySet], None]
"""Called as ``listener(old, new)`` after a successful swap."""

FailureListener = Callable[[str], None]
"""Called as ``listener(error)`` once for each new reason the file on disk could not be put in force."""

Activate = Callable[[PolicySet, Callable[[], None]], None]
"""``activate(new, swap)``: ready what ``new`` needs, then call ``swap()`` to put it in force; raising keeps the old."""


def _swap_at_once(_new: PolicySet, swap: Callable[[], None]) -> None:
    swap()


# A file modified this close to when we last looked may change again within the same mtime tick,
# so its stat alone cannot prove it unchanged (git's "racily clean" rule); hash it instead.
_RACY_NS = 2_000_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ReloadResult:
    """What one reload or check did."""

    changed: bool
    """A new policy was swapped in."""
    ok: bool
    """The file on disk is the policy in force (False: it could not be read or is invalid)."""
    version: str
    """The version in force after this call."""
    error: str | None = None
    """Why the file on disk was not taken, when ``ok`` is False."""
    settling: bool = False
    """The file changed since the last look; it is loaded once a later check reads the same content."""


class PolicyStore:
    """Holds the policy in force and reloads it when its file changes.

    Example:
        ```python
        store = PolicyStore("policy.yaml", loader=partial(load_policy, needs_examples=needs))
        store.add_listener(lambda old, new: metrics.policy_reloads.inc())
        async with store.watching(interval_s=1.0):
            ...  # every decision reads store.current and records store.current.version
        ```
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        loader: Callable[[Path], PolicySet] = load_policy,
        listeners: Iterable[Listener] = (),
        activate: Activate = _swap_at_once,
    ) -> None:
        """Load the file now.

        Args:
            path: the policy file.
            loader: reads and validates the file (``load_policy`` with its keyword arguments bound).
            listeners: called as ``listener(old, new)`` after each successful swap.
            activate: readies a new policy (trains its engines) and then calls the swap it is given;
                runs on the reloading thread; an exception is a failed reload and keeps the old policy.

        Raises:
            ConfigError: the first load failed; with no last good policy there is nothing to keep.
        """
        self._path = Path(path)
        self._loader = loader
        self._listeners: list[Listener] = list(listeners)
        self._failure_listeners: list[FailureListener] = []
        self._activate = activate
        # Serialises reloads (not reads) so stat bookkeeping and listener order stay consistent;
        # re-entrant so a listener may itself call check() or reload().
        self._lock = threading.RLock()
        self._last_error: str | None = None
        # (stat, content hash) of a changed file seen once; loaded when the next check sees the same.
        self._settling: tuple[tuple[int, int, int] | None, str] | None = None
        self._readying: str | None = None
        self._stat = self._stat_now()
        self._current = loader(self._path)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def current(self) -> PolicySet:
        """The policy in force: always one complete, validated ``PolicySet``."""
        return self._current

    @property
    def version(self) -> str:
        return self._current.version

    @property
    def change(self) -> Literal["settling", "readying"] | None:
        """A change of the file on its way in: ``settling`` (seen once, loaded when read unchanged
        again), ``readying`` (loaded and valid, its engines training while the old policy serves)."""
        if self._readying is not None:
            return "readying"
        return "settling" if self._settling is not None else None

    @property
    def last_error(self) -> str | None:
        """Why the file on disk is not in force, or ``None`` when it is."""
        return self._last_error

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(old, new)`` after every successful swap; returns a function that removes it.

        Listeners run on the reloading thread, one at a time; one that raises is logged and skipped.
        """
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def add_failure_listener(self, listener: FailureListener) -> Callable[[], None]:
        """Call ``listener(error)`` for each failed reload with a new reason; returns a function that removes it.

        A broken file that stays broken is reported once, not on every poll.
        """
        with self._lock:
            self._failure_listeners.append(listener)

        def remove() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._failure_listeners.remove(listener)

        return remove

    def reload(self) -> ReloadResult:
        """Read and validate the file now and swap it in if its version differs from the one in force."""
        with self._lock:
            # Stat before reading: a write that lands after the read leaves a newer stat for check().
            self._stat = self._stat_now()
            try:
                new = self._loader(self._path)
            except ConfigError as exc:
                return self._failed(str(exc))
            except Exception as exc:  # a loader bug must not stop the watcher or lose the good policy
                log.exception("policy reload of %s failed unexpectedly", self._path)
                return self._failed(f"{type(exc).__name__}: {exc}")
            return self._swap(new)

    def check(self, *, settle: bool = False) -> ReloadResult:
        """Reload only if the file's content changed: a stat first, then its hash, then a full load.

        An invalid file that has not changed since it was reported is not validated again.

        Args:
            settle: load a changed file only when the previous check read the same stat and content
                (the watcher's setting), so a file still being written is not put in force.
        """
        with self._lock:
            stat = self._stat_now()
            if stat is not None and stat == self._stat and time.time_ns() - stat[0] > _RACY_NS:
                return self._unchanged()
            try:
                data = self._path.read_bytes()
            except OSError as exc:
                self._stat = None
                self._settling = None
                return self._failed(f"{self._path}: cannot read the policy file: {exc.strerror or exc}")
            digest = policy_version(data)
            if digest == self._current.version:
                self._stat = stat
                self._last_error = None
                self._settling = None
                return self._unchanged()
            if settle and self._settling != (stat, digest):
                self._settling = (stat, digest)
                return ReloadResult(
                    changed=False, ok=False, version=self._current.version, error=self._last_error, settling=True
                )
            self._settling = None
            return self.reload()

    @contextlib.asynccontextmanager
    async def watching(self, interval_s: float = 1.0) -> AsyncIterator[PolicyStore]:
        """Poll the file every ``interval_s`` seconds in the background while the block runs.

        Checks run in a worker thread so a slow disk, training or listener never blocks the event
        loop. A changed file is loaded on the first poll that reads it unchanged since the one before.
        """
        watch = partial(asyncio.to_thread, self.check, settle=True)
        # check() itself reports file problems as results; what it raises is logged and the watch goes on.
        failure = f"policy watcher for {self._path} failed"
        async with polling(watch, interval_s, name=f"policy-watch:{self._path}", log=log, failure=failure):
            yield self

    def _stat_now(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _unchanged(self) -> ReloadResult:
        return ReloadResult(
            changed=False, ok=self._last_error is None, version=self._current.version, error=self._last_error
        )

    def _failed(self, error: str) -> ReloadResult:
        if error != self._last_error:
            log.warning("policy file %s not reloaded; keeping version %s: %s", self._path, self._current.version, error)
            for listener in list(self._failure_listeners):
                try:
                    listener(error)
                except Exception:
                    log.exception("policy reload failure listener %r failed", listener)
        self._last_error = error
        return ReloadResult(changed=False, ok=False, version=self._current.version, error=error)

    def _swap(self, new: PolicySet) -> ReloadResult:
        old = self._current
        if new.version == old.version:
            self._last_error = None
            return ReloadResult(changed=False, ok=True, version=old.version)

        def swap() -> None:
            # One attribute rebind: readers see the old policy or the new one, never a mixture.
            self._current = new

        self._readying = new.version
        try:
            self._activate(new, swap)
        except Exception as exc:
            log.exception("readying policy %s from %s failed", new.version, self._path)
            # Failed before the swap (training): the old policy and its engines keep serving. Failed
            # after it: the new policy is in force all the same, so say so below.
            if self._current is not new:
                return self._failed(f"readying the new policy failed: {type(exc).__name__}: {exc}")
        finally:
            self._readying = None
        if self._current is not new:
            return self._failed("readying the new policy did not put it in force")
        self._last_error = None
        log.info("policy file %s reloaded: %s -> %s", self._path, old.version, new.version)
        for listener in list(self._listeners):
            try:
                listener(old, new)
            except Exception:
                log.exception("policy reload listener %r failed", listener)
        return ReloadResult(changed=True, ok=True, version=new.version)
