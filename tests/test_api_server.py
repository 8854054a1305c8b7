"""``fastslow.api._server.Server``: uvicorn's server with the startup heap frozen out of the collector."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

from fakes.embedded import child_env
from fakes.serving import free_port
from fakes.tls import TLS

_APP = """
import gc, sys
from fastapi import FastAPI
from fastslow.api._server import Server, server_config
from fastslow.router import Settings

app = FastAPI()
frozen_before = gc.get_freeze_count()

@app.get("/gc")
def info() -> dict[str, int]:
    return {"before": frozen_before, "now": gc.get_freeze_count(), "enabled": int(gc.isenabled())}

Server(server_config(app, Settings(), port=int(sys.argv[1]), log_level="warning")).run()
"""


@pytest.mark.slow
def test_the_heap_alive_at_startup_is_frozen_and_collection_stays_on(tmp_path: Path) -> None:
    port = free_port()
    env = child_env()
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([sys.executable, "-c", _APP, str(port)], env=env, stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                answer = httpx2.get(f"http://127.0.0.1:{port}/gc", timeout=2, verify=TLS)
                break
            except httpx2.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=30)
    figures = answer.json()
    assert figures["before"] == 0
    assert figures["now"] > 1000  # the app, FastAPI and everything imported: moved to the permanent generation
    assert figures["enabled"] == 1  # what requests allocate is still collected
