"""JSON log lines (``logging.format: json``): one object per record, with the trace, span and decision ids."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import sys
from collections.abc import Iterator
from datetime import datetime

import pytest
from opentelemetry.sdk.trace import TracerProvider

from fastslow.api._logs import JsonFormatter, configure_command_logging, serve_log_config

# A provider of the test's own, never installed globally: the formatter reads the current span
# from the context, whichever provider made it.
TRACER = TracerProvider().get_tracer("test")


def _line(record: logging.LogRecord) -> dict[str, object]:
    text = JsonFormatter().format(record)
    assert "\n" not in text  # one record, one line
    parsed: dict[str, object] = json.loads(text)
    return parsed


def _record(message: str = "checked %s", *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("fastslow.api", logging.INFO, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return record


def test_a_record_inside_a_span_carries_its_trace_span_and_decision_ids() -> None:
    with TRACER.start_as_current_span("fastslow.check tool_safety") as span:
        line = _line(_record("policy check: %s", "deny", decision_ids=["d-1", "d-2"]))
        context = span.get_span_context()
    assert line["trace_id"] == f"{context.trace_id:032x}"
    assert line["span_id"] == f"{context.span_id:016x}"
    assert line["decision_ids"] == ["d-1", "d-2"]
    assert (line["level"], line["logger"], line["message"]) == ("INFO", "fastslow.api", "policy check: deny")
    assert datetime.fromisoformat(str(line["time"])).utcoffset() is not None  # ISO 8601 with its zone


def test_a_single_decision_id_and_no_span() -> None:
    line = _line(_record("route support: billing", decision_id="d-9"))
    assert line["decision_id"] == "d-9"
    assert "trace_id" not in line and "span_id" not in line  # no current span: no made-up ids


def test_other_extra_fields_and_arguments_stay_out_of_the_line() -> None:
    # Only the message and the decision ids: an extra a library attaches (a request, a state) is not written.
    line = _line(_record("route %s", "support", state="rm -rf /srv/secret", request={"key": "sk-1"}))
    assert set(line) == {"time", "level", "logger", "message"}
    assert "secret" not in json.dumps(line) and "sk-1" not in json.dumps(line)


def test_an_exception_is_one_field_of_the_same_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("fastslow.api", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = _line(record)
    assert line["message"] == "failed"
    assert "ValueError: boom" in str(line["exception"])


def test_text_leaves_uvicorn_its_own_configuration() -> None:
    assert serve_log_config("text", "info") is None


@pytest.fixture
def restored_logging() -> Iterator[None]:
    # dictConfig replaces handlers and levels of the loggers it names: put them back for the next tests.
    names = ["", "fastslow", "uvicorn", "uvicorn.error", "uvicorn.access"]
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).level) for name in names}
    propagate = {name: logging.getLogger(name).propagate for name in names}
    yield
    for name, (handlers, level) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate[name]


def test_the_serve_configuration_writes_json_access_lines_on_stdout_and_the_rest_on_stderr(
    restored_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    config = serve_log_config("json", "info")
    assert config is not None
    logging.config.dictConfig(config)
    with TRACER.start_as_current_span("POST /v1/policy-check") as span:
        # What uvicorn's access logger is given: the request line's parts as arguments.
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "POST", "/v1/policy-check", "1.1", 200
        )
        logging.getLogger("fastslow.api").info("policy check: allow", extra={"decision_ids": ["d-3"]})
        logging.getLogger("fastslow.api").debug("below the level asked for")
        logging.getLogger("httpx").info("a library's INFO line")  # libraries: WARNING and above only
        trace_id = f"{span.get_span_context().trace_id:032x}"
    access = [json.loads(line) for line in out.getvalue().splitlines()]
    rest = [json.loads(line) for line in err.getvalue().splitlines()]
    assert [a["message"] for a in access] == ['127.0.0.1:5000 - "POST /v1/policy-check HTTP/1.1" 200']
    assert [(r["logger"], r["message"], r["decision_ids"]) for r in rest] == [
        ("fastslow.api", "policy check: allow", ["d-3"])
    ]
    assert {line["trace_id"] for line in access + rest} == {trace_id}


def test_a_command_in_json_mode_writes_its_lines_on_stderr(
    restored_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    configure_command_logging("text")  # text: nothing configured, as before
    assert logging.getLogger("fastslow").level == logging.NOTSET
    configure_command_logging("json")
    logging.getLogger("fastslow.router").info("escalated", extra={"decision_id": "d-4"})
    assert out.getvalue() == ""  # stdout stays the command's result
    (line,) = [json.loads(text) for text in err.getvalue().splitlines()]
    assert (line["logger"], line["decision_id"]) == ("fastslow.router", "d-4")
