"""Cut a call that exceeds an engine's limits into calls it accepts, and merge the answers.

Two things get cut:

* too many questions: they are sent in chunks of ``max_questions``, concurrently;
* a choice (or score) with more options than the engine takes: the options are split into groups
  that fit, each group is asked as its own choice (stage 1), then the groups' winners are asked
  against each other (stage 2, itself split again if there are still too many). The final
  distribution is ``P(option) = P(its group's winner wins stage 2) * P(option | its group)``,
  so a 77-way Banking77 route works on a server that takes 26 options.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from ._answers import Answer, EngineReply, NoAnswer, Signals, Usage
from ._engine import EngineLimits, ReadOptions
from ._errors import InvalidRequest
from ._questions import Choice, Image, Question, Score, State
from ._work import gather_all

__all__ = ["AskFn", "SyncAskFn", "ask_whole_sync", "split_and_ask"]

AskFn = Callable[[State, Mapping[str, Question], Sequence[Image], ReadOptions], Awaitable[EngineReply]]
"""Answers a request already within the engine's limits."""

SyncAskFn = Callable[[State, Mapping[str, Question], Sequence[Image], ReadOptions], EngineReply]
"""``AskFn`` for sync code: answers a request within the engine's limits, blocking."""

_MAX_PARALLEL = 8


@dataclass(frozen=True, slots=True)
class _Grouped:
    name: str
    as_choice: Choice
    groups: tuple[tuple[str, ...], ...]


def _option_limit(question: Question, limits: EngineLimits) -> int | None:
    if isinstance(question, Score) and limits.max_score_levels is not None:
        return limits.max_score_levels
    if isinstance(question, (Choice, Score)):
        return limits.max_options
    return None


def _as_choice(question: Choice | Score) -> Choice:
    if isinstance(question, Choice):
        return question
    return Choice(
        criteria={str(i): level for i, level in enumerate(question.levels)},
        instructions=question.instructions,
    )


def _groups(options: Sequence[str], limit: int) -> tuple[tuple[str, ...], ...]:
    # Balanced groups whose sizes differ by at most one: 77 options at 26 become 26/26/25, and
    # 7 at 3 become 3/2/2 rather than 3/3/1.
    count = math.ceil(len(options) / limit)
    base, extra = divmod(len(options), count)
    out: list[tuple[str, ...]] = []
    start = 0
    for i in range(count):
        size = base + (1 if i < extra else 0)
        out.append(tuple(options[start : start + size]))
        start += size
    return tuple(out)


def _merge_signals(parts: Sequence[Signals]) -> Signals:
    masses = [s.label_mass for s in parts if s.label_mass is not None]
    argmaxes = [s.argmax_is_label for s in parts if s.argmax_is_label is not None]
    agreements = [s.agreement for s in parts if s.agreement is not None]
    read = [s.read_all for s in parts if s.read_all is not None]
    return Signals(
        label_mass=min(masses) if masses else None,
        argmax_is_label=all(argmaxes) if argmaxes else None,
        entropy=tuple(e for s in parts for e in s.entropy),
        agreement=min(agreements) if agreements else None,
        read_all=all(read) if read else None,
    )


def _validate(limits: EngineLimits, questions: Mapping[str, Question], images: Sequence[Image], engine: str) -> None:
    if images and not limits.accepts_images:
        raise InvalidRequest("images", f"engine {engine!r} does not take images")
    if not questions:
        raise InvalidRequest("questions", "at least one question is needed")
    for name, question in questions.items():
        if len(question.options) < limits.min_options:
            raise InvalidRequest(
                f"questions.{name}.criteria", f"engine {engine!r} needs at least {limits.min_options} options"
            )


def _fits(limits: EngineLimits, questions: Mapping[str, Question]) -> bool:
    """Whether one request within ``limits`` carries ``questions`` as they are."""
    if limits.max_questions is not None and len(questions) > limits.max_questions:
        return False
    for question in questions.values():
        limit = _option_limit(question, limits)
        if limit is not None and len(question.options) > limit:
            return False
    return True


def ask_whole_sync(
    ask: SyncAskFn,
    limits: EngineLimits,
    state: State,
    questions: Mapping[str, Question],
    *,
    images: Sequence[Image] = (),
    options: ReadOptions | None = None,
    engine: str,
) -> EngineReply | None:
    """``split_and_ask`` in the calling thread for a request ``limits`` take whole; ``None`` when it must be split.

    The reply is the one ``split_and_ask`` would give for the same request.
    """
    _validate(limits, questions, images, engine)
    if not _fits(limits, questions):
        return None
    started = time.perf_counter()
    return _whole(ask(state, questions, images, options or ReadOptions()), questions, engine, started)


def _whole(reply: EngineReply, questions: Mapping[str, Question], engine: str, started: float) -> EngineReply:
    """The reply to a request sent whole, as the merge of a split one would give it."""
    elapsed = (time.perf_counter() - started) * 1000.0
    answers = {name: _renamed(reply.answers[name], name, q, elapsed) for name, q in questions.items()}
    return EngineReply(answers=answers, engine=engine, model=reply.model, latency_ms=elapsed, usage=reply.usage)


