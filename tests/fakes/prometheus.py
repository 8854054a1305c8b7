"""Debian's Prometheus and promtool, for the alert-rule and dashboard tests.

Where they are not installed those tests skip and say why, except where ``FASTSLOW_TEST_PROMETHEUS``
is ``required`` (``.ci/run`` sets it after installing Debian's ``prometheus``): there a missing
binary fails, as a skipped test would hide broken rules or a dashboard query that returns nothing.

``running_prometheus(config)`` starts a real server on a free loopback port with its data in a
temporary folder, and waits until it is ready.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from fakes.processes import wait_until_answering
from fakes.tls import TLS

__all__ = ["REQUIRED", "Prometheus", "binary", "running_prometheus"]

# Read at import: the autouse settings fixture clears FASTSLOW_* variables before each test runs.
REQUIRED = os.environ.get("FASTSLOW_TEST_PROMETHEUS") == "required"
STARTUP_S = 60.0


def binary(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; skips (fails where required) when it is absent."""
    found = shutil.which(name)
    if found is None:
        why = f"no {name} on PATH (Debian: apt install prometheus)"
        if REQUIRED:
            pytest.fail(f"{why}; FASTSLOW_TEST_PROMETHEUS=required", pytrace=False)
        pytest.skip(why)
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class Prometheus:
    """A running server's HTTP API."""

    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log

    def get(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data``, asserting the call succeeded."""
        response = httpx2.get(f"{self.url}/api/v1/{path}", params=params, timeout=10.0, verify=TLS)
        body = response.json()
        assert response.status_code == 200 and body.get("status") == "success", (path, params, response.text)
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector (``[]`` when it selects nothing)."""
        data = self.get("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        result: list[dict[str, Any]] = data["result"]
        return result


@contextmanager
def running_prometheus(config: dict[str, Any]) -> Iterator[Prometheus]:
    """Prometheus with ``config`` (a parsed prometheus.yml) on a free loopback port until the block ends."""
    exe = binary("prometheus")
    folder = Path(tempfile.mkdtemp(prefix="fastslow-prometheus-"))
    config_file = folder / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = folder / "prometheus.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                exe,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_answering(process, f"{url}/-/ready", log=log, timeout_s=STARTUP_S, every_s=0.1)
        yield Prometheus(url, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
