"""Fake OpenAI-compatible servers at the HTTP seam, with reply bodies built from the SDK's own types.

Both fakes are ``httpx2.MockTransport`` handlers that *compute* a reply for any valid request, with
deterministic pseudo-probabilities drawn from a hash of the input and the label, so the conformance
suite can ask many questions (and split large ones) through the real engines and the real SDK.
Each fake records the JSON bodies it received in ``requests``.
"""

from __future__ import annotations

import hashlib
import json
import math
import string
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from openai.types import Completion, CompletionChoice, CompletionUsage, Decision
from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_token_logprob import TopLogprob
from openai.types.completion_choice import Logprobs
from openai.types.decision import (
    AnswerAnswerResourceChoice,
    AnswerAnswerResourceChoiceProbability,
    AnswerAnswerResourcePredicate,
    AnswerAnswerResourceRefusal,
    AnswerAnswerResourceScore,
    AnswerAnswerResourceScoreProbability,
    UsageInputTokensDetails,
    UsageOutputTokensDetails,
)
from openai.types.decision import Usage as DecisionUsage
from pydantic import SecretStr

from fastslow.engines.logprob import LogprobEngine
from fastslow.engines.openai_decisions import OpenAIDecisionsEngine
from fastslow.router.settings import LogprobSettings, OpenAIDecisionsSettings

__all__ = [
    "FakeCompletionServer",
    "FakeDecisionsServer",
    "Handler",
    "openai_error",
    "pseudo_unit",
    "running_logprob_engine",
    "running_openai_decisions_engine",
]

Handler = Callable[[httpx2.Request], Any]
"""What ``httpx2.MockTransport`` takes: request -> response (or an awaitable of one)."""

DECISIONS_URL = "http://decisions.test/v1"
COMPLETIONS_URL = "http://completions.test/v1"


