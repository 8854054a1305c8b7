"""`fastslow calibrate` and `fastslow tune` end to end: the embedded engine on CLINC150 rows, the YAML rewritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import SHARED_DATA
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.policies import load_policy
from fastslow.policies.evaluation import convert
from fastslow.policies.tuning import PolicyEditor

runner = CliRunner()
TASK = "clinc150-domain"


@pytest.fixture(scope="module")
def clinc(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """CLINC150 domains: 10 examples a domain, at most 160 rows a split; (rows, policy fragment)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"public data not found at {SHARED_DATA} (set FASTSLOW_SHARED_DATA); CI always has it")
    folder = tmp_path_factory.mktemp("clinc")
    result = convert(TASK, SHARED_DATA, folder / "clinc.jsonl", examples_per_label=10, limit=160)
    assert result.examples_path is not None
    return result.out_path, result.examples_path


def _policy(clinc: tuple[Path, Path], tmp_path: Path, temperature: float | None = None) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_bytes(clinc[1].read_bytes())
    if temperature is not None:
        editor = PolicyEditor(path)
        editor.set(("tasks", TASK, "calibration", "temperature"), temperature)
        editor.write()
    return path


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, [*args, "--no-progress"])
    return result.exit_code, result.output


def test_calibrate_lowers_held_out_ece_and_writes_the_temperature(clinc: tuple[Path, Path], tmp_path: Path) -> None:
    # A temperature far too low makes the engine overconfident: calibration must undo most of it.
    policy = _policy(clinc, tmp_path, temperature=0.2)
    code, out = _run(
        "calibrate", "--policy", str(policy), "--task", TASK, "--data", str(clinc[0]),
        "--split", "validation", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert code == 0, out
    assert "ECE" in out and f"wrote {policy}" in out
    task = load_policy(policy).tasks[TASK]
    assert task.calibration.temperature > 0.2
    record = task.fitted["calibration"]
    held = record["held_out"]
    assert held["after"]["ece"] < held["before"]["ece"]
    assert held["after"]["log_loss"] < held["before"]["log_loss"]
    assert record["engine"] == "embedded" and record["model"]


def test_tune_keeps_what_it_can_at_the_target_and_refuses_too_little_data(
    clinc: tuple[Path, Path], tmp_path: Path
) -> None:
    policy = _policy(clinc, tmp_path)
    args = ["--policy", str(policy), "--task", TASK, "--data", str(clinc[0]), "--split", "validation"]
    before = policy.read_bytes()
    code, out = _run("tune", *args, "--target-accuracy", "0.99", "--out", str(tmp_path / "strict"))
    assert code == 2 and "at least 268" in out, out
    assert policy.read_bytes() == before  # nothing written
    code, out = _run("tune", *args, "--target-accuracy", "0.85", "--dry-run", "--out", str(tmp_path / "run"))
    assert code == 0, out
    assert "dry run" in out and "+    thresholds:" in out
    assert policy.read_bytes() == before
    code, out = _run("tune", *args, "--target-accuracy", "0.85", "--out", str(tmp_path / "run"))
    assert code == 0, out
    assert (tmp_path / "run" / "tune.png").stat().st_size > 0
    task = load_policy(policy).tasks[TASK]
    fitted = task.fitted["thresholds"]
    assert fitted["held_out"]["lower_bound"] >= 0.85
    assert f"min_confidence {task.thresholds.min_confidence}," in out
    assert fitted["target_accuracy"] == 0.85
    # The file changed (the fit was written): the next run starts over instead of resuming.
    code, out = _run("tune", *args, "--target-accuracy", "0.85", "--dry-run", "--out", str(tmp_path / "run"))
    assert code == 0, out


def test_bad_input_is_refused_naming_the_row_or_key(clinc: tuple[Path, Path], tmp_path: Path) -> None:
    policy = _policy(clinc, tmp_path)
    before = policy.read_bytes()
    rows = [json.loads(line) for line in clinc[0].read_text(encoding="utf-8").splitlines()[:40]]
    rows[3]["labels"][TASK] = "astrology"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, out = _run("tune", "--policy", str(policy), "--task", TASK, "--data", str(bad), "--out", str(tmp_path / "b"))
    assert code == 2 and f"{bad}:4:" in out and "astrology" in out, out
    code, out = _run("tune", "--policy", str(policy), "--task", "nope", "--data", str(clinc[0]))
    assert code == 2 and "no task 'nope'" in out, out
    code, out = _run("tune", "--policy", str(policy), "--task", TASK, "--data", str(clinc[0]), "--split", "test")
    assert code == 2 and "--split" in out, out
    assert policy.read_bytes() == before
    assert yaml.safe_load(before)["tasks"][TASK]["kind"] == "route"
