"""Failed API keys and failed sign-ins, slowed per client address and per key prefix (docs/limits.md).

One ``AuthThrottle`` per process counts *failures* (an unknown or revoked API key, a sign-in with a
wrong key) in a sliding window of ``window_s``, twice: per client address (``client_address``) and
per key prefix (the ``fs_`` and 8 characters that ``fastslow keys list`` shows; a key of another
shape counts in one shared bucket). Once either holds ``failures`` failures in the window, the next
failure is answered 429 with ``Retry-After`` (``blocked``) instead of 401/403, and is not counted.

It never locks a real key out, because it only ever judges a failure: the caller checks the key
first (the key cache, else one indexed lookup), serves a valid key whatever the throttle holds,
and asks ``blocked`` only about a key that failed. So a client at a throttled address, or whose key
shares a prefix someone is hammering, keeps working. What the throttle is for is not the keys'
safety (a key is 256 random bits: nothing to guess) but a cheap, bounded answer to a client that
keeps failing: a ``Retry-After`` it can honour, no second lookup (is it revoked?), and a metric.

State is in memory, per process, and bounded: at most ``max_tracked`` addresses and as many
prefixes, the least recently failing dropped first. With several replicas each counts on its own.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any

from starlette.requests import HTTPConnection

from fastslow.api.store._codec import KEY_PREFIX
from fastslow.router import Settings
from fastslow.router.settings import AuthThrottleSettings

__all__ = ["MALFORMED", "PREFIX_CHARS", "UNKNOWN_ADDRESS", "AuthThrottle", "client_address", "key_bucket"]

PREFIX_CHARS = len(KEY_PREFIX) + 8
"""A key's display prefix, as the store keeps it (``api_keys.prefix``): ``fs_`` and 8 characters."""
MALFORMED = "malformed"
"""The one prefix bucket of every key that is not shaped like ours (it cannot be a real key)."""
UNKNOWN_ADDRESS = "unknown"
"""The address bucket of a connection without a peer address (a Unix socket)."""
_URLSAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_MAX_ADDRESS_CHARS = 64

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def key_bucket(key: str) -> str:
    """The prefix bucket a key's failures count in: its display prefix, or ``MALFORMED``."""
    prefix = key[:PREFIX_CHARS]
    if len(prefix) == PREFIX_CHARS and prefix.startswith(KEY_PREFIX) and _URLSAFE.issuperset(prefix[len(KEY_PREFIX) :]):
        return prefix
    return MALFORMED


def _address_bucket(address: str) -> str:
    # One IPv6 host usually holds a whole /64: counting its addresses one by one would let it
    # fail 2**64 times as often as an IPv4 host.
    ip = _parse_ip(address)
    if ip is None:
        return address[:_MAX_ADDRESS_CHARS] or UNKNOWN_ADDRESS
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class _Window:
    """Failures per bucket in the last ``window_s``: the newest ``failures`` times of each, in insertion order."""

    def __init__(self, *, failures: int, window_s: float, max_tracked: int) -> None:
        self._failures = failures
        self._window_s = window_s
        self._max_tracked = max_tracked
        self._times: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._times)

    def wait(self, bucket: str, now: float) -> float | None:
        """Seconds until ``bucket`` may fail again, or ``None`` when it may now."""
        times = self._times.get(bucket)
        if times is None or len(times) < self._failures:
            return None
        wait = times[0] + self._window_s - now
        return wait if wait > 0 else None

    def add(self, bucket: str, now: float) -> None:
        times = self._times.get(bucket)
        if times is None:
            times = self._times[bucket] = deque(maxlen=self._failures)
            if len(self._times) > self._max_tracked:
                self._times.popitem(last=False)
        else:
            self._times.move_to_end(bucket)
        times.append(now)


