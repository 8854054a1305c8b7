"""A webhook receiver on loopback: records every POST, answers with scripted statuses, then 200.

with webhook_receiver() as hook:
    hook.fail_next(500)           # the next delivery gets a 500
    ...
    [delivery] = hook.wait_for(1)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Delivery", "WebhookReceiver", "signed_by", "webhook_receiver"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One POST the receiver got, and what it answered."""

    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


def signed_by(secret: str, delivery: Delivery) -> bool:
    """Whether ``delivery``'s ``X-Fastslow-Signature`` is the HMAC a receiver computes with ``secret``.

    Written from docs/reviews.md, not from fastslow's code: what a receiver would write.
    """
    parts = dict(part.split("=", 1) for part in delivery.headers["x-fastslow-signature"].split(","))
    expected = hmac.new(secret.encode(), parts["t"].encode() + b"." + delivery.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["v1"]) and abs(time.time() - int(parts["t"])) < 300


class WebhookReceiver:
    """The receiving end of a tenant's webhook."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: deque[int] = deque()
        self.deliveries: list[Delivery] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    status = receiver._failures.popleft() if receiver._failures else 200
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.deliveries.append(Delivery(headers=headers, body=body, status=status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                del format, args

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def fail_next(self, *statuses: int) -> None:
        """Answer the next deliveries with these statuses, in order (then 200 again)."""
        with self._lock:
            self._failures.extend(statuses)

    def received(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)

    def wait_for(
        self, count: int, *, where: Callable[[Delivery], bool] = lambda _: True, timeout_s: float = 10.0
    ) -> list[Delivery]:
        """The deliveries ``where`` holds for, once at least ``count`` of them arrived (polling briefly)."""
        deadline = time.monotonic() + timeout_s
        while len(got := [d for d in self.received() if where(d)]) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {count} webhook deliveries, got {len(got)}: {got}")
            time.sleep(0.01)
        return got

    def start(self) -> None:
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, name="webhook-receiver", daemon=True
        ).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def webhook_receiver() -> Iterator[WebhookReceiver]:
    """A started receiver on 127.0.0.1, stopped on exit."""
    receiver = WebhookReceiver()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
