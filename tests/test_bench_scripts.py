"""The benchmark scripts' quick modes run end to end and end with one JSON object (slow, data-backed).

Each script runs as a script, in its own process. The session's embedding cache
(``FASTSLOW_EMBEDDED__CACHE_DIR``, which the processes inherit) keeps what one run embedded and
trained for the next. The report and quality.py are in tests/test_bench_report.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.data
@pytest.mark.slow
def test_the_tuning_quick_mode_tunes_then_judges_on_the_test_split(shared_data: Path, tmp_path: Path) -> None:
    # Two of the three sets: Banking77 goes through the same path as CLINC150 (one_set), so a third
    # run of it would add a third of the time and nothing else to what this checks.
    script, data = str(BENCH / "tuning.py"), str(shared_data)
    command = [sys.executable, script, "--quick", "--only", "clinc,xstest", "--data", data, "--work", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results["sets"]) == {"clinc", "xstest"}
    xstest = results["sets"].pop("xstest")
    assert [f["false_deny_bound"] <= 0.02 for f in xstest["fits"]] == [True]  # one rotation in --quick
    assert xstest["test"]["safe_denied"]["n"] > 0 and xstest["test"]["unsafe_caught"]["n"] > 0
    for entry in results["sets"].values():
        assert entry["held_out_promise"]["lower_bound"] >= results["target"] == 0.8
        tuned, shipped = entry["tuned"], entry["shipped"]
        assert tuned["rows"] == shipped["rows"] > 0
        assert 0.5 <= tuned["min_confidence"] <= 0.999 and shipped["min_confidence"] == 0.7
        assert 0.0 < tuned["kept"] <= 1.0 and tuned["kept_accuracy"] is not None
    assert (tmp_path / "tuning.md").read_text().startswith("## Tuned thresholds on the test split")


@pytest.mark.data
@pytest.mark.slow
def test_the_builtin_policy_quick_mode_measures_scope_and_tool_calls(shared_data: Path, tmp_path: Path) -> None:
    script = str(BENCH / "builtin_policy.py")
    command = [sys.executable, script, "--quick", "--data", str(shared_data), "--work", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["out_of_scope"]["escalated"]["n"] == results["in_scope"]["kept"]["n"] == 200
    assert all(results["floors_met"].values()), results["floors_met"]
    tools = results["tool_calls"]
    assert (tools["destructive"]["n"], tools["ordinary"]["n"]) == (114, 119)
    assert tools["destructive"]["deny"] > tools["destructive"]["allow"]
    assert tools["ordinary"]["allow"] > tools["ordinary"]["deny"]
    assert (tmp_path / "builtin_policy.md").read_text().startswith("## The built-in policy")


@pytest.mark.data
@pytest.mark.slow
def test_the_context_quick_mode_compares_what_system_1_reads_of_a_conversation(
    shared_data: Path, tmp_path: Path
) -> None:
    script = str(BENCH / "context.py")
    command = [sys.executable, script, "--quick", "--data", str(shared_data), "--work", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results["route"]) == {"alone", "with_earlier"}
    assert set(results["check"]) == {"alone", "one_read", "two_reads"}
    route, check = results["route"], results["check"]
    assert route["alone"]["top_accuracy"]["n"] == route["with_earlier"]["top_accuracy"]["n"] > 0
    # Two reads keep the more suspicious: never fewer violations caught than the item alone.
    assert check["two_reads"]["unsafe_caught"]["share"] >= check["alone"]["unsafe_caught"]["share"]
    assert (tmp_path / "context.md").read_text().startswith("## Conversation context")


@pytest.mark.data
@pytest.mark.slow
def test_the_learning_simulation_escalates_less_as_system_1_learns(shared_data: Path, tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(BENCH / "learning.py"),
        "--quick",
        "--data",
        str(shared_data),
        "--work",
        str(tmp_path),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    first, *_, last = results["points"]
    assert (first["requests"], first["learned"], first["examples_version"]) == (0, 0, "")
    assert last["learned"] > 0 and last["examples_version"].startswith(f"{last['learned']}-")
    assert results["retrains"] >= 1
    assert last["held_out"]["escalated"] < first["held_out"]["escalated"]
    assert results["escalation_falls"] and results["target_met_everywhere"]
    assert (tmp_path / "learning.md").read_text().startswith("## Learning from escalations")
    assert (tmp_path / "learning.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.xdist_group("timing")  # a deadline that must expire, and throughput
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
    # Priced in tokens, the 29,400-character check is read up to its budget, not timed out.
    assert "timeout" not in report["after_a_timeout"]["long_check_reasons"]
    assert report["after_a_timeout"]["short_after"]["timed_out"] == 0
    for name, probe in report["probes"].items():
        # The CPU each costs, not its wall time: on a shared CI runner the 2 s budget may run out.
        assert probe["status"] == 200 and probe["server_cpu_s"] < 3.0, (name, probe)
    assert report["ten_clients"]["during_ten_clients"]["timed_out"] == 0
    assert report["ten_clients"]["during_ten_clients"]["not_system1"] == 0
    assert all(400 <= case.get("status", 400) < 500 for case in report["malformed"].values())
    assert report["malformed"]["Content-Length and Transfer-Encoding"]["answer"].startswith("HTTP/1.1 400")
    assert report["malformed"]["over-limit Content-Length, no body"]["answer"].startswith("HTTP/1.1 413")


@pytest.mark.slow
def test_the_overhead_quick_mode_measures_every_form_beside_the_peers(tmp_path: Path) -> None:
    pytest.importorskip("langgraph_jev_router", reason="needs the bench extra")
    pytest.importorskip("langgraph_jev", reason="needs the bench extra")
    command = [sys.executable, str(BENCH / "overhead.py"), "--quick", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    peers = ("langgraph-jev-router", "langgraph-jev")
    for mode in ("invoke", "ainvoke"):
        forms = report[mode]
        assert {"fastslow node", "fastslow edge", "fastslow node + SQLite log", *peers} <= set(forms)
        for name, figures in forms.items():
            assert figures["n"] == report["calls"] and figures["raw_p50_ms"] > 0, (mode, name)
            if name != "bare conditional edge":
                assert all(f"ratio_vs_{peer}" in figures for peer in peers), (mode, name)
        assert [forms[peer][f"ratio_vs_{peer}"] for peer in peers] == [1.0, 1.0]
        # The traced node recorded its route span and its engine call span every call.
        assert "fastslow node, traced (in-memory exporter)" in forms
        assert report["tracing"][mode]["spans_per_call"] >= 2.0
    assert report["rss"]["decisions_last"] > report["rss"]["decisions_first"] > 0
    assert (tmp_path / "overhead.md").read_text().startswith("## Overhead per routing decision")


@pytest.mark.slow
def test_the_coalesce_quick_mode_sends_few_requests_for_many_callers(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "coalesce.py"), "--quick"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["engine_requests"]["bare"] == 64
    assert 1 <= report["engine_requests"]["coalesced"] <= 4
    assert report["lone_p50_ms"]["coalesced"] > 0 and report["lone_p50_ms"]["bare"] > 0


@pytest.mark.slow
@pytest.mark.xdist_group("timing")  # a deadline that must expire, and throughput
def test_the_http_service_quick_mode_measures_fastslow_beside_a_bare_route(tmp_path: Path) -> None:
    command = [sys.executable, str(BENCH / "http_service.py"), "--quick", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["errors"] == 0 and report["check"]["verdict"] in ("allow", "review", "deny")
    assert set(report["ratio_vs_bare"]) == set(report["ratio_vs_proxy"]) == {"1", "8", "32"}
    for figures in report["jev"].values():
        for target in ("bare", "proxy", "fastslow"):
            assert figures[target]["rps"] > 0 and figures[target]["p99_ms"] >= figures[target]["p50_ms"] > 0
        assert figures["ratio_vs_bare"] == pytest.approx(figures["fastslow"]["rps"] / figures["bare"]["rps"], rel=0.01)
        proxy = figures["fastslow"]["rps"] / figures["proxy"]["rps"]
        assert figures["ratio_vs_proxy"] == pytest.approx(proxy, rel=0.01)
        assert figures["proxy"]["stub_cpu_ms_per_request"] > 0  # it did call the stub
    assert {"on", "off"} == set(report["embedded"]["32"]) and report["embedded_batching_ratio"] > 0
    assert set(report["encoder_ms_per_text_by_batch"]) == {"1", "4", "16", "32"}
    assert report["rss"]["checks_last"] > report["rss"]["checks_first"] > 0
    assert [t["target"] for t in report["targets"]][0] == "throughput ≥ 0.6× proxy at 8"
    assert (tmp_path / "http.md").read_text().startswith("## HTTP policy-check service")


@pytest.mark.slow
def test_the_jev_client_quick_mode_times_each_client_on_the_same_exchange(tmp_path: Path) -> None:
    command = [sys.executable, str(BENCH / "jev_client.py"), "--quick", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(summary["aiohttp_cpu_vs_httpx2"]) == {"1", "8", "32"}
    assert summary["decision"].startswith(("use aiohttp", "keep httpx2"))
    report = json.loads((tmp_path / "jev_client.json").read_text())
    for row in report["by_concurrency"].values():
        for client in ("httpx2", "aiohttp", "httpx2-aiohttp", "httpx2-bare", "httpx2-default"):
            figures = row[client]
            assert figures["errors"] == 0 and figures["exchanges"] == report["slices"] * report["exchanges_per_slice"]
            assert figures["cpu_us_per_exchange"] > 0 and figures["p99_ms"] >= figures["p50_ms"] > 0


def test_the_cli_startup_bench_times_each_command_beside_the_interpreter() -> None:
    # One run a command: the shape of the result, not a timing (speed is never a timed test).
    command = [sys.executable, str(BENCH / "cli_startup.py"), "--runs", "1"]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["failed"] == []
    assert set(results["median_s"]) == {
        "python -c pass",
        "python -c 'import typer'",
        "fastslow --help",
        "fastslow keys create",
        "fastslow graph list",
        "fastslow policy check",
    }
    assert results["ratio_to_python"]["python -c pass"] == 1.0
