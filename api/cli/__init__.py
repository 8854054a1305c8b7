"""The ``fastslow`` command line: one module per command group, each loading what it needs when it runs.

Bad input ends with one line on stderr naming the field, and a non-zero exit: 2 for a bad request
or configuration, 3 when the engine could not answer, 4 when the decision log could not be reached
(``_base``). Never a traceback for a user mistake.

Building ``app`` imports typer and the standard library only: every command imports the kernel,
the engines, the policies, the database layer or the web server inside its function, so that
``fastslow --help`` and a mistyped option answer at once (tests/test_cli_imports.py holds it).

=====================  ===========================================================
module                 commands
=====================  ===========================================================
``_decide``            ``decide`` (``_jsonl``: its JSON Lines streaming)
``_serve``             ``serve``
``_init``              ``init``
``_eval``              ``eval``
``_fit``               ``calibrate``, ``tune`` (their shared ``FitOptions``)
``_data``              ``data list``, ``data convert``
``_policy``            ``policy check``
``_graph``             ``graph list``, ``graph run``
``_keys``              ``keys create``, ``keys list``, ``keys revoke``
``_db``                ``db upgrade``, ``db prune``
``_report``            ``report drift``, ``report shadow``
``_learned``           ``learned list``, ``learned withdraw``
=====================  ===========================================================
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperOption

from ._data import data_app
from ._db import db_app
from ._decide import decide
from ._eval import eval_command
from ._fit import calibrate_command, tune_command
from ._graph import graph_app
from ._init import init
from ._keys import keys_app
from ._learned import learned_app
from ._policy import policy_app
from ._report import report_app
from ._serve import serve

__all__ = ["app", "main"]


def _flags_show_no_type() -> None:
    # Typer (0.29) prints a value type beside every option in --help, `<bool>` beside each flag too,
    # though a flag takes no value (`--strict / --no-strict  <bool>`): print none for flags.
    shows_type = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shows_type(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_show_no_type()

app = typer.Typer(
    name="fastslow",
    help="System-1 / System-2 router for agent graphs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """System-1 / System-2 router for agent graphs."""


# In the order `fastslow --help` lists them: the commands, then the groups.
app.command()(decide)
app.command()(serve)
app.command()(init)
app.command("eval")(eval_command)
app.command("calibrate")(calibrate_command)
app.command("tune")(tune_command)
app.add_typer(data_app, name="data")
app.add_typer(policy_app, name="policy")
app.add_typer(graph_app, name="graph")
app.add_typer(keys_app, name="keys")
app.add_typer(db_app, name="db")
app.add_typer(report_app, name="report")
app.add_typer(learned_app, name="learned")


def main() -> None:
    """Entry point for ``python -m fastslow.api.cli``."""
    app()