class AuthThrottle:
    """Counts failed keys per client address and per key prefix; says when a failure must wait.

    The contract, for the API's ``authenticate`` and the console's sign-in alike: check the key
    first and serve a valid one; for one that failed, ``await blocked(address, key)``: a number is
    a 429 with that ``Retry-After`` (the failure is not counted), ``None`` is the ordinary refusal
    (401, 403, the sign-in form again) after ``failed(address, key)``.

    Args:
        settings: ``settings.auth_throttle`` (failures, window_s, trusted_proxies).
        clock: monotonic seconds (tests pass their own).
        max_tracked: addresses, and separately prefixes, remembered at most.
        on_refused: called each time ``blocked`` refuses (the API counts a metric).

    Raises:
        ValueError: a ``trusted_proxies`` entry is not an address or network.
    """

    def __init__(
        self,
        settings: AuthThrottleSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_tracked: int = 10_000,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings if settings is not None else AuthThrottleSettings()
        _networks(tuple(self.settings.trusted_proxies))  # a bad entry fails the start, not a request
        self._clock = clock
        self._on_refused = on_refused
        failures, window_s = self.settings.failures, self.settings.window_s
        self._addresses = _Window(failures=failures, window_s=window_s, max_tracked=max_tracked)
        self._prefixes = _Window(failures=failures, window_s=window_s, max_tracked=max_tracked)

    @property
    def tracked(self) -> tuple[int, int]:
        """How many addresses and prefixes are remembered now (bounded by ``max_tracked`` each)."""
        return len(self._addresses), len(self._prefixes)

    async def blocked(self, address: str, key: str) -> float | None:
        """Seconds until a failure from ``address`` with ``key`` is accepted again, or ``None`` now.

        Async so that a shared store (one count across replicas) can take its place unchanged.
        """
        now = self._clock()
        waits = [
            wait
            for wait in (
                self._addresses.wait(_address_bucket(address), now),
                self._prefixes.wait(key_bucket(key), now),
            )
            if wait is not None
        ]
        if not waits:
            return None
        if self._on_refused is not None:
            self._on_refused()
        return max(waits)

    def failed(self, address: str, key: str) -> None:
        """Count one failure from ``address`` with ``key`` (an unknown or revoked key, a wrong sign-in)."""
        now = self._clock()
        self._addresses.add(_address_bucket(address), now)
        self._prefixes.add(key_bucket(key), now)


def client_address(connection: HTTPConnection | Mapping[str, Any], settings: Settings | AuthThrottleSettings) -> str:
    """The client's address: the peer's, or behind a trusted proxy, the one it forwarded.

    When the peer is in ``trusted_proxies``, ``X-Forwarded-For`` is read from the right (each proxy
    appends the address it saw), skipping the trusted proxies; the first other address is the
    client. Anything left of it was written by the client and proves nothing. An entry that is no
    address (a proxy that passed the header on without appending) stops the walk at the nearest
    trusted hop: wrong for fairness at worst, never a bucket the client chose.

    Args:
        connection: a request, or its ASGI scope.
        settings: fastslow's settings, or their ``auth_throttle``.
    """
    scope = connection.scope if isinstance(connection, HTTPConnection) else connection
    throttle = settings.auth_throttle if isinstance(settings, Settings) else settings
    client = scope.get("client")
    peer = str(client[0]) if client else ""
    hop = _parse_ip(peer)
    if hop is None:
        return peer[:_MAX_ADDRESS_CHARS] or UNKNOWN_ADDRESS
    proxies = _networks(tuple(throttle.trusted_proxies))
    if not _trusted(hop, proxies):
        return str(hop)
    for entry in reversed(_forwarded(scope.get("headers", ()))):
        ip = _parse_ip(entry)
        if ip is None:
            break
        if not _trusted(ip, proxies):
            return str(ip)
        hop = ip
    return str(hop)


def _forwarded(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    # Several X-Forwarded-For headers are one list, in order (RFC 9110's field combination).
    values = [value.decode("latin-1") for name, value in headers if name.lower() == b"x-forwarded-for"]
    return [part.strip() for part in ",".join(values).split(",")] if values else []


def _parse_ip(text: str) -> IpAddress | None:
    """An address from ``1.2.3.4``, ``1.2.3.4:80``, ``::1`` or ``[::1]:80``; ``None`` for anything else."""
    text = text.strip()
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@lru_cache(maxsize=16)
def _networks(entries: tuple[str, ...]) -> tuple[IpNetwork, ...]:
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(f"auth_throttle.trusted_proxies: {entry!r} is not an address or network (CIDR)") from None
    return tuple(networks)


def _trusted(ip: IpAddress, proxies: tuple[IpNetwork, ...]) -> bool:
    return any(ip.version == net.version and ip in net for net in proxies)
