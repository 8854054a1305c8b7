"""Resuming an evaluation run: what a report directory already holds, and whether it is this run's.

A run appends to ``predictions.jsonl`` as rows finish; an interrupted one is resumed by running it
again with the same arguments, which skips the (row, question) pairs already predicted.
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path

from fastslow.router import ConfigError

from ._predictions import PREDICTIONS_FILE, RUN_FILE, RunInfo, read_predictions, read_run

__all__ = ["now", "resume", "sha256"]

# What must match for a run to resume another: otherwise its predictions would be of other rows,
# another engine or other thresholds.
_SAME_RUN = ("data_sha256", "engine", "policy_version", "task", "split")


def sha256(path: Path) -> str:
    """The file's sha256 hex digest, read in blocks (evaluation files may be large)."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=str(path)) from None
    return digest.hexdigest()


def now() -> str:
    """The time now, as a run's record gives it (UTC, to the second)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def resume(out_dir: Path, info: RunInfo, *, overwrite: bool) -> tuple[set[tuple[str, str]], RunInfo | None]:
    """The (row, question) pairs already predicted in ``out_dir``, and the run they belong to.

    Raises:
        ConfigError: ``out_dir`` holds predictions of another run (and ``overwrite`` is not set).
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError("the report directory is a file", path=str(out_dir))
    path = out_dir / PREDICTIONS_FILE
    if overwrite:
        path.unlink(missing_ok=True)
        (out_dir / RUN_FILE).unlink(missing_ok=True)
        return set(), None
    if not path.is_file() or path.stat().st_size == 0:
        return set(), None
    try:
        prior = read_run(out_dir)
    except ConfigError:
        raise ConfigError(
            f"holds {PREDICTIONS_FILE} but no readable {RUN_FILE}, so it cannot be resumed; "
            "start over with --fresh (overwrite=True)",
            path=str(out_dir),
        ) from None
    differ = [key for key in _SAME_RUN if getattr(prior, key) != getattr(info, key)]
    if prior.settings.get("examples_sha256") != info.settings.get("examples_sha256"):
        differ.append("examples file")
    if differ:
        raise ConfigError(
            f"holds a run with a different {', '.join(differ)}; resume it with the same arguments, "
            "use another directory, or start over with --fresh (overwrite=True)",
            path=str(out_dir),
        )
    _drop_cut_line(path)
    return {(p.row, p.question) for p in read_predictions(out_dir)}, prior


def _drop_cut_line(path: Path) -> None:
    """Cut a last line left incomplete by an interruption, so appended lines start on their own."""
    with path.open("rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        # Walk back to the last newline; a prediction line is small, so this stays cheap.
        position = size
        while position > 0:
            step = min(position, 1 << 16)
            fh.seek(position - step)
            chunk = fh.read(step)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                fh.truncate(position - step + cut + 1)
                return
            position -= step
        fh.truncate(0)
