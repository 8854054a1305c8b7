"""Logprob readout: typed questions answered by any OpenAI-compatible server that returns logprobs.

Each question becomes a prompt that lists its options under one-token labels (``yes``/``no`` for a
noul, ``A``, ``B``, ... for a choice, ``1``...``9`` for a score of up to nine levels, letters above
that). The server generates one token with ``logprobs``; each option is scored by the next-token
log-probability of its label, and a softmax over the labels gives the distribution. A label missing
from the returned top-k gets (lowest returned logprob - 5), as the structured server does
(wire-formats.md §2.4); llm2jev does a similar one-token read on vLLM (§3).

On the completions endpoint all questions of a call go in one request (``prompt`` is a list; vLLM
answers it with one choice per prompt, ``choices[i].index`` naming the prompt). Concurrent calls
about different states share requests too, while one is in flight (``_prompt_batch.PromptBatcher``;
a lone call is sent at once). Servers that take a single prompt (Ollama) use ``batch_prompts=False``;
the chat variant (``chat=True``) sends one chat completion per question, concurrently.
"""

from __future__ import annotations

import json
import math
import string
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx2
from openai.types import Completion, CompletionUsage
from openai.types.chat import ChatCompletion

from fastslow.router import Answer, Choice, EngineProtocolError, Image, Noul, Question, ReadOptions, State
from fastslow.router.engine_api import (
    Deadline,
    EngineLimits,
    EngineReply,
    Signals,
    Usage,
    gather_all,
    trace_headers,
)
from fastslow.router.settings import LogprobSettings

from ._http_limits import DEFAULT_MAX_REPLY_BYTES
from ._openai_sdk import OpenAISdkDecisionEngine
from ._prompt_batch import PromptBatcher
from ._sdk_errors import request_timeout

__all__ = ["MISSING_LABEL_PENALTY", "LogprobEngine", "label_distribution"]

MISSING_LABEL_PENALTY = 5.0
"""A label absent from the top-k scores this much below the lowest returned logprob."""

# One letter per option; larger choices are split by ``fastslow.router.engine_api.split_and_ask``.
_LIMITS = EngineLimits(max_options=26)
_LETTERS = string.ascii_uppercase
# Byte-level BPE (``Ġ``) and SentencePiece (``▁``) mark a leading space inside raw token strings;
# some servers return tokens that way instead of detokenised text.
_SPACE_MARKERS = "\u2581\u0120"
_Tops = list[list[tuple[str, float]]]
"""Per prompt, the first position's top-k ``(token, logprob)`` pairs."""
_SYSTEM = "You answer one question about the input with exactly one label."


@dataclass(frozen=True, slots=True)
class _Read:
    """One question as a prompt: its labels, in option order."""

    name: str
    question: Question
    labels: tuple[str, ...]
    question_text: str


@dataclass(frozen=True, slots=True)
class _Part:
    """One call's prompts in a completion: ``size`` of them from index ``start``.

    ``billed``: the completion's usage counts towards this call (a shared request's is counted once).
    """

    completion: Completion
    size: int
    start: int = 0
    billed: bool = True


