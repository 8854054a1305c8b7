"""The opt-in thought sink, thought stripping helpers, and the ``debug_thoughts`` policy key."""

from __future__ import annotations

import asyncio
import json
import logging
import stat
from pathlib import Path

import pytest

from fastslow.engines.chat import Frontier, ThoughtSink, keep_thoughts
from fastslow.engines.chat._thoughts import final_content, inline_thoughts
from fastslow.policies import parse_policy
from fastslow.router import TaskCommon
from fastslow.router.settings import System2Settings

SECRET = "secret plan"


def test_the_sink_is_off_by_default() -> None:
    assert ThoughtSink.from_settings(System2Settings()) is None
    frontier = Frontier(System2Settings(local_base_url="http://127.0.0.1:1/v1"))
    assert frontier.thoughts is None
    assert frontier.chat_for("local:qwen") is not None


def test_without_an_opted_in_task_nothing_is_written(tmp_path: Path) -> None:
    sink = ThoughtSink(tmp_path / "thoughts.jsonl")
    sink.keep(SECRET, model="openai:gpt-5.5")
    with keep_thoughts(None):
        sink.keep(SECRET, model="openai:gpt-5.5")
    with keep_thoughts(TaskCommon(name="support", debug_thoughts=False)):
        sink.keep(SECRET, model="openai:gpt-5.5")
    assert not sink.path.exists()


def test_an_opted_in_task_appends_one_private_jsonl_record_per_thought(tmp_path: Path) -> None:
    sink = ThoughtSink(tmp_path / "debug" / "thoughts.jsonl")
    keep = sink.for_model("openai:gpt-5.5")
    with keep_thoughts(TaskCommon(name="support", debug_thoughts=True)):
        keep(f"  {SECRET}  ")
        keep("   ")  # blank thoughts are not worth a line
        keep("second")
    records = [json.loads(line) for line in sink.path.read_text().splitlines()]
    assert [(r["task"], r["model"], r["thought"]) for r in records] == [
        ("support", "openai:gpt-5.5", SECRET),
        ("support", "openai:gpt-5.5", "second"),
    ]
    assert all(set(r) == {"time", "task", "model", "thought"} for r in records)
    assert stat.S_IMODE(sink.path.stat().st_mode) == 0o600


async def test_opting_in_is_scoped_to_the_running_task(tmp_path: Path) -> None:
    sink = ThoughtSink(tmp_path / "thoughts.jsonl")

    async def call(task: str | None) -> None:
        with keep_thoughts(task):
            await asyncio.sleep(0)  # interleave with the other task
            sink.keep(f"thought of {task}", model="m")

    await asyncio.gather(call("debugged"), call(None))
    assert [json.loads(line)["task"] for line in sink.path.read_text().splitlines()] == ["debugged"]


def test_a_failing_write_is_logged_without_the_thought(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = ThoughtSink(tmp_path)  # a directory: the append fails
    with keep_thoughts("support"):
        sink.keep(SECRET, model="m")
    assert "cannot write the thought sink" in caplog.text and SECRET not in caplog.text


def test_frontier_builds_engines_with_the_sinks_callback(tmp_path: Path) -> None:
    frontier = Frontier(System2Settings(local_base_url="http://127.0.0.1:1/v1", thought_sink=tmp_path / "t.jsonl"))
    assert frontier.thoughts is not None and frontier.thoughts.path == tmp_path / "t.jsonl"
    assert frontier.chat_for("local:qwen") is not None


@pytest.mark.parametrize(
    ("text", "content", "thoughts"),
    [
        ("The answer.", "The answer.", []),
        (f"<think>{SECRET}</think>The answer.", "The answer.", [SECRET]),
        (f"<|channel>thought\n{SECRET}<channel|>The answer.", "The answer.", [SECRET]),
        (f"The answer.<|channel>thought {SECRET}", "The answer.", [SECRET]),
        (f"The answer.<think>{SECRET}", "The answer.", [SECRET]),
        (f"{SECRET}\n</think>\n\nThe answer.", "The answer.", [SECRET]),
        (f"<THINK>{SECRET}</THINK>The answer.", "The answer.", [SECRET]),
    ],
    ids=["none", "think", "channel", "unclosed channel", "unclosed think", "template-opened", "upper case"],
)
def test_final_content_and_the_thoughts_it_cuts(text: str, content: str, thoughts: list[str]) -> None:
    assert final_content(text) == content
    assert inline_thoughts(text) == thoughts


def test_debug_thoughts_is_a_policy_key_that_defaults_to_off() -> None:
    policy = parse_policy(
        """
defaults:
  debug_thoughts: true
tasks:
  a: {kind: route, routes: {x: X, y: Y}}
  b: {kind: route, debug_thoughts: false, routes: {x: X, y: Y}}
"""
    )
    assert policy.tasks["a"].debug_thoughts and not policy.tasks["b"].debug_thoughts
    plain = parse_policy("tasks:\n  a: {kind: route, routes: {x: X, y: Y}}\n")
    assert not plain.tasks["a"].debug_thoughts


def test_the_sink_never_logs_thoughts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with keep_thoughts("support"):
        ThoughtSink(tmp_path / "t.jsonl").keep(SECRET, model="m")
    assert SECRET not in caplog.text