async def _ask_chunked(
    ask: AskFn,
    limits: EngineLimits,
    state: State,
    questions: Mapping[str, Question],
    images: Sequence[Image],
    options: ReadOptions,
) -> tuple[dict[str, Answer | NoAnswer], Usage, str]:
    names = list(questions)
    step = limits.max_questions or len(names) or 1
    chunks = [names[i : i + step] for i in range(0, len(names), step)]
    gate = asyncio.Semaphore(_MAX_PARALLEL)

    async def one(chunk: list[str]) -> EngineReply:
        async with gate:
            return await ask(state, {n: questions[n] for n in chunk}, images, options)

    replies = await gather_all([one(c) for c in chunks])
    answers: dict[str, Answer | NoAnswer] = {}
    usage = Usage()
    model = ""
    for reply in replies:
        answers.update(reply.answers)
        usage = usage + reply.usage
        model = model or reply.model
    return answers, usage, model


async def split_and_ask(
    ask: AskFn,
    limits: EngineLimits,
    state: State,
    questions: Mapping[str, Question],
    *,
    images: Sequence[Image] = (),
    options: ReadOptions | None = None,
    engine: str,
) -> EngineReply:
    """Answer ``questions`` through ``ask``, splitting whatever exceeds ``limits``."""
    _validate(limits, questions, images, engine)
    opts = options or ReadOptions()
    started = time.perf_counter()
    if _fits(limits, questions):
        # Nothing to split, so no tasks to gather: the common call stays in the caller's task.
        return _whole(await ask(state, questions, images, opts), questions, engine, started)

    flat: dict[str, Question] = {}
    grouped: list[_Grouped] = []
    for name, question in questions.items():
        limit = _option_limit(question, limits)
        if limit is None or len(question.options) <= limit:
            flat[name] = question
            continue
        assert isinstance(question, (Choice, Score))
        as_choice = _as_choice(question)
        groups = _groups(as_choice.options, limit)
        grouped.append(_Grouped(name, as_choice, groups))
        for i, group in enumerate(groups):
            if len(group) == 1:
                continue  # only when the limit is 2: a lone option wins its group for certain
            flat[f"{name}~g{i}"] = Choice(
                criteria={o: as_choice.criteria[o] for o in group},
                instructions=as_choice.instructions,
            )

    answers, usage, model = await _ask_chunked(ask, limits, state, flat, images, opts)

    # Stage 2: each grouped question's group winners against each other.
    finals: dict[str, Question] = {}
    winners: dict[str, list[str]] = {}
    for g in grouped:
        parts = _parts(answers, g, engine)
        if any(isinstance(p, NoAnswer) for p in parts):
            continue
        tops = [p.top for p in parts if isinstance(p, Answer)]
        winners[g.name] = tops
        finals[g.name] = Choice(
            criteria={t: g.as_choice.criteria[t] for t in tops},
            instructions=g.as_choice.instructions,
        )
    stage2: Mapping[str, Answer | NoAnswer] = {}
    if finals:
        reply2 = await split_and_ask(ask, limits, state, finals, images=images, options=opts, engine=engine)
        stage2 = reply2.answers
        usage = usage + reply2.usage

    elapsed = (time.perf_counter() - started) * 1000.0
    merged: dict[str, Answer | NoAnswer] = {}
    for name, question in questions.items():
        found = next((x for x in grouped if x.name == name), None)
        if found is None:
            merged[name] = _renamed(answers[name], name, question, elapsed)
            continue
        parts = _parts(answers, found, engine)
        final = stage2.get(name)
        bad = next((p for p in [*parts, final] if not isinstance(p, Answer)), None)
        if bad is not None or not isinstance(final, Answer):
            reason = bad.reason if isinstance(bad, NoAnswer) else "no answer"
            merged[name] = NoAnswer(
                question=name, kind=question.kind, reason=reason, engine=engine, model=model, latency_ms=elapsed
            )
            continue
        probs: dict[str, float] = {}
        answered = [p for p in parts if isinstance(p, Answer)]
        for part, winner in zip(answered, winners[name], strict=True):
            for option, p in part.probabilities.items():
                probs[option] = final.probabilities[winner] * p
        total = math.fsum(probs.values())
        merged[name] = Answer(
            question=name,
            kind=question.kind,
            probabilities={o: probs[o] / total for o in question.options},
            engine=engine,
            model=final.model,
            latency_ms=elapsed,
            signals=_merge_signals([*(p.signals for p in answered), final.signals]),
        )
    return EngineReply(answers=merged, engine=engine, model=model, latency_ms=elapsed, usage=usage)


def _parts(answers: Mapping[str, Answer | NoAnswer], g: _Grouped, engine: str) -> list[Answer | NoAnswer]:
    out: list[Answer | NoAnswer] = []
    for i, group in enumerate(g.groups):
        if len(group) == 1:
            out.append(Answer(question=g.name, kind="choice", probabilities={group[0]: 1.0}, engine=engine, model=""))
        else:
            out.append(answers[f"{g.name}~g{i}"])
    return out


def _renamed(answer: Answer | NoAnswer, name: str, question: Question, elapsed: float) -> Answer | NoAnswer:
    if isinstance(answer, NoAnswer):
        return NoAnswer(
            question=name,
            kind=question.kind,
            reason=answer.reason,
            engine=answer.engine,
            model=answer.model,
            latency_ms=elapsed,
        )
    return Answer(
        question=name,
        kind=question.kind,
        probabilities=answer.probabilities,
        engine=answer.engine,
        model=answer.model,
        latency_ms=elapsed,
        signals=answer.signals,
    )
