"""`fastslow decide` on JSON Lines: one request a line, one engine, responses in input order, error lines."""

from __future__ import annotations

import asyncio
import io
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.api.cli._jsonl import decide_lines as _decide_lines
from fastslow.router import Image, Question, ReadOptions, Settings, State
from fastslow.router.engine_api import EngineReply

from fakes.scripted import ScriptedEngine

REPO = Path(__file__).resolve().parent.parent
FASTSLOW = Path(sys.executable).with_name("fastslow")  # the installed command, as a user runs it
TICKET = json.loads((REPO / "examples" / "support_request.json").read_text())
ROUTE = TICKET["questions"]["route"]


def request(name: str, state: object = "I was charged twice, refund me") -> str:
    """A one-line request asking one question, named ``name``: the response's answer says which line it is."""
    return json.dumps({"state": state, "questions": {name: ROUTE}})


def fastslow(*args: str, stdin: str = "", cwd: Path) -> subprocess.CompletedProcess[str]:
    # The real engine in a real process; the environment is the test's own (conftest isolates it).
    return subprocess.run(
        [str(FASTSLOW), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=dict(os.environ),
        cwd=cwd,
        timeout=300,
        check=False,
    )


def lines_of(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_a_bad_line_gets_an_error_line_in_its_place_and_the_rest_go_on(tmp_path: Path) -> None:
    source = tmp_path / "requests.txt"  # not *.jsonl: --jsonl asks for it
    source.write_text(
        "\n".join([request("first"), '{"state": "x", "questions": ', request("third"), request("fourth")])
    )
    done = fastslow("decide", str(source), "--jsonl", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    out = lines_of(done.stdout)
    assert len(out) == 4
    assert list(out[0]["answers"]) == ["first"]
    assert out[0]["answers"]["first"]["choice"] == "billing"
    assert out[1] == {
        "error": {
            "line": 2,
            "type": "invalid_request",
            "message": "invalid JSON at column 29: Expecting value",
            "field": "body",
        }
    }
    assert list(out[2]["answers"]) == ["third"]
    assert list(out[3]["answers"]) == ["fourth"]
    assert done.stderr == "error: 1 of 4 request line(s) got an error line (the first: line 2)\n"


def test_a_jsonl_file_is_json_lines_without_the_flag(tmp_path: Path) -> None:
    source = tmp_path / "requests.jsonl"
    source.write_text(f"{request('a')}\n{request('b', {'ticket': 'The app crashes on start'})}\n")
    done = fastslow("decide", str(source), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [list(reply["answers"]) for reply in lines_of(done.stdout)] == [["a"], ["b"]]
    assert done.stderr == ""
    # --no-jsonl reads the file as one body, which two lines are not.
    single = fastslow("decide", str(source), "--no-jsonl", cwd=tmp_path)
    assert single.returncode == 2
    assert single.stderr.startswith("error: body: invalid JSON")


def test_stdin_with_jsonl_skips_blank_lines_and_numbers_errors_by_the_files_lines(tmp_path: Path) -> None:
    bad = json.dumps({"state": "x", "questions": {"q": {"type": "maybe"}}})
    stdin = f"{request('one')}\n\n   \n{bad}\r\n{request('five')}\n\n"
    done = fastslow("decide", "-", "--jsonl", cwd=tmp_path, stdin=stdin)
    assert done.returncode == 1
    out = lines_of(done.stdout)
    assert len(out) == 3  # the blank lines got nothing, but they count: the bad request is line 4
    assert list(out[0]["answers"]) == ["one"]
    assert out[1]["error"]["line"] == 4
    assert out[1]["error"]["type"] == "invalid_request"
    assert out[1]["error"]["field"] == "questions.q.type"
    assert "unknown question type 'maybe'" in out[1]["error"]["message"]
    assert list(out[2]["answers"]) == ["five"]
    assert done.stderr.splitlines() == ["error: 1 of 3 request line(s) got an error line (the first: line 4)"]


def test_an_engine_error_is_an_error_line_not_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSLOW_JEV__BASE_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("FASTSLOW_JEV__TIMEOUT_S", "1")
    stdin = f"{request('a')}\n[]\n{request('c')}\n"
    done = fastslow("decide", "--jsonl", "--engine", "jev", cwd=tmp_path, stdin=stdin)
    assert done.returncode == 1
    errors = [reply["error"] for reply in lines_of(done.stdout)]
    assert [(e["line"], e["type"]) for e in errors] == [
        (1, "engine_error"),
        (2, "invalid_request"),
        (3, "engine_error"),
    ]
    assert "127.0.0.1:9" in errors[0]["message"]
    assert "field" not in errors[0]
    assert "Traceback" not in done.stderr


def test_each_response_is_written_before_the_next_line_arrives(tmp_path: Path) -> None:
    # A program that sends one request and waits for its answer before it sends the next one.
    with subprocess.Popen(
        [str(FASTSLOW), "decide", "--jsonl"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        cwd=tmp_path,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        replies: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: [replies.put(line) for line in proc.stdout or ()], daemon=True)
        reader.start()
        try:
            for name in ("a", "b", "c"):
                proc.stdin.write(request(name) + "\n")
                proc.stdin.flush()
                # A generous bound, only so that a command waiting for more input fails, not hangs.
                reply = json.loads(replies.get(timeout=120))
                assert list(reply["answers"]) == [name]
            proc.stdin.close()
            assert proc.wait(timeout=120) == 0
            assert proc.stderr.read() == ""
        finally:
            proc.kill()  # nothing to do once it has ended
            reader.join(timeout=120)  # it ends at the end of the output


runner = CliRunner()


def test_twenty_lines_build_the_engine_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fastslow.engines

    real = fastslow.engines.build_engine
    builds: list[Settings] = []

    def counting(settings: Settings) -> Any:
        builds.append(settings)
        return real(settings)

    monkeypatch.setattr("fastslow.engines.build_engine", counting)
    states = [f"ticket {i}: I was charged twice, refund me" for i in range(20)]
    source = tmp_path / "requests.jsonl"
    source.write_text("".join(f"{request(f'q{i}', state)}\n" for i, state in enumerate(states)))
    done = runner.invoke(app, ["decide", str(source), "--concurrency", "4"])
    assert done.exit_code == 0, done.output
    # The models load once, before the first line: not once per line.
    assert len(builds) == 1
    assert [list(reply["answers"]) for reply in lines_of(done.stdout)] == [[f"q{i}"] for i in range(20)]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--jsonl", "--concurrency", "0"], "error: --concurrency: must be at least 1, not 0"),
        (["--jsonl", "--pretty"], "error: --pretty: JSON Lines are one response per line"),
        (["/no/such/requests.jsonl"], "error: cannot read /no/such/requests.jsonl: No such file or directory"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(args: list[str], expected: str) -> None:
    result = runner.invoke(app, ["decide", *args], input=request("a") + "\n")
    assert result.exit_code == 2
    assert result.stderr.startswith(expected)
    assert len(result.stderr.splitlines()) == 1
    assert result.stdout == ""


class GatedEngine(ScriptedEngine):
    """Line 1's answer waits until line ``gate`` is being answered: only concurrent lines finish it."""

    def __init__(self, gate: str) -> None:
        super().__init__(script=lambda _state, _name, _question: {"billing": 1.0})
        self.gate = gate
        self.opened = asyncio.Event()
        self.active = 0
        self.most_active = 0

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            if state == self.gate:
                self.opened.set()
            if state == "1":
                await asyncio.wait_for(self.opened.wait(), timeout=60)  # fails, not hangs, without concurrency
            return await super().decide(state, questions, images=images, options=options)
        finally:
            self.active -= 1


class CountingStream(io.BytesIO):
    """A stream that counts the lines read from it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.read_lines = 0

    def readline(self, size: int | None = -1) -> bytes:
        self.read_lines += 1
        return super().readline(size)


async def test_lines_are_read_lazily_in_a_bounded_window_and_written_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = GatedEngine(gate="3")
    monkeypatch.setattr("fastslow.engines.build_engine", lambda _settings: engine)
    stream = CountingStream("".join(f"{request(f'q{i}', str(i))}\n" for i in range(1, 31)).encode())
    written: list[tuple[str, int]] = []

    def emit(result: dict[str, Any]) -> None:
        written.append((next(iter(result["answers"])), stream.read_lines))

    tally = await _decide_lines(Settings(), stream, "test", 3, emit)
    assert (tally.requests, tally.errors) == (30, 0)
    # Line 1 was answered only once line 3 was being answered, yet its response came first.
    assert [name for name, _ in written] == [f"q{i}" for i in range(1, 31)]
    assert engine.most_active <= 3
    # When the k-th response is written, at most the 3 lines of the window and the one being read
    # have been read beyond the k written before it: the file is never held whole.
    for k, (_, read) in enumerate(written):
        assert read <= k + 3 + 1, (k, read)
