"""``fastslow serve`` as a process of its own: its environment, a free port, waiting until it answers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .api_server import REPO, test_policy
from .embedded import child_env
from .processes import wait_until_answering

__all__ = ["STARTUP_S", "cli", "free_port", "serve_env", "serving", "worker_pids"]

STARTUP_S = 120.0


def serve_env(tmp_path: Path, url: str, **settings: str) -> dict[str, str]:
    """A child's environment: the decision log at ``url``, the test policy, no settings file, then ``settings``."""
    return child_env(
        FASTSLOW_DATA_DIR=str(tmp_path / "data"),
        FASTSLOW_DATABASE_URL=url,
        FASTSLOW_POLICY_FILE=str(test_policy(tmp_path)),
        FASTSLOW_SETTINGS_FILE=str(tmp_path / "none.toml"),
        **settings,
    )


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``fastslow ARGS`` in ``env``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "fastslow.api.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextmanager
def serving(
    env: dict[str, str], log: Path, *args: str, log_level: str = "warning"
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``fastslow serve ARGS`` on a free port, once ``/readyz`` answers 200; killed after the block if still running."""
    port = free_port()
    command = ["serve", "--port", str(port), "--log-level", log_level, *args]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "fastslow.api.cli", *command],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(process, f"{url}/readyz", log=log, timeout_s=STARTUP_S)
        yield process, url
    finally:
        # Read first: once the supervisor is killed its workers, left running, belong to init.
        workers = worker_pids(process.pid)
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def worker_pids(parent: int) -> set[int]:
    """The worker processes uvicorn's supervisor ``parent`` spawned (Linux: read from /proc)."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        # The command name in parentheses may hold spaces: the fields after it are what counts.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"spawn_main" in command:
            found.add(int(entry.name))
    return found
