"""Hot reload: valid changes swap in atomically, invalid ones keep the last good policy."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fastslow.policies import PolicyStore, ReloadResult, load_policy, policy_version
from fastslow.router import ConfigError, PolicySet, RouteTask


def policy_text(min_confidence: float, *, routes: int = 3) -> str:
    names = "\n".join(f"      r{i}: {{description: route {i}, examples: [example {i}]}}" for i in range(routes))
    head = f"tasks:\n  support:\n    kind: route\n    thresholds: {{min_confidence: {min_confidence}}}\n"
    return f"{head}    routes:\n{names}\n"


def write_atomically(path: Path, text: str) -> None:
    # How editors, config management and Kubernetes update files: readers see old or new, whole.
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def min_confidence(policy: PolicySet) -> float:
    task = policy.tasks["support"]
    assert isinstance(task, RouteTask)
    return task.thresholds.min_confidence


class CountingLoader:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Path) -> PolicySet:
        self.calls += 1
        return load_policy(path)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(0.5))
    return path


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


async def async_wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# -- reload ------------------------------------------------------------------------------------


def test_first_load_is_in_force(path: Path) -> None:
    store = PolicyStore(path)
    assert store.path == path
    assert store.version == store.current.version == policy_version(path.read_bytes())
    assert min_confidence(store.current) == 0.5 and store.last_error is None


def test_a_bad_first_load_raises(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: {}\n")
    with pytest.raises(ConfigError):
        PolicyStore(bad)


def test_good_change_is_swapped_in_and_listeners_hear_of_it(path: Path) -> None:
    store = PolicyStore(path)
    heard: list[tuple[str, str]] = []
    store.add_listener(lambda old, new: heard.append((old.version, new.version)))
    old = store.version
    write_atomically(path, policy_text(0.75))
    result = store.reload()
    assert result == ReloadResult(changed=True, ok=True, version=store.version)
    assert min_confidence(store.current) == 0.75 and store.version != old
    assert heard == [(old, store.version)]


def test_bad_change_keeps_the_last_good_policy_and_says_why(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = PolicyStore(path)
    good = store.current
    path.write_text(policy_text(0.5).replace("thresholds", "treshold"))
    with caplog.at_level(logging.WARNING, logger="fastslow.policies"):
        result = store.reload()
    assert not result.changed and not result.ok and result.version == good.version
    assert result.error is not None and "did you mean 'thresholds'?" in result.error and ":4:" in result.error
    assert store.current is good and store.last_error == result.error
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "keeping version " + good.version in caplog.text

    # Reporting the same problem again does not log again; fixing the file clears the error.
    with caplog.at_level(logging.WARNING, logger="fastslow.policies"):
        assert store.check().error == result.error
    assert len(caplog.records) == 1
    write_atomically(path, policy_text(0.6))
    assert store.check() == ReloadResult(changed=True, ok=True, version=store.version)
    assert store.last_error is None and min_confidence(store.current) == 0.6


def test_a_deleted_file_keeps_the_last_good_policy(path: Path) -> None:
    store = PolicyStore(path)
    path.unlink()
    result = store.check()
    assert not result.ok and result.error is not None and "cannot read" in result.error
    assert min_confidence(store.current) == 0.5


def test_unchanged_file_is_not_reloaded(path: Path) -> None:
    loader = CountingLoader()
    store = PolicyStore(path, loader=loader)
    assert store.check() == ReloadResult(changed=False, ok=True, version=store.version)
    # Same content with a new mtime: the hash says nothing changed, so nothing is validated.
    os.utime(path, ns=(time.time_ns(), time.time_ns()))
    assert not store.check().changed
    # Forcing a reload of identical content validates it but swaps nothing.
    assert store.reload() == ReloadResult(changed=False, ok=True, version=store.version)
    assert loader.calls == 2


def test_an_old_unchanged_stat_skips_even_the_hash(path: Path) -> None:
    past = time.time_ns() - 60_000_000_000
    os.utime(path, ns=(past, past))
    store = PolicyStore(path)
    # Same inode, size and (old) mtime: the stat alone says unchanged, so the file is not read.
    path.write_text(policy_text(0.6))
    os.utime(path, ns=(past, past))
    assert store.check() == ReloadResult(changed=False, ok=True, version=store.version)
    assert min_confidence(store.current) == 0.5
    # reload() always reads the file.
    assert store.reload().changed and min_confidence(store.current) == 0.6


def test_same_size_rewrite_within_one_mtime_tick_is_seen(path: Path) -> None:
    store = PolicyStore(path)
    stat = os.stat(path)
    path.write_text(policy_text(0.6))  # same length as 0.5
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_size == stat.st_size
    assert store.check().changed and min_confidence(store.current) == 0.6


def test_failing_listener_is_logged_and_the_rest_still_run(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def broken(old: PolicySet, new: PolicySet) -> None:
        raise RuntimeError("listener bug")

    store = PolicyStore(path, listeners=[broken])
    remove = store.add_listener(lambda old, new: seen.append(new.version))
    write_atomically(path, policy_text(0.7))
    with caplog.at_level(logging.ERROR, logger="fastslow.policies"):
        assert store.reload().changed
    assert seen == [store.version] and "listener bug" in caplog.text
    remove()
    write_atomically(path, policy_text(0.8))
    assert store.reload().changed and len(seen) == 1


def test_unexpected_loader_errors_keep_the_last_good_policy(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    def flaky(p: Path) -> PolicySet:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise OSError("disk on fire")
        return load_policy(p)

    store = PolicyStore(path, loader=flaky)
    with caplog.at_level(logging.ERROR, logger="fastslow.policies"):
        result = store.reload()
    assert not result.ok and result.error == "OSError: disk on fire" and min_confidence(store.current) == 0.5


# -- settling, readying and failures ---------------------------------------------------------------


def test_with_settle_a_change_is_loaded_only_when_two_checks_read_the_same_content(path: Path) -> None:
    store = PolicyStore(path)
    old = store.version
    path.write_text(policy_text(0.5, routes=1))  # the first half of a two-step write
    first = store.check(settle=True)
    assert first.settling and not first.changed and store.version == old
    path.write_text(policy_text(0.7, routes=4))  # the rest, before the next check
    assert store.check(settle=True).settling and store.version == old
    assert store.check(settle=True) == ReloadResult(changed=True, ok=True, version=store.version)
    task = store.current.tasks["support"]
    assert isinstance(task, RouteTask) and min_confidence(store.current) == 0.7 and len(task.routes) == 4
    # Settled and unchanged: nothing more to do.
    assert store.check(settle=True) == ReloadResult(changed=False, ok=True, version=store.version)


def test_activate_readies_the_new_policy_before_it_is_in_force(path: Path) -> None:
    seen: list[tuple[str, str]] = []

    def activate(new: PolicySet, swap: Callable[[], None]) -> None:
        seen.append(("before swap", store.version))
        swap()
        seen.append(("after swap", store.version))

    store = PolicyStore(path, activate=activate)
    old = store.version
    write_atomically(path, policy_text(0.8))
    assert store.reload().changed
    assert seen == [("before swap", old), ("after swap", store.version)] and store.version != old


def test_a_failed_activation_keeps_the_old_policy_and_is_a_failed_reload(path: Path) -> None:
    def activate(new: PolicySet, swap: Callable[[], None]) -> None:
        if min_confidence(new) == 0.8:
            raise RuntimeError("training ran out of memory")
        swap()

    store = PolicyStore(path, activate=activate)
    failures: list[str] = []
    remove = store.add_failure_listener(failures.append)
    good = store.current
    write_atomically(path, policy_text(0.8))
    result = store.reload()
    assert not result.ok and result.error == "readying the new policy failed: RuntimeError: training ran out of memory"
    assert store.current is good and failures == [result.error]
    # The same failure again is reported once; a different one is reported again.
    store.reload()
    path.write_text("tasks: [not, a, mapping]\n")
    assert store.reload().error != result.error and len(failures) == 2
    remove()
    write_atomically(path, policy_text(0.9))
    assert store.reload().changed and store.last_error is None and len(failures) == 2


# -- concurrency -------------------------------------------------------------------------------


def test_threads_always_read_one_complete_policy(path: Path) -> None:
    store = PolicyStore(path)
    texts = [policy_text(0.5 + i / 1000, routes=3 + i % 5) for i in range(40)]
    written = {store.version} | {policy_version(t.encode()) for t in texts}
    by_version = {policy_version(t.encode()): load_policy_text(path.parent, t) for t in texts}
    by_version[store.version] = store.current
    stop = threading.Event()
    problems: list[str] = []
    reads = [0]

    def reader() -> None:
        while not stop.is_set():
            policy = store.current
            reads[0] += 1
            if policy.version not in written:
                problems.append(f"unknown version {policy.version}")
            elif policy != by_version[policy.version]:
                problems.append(f"policy {policy.version} is not the one written")
            time.sleep(0)  # let the writer run: busy readers would starve it of the GIL

    def reloader() -> None:
        while not stop.is_set():
            store.check()
            time.sleep(0.001)

    threads = [threading.Thread(target=reader) for _ in range(6)] + [threading.Thread(target=reloader)]
    for thread in threads:
        thread.start()
    try:
        for text in texts:
            write_atomically(path, text)
            store.reload()  # the writer's own thread reloads too: two reloaders race
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert not problems and reads[0] > 0
    store.check()
    assert store.version == policy_version(texts[-1].encode())


def load_policy_text(folder: Path, text: str) -> PolicySet:
    scratch = folder / "scratch.yaml"
    scratch.write_text(text)
    policy = load_policy(scratch)
    # The expected policy must look as if read from the watched file.
    return PolicySet(
        tasks=policy.tasks,
        version=policy.version,
        source=str(folder / "policy.yaml"),
        egress_allow=policy.egress_allow,
        default_escalate_to=policy.default_escalate_to,
    )


async def test_asyncio_tasks_read_while_the_watcher_reloads(path: Path) -> None:
    store = PolicyStore(path)
    texts = [policy_text(0.6 + i / 1000) for i in range(20)]
    written = {store.version} | {policy_version(t.encode()) for t in texts}
    seen: set[str] = set()
    done = asyncio.Event()

    async def reader() -> None:
        while not done.is_set():
            policy = store.current
            assert policy.version in written and isinstance(policy.tasks["support"], RouteTask)
            seen.add(policy.version)
            await asyncio.sleep(0)

    async with store.watching(interval_s=0.005):
        readers = [asyncio.create_task(reader()) for _ in range(10)]
        for text in texts:
            await asyncio.to_thread(write_atomically, path, text)
            await asyncio.sleep(0.01)
        await async_wait_for(lambda: store.version == policy_version(texts[-1].encode()))
        done.set()
        await asyncio.gather(*readers)
    assert len(seen) > 1


# -- the watcher -------------------------------------------------------------------------------


async def test_watcher_picks_up_a_change(path: Path) -> None:
    store = PolicyStore(path)
    reloads: list[str] = []
    store.add_listener(lambda old, new: reloads.append(new.version))
    async with store.watching(interval_s=0.01) as watched:
        assert watched is store
        write_atomically(path, policy_text(0.9))
        await async_wait_for(lambda: min_confidence(store.current) == 0.9)
        path.write_text("tasks: [not, a, mapping]\n")
        await async_wait_for(lambda: store.last_error is not None)
        assert min_confidence(store.current) == 0.9
    assert reloads == [store.version]


async def test_watcher_survives_a_failing_check(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    class Boom(PolicyStore):
        def check(self, *, settle: bool = False) -> ReloadResult:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("boom")
            return super().check(settle=settle)

    store = Boom(path)
    with caplog.at_level(logging.ERROR, logger="fastslow.policies"):
        async with store.watching(interval_s=0.005):
            await async_wait_for(lambda: calls >= 2)
    assert "boom" in caplog.text


async def test_watcher_needs_a_positive_interval(path: Path) -> None:
    with pytest.raises(ValueError):
        async with PolicyStore(path).watching(interval_s=0):
            pass
