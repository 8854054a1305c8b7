"""Servers started as subprocesses: waiting, within a deadline, until one answers over HTTP."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx2

from fakes.tls import TLS

__all__ = ["wait_until_answering"]


def wait_until_answering(
    process: subprocess.Popen[bytes], url: str, *, log: Path, timeout_s: float, every_s: float = 0.2
) -> None:
    """Poll ``url`` until it answers 200; fail with ``log``'s text if ``process`` exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    with httpx2.Client(timeout=1.0, verify=TLS) as client:
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(every_s)
