"""``bench/live_structured.py`` runs end to end against the loopback fake."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from fakes.jev_server import JevFakeServer, Reply

BENCH = Path(__file__).resolve().parent.parent / "bench" / "live_structured.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("live_structured", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_reports_latency_and_ends_with_json(capsys: pytest.CaptureFixture[str]) -> None:
    server = JevFakeServer("structured")
    server.start()
    try:
        code = _bench().main(["--url", server.url, "--quick", "--samples", "2"])
    finally:
        server.stop()
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert code == 0
    assert summary["requests"] == summary["ok"] == 16 and summary["errors"] == 0
    assert summary["p50_ms"] <= summary["p99_ms"]
    assert set(summary["mixes"]) == {"noul-1", "choice-1", "score-1", "mixed-16"}
    assert max(len(r.json["questions"]) for r in server.requests) == 16
    assert all(r.json["samples"] == 2 and r.json["think"] == 0 for r in server.requests)


def test_errors_are_counted_and_fail_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    server = JevFakeServer("structured")
    server.script(*[Reply(422, {"error": {"message": "bad", "type": "validation_error"}})] * 2)
    server.start()
    try:
        code = _bench().main(["--url", server.url, "--quick", "--concurrency", "1"])
    finally:
        server.stop()
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 1
    assert summary["errors"] == 2 and summary["error_kinds"] == {"EngineHTTPError": 2}


def test_percentile_is_nearest_rank() -> None:
    percentile = _bench().percentile
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