class LogprobEngine(OpenAISdkDecisionEngine[LogprobSettings]):
    """Answers typed questions from next-token logprobs of a completion server.

    Choices and scores of more than 26 options are split and recombined. A server that returns no
    logprobs is an ``EngineProtocolError``.

    Args:
        settings: endpoint, model, key, time budget, retries and how many top logprobs to ask for.
        http_client: an ``httpx2.AsyncClient`` to send requests through (tests pass one with a
            ``MockTransport``). The caller keeps ownership: ``aclose`` leaves it open, and the
            client is used as it is, without the reply cap.
        chat: read the first token of a chat completion (``logprobs=True, top_logprobs=k``)
            instead of a plain completion.
        batch_prompts: send all of a call's prompts in one completions request (vLLM, OpenAI), and
            the prompts of calls that arrive while a request is in flight together in the next
            (a shared request's usage goes to the first of its callers still waiting); turn off for
            servers that take one prompt per request. Ignored when ``chat``.
        max_reply_bytes: the largest reply body the engine's own client reads
            (``limits.max_engine_reply_bytes``); a longer one is an ``EngineProtocolError``.
    """

    def __init__(
        self,
        settings: LogprobSettings,
        *,
        http_client: httpx2.AsyncClient | None = None,
        chat: bool = False,
        batch_prompts: bool = True,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        super().__init__(
            settings,
            name="logprob",
            limits=_LIMITS,
            key_setting="logprob.api_key",
            http_client=http_client,
            max_reply_bytes=max_reply_bytes,
        )
        self._chat = chat
        self._batch = batch_prompts
        self._batcher = PromptBatcher[Completion](self._send_prompts)

    async def _ask(
        self,
        state: State,
        questions: Mapping[str, Question],
        images: Sequence[Image],  # noqa: ARG002 - split_and_ask refuses images for this engine
        options: ReadOptions,
        *,
        deadline: Deadline,
    ) -> EngineReply:
        started = time.perf_counter()
        text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
        reads = [_read(name, q) for name, q in questions.items()]
        parse: Callable[[str], tuple[_Tops, Usage, str]]
        if self._chat:
            parse = partial(_read_chats, await self._chat_replies(text, reads, options, deadline))
        else:
            parse = partial(_read_completions, await self._completion_replies(text, reads, options, deadline))
        try:
            tops, usage, model = parse(self.name)
        except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
            # The SDK builds replies without validating them; a malformed body surfaces here.
            raise EngineProtocolError(f"cannot read the completion: {exc}", engine=self.name) from exc
        latency = (time.perf_counter() - started) * 1000.0
        answers: dict[str, Answer] = {}
        for read, top in zip(reads, tops, strict=True):
            probs, signals = label_distribution(
                read.labels, top, fold_case=isinstance(read.question, Noul), engine=self.name
            )
            answers[read.name] = Answer(
                question=read.name,
                kind=read.question.kind,
                probabilities=dict(zip(read.question.options, probs, strict=True)),
                engine=self.name,
                model=model,
                latency_ms=latency,
                signals=signals,
            )
        return EngineReply(answers=answers, engine=self.name, model=model, latency_ms=latency, usage=usage)

    def _sampling(self, options: ReadOptions, deadline: Deadline) -> dict[str, Any]:
        extra: dict[str, Any] = {
            "max_tokens": 1,
            # Logprobs at T=1 are the model's own distribution; a server that applies its default
            # temperature to reported logprobs (llama.cpp) would otherwise sharpen or flatten it.
            "temperature": 1.0,
            "timeout": request_timeout(deadline, self.name),
        }
        if options.seed is not None:
            extra["seed"] = options.seed
        return extra

    async def _completion_replies(
        self, text: str, reads: list[_Read], options: ReadOptions, deadline: Deadline
    ) -> list[_Part]:
        prompts = [_completion_prompt(text, r) for r in reads]
        # Read once, before any call is made: raising between two would leave one never awaited.
        sampling = self._sampling(options, deadline)
        if self._batch:
            # Calls batch when these match (model and logprobs are the engine's own, the same for
            # every call); a shared request's timeout is its longest caller's.
            params: dict[str, Hashable] = {k: v for k, v in sampling.items() if k != "timeout"}
            share = await self._batcher.complete(prompts, params, deadline)
            return [_Part(share.reply, len(prompts), share.offset, share.billed)]
        completions = await gather_all(
            [
                self._client.completions.create(
                    model=self._settings.model,
                    prompt=[prompt],
                    logprobs=self._settings.top_logprobs,
                    extra_headers=trace_headers(),
                    **sampling,
                )
                for prompt in prompts
            ]
        )
        return [_Part(completion, 1) for completion in completions]

    async def _send_prompts(self, prompts: list[str], params: Mapping[str, Hashable], deadline: Deadline) -> Completion:
        """One completions request for the batcher, with the timeout that is left of ``deadline``."""
        sampling: dict[str, Any] = dict(params)
        # ``**sampling`` leaves the SDK's overloads (stream or not) unresolved; this one does not stream.
        completion: Completion = await self._client.completions.create(
            model=self._settings.model,
            prompt=prompts,
            logprobs=self._settings.top_logprobs,
            timeout=request_timeout(deadline, self.name),
            extra_headers=trace_headers(),
            **sampling,
        )
        return completion

    async def _chat_replies(
        self, text: str, reads: list[_Read], options: ReadOptions, deadline: Deadline
    ) -> list[ChatCompletion]:
        sampling = self._sampling(options, deadline)
        completions = await gather_all(
            [
                self._client.chat.completions.create(
                    model=self._settings.model,
                    messages=[
                        {"role": "system", "content": f"{_SYSTEM}\n\n{r.question_text}"},
                        {"role": "user", "content": text},
                    ],
                    logprobs=True,
                    top_logprobs=self._settings.top_logprobs,
                    extra_headers=trace_headers(),
                    **sampling,
                )
                for r in reads
            ]
        )
        return list(completions)


def _read_completions(parts: list[_Part], engine: str) -> tuple[_Tops, Usage, str]:
    """Each prompt's first-position top logprobs, in prompt order (``choices[i].index`` names the prompt)."""
    tops: _Tops = []
    usage = Usage()
    for part in parts:
        by_index = {c.index: c for c in part.completion.choices}
        for i in range(part.size):
            choice = by_index.get(part.start + i)
            logprobs = choice.logprobs if choice is not None else None
            if logprobs is None or not logprobs.top_logprobs:
                raise EngineProtocolError(f"no logprobs for prompt {i}; does the server return them?", engine=engine)
            tops.append(list(logprobs.top_logprobs[0].items()))
        if part.billed:
            usage = usage + _usage(part.completion.usage)
    return tops, usage, parts[0].completion.model


def _read_chats(replies: list[ChatCompletion], engine: str) -> tuple[_Tops, Usage, str]:
    """Each chat completion's first-token top logprobs."""
    tops: _Tops = []
    usage = Usage()
    for completion in replies:
        choice = completion.choices[0] if completion.choices else None
        content = choice.logprobs.content if choice is not None and choice.logprobs is not None else None
        if not content:
            raise EngineProtocolError("no logprobs in the chat completion; does the server return them?", engine=engine)
        tops.append([(t.token, t.logprob) for t in content[0].top_logprobs])
        usage = usage + _usage(completion.usage)
    return tops, usage, replies[0].model


def _usage(usage: CompletionUsage | None) -> Usage:
    if usage is None:
        return Usage()
    return Usage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)


