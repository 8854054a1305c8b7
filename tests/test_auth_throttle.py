"""The throttle of failed API keys: per client address and key prefix, and never in a real key's way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from starlette.requests import Request

from fastslow.api.app._throttle import MALFORMED, UNKNOWN_ADDRESS, AuthThrottle, client_address, key_bucket
from fastslow.api.store._codec import new_key
from fastslow.router import Settings
from fastslow.router.settings import AuthThrottleSettings

from fakes.api_server import RunningApi, api_client, running_api, test_settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _key(prefix: str = "") -> str:
    """A key shaped like a real one (``fs_`` and 43 characters), but no key: ``prefix`` fixes its start."""
    key = new_key()[0]
    return prefix + key[len(prefix) :]


def _throttle(failures: int = 3, window_s: float = 10.0, **kw: Any) -> tuple[AuthThrottle, Clock]:
    clock = Clock()
    return AuthThrottle(AuthThrottleSettings(failures=failures, window_s=window_s), clock=clock, **kw), clock


# --- the throttle ------------------------------------------------------------------------------


async def test_an_address_that_failed_its_budget_waits_until_its_oldest_failure_leaves_the_window() -> None:
    throttle, clock = _throttle(failures=3, window_s=10.0)
    for step in (0.0, 4.0, 4.0):  # failures at 1000, 1004, 1008, each with a new key (a new prefix)
        clock.now += step
        assert await throttle.blocked("198.51.100.7", key := _key()) is None
        throttle.failed("198.51.100.7", key)
    clock.now += 1.0  # 1009: the oldest failure (1000) leaves the window at 1010

    assert await throttle.blocked("198.51.100.7", _key()) == pytest.approx(1.0)
    assert await throttle.blocked("198.51.100.8", _key()) is None  # another address is not concerned
    clock.now += 1.5  # 1010.5: two failures in the window; one more is accepted
    assert await throttle.blocked("198.51.100.7", key := _key()) is None
    throttle.failed("198.51.100.7", key)
    # Sliding: now 1004 is the oldest of the three, so the next wait ends at 1014.
    assert await throttle.blocked("198.51.100.7", _key()) == pytest.approx(3.5)


async def test_a_prefix_that_failed_its_budget_is_refused_from_every_address() -> None:
    throttle, _clock = _throttle(failures=3)
    target = "fs_Abc-_123"
    for n in range(3):  # one failure each from three addresses: no address is over its budget
        throttle.failed(f"203.0.113.{n}", _key(target))

    assert await throttle.blocked("203.0.113.99", _key(target)) == pytest.approx(10.0)
    assert await throttle.blocked("203.0.113.99", _key("fs_Zzz")) is None


async def test_keys_that_cannot_be_ours_share_one_bucket() -> None:
    throttle, _clock = _throttle(failures=3)
    assert {key_bucket(k) for k in ("", "nope", "fs_short", "fs_abc!efgh_rest", "sk_" + "a" * 43)} == {MALFORMED}
    for n, key in enumerate(("", "nope", "fs_short")):
        throttle.failed(f"203.0.113.{n}", key)

    assert await throttle.blocked("203.0.113.50", "xx_anything") is not None
    assert await throttle.blocked("203.0.113.50", _key()) is None  # a well-shaped key has its own prefix


def test_the_prefix_is_the_one_keys_list_shows() -> None:
    key, prefix, _digest = new_key()
    assert key_bucket(key) == prefix


async def test_an_ipv6_client_counts_per_64_network() -> None:
    throttle, _clock = _throttle(failures=3)
    for host in ("2001:db8::1", "2001:db8::2", "2001:db8::3:4"):
        throttle.failed(host, _key())

    assert await throttle.blocked("2001:db8::ffff", _key()) is not None
    assert await throttle.blocked("2001:db8:0:1::1", _key()) is None


async def test_memory_is_bounded_and_the_least_recently_failing_are_forgotten_first() -> None:
    throttle, _clock = _throttle(failures=1, max_tracked=4)
    throttle.failed("192.0.2.0", "fs_00000000-rest")
    throttle.failed("192.0.2.1", "fs_11111111-rest")
    assert await throttle.blocked("192.0.2.0", _key()) is not None
    throttle.failed("192.0.2.0", "fs_00000000-rest")  # failing again makes it the most recent
    for n in range(2, 5):
        throttle.failed(f"192.0.2.{n}", _key())

    assert throttle.tracked == (4, 4)
    assert await throttle.blocked("192.0.2.1", _key()) is None  # the least recently failing: forgotten
    assert await throttle.blocked("192.0.2.0", _key()) is not None  # failed since: kept


async def test_each_refusal_is_reported_once() -> None:
    refusals: list[None] = []
    throttle, _clock = _throttle(failures=1, on_refused=lambda: refusals.append(None))
    assert await throttle.blocked("192.0.2.9", key := _key()) is None
    throttle.failed("192.0.2.9", key)
    for _ in range(3):
        assert await throttle.blocked("192.0.2.9", _key()) is not None
    assert len(refusals) == 3


def test_a_trusted_proxy_that_is_no_address_is_refused_with_the_settings() -> None:
    # Where the settings load (a typo in an environment variable fails `fastslow serve` at once), and
    # again by the throttle itself for settings built without validation.
    with pytest.raises(ValueError, match=r"trusted_proxies\n.*'proxy.internal' is not an address"):
        AuthThrottleSettings(trusted_proxies=["10.0.0.0/8", "proxy.internal"])
    unchecked = AuthThrottleSettings.model_construct(trusted_proxies=["proxy.internal"])
    with pytest.raises(ValueError, match=r"auth_throttle.trusted_proxies: 'proxy.internal' is not an address"):
        AuthThrottle(unchecked)


# --- the client's address ----------------------------------------------------------------------


def _scope(peer: str | None, *forwarded: str) -> dict[str, Any]:
    headers = [(b"x-forwarded-for", value.encode("latin-1")) for value in forwarded]
    return {"type": "http", "client": None if peer is None else (peer, 50000), "headers": headers}


PROXIES = AuthThrottleSettings(trusted_proxies=["10.0.0.0/8", "2001:db8:ffff::1"])


@pytest.mark.parametrize(
    ("scope", "settings", "expected"),
    [
        # No trusted proxy: the header is the client's word, and ignored.
        (_scope("127.0.0.1", "203.0.113.9"), AuthThrottleSettings(), "127.0.0.1"),
        (_scope("203.0.113.5", "198.51.100.7"), PROXIES, "203.0.113.5"),  # a peer that is no trusted proxy
        # Behind trusted proxies: the right-most address that is not one of them.
        (_scope("10.0.0.5", "198.51.100.7, 10.0.0.3"), PROXIES, "198.51.100.7"),
        (_scope("10.0.0.5", "1.1.1.1, 198.51.100.7"), PROXIES, "198.51.100.7"),  # the client's own entry left of it
        (_scope("10.0.0.5", "1.1.1.1", "198.51.100.7, 10.1.2.3"), PROXIES, "198.51.100.7"),  # two headers, one list
        (_scope("2001:db8:ffff::1", "[2001:db8::7]:443"), PROXIES, "2001:db8::7"),
        (_scope("10.0.0.5", "198.51.100.7:8080"), PROXIES, "198.51.100.7"),
        (_scope("10.0.0.5", "::ffff:198.51.100.7"), PROXIES, "198.51.100.7"),
        (_scope("10.0.0.5"), PROXIES, "10.0.0.5"),  # no header: the proxy itself
        (_scope("10.0.0.5", "10.0.0.4"), PROXIES, "10.0.0.4"),  # only proxies: the farthest one
        # An entry that is no address stops the walk at the nearest trusted hop, never a bucket it names.
        (_scope("10.0.0.5", "198.51.100.7, garbage, 10.0.0.3"), PROXIES, "10.0.0.3"),
        (_scope(None, "198.51.100.7"), PROXIES, UNKNOWN_ADDRESS),  # a Unix socket
    ],
)
def test_client_address(scope: dict[str, Any], settings: AuthThrottleSettings, expected: str) -> None:
    assert client_address(scope, settings) == expected


def test_client_address_takes_a_request_and_the_whole_settings() -> None:
    request = Request(_scope("10.0.0.5", "198.51.100.7"))
    assert client_address(request, Settings(auth_throttle=PROXIES)) == "198.51.100.7"
    assert client_address(request, Settings()) == "10.0.0.5"


# --- over HTTP ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    # The shipped budget: 10 failures a minute per address and per prefix.
    with running_api(test_settings(tmp_path_factory.mktemp("api"))) as running:
        yield running


def _from(address: str, api: RunningApi, key: str | None) -> httpx2.AsyncClient:
    """A client whose connections leave from ``address`` (any of 127/8 is the loopback interface)."""
    return api_client(api.url, key, transport=httpx2.AsyncHTTPTransport(local_address=address))


async def test_unknown_keys_from_one_address_are_refused_while_real_keys_work_at_once(api: RunningApi) -> None:
    budget = api.settings.auth_throttle.failures
    statuses: list[int] = []
    retry_after: set[int] = set()
    async with _from("127.0.0.1", api, None) as attacker:
        for _ in range(50):
            response = await attacker.get("/v1/tasks", headers={"Authorization": f"Bearer {_key()}"})
            statuses.append(response.status_code)
            if response.status_code == 429:
                retry_after.add(int(response.headers["retry-after"]))
                assert response.json()["error"]["type"] == "rate_limited"
    key_elsewhere, key_here = await api.key("acme"), await api.key("acme")  # fresh: not in the key cache
    async with _from("127.0.0.2", api, key_elsewhere) as neighbour, _from("127.0.0.1", api, key_here) as same:
        served_elsewhere = await neighbour.get("/v1/tasks")
        stranger_elsewhere = await neighbour.get("/v1/tasks", headers={"Authorization": f"Bearer {_key()}"})
        served_here = await same.get("/v1/tasks")
        still_refused = await same.get("/v1/tasks", headers={"Authorization": f"Bearer {_key()}"})
        metrics = (await same.get("/metrics")).text

    assert statuses == [401] * budget + [429] * (50 - budget)
    assert retry_after and all(1 <= seconds <= api.settings.auth_throttle.window_s for seconds in retry_after)
    assert served_elsewhere.status_code == 200, served_elsewhere.text
    assert stranger_elsewhere.status_code == 401  # the neighbour's own failures are its own
    assert served_here.status_code == 200, served_here.text  # a real key, even from the throttled address
    assert still_refused.status_code == 429
    assert f"fastslow_auth_throttled_total {float(50 - budget + 1)}" in metrics


async def test_failures_aimed_at_one_prefix_never_lock_out_the_key_that_has_it(api: RunningApi) -> None:
    key = await api.key("acme")
    prefix = key_bucket(key)
    for n in range(api.settings.auth_throttle.failures):  # each from its own address: only the prefix fills up
        async with _from(f"127.0.1.{n + 1}", api, _key(prefix)) as guesser:
            assert (await guesser.get("/v1/tasks")).status_code == 401
    async with _from("127.0.2.1", api, _key(prefix)) as guesser, _from("127.0.2.1", api, key) as owner:
        refused = await guesser.get("/v1/tasks")
        served = await owner.get("/v1/tasks")

    assert refused.status_code == 429 and "prefix" in refused.json()["error"]["message"]
    assert served.status_code == 200, served.text
