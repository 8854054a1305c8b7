"""JSON log lines that join traces and decisions: ``logging.format: json`` (``FASTSLOW_LOGGING__FORMAT=json``).

Each record is one JSON object on one line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
``message``; ``trace_id`` and ``span_id`` of the current OpenTelemetry span when there is a valid
one (the trace a collector shows for the same request); ``decision_id`` or ``decision_ids`` when the
record carries them (``extra=``), as the API's decision lines do; ``exception`` with the traceback.
Nothing else a record carries is written: ``extra`` fields other than those are left out, so a
log line says no more than its message does.

``text`` (the default) leaves logging as it was: uvicorn's own configuration for ``fastslow serve``,
none for the other commands.
"""

from __future__ import annotations

import json
import logging
import logging.config
from datetime import UTC, datetime
from typing import Any, Final, Literal

from opentelemetry import trace

__all__ = ["JsonFormatter", "configure_command_logging", "serve_log_config"]

LogFormat = Literal["text", "json"]

_DECISION_FIELDS: Final = ("decision_id", "decision_ids")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, trace and span ids, decision ids."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        # The span current where the record was made: handlers format in the logging call's thread.
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            line["trace_id"] = f"{context.trace_id:032x}"
            line["span_id"] = f"{context.span_id:016x}"
        for name in _DECISION_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = list(value) if isinstance(value, (list, tuple)) else str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _config(level: str, *, loggers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"},
            "stdout": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout"},
        },
        # fastslow's own loggers at the level asked for; the libraries' (httpx logs every request at
        # INFO) only from WARNING, as Python's default shows them.
        "loggers": {"fastslow": {"level": level}, **loggers},
        "root": {"handlers": ["stderr"], "level": "WARNING"},
    }


def serve_log_config(log_format: LogFormat, level: str) -> dict[str, Any] | None:
    """uvicorn's ``log_config`` for ``fastslow serve``: ``None`` (uvicorn's own) for text, else JSON lines.

    As uvicorn's own configuration: the access log on stdout, everything else on stderr.
    """
    if log_format == "text":
        return None
    upper = level.upper()
    return _config(
        upper,
        loggers={
            "uvicorn": {"handlers": ["stderr"], "level": upper, "propagate": False},
            "uvicorn.error": {"level": upper},
            "uvicorn.access": {"handlers": ["stdout"], "level": upper, "propagate": False},
        },
    )


def configure_command_logging(log_format: LogFormat, level: str = "INFO") -> None:
    """JSON lines on stderr for a command other than ``serve`` (stdout is its result); text: left as it is."""
    if log_format == "json":
        logging.config.dictConfig(_config(level.upper(), loggers={}))