def label_distribution(
    labels: Sequence[str], top: Sequence[tuple[str, float]], *, fold_case: bool = False, engine: str = ""
) -> tuple[list[float], Signals]:
    """Turn one position's top-k ``(token, logprob)`` pairs into a distribution over ``labels``.

    Tokens match a label after stripping whitespace (``" A"`` is ``A``); several tokens that match
    one label pool their mass. A label with no matching token gets (lowest logprob - 5). Also
    returns the read's signals: the label mass within the top-k, whether the top token is a label,
    and the entropy of the top-k.
    """
    returned = [(tok, lp) for tok, lp in top if math.isfinite(lp)]
    if not returned:
        raise EngineProtocolError("the server returned no finite logprobs", engine=engine)
    index = {(label.lower() if fold_case else label): i for i, label in enumerate(labels)}

    def match(token: str) -> int | None:
        key = token.strip().lstrip(_SPACE_MARKERS).strip()
        return index.get(key.lower() if fold_case else key)

    pooled: list[list[float]] = [[] for _ in labels]
    for tok, lp in returned:
        i = match(tok)
        if i is not None:
            pooled[i].append(lp)
    floor = min(lp for _, lp in returned) - MISSING_LABEL_PENALTY
    scores = [_logsumexp(lps) if lps else floor for lps in pooled]
    peak = max(scores)
    weights = [math.exp(s - peak) for s in scores]
    total = math.fsum(weights)
    top_token = max(returned, key=lambda pair: pair[1])[0]
    probs = [math.exp(lp) for _, lp in returned]
    mass = math.fsum(probs)
    signals = Signals(
        label_mass=math.fsum(math.exp(lp) for lps in pooled for lp in lps),
        argmax_is_label=match(top_token) is not None,
        entropy=(-math.fsum(p / mass * math.log(p / mass) for p in probs if p > 0),) if mass > 0 else (),
    )
    return [w / total for w in weights], signals


def _logsumexp(values: Sequence[float]) -> float:
    peak = max(values)
    return peak + math.log(math.fsum(math.exp(v - peak) for v in values))


def _read(name: str, question: Question) -> _Read:
    if isinstance(question, Noul):
        labels: tuple[str, ...] = ("yes", "no")
        head = question.instructions or "Which of these describes the input?"
        lines = [f"yes: {question.yes or 'the statement is true'}", f"no: {question.no or 'the statement is false'}"]
    elif isinstance(question, Choice):
        labels = tuple(_LETTERS[: len(question.options)])
        head = question.instructions or "Which option fits the input best?"
        lines = [
            f"{label}: {option}" + (f" ({desc})" if desc else "")
            for label, (option, desc) in zip(labels, question.criteria.items(), strict=True)
        ]
    else:
        n = len(question.levels)
        labels = tuple(str(i + 1) for i in range(n)) if n <= 9 else tuple(_LETTERS[:n])
        head = question.instructions or "Rate the input on this scale."
        lines = [f"{label}: {level}" for label, level in zip(labels, question.levels, strict=True)]
        head += " The levels run from lowest to highest."
    body = "\n".join([f"Question: {head}", *lines, f"Reply with one label: {', '.join(labels)}."])
    return _Read(name=name, question=question, labels=labels, question_text=body)


def _completion_prompt(text: str, read: _Read) -> str:
    return f"{_SYSTEM}\n\nInput:\n{text}\n\n{read.question_text}\nAnswer:"
