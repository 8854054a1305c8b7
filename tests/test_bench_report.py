"""bench/quality.py and bench/report.py, quick modes, end to end (slow, data-backed).

The report's quick mode would run quality.py's quick mode itself; here it takes the results of the
one quality run this module makes (``--quality-from``, the option that merges earlier quality runs
into the page), so the quality targets are measured once and both scripts are tested whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SHARED_DATA

BENCH = Path(__file__).resolve().parent.parent / "bench"


@dataclass(frozen=True, slots=True)
class QualityRun:
    """One ``quality.py --quick`` run: its process and its work folder."""

    done: subprocess.CompletedProcess[str]
    work: Path

    def results(self) -> dict[str, object]:
        assert self.done.returncode == 0, self.done.stderr[-3000:]
        results: dict[str, object] = json.loads(self.done.stdout.strip().splitlines()[-1])
        return results


@pytest.fixture(scope="module")
def quality_run(tmp_path_factory: pytest.TempPathFactory) -> QualityRun:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"public data not found at {SHARED_DATA} (set FASTSLOW_SHARED_DATA); CI always has it")
    work = tmp_path_factory.mktemp("quality")
    command = [sys.executable, str(BENCH / "quality.py"), "--quick", "--data", str(SHARED_DATA), "--work", str(work)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900, cwd=work)
    return QualityRun(done, work)


@pytest.mark.data
@pytest.mark.slow
def test_the_quality_quick_mode_measures_every_target_and_ends_with_one_json_line(quality_run: QualityRun) -> None:
    results = quality_run.results()
    assert results["quick"] is True and results["errors"] == []
    for section in ("clinc", "banking", "xstest", "injection", "documents"):
        entries = results[section]
        assert isinstance(entries, dict)
        for figure in (f for entry in entries.values() for f in entry["figures"]):
            assert figure["n"] > 0, (section, figure)
            assert 0.0 <= figure["low"] <= figure["value"] <= figure["high"] <= 1.0, (section, figure)
    clinc, xstest, latency, zero_shot = (results[k] for k in ("clinc", "xstest", "latency", "zero_shot"))
    assert isinstance(clinc, dict) and isinstance(xstest, dict) and isinstance(latency, dict)
    thresholds = clinc["e5"]["thresholds"]
    assert 0.5 <= thresholds["min_confidence"] <= 0.99 and thresholds["min_margin"] in (0, 0.05, 0.1, 0.15, 0.2, 0.3)
    for bands in xstest["e5"]["bands"].values():
        assert 0.0 <= bands["allow_at"] <= bands["deny_at"] <= 1.0
    assert {(c["task"], c["state"]) for c in latency["e5"]["cells"]} == {
        ("route", "short"),
        ("route", "long"),
        ("check", "short"),
        ("check", "long"),
    }
    assert isinstance(zero_shot, dict) and zero_shot["shipped"]["sets"]
    page = (quality_run.work / "quality.md").read_text()
    assert page.startswith("## System-1 quality: targets")
    for heading in ("### 1. CLINC150", "### 2. Banking77", "### 3. XSTest", "### 4. Prompt injections", "### 6."):
        assert heading in page
    assert "Wilson 95 %" in page


@pytest.mark.data
@pytest.mark.slow
def test_the_report_quick_mode_writes_the_report_and_one_json_line(quality_run: QualityRun, tmp_path: Path) -> None:
    quality = quality_run.results()
    command = [
        sys.executable,
        str(BENCH / "report.py"),
        "--quick",
        "--data",
        str(SHARED_DATA),
        "--work",
        str(tmp_path / "work"),
        "--docs",
        str(tmp_path / "docs"),
        "--quality-from",
        str(quality_run.work / "quality.json"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(report["routing"]["clinc150-domain"]) == {"sparrow zero-shot", "e5 + head, 10/option"}
    for figures in report["routing"]["clinc150-domain"].values():
        assert figures["n"] == report["rows"]
        assert 0.0 <= figures["accuracy"] <= 1.0
    assert "e5 + head, 50/option" in report["checks"]["xstest"]
    assert report["quality"]["clinc"] == quality["clinc"]
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "## CLINC150, 10 domains" in page and "as a policy check" in page
    assert "## System-1 quality: targets" in page and "### 1. CLINC150" in page
    assert (tmp_path / "docs" / "benchmarks" / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
