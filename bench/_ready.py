"""Waiting until a server a benchmark started answers.

One client for every poll: an ``httpx2`` client loads the CA bundle when it is made (about 35 ms of
CPU), and a loop making one a poll spent a core on that beside the server it was waiting for.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx2

POLL_S = 0.1


def wait_answering(url: str, *, alive: Callable[[], bool], deadline_s: float, every_s: float = POLL_S) -> bool:
    """Poll ``url`` until it answers 200 (``True``), or until ``alive()`` is false or ``deadline_s`` passes."""
    deadline = time.monotonic() + deadline_s
    with httpx2.Client(timeout=2.0) as client:
        while alive() and time.monotonic() < deadline:
            try:
                if client.get(url).status_code == 200:
                    return True
            except httpx2.TransportError:
                pass
            time.sleep(every_s)
    return False
