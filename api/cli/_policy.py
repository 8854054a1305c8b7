"""``fastslow policy check``: load and validate a policy file as the service would, and say what it holds.

As ``nginx -t`` or ``promtool check config``: exit 0 and a summary of every task (kind, engine,
System-2 model, thresholds or bands, ``fitted:`` records) for a good file; exit 2 and the file, line
and key for a bad one. ``--json`` prints one JSON object either way, for CI and pre-commit hooks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._base import EXIT_BAD_INPUT, fail, load_settings, policy_source

if TYPE_CHECKING:
    from fastslow.policies import PolicySource
    from fastslow.router import PolicySet, Settings

__all__ = ["policy_app"]

policy_app = typer.Typer(help="Policy files.", no_args_is_help=True)


def _summary(source: PolicySource, policy: PolicySet, settings: Settings) -> dict[str, Any]:
    from fastslow.policies import describe_policy
    from fastslow.policies.tuning import embedder_name, fit_mismatches

    return {
        "ok": True,
        "file": str(source.path),
        "origin": source.origin,
        "version": policy.version,
        "tasks": describe_policy(policy, default_engine=settings.engine),
        "warnings": fit_mismatches(policy, default_engine=settings.engine, embedder=embedder_name(settings)),
    }


def _fitted_line(kind: str, record: dict[str, Any]) -> str:
    said = ", ".join(f"{key} {record[key]}" for key in ("by", "date", "data", "engine", "embedder") if key in record)
    return f"    fitted {kind}: {said or '(no details)'}"


def _print_text(summary: dict[str, Any], source: PolicySource) -> None:
    lines = [f"policy: {source.describe()}", f"version: {summary['version']}"]
    for name, task in summary["tasks"].items():
        lines.append(f"{name}: {task['kind']} on {task['engine']}, System 2 {task['escalate_to'] or 'none'}")
        if "rules" in task:
            for rule, bands in task["rules"].items():
                lines.append(
                    f"    rule {rule}: deny at >= {bands['deny_at']}, allow at <= {bands['allow_at']}, "
                    f"{bands['examples']} examples"
                )
        else:
            t = task["thresholds"]
            lines.append(f"    thresholds: min_confidence {t['min_confidence']}, min_margin {t['min_margin']}")
            if "routes" in task:
                none = f" (none of these: {task['none_of_these']})" if task["none_of_these"] else ""
                lines.append(f"    routes: {', '.join(task['routes'])}{none}")
            else:
                asked = ", ".join(f"{q} ({about['kind']})" for q, about in task["questions"].items())
                lines.append(f"    questions: {asked}")
        if task["calibration"]["temperature"] != 1.0 or "questions" in task["calibration"]:
            lines.append(f"    calibration: temperature {task['calibration']['temperature']}")
        lines.extend(_fitted_line(kind, record) for kind, record in task["fitted"].items())
    lines.extend(f"warning: {w}" for w in summary["warnings"])
    lines.append(f"ok: {len(summary['tasks'])} task(s)")
    sys.stdout.write("\n".join(lines) + "\n")


@policy_app.command("check")
def policy_check(
    file: Annotated[
        Path | None,
        typer.Argument(help="The policy file; default: the one fastslow would use (FASTSLOW_POLICY_FILE, ...)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout, for CI and hooks.")] = False,
) -> None:
    """Load and validate a policy file as the service would; print its tasks, or the file, line and key at fault."""
    from fastslow.api._compose import policy_loader
    from fastslow.router import ConfigError

    settings = load_settings(None, None)
    if file is not None and not file.is_file():
        if as_json:
            _write_json({"ok": False, "file": str(file), "error": {"message": "no such file"}})
            raise typer.Exit(EXIT_BAD_INPUT)
        fail(f"no such policy file: {file}", EXIT_BAD_INPUT)
    source = policy_source(settings, file)
    try:
        policy = policy_loader(settings)(source.path)
    except ConfigError as exc:
        if as_json:
            error = {"message": exc.message, "line": exc.line, "key": exc.key, "text": str(exc)}
            _write_json({"ok": False, "file": str(source.path), "error": error})
            raise typer.Exit(EXIT_BAD_INPUT) from None
        fail(str(exc), EXIT_BAD_INPUT)
    summary = _summary(source, policy, settings)
    if as_json:
        _write_json(summary)
    else:
        _print_text(summary, source)


def _write_json(obj: dict[str, Any]) -> None:
    # default=str: a fitted record may hold a value YAML typed (a date written unquoted).
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
