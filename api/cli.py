"""The ``fastslow`` command line.

Bad input ends with one line on stderr naming the field, and a non-zero exit: 2 for a bad request
or configuration, 3 when the engine could not answer. Never a traceback for a user mistake.
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
from typing import Annotated, Any, BinaryIO, cast

import typer

from fastslow.policies import (
    BUILTIN_POLICY,
    POLICY_FILE_NAME,
    PolicySource,
    load_policy,
    locate_policy,
    parse_policy,
)
from fastslow.router import ConfigError, EngineError, InvalidRequest, Settings
from fastslow.router.engine_api import SystemOneRequest, parse_systemone_request, render_systemone_reply

from ._cli_base import EXIT_BAD_INPUT, EXIT_ENGINE, check_engine, fail, load_settings, write_line
from ._cli_learned import learned_app
from ._cli_store import db_app, keys_app, migrate

__all__ = ["app"]

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


def _read_body(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    path = Path(source)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"cannot read {source}: {exc.strerror}", EXIT_BAD_INPUT)


async def _decide(settings: Settings, body: str) -> dict[str, Any]:
    from fastslow.engines import build_engine

    request = parse_systemone_request(body, max_state_chars=settings.max_state_chars, limits=settings.limits)
    engine = build_engine(settings)
    try:
        reply = await engine.decide(request.state, request.questions, options=request.options)
    finally:
        await engine.aclose()
    return render_systemone_reply(reply, request.questions)


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


async def _decide_lines(
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


def _decide_jsonl(settings: Settings, source: str, concurrency: int) -> None:
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
        tally = asyncio.run(_decide_lines(settings, stream, name, concurrency, write_line))
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


@app.command()
def decide(
    source: Annotated[
        str, typer.Argument(help="Jev /v1/systemone request body: a file, or - for stdin; *.jsonl: JSON Lines.")
    ] = "-",
    engine: Annotated[
        str | None,
        typer.Option(help="Engine to use: embedded, sparrow, examples, jev, openai-decisions, logprob, or a plugin's."),
    ] = None,
    examples: Annotated[
        Path | None, typer.Option(help="Examples file (JSON/YAML) for the example-trained engine.")
    ] = None,
    pretty: Annotated[bool, typer.Option(help="Indent the JSON output (not with JSON Lines).")] = False,
    jsonl: Annotated[
        bool | None,
        typer.Option(
            "--jsonl/--no-jsonl",
            help="Read JSON Lines: one request per line, one response per line. Default: on for a *.jsonl file.",
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="JSON Lines: how many lines are answered at once.")] = 4,
) -> None:
    """Answer a Jev request body with the configured engine and print Jev's response body.

    With JSON Lines (--jsonl, or a source file named *.jsonl) each line is a
    request, all answered by one engine (the models load once), up to
    --concurrency at a time. The responses come one per line, in the order of
    the requests, each as soon as it and those before it are done. Blank lines
    are skipped. A line that is not a valid request, or that the engine could
    not answer, gets an error line and the lines after it go on:
    {"error": {"line": N, "type": "invalid_request" or "engine_error",
    "message": ..., "field": ...}}, N being its line in the file (blank lines
    count).

    Exit status: 0 when every request was answered; 1 with JSON Lines when any
    line got an error line; 2 for a bad option, request or configuration; 3
    when the engine could not answer a single request.
    """
    check_engine(engine)
    lines = jsonl if jsonl is not None else source.lower().endswith(".jsonl")
    if lines and pretty:
        fail("--pretty: JSON Lines are one response per line; drop --pretty", EXIT_BAD_INPUT)
    if concurrency < 1:
        fail(f"--concurrency: must be at least 1, not {concurrency}", EXIT_BAD_INPUT)
    settings = load_settings(engine, examples)
    if lines:
        _decide_jsonl(settings, source, concurrency)
        return
    body = _read_body(source)
    try:
        result = asyncio.run(_decide(settings, body))
    except InvalidRequest as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except EngineError as exc:
        fail(str(exc), EXIT_ENGINE)
    sys.stdout.write(json.dumps(result, indent=2 if pretty else None, ensure_ascii=False) + "\n")


data_app = typer.Typer(help="Labelled data sets for evaluation.", no_args_is_help=True)
app.add_typer(data_app, name="data")


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

    from fastslow.policies._base import suggest
    from fastslow.policies.evaluation import CONVERTERS, convert

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


graph_app = typer.Typer(help="Ready agent graphs.", no_args_is_help=True)
app.add_typer(graph_app, name="graph")


def _policy_source(settings: Settings) -> PolicySource:
    try:
        return locate_policy(settings)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def _say_policy(source: PolicySource) -> None:
    # On stderr: stdout stays the command's result, for scripts.
    sys.stderr.write(f"policy: {source.describe()}\n")


@graph_app.command("list")
def graph_list() -> None:
    """Name the ready graphs, one per line, and the policy file they would run with."""
    from fastslow.graphs import GRAPHS

    sys.stdout.write("".join(f"{name}\n" for name in GRAPHS))
    _say_policy(_policy_source(load_settings(None, None)))


async def _run_graph(settings: Settings, name: str, text: str) -> dict[str, Any]:
    from fastslow.graphs import GraphName, run_graph

    from ._compose import build_runtime

    runtime = build_runtime(settings)
    _say_policy(runtime.policy_source)  # the file the runtime loaded, not a second look-up
    try:
        return await run_graph(
            cast(GraphName, name),
            text,
            router=runtime.router,
            chats=runtime.chats,
            draft_model=settings.system2.draft,
        )
    finally:
        await runtime.aclose()


@graph_app.command("run")
def graph_run(
    name: Annotated[str, typer.Argument(help="A graph from `fastslow graph list`.")],
    input: Annotated[str, typer.Option("--input", help="The user's message.")],
    pretty: Annotated[bool, typer.Option(help="Indent the JSON output.")] = False,
) -> None:
    """Run a ready graph on one message and print its final state as JSON."""
    from fastslow.graphs import GRAPHS

    if name not in GRAPHS:
        fail(f"unknown graph {name!r}; expected one of {', '.join(GRAPHS)}", EXIT_BAD_INPUT)
    settings = load_settings(None, None)
    try:
        result = asyncio.run(_run_graph(settings, name, input))
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except EngineError as exc:
        fail(str(exc), EXIT_ENGINE)
    sys.stdout.write(json.dumps(result, indent=2 if pretty else None, ensure_ascii=False, default=str) + "\n")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on.", min=0, max=65535)] = 8000,
    log_level: Annotated[str, typer.Option(help="uvicorn log level: debug, info, warning, error.")] = "info",
) -> None:
    """Run the HTTP API (OpenAPI docs at /docs); migrations run first, API keys come from `fastslow keys create`."""
    from ._server import Server, server_config
    from .app import create_app

    settings = load_settings(None, None)
    # Check what a person can get wrong before the server starts, so a mistake is one line, not
    # a lifespan traceback: the policy file, and the database (which also migrates it).
    source = _policy_source(settings)
    try:
        load_policy(source.path)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    _say_policy(source)
    migrate(settings)
    # The connection limits of settings.server (timeouts, header size, framing) come with the config.
    server = Server(server_config(create_app(settings), settings, host=host, port=port, log_level=log_level))
    server.run()
    if not server.started:
        fail("the API did not start; see the log above", EXIT_BAD_INPUT)


app.add_typer(keys_app, name="keys")
app.add_typer(db_app, name="db")


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the policy file.")] = Path(POLICY_FILE_NAME),
    force: Annotated[bool, typer.Option(help="Overwrite the file if it exists.")] = False,
) -> None:
    """Write a commented starter policy (the built-in example) for you to edit."""
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


EXIT_INTERRUPTED = 130
PROBLEMS_SHOWN = 20
"""Row problems printed by `fastslow eval`; run.json lists them all."""


def _say_run_problems(problems: tuple[str, ...], dropped: int) -> None:
    # On stderr, one `line N: why` each: stdout stays the run's result.
    for problem in problems[:PROBLEMS_SHOWN]:
        sys.stderr.write(f"{' '.join(problem.split())}\n")
    if len(problems) > PROBLEMS_SHOWN:
        sys.stderr.write(f"... and {len(problems) - PROBLEMS_SHOWN} more bad row(s), all listed in run.json\n")
    if problems:
        sys.stderr.write(f"skipped {len(problems)} bad row(s); --strict refuses the file instead\n")
    if dropped:
        sys.stderr.write(
            f"left out {dropped} row(s) whose state is one of the engine's training examples "
            "(run.json: dropped_training_rows)\n"
        )


def _compare_reports(a: Path, b: Path, out: Path | None) -> None:
    from fastslow.policies.evaluation import compare_reports

    for path in (a, b):
        if not path.is_dir():
            fail(f"--compare: no such report directory {path}", EXIT_BAD_INPUT)
    try:
        comparison = compare_reports(a, b)
    except ConfigError as exc:  # the two runs are not over the same rows, or a report is unreadable
        fail(str(exc), EXIT_BAD_INPUT)
    if out is not None:
        try:
            written = comparison.write(out)
        except OSError as exc:
            fail(f"--out: cannot write the comparison to {out}: {exc.strerror or exc}", EXIT_BAD_INPUT)
        sys.stderr.write(f"wrote {', '.join(str(path) for path in written)}\n")
    sys.stdout.write(comparison.markdown())


@app.command("eval")
def eval_command(
    data: Annotated[Path | None, typer.Option("--data", help="The evaluation file (JSON Lines).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="The report directory to write (or resume).")] = None,
    policy: Annotated[Path | None, typer.Option(help="Policy file whose tasks the rows name.")] = None,
    task: Annotated[str | None, typer.Option(help="Run every row as this policy task.")] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="Engine to use: embedded, sparrow, examples, jev, openai-decisions, logprob, or a plugin's."),
    ] = None,
    examples: Annotated[
        Path | None, typer.Option(help="Examples file (JSON/YAML) for the example-trained engine.")
    ] = None,
    split: Annotated[str | None, typer.Option(help="Only rows of this split: train, validation or test.")] = None,
    concurrency: Annotated[int, typer.Option(help="Rows in flight at once.")] = 4,
    limit: Annotated[int | None, typer.Option(help="Only the first N rows, for a quick look.")] = None,
    strict: Annotated[
        bool, typer.Option(help="Refuse the file at a bad row or a training example instead of skipping it.")
    ] = False,
    fresh: Annotated[bool, typer.Option(help="Start over, discarding a run already in --out.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
    compare: Annotated[
        tuple[Path, Path] | None,
        typer.Option(help="Compare two report directories (REPORT_A REPORT_B) instead of running."),
    ] = None,
) -> None:
    """Run every row of an evaluation file and write a report directory (resumable), or compare two."""
    from fastslow.policies.evaluation import SPLITS

    if compare is not None:
        if data is not None:
            fail("--compare: compares two report directories; it takes no --data", EXIT_BAD_INPUT)
        _compare_reports(compare[0], compare[1], out)
        return
    if data is None:
        fail("--data: the evaluation file is required (or --compare REPORT_A REPORT_B)", EXIT_BAD_INPUT)
    if out is None:
        fail("--out: the report directory is required", EXIT_BAD_INPUT)
    if not data.is_file():
        fail(f"--data: no such file {data}", EXIT_BAD_INPUT)
    if policy is not None and not policy.is_file():
        fail(f"--policy: no such file {policy}", EXIT_BAD_INPUT)
    check_engine(engine)
    if split is not None and split not in SPLITS:
        fail(f"--split: must be one of {', '.join(SPLITS)}, not {split!r}", EXIT_BAD_INPUT)
    if concurrency < 1:
        fail(f"--concurrency: must be at least 1, not {concurrency}", EXIT_BAD_INPUT)
    if limit is not None and limit < 1:
        fail(f"--limit: must be at least 1, not {limit}", EXIT_BAD_INPUT)
    settings = load_settings(engine, examples)
    from ._evaluate import evaluate, headline

    try:
        info = asyncio.run(
            evaluate(
                data,
                out,
                settings=settings,
                policy=policy,
                task=task,
                split=split,
                concurrency=concurrency,
                strict=strict,
                limit=limit,
                progress=progress,
                overwrite=fresh,
            )
        )
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        fail(f"interrupted; run the same command again to resume the run in {out}", EXIT_INTERRUPTED)
    _say_run_problems(info.problems, len(info.dropped_training_rows))
    summary = headline(out)
    sys.stdout.write(f"report: {out}\n{summary}\n")
    if summary.predictions and summary.errors == summary.predictions:
        fail(f"System 1 answered no row: {summary.first_error}", EXIT_ENGINE)


def _fit(
    command: str,
    *,
    policy: Path,
    task: str,
    data: Path | None,
    from_log: bool,
    tenant: str | None,
    sample: str | None,
    out: Path | None,
    engine: str | None,
    examples: Path | None,
    split: str | None,
    held_out: float,
    seed: int,
    dry_run: bool,
    progress: bool,
    fit: Callable[[Any, Settings], Any],
) -> None:
    """What calibrate and tune share: check the arguments, run the task on the data, fit, diff, write."""
    from fastslow.policies.tuning import PolicyEditor, TooFewLabels

    from ._tune import SAMPLE_WORDS, Sample, apply, collect, collect_from_log, plot

    SAMPLES = tuple(SAMPLE_WORDS)

    if not policy.is_file():
        fail(f"--policy: no such file {policy}", EXIT_BAD_INPUT)
    if (data is None) == (not from_log):
        fail(
            "--data: give an evaluation file, or --from-log for the decision log's outcomes (not both)", EXIT_BAD_INPUT
        )
    if data is not None and not data.is_file():
        fail(f"--data: no such file {data}", EXIT_BAD_INPUT)
    if tenant is not None and not from_log:
        fail("--tenant: filters the decision log; it needs --from-log", EXIT_BAD_INPUT)
    if sample is not None and (not from_log or sample not in SAMPLES):
        fail(f"--sample: with --from-log, one of {', '.join(SAMPLES)}, not {sample!r}", EXIT_BAD_INPUT)
    if from_log and split is not None:
        fail("--split: the decision log has no splits; drop --split with --from-log", EXIT_BAD_INPUT)
    check_engine(engine)
    if not 0.0 < held_out < 1.0:
        fail(f"--held-out: must lie strictly between 0 and 1, not {held_out}", EXIT_BAD_INPUT)
    if split is not None and split not in ("train", "validation"):
        fail(f"--split: fit on train or validation rows, not {split!r} (the test split judges a fit)", EXIT_BAD_INPUT)
    settings = load_settings(engine, examples)
    out_dir = out if out is not None else settings.resolved_data_dir() / "fits" / f"{command}-{task}"
    try:
        # Read (and check) the file first: a file that cannot be rewritten faithfully fails before the run.
        editor = PolicyEditor(policy)
        editor.task(task)
        gathering = (
            collect(
                data,
                out_dir,
                settings=settings,
                policy=policy,
                task=task,
                split=split,
                held_out=held_out,
                seed=seed,
                progress=progress,
            )
            if data is not None
            else collect_from_log(
                settings=settings,
                policy=policy,
                task=task,
                tenant=tenant,
                sample=cast("Sample | None", sample),
                held_out=held_out,
                seed=seed,
            )
        )
        collected = asyncio.run(gathering)
        result = fit(collected, settings)
        apply(editor, result)
        # The edited file must load as a policy before anything is shown as its new form.
        parse_policy(editor.text(), source=str(policy), default_engine=settings.engine)
    except TooFewLabels as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        fail(f"interrupted; run the same command again to resume the run in {out_dir}", EXIT_INTERRUPTED)
    left = collected.test_rows_left_out
    sys.stdout.write(
        f"{len({p.row for p in collected.fit})} fit rows, {len({p.row for p in collected.held_out})} held-out rows"
        + (f"; {left} test rows left out (never fitted on)" if left else "")
        + (f"; {collected.unanswered} decisions System 1 did not answer left out" if collected.unanswered else "")
        + "\n"
    )
    if collected.source == "log":
        sys.stdout.write(
            f"from the decision log ({collected.sample}): {SAMPLE_WORDS[collected.sample or 'all']} "
            f"(policy versions: {collected.info.policy_version})\n"
        )
    for line in result.lines:
        sys.stdout.write(line + "\n")
    picture = out_dir / f"{command}.png"
    if plot(result, picture, task):
        sys.stdout.write(f"accuracy-coverage plot: {picture}\n")
    diff = editor.diff()
    sys.stdout.write(diff or "(no change to the policy file)\n")
    if dry_run:
        sys.stdout.write(f"dry run: {policy} not written\n")
        return
    try:
        editor.write()
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    sys.stdout.write(f"wrote {policy}; a running service reloads it\n")


_POLICY_OPT = typer.Option("--policy", help="The policy file to fit and rewrite.")
_TASK_OPT = typer.Option("--task", help="The task to fit.")
_DATA_OPT = typer.Option("--data", help="Labelled evaluation file (JSON Lines); its test split is never used.")
_LOG_OPT = typer.Option("--from-log", help="Fit on outcomes recorded in the decision log instead of --data.")
_TENANT_OPT = typer.Option("--tenant", help="With --from-log: only this tenant's decisions (the fit is shared).")
_SAMPLE_OPT = typer.Option(
    "--sample", help="With --from-log: weighted (audit sample by 1/rate, plus escalations), audit, or all."
)
_OUT_OPT = typer.Option("--out", help="Report directory of the run (default DATA_DIR/fits/COMMAND-TASK; resumable).")
_HELD_OUT_OPT = typer.Option("--held-out", help="Share of labelled rows held out to judge the fit.")
_SPLIT_OPT = typer.Option("--split", help="Only rows of this split: train or validation (default: both).")
_DRY_OPT = typer.Option("--dry-run", help="Show the fit and the diff; write nothing.")


@app.command("calibrate")
def calibrate_command(
    policy: Annotated[Path, _POLICY_OPT],
    task: Annotated[str, _TASK_OPT],
    data: Annotated[Path | None, _DATA_OPT] = None,
    from_log: Annotated[bool, _LOG_OPT] = False,
    tenant: Annotated[str | None, _TENANT_OPT] = None,
    sample: Annotated[str | None, _SAMPLE_OPT] = None,
    out: Annotated[Path | None, _OUT_OPT] = None,
    engine: Annotated[str | None, typer.Option(help="System-1 engine (the settings' when omitted).")] = None,
    examples: Annotated[Path | None, typer.Option(help="Examples file for the example-trained engine.")] = None,
    split: Annotated[str | None, _SPLIT_OPT] = None,
    held_out: Annotated[float, _HELD_OUT_OPT] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the fit / held-out split.")] = 0,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="auto (by cross-validation on the fit split), temperature, platt (200+ fit decisions) or "
            "isotonic (1,000+).",
        ),
    ] = "auto",
    dry_run: Annotated[bool, _DRY_OPT] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """Fit the task's calibration (task-wide and per question) and write it into the policy file.

    A temperature always; a Platt or isotonic map of the top probability on top of it where the
    fit split is large enough and, with --method auto, where it scores better out of fold.
    """
    from fastslow.policies.tuning import METHODS, Method

    from ._tune import calibrate_task

    if method != "auto" and method not in METHODS:
        fail(f"--method: one of auto, {', '.join(METHODS)}, not {method!r}", EXIT_BAD_INPUT)
    _fit(
        "calibrate",
        policy=policy,
        task=task,
        data=data,
        from_log=from_log,
        tenant=tenant,
        sample=sample,
        out=out,
        engine=engine,
        examples=examples,
        split=split,
        held_out=held_out,
        seed=seed,
        dry_run=dry_run,
        progress=progress,
        fit=lambda c, _settings: calibrate_task(c, c.info.data, method=cast(Method, method)),
    )


@app.command("tune")
def tune_command(
    policy: Annotated[Path, _POLICY_OPT],
    task: Annotated[str, _TASK_OPT],
    data: Annotated[Path | None, _DATA_OPT] = None,
    from_log: Annotated[bool, _LOG_OPT] = False,
    tenant: Annotated[str | None, _TENANT_OPT] = None,
    sample: Annotated[str | None, _SAMPLE_OPT] = None,
    target_accuracy: Annotated[
        float,
        typer.Option("--target-accuracy", help="Accuracy the kept decisions must show (routes, classifications)."),
    ] = 0.97,
    level: Annotated[float, typer.Option(help="Confidence level of the lower bound.")] = 0.95,
    max_false_deny: Annotated[
        float, typer.Option("--max-false-deny", help="Checks: the most benign states denied (a share).")
    ] = 0.02,
    max_miss: Annotated[
        float, typer.Option("--max-miss", help="Checks: the most violations allowed (a share).")
    ] = 0.05,
    out: Annotated[Path | None, _OUT_OPT] = None,
    engine: Annotated[str | None, typer.Option(help="System-1 engine (the settings' when omitted).")] = None,
    examples: Annotated[Path | None, typer.Option(help="Examples file for the example-trained engine.")] = None,
    split: Annotated[str | None, _SPLIT_OPT] = None,
    held_out: Annotated[float, _HELD_OUT_OPT] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the fit / held-out split and the bootstrap.")] = 0,
    dry_run: Annotated[bool, _DRY_OPT] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """Choose the task's thresholds (or a check's bands) to keep the most decisions at a stated accuracy."""
    from ._tune import tune_task

    for name, value in (
        ("--target-accuracy", target_accuracy),
        ("--max-false-deny", max_false_deny),
        ("--max-miss", max_miss),
    ):
        if not 0.0 < value < 1.0:
            fail(f"{name}: must lie strictly between 0 and 1, not {value}", EXIT_BAD_INPUT)
    if not 0.5 <= level < 1.0:
        fail(f"--level: must be at least 0.5 and below 1, not {level}", EXIT_BAD_INPUT)
    _fit(
        "tune",
        policy=policy,
        task=task,
        data=data,
        from_log=from_log,
        tenant=tenant,
        sample=sample,
        out=out,
        engine=engine,
        examples=examples,
        split=split,
        held_out=held_out,
        seed=seed,
        dry_run=dry_run,
        progress=progress,
        fit=lambda c, settings: tune_task(
            c,
            c.info.data,
            settings,
            target=target_accuracy,
            level=level,
            max_false_deny=max_false_deny,
            max_miss=max_miss,
            seed=seed,
        ),
    )


report_app = typer.Typer(help="Reports on what the service decided.", no_args_is_help=True)
app.add_typer(report_app, name="report")


@report_app.command("drift")
def report_drift(
    policy: Annotated[Path, _POLICY_OPT],
    task: Annotated[str, _TASK_OPT],
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's decisions.")] = None,
    since_days: Annotated[float, typer.Option("--since-days", help="Only decisions of the last N days.")] = 7.0,
    level: Annotated[float, typer.Option(help="Confidence level of the accuracy bounds.")] = 0.95,
) -> None:
    """Compare recent logged outcomes with the task's fit; exit 1 when it should be refitted (for CI or cron)."""
    from datetime import UTC, datetime, timedelta

    from ._drift import drift

    if not policy.is_file():
        fail(f"--policy: no such file {policy}", EXIT_BAD_INPUT)
    if not since_days > 0:
        fail(f"--since-days: must be positive, not {since_days}", EXIT_BAD_INPUT)
    if not 0.5 <= level < 1.0:
        fail(f"--level: must be at least 0.5 and below 1, not {level}", EXIT_BAD_INPUT)
    settings = load_settings(None, None)
    since = datetime.now(UTC) - timedelta(days=since_days)
    try:
        result = asyncio.run(
            drift(settings=settings, policy=policy, task=task, tenant=tenant, since=since, level=level)
        )
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    sys.stdout.write("".join(f"{line}\n" for line in result.lines))
    if result.refit:
        raise typer.Exit(EXIT_DRIFT)


EXIT_DRIFT = 1


@report_app.command("shadow")
def report_shadow(
    policy: Annotated[Path, _POLICY_OPT],
    task: Annotated[str, _TASK_OPT],
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's decisions.")] = None,
    since_days: Annotated[float, typer.Option("--since-days", help="Only decisions of the last N days.")] = 7.0,
) -> None:
    """For a task in shadow mode: agreement with the incumbent, what System 1 would have kept, the savings."""
    from datetime import UTC, datetime, timedelta

    from ._shadow import shadow_report

    if not policy.is_file():
        fail(f"--policy: no such file {policy}", EXIT_BAD_INPUT)
    if not since_days > 0:
        fail(f"--since-days: must be positive, not {since_days}", EXIT_BAD_INPUT)
    since = datetime.now(UTC) - timedelta(days=since_days)
    try:
        result = asyncio.run(
            shadow_report(settings=load_settings(None, None), policy=policy, task=task, tenant=tenant, since=since)
        )
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    sys.stdout.write("".join(f"{line}\n" for line in result.lines))


app.add_typer(learned_app, name="learned")


def main() -> None:
    """Entry point for ``python -m fastslow.api.cli``."""
    app()


if __name__ == "__main__":
    main()