def pseudo_unit(*parts: object) -> float:
    """A deterministic number in (0, 1) from ``parts``: the fakes' stand-in for a model."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return (int.from_bytes(digest[:8], "big") + 1) / (2**64 + 2)


def openai_error(
    status: int, message: str, *, headers: dict[str, str] | None = None, param: str | None = None
) -> httpx2.Response:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return httpx2.Response(status, json=body, headers=headers)


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class FakeDecisionsServer:
    """``POST /v1/decisions``: validates the request the way the API documents it and answers it.

    Args:
        refuse: question names to answer with ``{"type": "refusal"}``.
    """

    def __init__(self, *, refuse: Collection[str] = ()) -> None:
        self.refuse = set(refuse)
        self.requests: list[dict[str, Any]] = []
        self.replies: list[dict[str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.method != "POST" or not request.url.path.endswith("/decisions"):
            return openai_error(404, f"no route {request.method} {request.url.path}")
        body = json.loads(request.content)
        self.requests.append(body)
        problem = _decision_problem(body)
        if problem is not None:
            return openai_error(400, problem[1], param=problem[0])
        text = _decision_input_text(body["input"])
        answers = [self._answer(text, q) for q in body["questions"]]
        tokens = len(text) // 4 + 10 * len(answers)
        decision = Decision(
            answers=answers,
            model=body["model"],
            usage=DecisionUsage(
                input_tokens=tokens,
                input_tokens_details=UsageInputTokensDetails(cache_write_tokens=0, cached_tokens=0),
                output_tokens=0,
                output_tokens_details=UsageOutputTokensDetails(reasoning_tokens=0),
                total_tokens=tokens,
            ),
        )
        reply = decision.model_dump(mode="json")
        self.replies.append(reply)
        return httpx2.Response(200, json=reply)

    def _answer(self, text: str, q: dict[str, Any]) -> Any:
        name, instructions = q.get("name"), _text_of(q["instructions"])
        if name in self.refuse:
            return AnswerAnswerResourceRefusal(name=name, type="refusal")
        if q["type"] == "predicate":
            p = 0.02 + 0.96 * pseudo_unit(text, instructions)
            return AnswerAnswerResourcePredicate(name=name, probability=p, type="predicate")
        if q["type"] == "choice":
            values = [c["value"] for c in q["choices"]]
            probs = _softmax([4.0 * pseudo_unit(text, instructions, v) for v in values])
            best = max(range(len(values)), key=probs.__getitem__)
            return AnswerAnswerResourceChoice(
                name=name,
                type="choice",
                choice=values[best],
                confidence=probs[best],
                probabilities=[
                    AnswerAnswerResourceChoiceProbability(value=v, probability=p)
                    for v, p in zip(values, probs, strict=True)
                ],
            )
        labels = [lv["label"] for lv in q["levels"]]
        probs = _softmax([4.0 * pseudo_unit(text, instructions, lb) for lb in labels])
        return AnswerAnswerResourceScore(
            name=name,
            type="score",
            score=math.fsum(i * p for i, p in enumerate(probs)),
            confidence=max(probs),
            probabilities=[
                AnswerAnswerResourceScoreProbability(value=i, label=lb, probability=p)
                for i, (lb, p) in enumerate(zip(labels, probs, strict=True))
            ],
        )


def _softmax(logits: list[float]) -> list[float]:
    peak = max(logits)
    weights = [math.exp(x - peak) for x in logits]
    total = math.fsum(weights)
    return [w / total for w in weights]


def _decision_input_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    parts: list[str] = []
    for message in value:
        content = message["content"]
        for part in [content] if isinstance(content, str) else content:
            if isinstance(part, str):
                parts.append(part)
            elif part["type"] == "input_text":
                parts.append(part["text"])
            else:
                parts.append(hashlib.sha256(_text_of(part).encode()).hexdigest()[:16])
    return "\n".join(parts)


def _decision_problem(body: dict[str, Any]) -> tuple[str, str] | None:
    """The first thing the API would reject, as (param, message); ``None`` for a valid request."""
    if not isinstance(body.get("model"), str):
        return "model", "model is required"
    inp = body.get("input")
    if isinstance(inp, list):
        images = 0
        for message in inp:
            if message.get("role") != "user":
                return "input", "only user messages are allowed"
            content = message.get("content")
            for part in content if isinstance(content, list) else []:
                if part.get("type") == "input_image":
                    images += 1
                    if not str(part.get("image_url", "")).startswith("data:"):
                        return "input", "images must be data URLs"
        if images > 128:
            return "input", "at most 128 images"
    elif not isinstance(inp, str):
        return "input", "input must be a string or a list of messages"
    questions = body.get("questions")
    if not isinstance(questions, list) or not 1 <= len(questions) <= 400:
        return "questions", "ask 1-400 questions"
    names = [q.get("name") for q in questions if q.get("name") is not None]
    if len(names) != len(set(names)):
        return "questions", "question names must be unique"
    for i, q in enumerate(questions):
        where = f"questions[{i}]"
        if not q.get("instructions"):
            return f"{where}.instructions", "instructions are required"
        if q.get("type") == "choice":
            values = [(type(c.get("value")), c.get("value")) for c in q.get("choices", [])]
            if not 2 <= len(values) <= 255 or len(set(values)) != len(values):
                return f"{where}.choices", "provide between 2 and 255 unique choices"
        elif q.get("type") == "score":
            if len(q.get("levels", [])) < 2 or not all(lv.get("label") for lv in q["levels"]):
                return f"{where}.levels", "a score needs at least 2 labelled levels"
        elif q.get("type") != "predicate":
            return f"{where}.type", f"unknown question type {q.get('type')!r}"
    return None


# What the fake language model can say next: the answer labels (with the leading space a completion
# prompt ending in "Answer:" gets, in both cases for yes/no) and some non-label tokens.
_VOCABULARY = (
    *(f" {c}" for c in string.ascii_uppercase),
    *(f" {d}" for d in "123456789"),
    " yes",
    " no",
    " Yes",
    " No",
    " The",
    " I",
    "\n",
    " maybe",
)


class FakeCompletionServer:
    """``POST /v1/completions`` and ``/v1/chat/completions`` with logprobs, like vLLM.

    The next-token distribution over a small vocabulary comes from a hash of the prompt; the top-k
    asked for is returned, so with k=20 some labels are missing, as with a real model.

    Args:
        max_logprobs: the most top logprobs a request may ask for (vLLM's default is 20).
    """

    def __init__(self, *, max_logprobs: int = 20) -> None:
        self.max_logprobs = max_logprobs
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        body = json.loads(request.content)
        self.requests.append(body)
        self.paths.append(path)
        if path.endswith("/chat/completions"):
            return self._chat(body)
        if path.endswith("/completions"):
            return self._completions(body)
        return openai_error(404, f"no route {path}")

    def next_token(self, prompt: str, k: int) -> list[tuple[str, float]]:
        """The top-``k`` (token, logprob) pairs after ``prompt``, most likely first."""
        logits = [6.0 * pseudo_unit(prompt, tok) for tok in _VOCABULARY]
        peak = max(logits)
        log_total = peak + math.log(math.fsum(math.exp(x - peak) for x in logits))
        ranked = sorted(zip(_VOCABULARY, (x - log_total for x in logits), strict=True), key=lambda t: -t[1])
        return ranked[:k]

    def _completions(self, body: dict[str, Any]) -> httpx2.Response:
        k = body.get("logprobs")
        if not isinstance(k, int) or not 0 < k <= self.max_logprobs:
            return openai_error(400, f"logprobs must be 1..{self.max_logprobs}", param="logprobs")
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        choices = []
        for i, prompt in enumerate(prompts):
            top = self.next_token(prompt, k)
            choices.append(
                CompletionChoice(
                    finish_reason="length",
                    index=i,
                    text=top[0][0],
                    logprobs=Logprobs(
                        text_offset=[len(prompt)],
                        tokens=[top[0][0]],
                        token_logprobs=[top[0][1]],
                        top_logprobs=[dict(top)],
                    ),
                )
            )
        tokens = sum(len(p) // 4 for p in prompts)
        completion = Completion(
            id="cmpl-fake",
            choices=choices,
            created=0,
            model=body["model"],
            object="text_completion",
            usage=CompletionUsage(
                prompt_tokens=tokens, completion_tokens=len(prompts), total_tokens=tokens + len(prompts)
            ),
        )
        return httpx2.Response(200, json=completion.model_dump(mode="json"))

    def _chat(self, body: dict[str, Any]) -> httpx2.Response:
        k = body.get("top_logprobs")
        if body.get("logprobs") is not True or not isinstance(k, int) or not 0 < k <= self.max_logprobs:
            return openai_error(400, "logprobs=true and top_logprobs 1..20 are required", param="top_logprobs")
        prompt = "\n".join(_text_of(m["content"]) for m in body["messages"])
        # A chat model's first token has no leading space.
        top = [(tok.strip() or tok, lp) for tok, lp in self.next_token(prompt, k)]
        first = ChatCompletionTokenLogprob(
            token=top[0][0], logprob=top[0][1], top_logprobs=[TopLogprob(token=t, logprob=lp) for t, lp in top]
        )
        tokens = len(prompt) // 4
        completion = ChatCompletion(
            id="chatcmpl-fake",
            choices=[
                ChatChoice(
                    finish_reason="length",
                    index=0,
                    logprobs=ChoiceLogprobs(content=[first]),
                    message=ChatCompletionMessage(role="assistant", content=top[0][0]),
                )
            ],
            created=0,
            model=body["model"],
            object="chat.completion",
            usage=CompletionUsage(prompt_tokens=tokens, completion_tokens=1, total_tokens=tokens + 1),
        )
        return httpx2.Response(200, json=completion.model_dump(mode="json"))


@asynccontextmanager
async def running_openai_decisions_engine(
    *,
    handler: Handler | None = None,
    settings: OpenAIDecisionsSettings | None = None,
    **settings_fields: Any,
) -> AsyncIterator[OpenAIDecisionsEngine]:
    """An ``OpenAIDecisionsEngine`` talking to ``handler`` (a fresh ``FakeDecisionsServer`` by default).

    ``settings_fields`` (``max_retries=0``, ``timeout_s=...``) override the test defaults.
    """
    if settings is None:
        fields: dict[str, Any] = {"api_key": SecretStr("sk-test"), "base_url": DECISIONS_URL, **settings_fields}
        settings = OpenAIDecisionsSettings(**fields)
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler or FakeDecisionsServer())) as http:
        engine = OpenAIDecisionsEngine(settings, http_client=http)
        try:
            yield engine
        finally:
            await engine.aclose()


@asynccontextmanager
async def running_logprob_engine(
    *,
    handler: Handler | None = None,
    settings: LogprobSettings | None = None,
    chat: bool = False,
    batch_prompts: bool = True,
    **settings_fields: Any,
) -> AsyncIterator[LogprobEngine]:
    """A ``LogprobEngine`` talking to ``handler`` (a fresh ``FakeCompletionServer`` by default)."""
    if settings is None:
        settings = LogprobSettings(**{"base_url": COMPLETIONS_URL, "model": "fake-lm", **settings_fields})
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler or FakeCompletionServer())) as http:
        engine = LogprobEngine(settings, http_client=http, chat=chat, batch_prompts=batch_prompts)
        try:
            yield engine
        finally:
            await engine.aclose()
