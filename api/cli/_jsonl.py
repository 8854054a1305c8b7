"""``fastslow decide`` on JSON Lines: one request per line, one response per line, in input order.

Imported when such a command runs (``_decide`` imports it then), so this module loads the kernel
at its top.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import typer

from fastslow.router import ConfigError, EngineError, InvalidRequest, Settings
from fastslow.router.engine_api import SystemOneRequest, parse_systemone_request, render_systemone_reply

from ._base import EXIT_BAD_INPUT, fail, write_line

__all__ = ["EXIT_LINES", "decide_jsonl", "decide_lines"]

EXIT_LINES = 1
"""``decide`` on JSON Lines: every line was read, and at least one got an error line."""


@dataclass(slots=True)
class _Tally:
    """What ``decide`` on JSON Lines did, for its exit status and its closing line."""

    requests: int = 0
    errors: int = 0
    first_error: int | None = None


def _line_error(line: int, kind: str, message: str, field: str | None = None) -> dict[str, Any]:
    # The HTTP API's error shape, plus the line: a script matches error lines to its requests.
    error: dict[str, Any] = {"line": line, "type": kind, "message": message}
    if field:
        error["field"] = field
    return {"error": error}


def _settle(future: asyncio.Future[bytes], outcome: bytes | BaseException) -> None:
    if future.done():  # cancelled: the command ended while the line was being read
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class _LineReader:
    """Reads a byte stream one line per ``next()`` call, on a thread of its own.

    A read that blocks (stdin fed by a person or by a program waiting for each answer) then
    never stalls the event loop, so a finished response is written while the next line is still
    to come. The thread is a daemon: a read that never returns cannot keep the process alive.
    """

    def __init__(self, stream: BinaryIO, name: str) -> None:
        self._stream = stream
        self._name = name
        self._loop = asyncio.get_running_loop()
        self._asks: queue.SimpleQueue[asyncio.Future[bytes] | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="fastslow-decide-lines", daemon=True).start()

    def next(self) -> asyncio.Future[bytes]:
        """The next line with its line break; ``b""`` at the end of the stream."""
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._asks.put(future)
        return future

    def close(self) -> None:
        self._asks.put(None)

    def _serve(self) -> None:
        while (future := self._asks.get()) is not None:
            outcome: bytes | BaseException
            try:
                outcome = self._stream.readline()
            except OSError as exc:
                outcome = ConfigError(f"cannot read {self._name}: {exc.strerror or exc}")
            try:
                self._loop.call_soon_threadsafe(_settle, future, outcome)
            except RuntimeError:  # the loop has closed: nobody waits for this line any more
                return


def _parse_line(raw: bytes, number: int, settings: Settings) -> SystemOneRequest:
    try:
        # Without its line break, so an error at the end of the line is at a column of that line.
        text = raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\r\n")  # an editor's BOM
    except UnicodeDecodeError as exc:
        raise InvalidRequest("body", f"not UTF-8 text (byte {exc.start + 1})") from None
    body: Any = text
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        # Its column only: "line 1" of a one-line document would read as the file's line 1.
        raise InvalidRequest("body", f"invalid JSON at column {exc.colno}: {exc.msg}") from None
    except (RecursionError, ValueError):
        pass  # the text goes to the parser as it is, which says what is wrong as for one request
    return parse_systemone_request(body, max_state_chars=settings.max_state_chars, limits=settings.limits)


async def decide_lines(
    settings: Settings, stream: BinaryIO, name: str, concurrency: int, emit: Callable[[dict[str, Any]], None]
) -> _Tally:
    """Answer every request line of ``stream`` with one engine; ``emit`` each response in input order.

    At most ``concurrency`` lines are held at once, answered or not yet written, and the next line
    is read only when one of them is written: memory stays bounded, however long the stream.
    """
    from fastslow.engines import build_engine

    engine = build_engine(settings)  # once: the models load before the first line, not per line

    async def answer(number: int, raw: bytes) -> tuple[bool, dict[str, Any]]:
        try:
            request = _parse_line(raw, number, settings)
            reply = await engine.decide(request.state, request.questions, options=request.options)
        except InvalidRequest as exc:
            return False, _line_error(number, "invalid_request", exc.message, exc.field)
        except EngineError as exc:
            return False, _line_error(number, "engine_error", str(exc))
        return True, render_systemone_reply(reply, request.questions)

    tally = _Tally()
    lines = _LineReader(stream, name)
    window: deque[asyncio.Task[tuple[bool, dict[str, Any]]]] = deque()
    asked: asyncio.Future[bytes] | None = None
    number = 0
    ended = False
    try:
        while True:
            if asked is None and not ended and len(window) < concurrency:
                asked = lines.next()
            waiting: list[asyncio.Future[Any]] = [window[0]] if window else []
            if asked is not None:
                waiting.append(asked)
            if not waiting:
                return tally
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            while window and window[0].done():
                ok, result = window.popleft().result()  # a ConfigError or a bug ends the command here
                tally.requests += 1
                if not ok:
                    tally.errors += 1
                    tally.first_error = tally.first_error or int(result["error"]["line"])
                emit(result)
            if asked is not None and asked.done():
                raw = asked.result()
                asked = None
                ended = not raw
                number += 1
                if raw.strip():  # a blank line is skipped, but counts: numbers are the file's lines
                    window.append(asyncio.create_task(answer(number, raw)))
    finally:
        lines.close()
        if asked is not None:
            asked.cancel()
        for task in window:
            task.cancel()
        await asyncio.gather(*window, return_exceptions=True)
        await engine.aclose()


def _silence_stdout() -> None:
    # After a broken pipe, Python's last flush of stdout would fail again, with a message.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout): nothing to flush
        pass


def decide_jsonl(settings: Settings, source: str, concurrency: int) -> None:
    stream: BinaryIO
    if source == "-":
        stream = sys.stdin.buffer
    else:
        try:
            stream = Path(source).open("rb")  # closed below, after the last line
        except OSError as exc:
            fail(f"cannot read {source}: {exc.strerror}", EXIT_BAD_INPUT)
    name = "stdin" if source == "-" else source
    try:
        tally = asyncio.run(decide_lines(settings, stream, name, concurrency, write_line))
    except BrokenPipeError:
        # Whoever read the output stopped (`| head`): stop too, quietly, as other tools do.
        _silence_stdout()
        raise typer.Exit(EXIT_LINES) from None
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    finally:
        if source != "-":
            stream.close()
    if tally.errors:
        fail(
            f"{tally.errors} of {tally.requests} request line(s) got an error line (the first: line "
            f"{tally.first_error})",
            EXIT_LINES,
        )
