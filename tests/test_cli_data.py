"""`fastslow data list` and `fastslow data convert`: the converters from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.policies.evaluation import CONVERTERS, read_rows

runner = CliRunner()


def report(stdout: str) -> dict[str, str]:
    """The command's ``key: value`` lines."""
    return dict(line.split(": ", 1) for line in stdout.splitlines())


def test_data_list_names_every_converter_with_its_summary() -> None:
    result = runner.invoke(app, ["data", "list"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(CONVERTERS)
    for line, converter in zip(lines, CONVERTERS.values(), strict=True):
        assert line.endswith(converter.summary)


@pytest.mark.data
def test_convert_xstest_writes_the_rows_meta_and_examples(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval" / "xstest.jsonl"
    result = runner.invoke(
        app, ["data", "convert", "xstest", "--source", str(shared_data), "--out", str(out), "--examples", "2"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # the progress indicator is drawn on a terminal only
    printed = report(result.stdout)
    assert printed == {
        "rows": str(out),
        "meta": f"{out}.meta.json",
        "examples": f"{out}.examples.yaml",
        "counts": "train 270, validation 90, test 90 (450 rows)",
    }
    rows = read_rows(out, strict=True).rows
    assert len(rows) == 450
    meta = json.loads(Path(printed["meta"]).read_text())
    assert meta["converter"] == "xstest"
    assert meta["counts"] == {"train": 270, "validation": 90, "test": 90}
    fragment = yaml.safe_load(Path(printed["examples"]).read_text())
    assert set(fragment["tasks"]["xstest"]["rules"]["unsafe"]["examples"]) == {"yes", "no"}


@pytest.mark.data
def test_convert_prompt_injection_with_a_seeded_limit(shared_data: Path, tmp_path: Path) -> None:
    source = shared_data / CONVERTERS["prompt-injection"].source.folder  # the data set's own folder works too
    out = tmp_path / "pi.jsonl"
    result = runner.invoke(
        app,
        ["data", "convert", "prompt-injection", "--source", str(source), "--out", str(out), "--limit", "5"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    printed = report(result.stdout)
    assert "examples" not in printed  # none asked for, none written
    assert not Path(f"{out}.examples.yaml").exists()
    assert printed["counts"] == "train 5, validation 5, test 5 (15 rows)"
    rows = read_rows(out, strict=True).rows
    assert [row.split for row in rows].count("test") == 5
    meta = json.loads(Path(printed["meta"]).read_text())
    assert (meta["limit"], meta["seed"], meta["available"]) == (5, 0, {"train": 529, "validation": 66, "test": 67})


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["xstets"], "unknown data set 'xstets'; expected one of clinc150-domain, "),
        (["xstets"], "; did you mean 'xstest'?"),
        (["bogus"], "prompt-injection"),
        (["xstest", "--source", "/no/such/folder"], "--source: no such folder /no/such/folder"),
        (["xstest", "--limit", "0"], "limit must be at least 1"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(tmp_path: Path, args: list[str], expected: str) -> None:
    command = ["data", "convert", *args, "--out", str(tmp_path / "out.jsonl")]
    if "--source" not in args:
        command += ["--source", str(tmp_path)]
    result = runner.invoke(app, command)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert expected in lines[0]
    if args == ["bogus"]:
        assert "did you mean" not in lines[0]  # nothing is close
    assert not (tmp_path / "out.jsonl").exists()
