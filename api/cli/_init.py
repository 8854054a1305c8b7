"""``fastslow init``: write the commented starter policy for a person to edit."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ._base import EXIT_BAD_INPUT, fail

__all__ = ["POLICY_FILE_NAME", "init"]

POLICY_FILE_NAME = "fastslow-policy.yaml"
"""``fastslow.policies.POLICY_FILE_NAME``, written out: the default of ``init``'s path is read when the
command line is built, and importing the policies package then would load the kernel (and langgraph)
for every command. tests/test_cli_imports.py checks that the two stay the same."""


def init(
    path: Annotated[Path, typer.Argument(help="Where to write the policy file.")] = Path(POLICY_FILE_NAME),
    force: Annotated[bool, typer.Option(help="Overwrite the file if it exists.")] = False,
) -> None:
    """Write a commented starter policy (the built-in example) for you to edit."""
    from fastslow.policies import BUILTIN_POLICY, load_policy

    if path.exists() and not force:
        fail(f"{path} exists; pass --force to overwrite it", EXIT_BAD_INPUT)
    try:
        path.write_bytes(BUILTIN_POLICY.read_bytes())
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror}", EXIT_BAD_INPUT)
    tasks = ", ".join(load_policy(path).tasks)
    found = path.resolve() == (Path.cwd() / POLICY_FILE_NAME).resolve()
    hint = (
        "fastslow uses it when run from this folder" if found else f"use it with FASTSLOW_POLICY_FILE={path.resolve()}"
    )
    sys.stderr.write(f"wrote {path} (tasks: {tasks}); edit it, {hint}; changes reload without a restart\n")
