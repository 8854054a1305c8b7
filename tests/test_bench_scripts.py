"""The benchmark scripts' quick modes run end to end and end with one JSON object (slow, data-backed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.data
@pytest.mark.slow
def test_the_report_quick_mode_writes_the_report_and_one_json_line(shared_data: Path, tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(BENCH / "report.py"),
        "--quick",
        "--data",
        str(shared_data),
        "--work",
        str(tmp_path / "work"),
        "--docs",
        str(tmp_path / "docs"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(report["routing"]["clinc150-domain"]) == {"sparrow zero-shot", "e5 + head, 10/option"}
    for figures in report["routing"]["clinc150-domain"].values():
        assert figures["n"] == report["rows"]
        assert 0.0 <= figures["accuracy"] <= 1.0
    assert "e5 + head, 50/option" in report["checks"]["xstest"]
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "## CLINC150, 10 domains" in page and "as a policy check" in page
    assert (tmp_path / "docs" / "benchmarks" / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_abuse_bench_quick_mode(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "abuse.py"), "--quick"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["server_alive"]
    assert report["after_a_timeout"]["long_check_reasons"] == ["timeout"]
    assert report["after_a_timeout"]["short_after"]["timed_out"] == 0
    assert all(400 <= case.get("status", 400) < 500 for case in report["malformed"].values())
    assert report["malformed"]["Content-Length and Transfer-Encoding"]["answer"].startswith("HTTP/1.1 400")
    assert report["malformed"]["over-limit Content-Length, no body"]["answer"].startswith("HTTP/1.1 413")
