"""Servers started as subprocesses: waiting, within a deadline, until one answers over HTTP."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx2

__all__ = ["wait_until_answering"]


def wait_until_answering(
    process: subprocess.Popen[bytes], url: str, *, log: Path, timeout_s: float, every_s: float = 0.2
) -> None:
    """Poll ``url`` until it answers 200; fail with ``log``'s text if ``process`` exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, log.read_text()
        try:
            if httpx2.get(url, timeout=1.0).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(every_s)
