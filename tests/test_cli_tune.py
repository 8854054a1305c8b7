"""`fastslow calibrate` and `fastslow tune` end to end: the embedded engine on CLINC150 rows, the YAML rewritten."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import yaml
from conftest import SHARED_DATA
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.policies import load_policy
from fastslow.policies.evaluation import convert, read_predictions
from fastslow.policies.tuning import ISOTONIC_MIN_ROWS, Labelled, PolicyEditor, fit_calibration
from fastslow.router import Isotonic, Platt, get_settings

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


# -- Platt and isotonic maps ------------------------------------------------------------------------


def _split_tail(before: str, after: str, marker: str) -> tuple[str, str]:
    """``after`` cut where ``before``'s ``marker`` line starts: the untouched head, and the rest."""
    at = before.index(marker)
    return after[:at], after[at:]


def test_calibrate_replaces_a_map_and_keeps_every_other_byte(clinc: tuple[Path, Path], tmp_path: Path) -> None:
    # A file with an over-confident temperature and a stale isotonic map; 80 fit decisions allow neither map.
    policy = _policy(clinc, tmp_path)
    editor = PolicyEditor(policy)
    stale = [[0.3, 0.5], [0.6, 0.9], [0.99, 0.999]]
    editor.set(("tasks", TASK, "calibration"), {"temperature": 0.3, "isotonic": stale})
    editor.write()
    before = policy.read_text(encoding="utf-8")
    args = ["--policy", str(policy), "--task", TASK, "--data", str(clinc[0]), "--split", "validation"]
    code, out = _run("calibrate", *args, "--method", "isotonic", "--out", str(tmp_path / "run"))
    assert code == 2 and "at least 1000" in out, out
    assert policy.read_text(encoding="utf-8") == before
    code, out = _run("calibrate", *args, "--out", str(tmp_path / "run"))
    assert code == 0, out
    assert "too few for platt (at least 200) or isotonic (at least 1000)" in out
    head, rest = _split_tail(before, policy.read_text(encoding="utf-8"), "    calibration:\n")
    assert before.startswith(head)  # every byte before the calibration block is as it was
    assert rest.startswith("    calibration:\n      temperature: ") and "isotonic" not in rest
    task = load_policy(policy).tasks[TASK]
    assert task.calibration.confidence_map is None
    record = task.fitted["calibration"]
    assert record["method"] == "temperature" and record["asked"] == "auto"
    # The decisions were made under the stale map: undoing it, the fit lands far closer to calibrated.
    assert record["held_out"]["after"]["ece"] < record["held_out"]["before"]["ece"] / 2


@pytest.fixture(scope="module")
def clinc_large(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, Path]:
    """1,400 CLINC150 validation rows run once through the embedded engine: (rows, policy bytes, run folder).

    The policy's temperature (0.25) makes the engine over-confident. Later runs with the same
    policy bytes and ``--out`` resume the run instead of answering the rows again.
    """
    if not SHARED_DATA.is_dir():
        pytest.skip(f"public data not found at {SHARED_DATA} (set FASTSLOW_SHARED_DATA); CI always has it")
    folder = tmp_path_factory.mktemp("clinc-large")
    converted = convert(
        TASK, SHARED_DATA, folder / "clinc.jsonl", examples_per_label=10, splits=["validation"], limit=1400
    )
    assert converted.examples_path is not None
    policy = folder / "policy.yaml"
    policy.write_bytes(converted.examples_path.read_bytes())
    editor = PolicyEditor(policy)
    editor.set(("tasks", TASK, "calibration", "temperature"), 0.25)
    editor.write()
    with pytest.MonkeyPatch.context() as env:
        # The autouse settings isolation is per test; this runs once for the module, so isolate it here.
        # The session's embedding cache stays: the examples' vectors and head come from it.
        keep = {"FASTSLOW_SHARED_DATA", "FASTSLOW_EMBEDDED__CACHE_DIR"}
        for name in [n for n in os.environ if n.startswith("FASTSLOW_") and n not in keep]:
            env.delenv(name)
        env.setenv("FASTSLOW_DATA_DIR", str(folder / "data"))
        env.setenv("FASTSLOW_SETTINGS_FILE", str(folder / "no-settings.toml"))
        get_settings.cache_clear()
        code, out = _run(
            "calibrate", "--policy", str(policy), "--task", TASK, "--data", str(converted.out_path),
            "--out", str(folder / "run"), "--dry-run",
        )  # fmt: skip
        get_settings.cache_clear()
    assert code == 0, out
    return converted.out_path, policy.read_bytes(), folder / "run"


def test_platt_and_isotonic_fitted_on_clinc_rows_lower_held_out_ece(clinc_large: tuple[Path, bytes, Path]) -> None:
    rows = [
        Labelled(probabilities=dict(p.probabilities), label=str(p.label))
        for p in read_predictions(clinc_large[2])
        if p.label is not None and p.probabilities
    ]
    assert len(rows) >= 1300
    random.Random(0).shuffle(rows)
    fit, held = rows[:1050], rows[1050:]
    for method in ("platt", "isotonic"):
        got = fit_calibration(fit, held, method=method, base_temperature=0.25)
        assert got.method == method and got.calibration.confidence_map is not None
        # Measured: ECE 0.276 before; 0.068 (platt) and 0.058 (isotonic) after, on 350 rows.
        assert got.after.ece < got.before.ece / 2, got
        assert got.after.accuracy == got.before.accuracy  # a map never changes the top option
    # Below the minimum, auto does not even try isotonic.
    small = fit_calibration(fit[: ISOTONIC_MIN_ROWS - 1], held, base_temperature=0.25)
    assert "isotonic" not in small.scores and set(small.scores) == {"temperature", "platt"}


def test_calibrate_writes_a_map_and_the_policy_loads_again(
    clinc_large: tuple[Path, bytes, Path], tmp_path: Path
) -> None:
    data, original, run = clinc_large
    for method, key in (("platt", "platt:"), ("isotonic", "isotonic:\n")):
        policy = tmp_path / f"{method}.yaml"
        policy.write_bytes(original)
        code, out = _run(
            "calibrate", "--policy", str(policy), "--task", TASK, "--data", str(data), "--held-out", "0.25",
            "--method", method, "--out", str(run),
        )  # fmt: skip
        assert code == 0, out
        assert f"{TASK}: {method}: temperature " in out and f"{method}, as asked (1050 fit decisions)" in out
        written = policy.read_bytes()
        head, rest = _split_tail(original.decode(), written.decode(), "    calibration:\n")
        assert original.startswith(head.encode()) and key in rest
        task = load_policy(policy).tasks[TASK]
        g = task.calibration.confidence_map
        assert isinstance(g, Platt if method == "platt" else Isotonic)
        record = task.fitted["calibration"]
        assert record["method"] == method and record["rows_fit"] == 1050
        assert record["held_out"]["after"]["ece"] < record["held_out"]["before"]["ece"]
    # auto: the written record names the cross-validated scores the choice was made on.
    policy = tmp_path / "auto.yaml"
    policy.write_bytes(original)
    code, out = _run(
        "calibrate", "--policy", str(policy), "--task", TASK, "--data", str(data), "--held-out", "0.25",
        "--out", str(run), "--dry-run",
    )  # fmt: skip
    assert code == 0 and "5-fold cross-validated Brier score" in out and "dry run" in out, out
    assert policy.read_bytes() == original
