"""``fastslow data``: the public data sets it knows, and converting one into an evaluation file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ._base import EXIT_BAD_INPUT, fail

__all__ = ["data_app"]

data_app = typer.Typer(help="Labelled data sets for evaluation.", no_args_is_help=True)


@data_app.command("list")
def data_list() -> None:
    """Name the data sets `fastslow data convert` knows, each with what its rows ask."""
    from fastslow.policies.evaluation import CONVERTERS

    width = max(map(len, CONVERTERS))
    sys.stdout.write("".join(f"{name:<{width}}  {' '.join(c.summary.split())}\n" for name, c in CONVERTERS.items()))


@data_app.command("convert")
def data_convert(
    name: Annotated[str, typer.Argument(help="A data set from `fastslow data list`.")],
    source: Annotated[
        Path, typer.Option("--source", help="The data set's folder, or the shared data folder that holds it.")
    ],
    out: Annotated[Path, typer.Option("--out", help="The evaluation file to write (JSON Lines; gzipped if *.gz).")],
    examples: Annotated[
        int | None, typer.Option(help="Also write FILE.examples.yaml: this many training rows per label.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the splits the data does not make, the examples and --limit.")] = 0,
    limit: Annotated[int | None, typer.Option(help="At most this many rows per split, a seeded sample.")] = None,
) -> None:
    """Convert a public data set into an evaluation file, with FILE.meta.json (source, licence, counts)."""
    from rich.console import Console

    from fastslow.policies import suggest
    from fastslow.policies.evaluation import CONVERTERS, convert
    from fastslow.router import ConfigError

    if name not in CONVERTERS:
        fail(
            f"unknown data set {name!r}; expected one of {', '.join(CONVERTERS)}{suggest(name, CONVERTERS)}",
            EXIT_BAD_INPUT,
        )
    if not source.is_dir():
        fail(f"--source: no such folder {source}", EXIT_BAD_INPUT)
    try:
        # On stderr, and drawn only on a terminal: stdout stays the result, for scripts.
        with Console(stderr=True).status(f"converting {name} from {source} ..."):
            result = convert(name, source, out, seed=seed, examples_per_label=examples, limit=limit)
    except ConfigError as exc:  # a bad --examples or --limit, a folder without the data set
        fail(str(exc), EXIT_BAD_INPUT)
    except OSError as exc:
        fail(f"{exc.filename or out}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    counts = ", ".join(f"{split} {rows}" for split, rows in result.counts.items())
    report = [f"rows: {result.out_path}", f"meta: {result.meta_path}"]
    if result.examples_path is not None:
        report.append(f"examples: {result.examples_path}")
    report.append(f"counts: {counts} ({result.rows} rows)")
    dropped = ", ".join(f"{reason} {rows}" for reason, rows in result.dropped.items() if rows)
    if dropped:
        report.append(f"dropped: {dropped}")
    sys.stdout.write("".join(f"{line}\n" for line in report))
