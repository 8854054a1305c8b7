"""Logs and traces for a command's run: ``logging.format`` and the standard ``OTEL_*`` variables.

``fastslow serve`` and the commands that decide (``decide``, ``graph run``, ``eval``) install the
tracer provider the ``OTEL_*`` variables ask for (``fastslow.api.configure_tracing``) before they
start, and shut it down when they end, so the spans still queued are exported before the process
exits. A command that decides once (``decide``, ``graph run``) opens a root span for its run, so its
decisions and engine calls are one trace. Variables asking for traces the installed packages cannot
send are one line and exit status 2, before any work.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

from ._base import EXIT_BAD_INPUT, fail

if TYPE_CHECKING:
    from fastslow.api._telemetry import Tracing
    from fastslow.router import Settings

__all__ = ["observed", "start_tracing"]


def start_tracing() -> Tracing | None:
    """The provider the ``OTEL_*`` variables ask for, installed; a package they need that is missing is one line."""
    from fastslow.api._telemetry import TracingUnavailable, configure_tracing

    try:
        return configure_tracing()
    except TracingUnavailable as exc:
        fail(str(exc), EXIT_BAD_INPUT)


@contextmanager
def observed(settings: Settings, span: str | None = None) -> Iterator[None]:
    """Within the block: logs as ``settings.logging`` says, traces as the ``OTEL_*`` variables say.

    Args:
        settings: the command's settings (``logging.format``).
        span: the name of a root span for the block (the command's run); none when omitted.
    """
    from fastslow.api._logs import configure_command_logging

    configure_command_logging(settings.logging.format)
    tracing = start_tracing()
    with ExitStack() as stack:
        if tracing is not None:
            stack.callback(tracing.shutdown)  # last: the root span below has ended and is queued
            if span is not None:
                from opentelemetry import trace

                root = trace.get_tracer("fastslow.cli").start_as_current_span(
                    span,
                    record_exception=False,
                    set_status_on_exception=False,  # an error's text may quote input
                )
                stack.enter_context(root)
        yield
