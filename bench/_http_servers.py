"""The servers ``bench/http_service.py`` starts, each its own process: ``python bench/_http_servers.py KIND``.

* ``stub``: a Jev ``/v1/systemone`` server answering at once (every noul "no" at 0.03, every choice
  its first option at 0.9, as ``bench/_overhead_peers.py`` answers), a bare ASGI callable under
  uvicorn, so the stub costs the core it shares with the load generator as little as it can;
* ``bare``: the baseline, a FastAPI app with one ``POST /v1/policy-check`` route that reads the JSON
  body and answers with bytes captured from a real fastslow answer (``--body FILE``), run under the
  very uvicorn configuration ``fastslow serve`` uses (``server_config``: the guarded h11 protocol,
  its timeouts and header limit), one worker;
* ``proxy``: the fair baseline, a FastAPI app whose ``POST /v1/policy-check`` forwards each check
  to the stub System 1 as fastslow's jev engine does (the same Jev request for the example
  policy's ``tool_safety`` rules, encoded by the engine's own ``build_request``, through the same
  client: ``httpx2`` over ``aiohttp_transport``, ``post_with_retries`` with the deadline and reply
  cap) and answers the stub's JSON. Beside it, fastslow's figures separate what fastslow itself
  costs from what the System-1 exchange costs (``--stub URL``), under the same uvicorn
  configuration;
* ``serve-switchable``: ``fastslow serve`` itself, for the batching on/off comparison. Rather than
  two servers (``FASTSLOW_EMBEDDED__BATCHING=false`` turns the batching off for a whole process),
  this process patches ``BatchingEmbedder.embed`` to go straight to the model while batching is off, and ``SIGUSR1``
  turns it off, ``SIGUSR2`` on again (on at start: as shipped). One process for both, so the run
  loads the encoder once, and on and off share the process, its caches and its core. Arguments
  after ``--`` go to the CLI command;
* ``encoder-scaling``: not a server: the shipped encoder (``load_embedder()``) timed on batches of
  1 to 32 short texts, one JSON line of milliseconds per text by batch size. It says how much a
  cross-request batch can save at most: the model's own cost per text as batches grow.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from _jev_stub import stub_answers
from fastapi import FastAPI, Request, Response

_HEADERS = [(b"content-type", b"application/json")]


async def stub_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The Jev stub as a plain ASGI callable: no framework between the socket and the reply."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    try:
        questions = json.loads(body)["questions"] if body else {}
    except (ValueError, KeyError, TypeError):
        questions = {}
    reply = {
        "model": "jev-1.13.0",
        "answers": stub_answers(questions),
        "usage": {"input_tokens": 40, "output_tokens": 1},
    }
    content = json.dumps(reply).encode()
    headers = [*_HEADERS, (b"content-length", str(len(content)).encode()), (b"x-request-id", b"bench")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def bare_app(body: bytes) -> FastAPI:
    """FastAPI with one route returning ``body``, and ``/healthz`` for the readiness wait.

    ``Request`` and ``Response`` are imported at module level: FastAPI resolves the (postponed)
    annotations in the module's globals, and a ``Request`` it cannot resolve becomes a query field.
    """
    app = FastAPI()

    @app.post("/v1/policy-check")
    async def policy_check(request: Request) -> Response:
        await request.json()  # a real route reads its body; this one only parses it
        return Response(content=body, media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def proxy_app(stub_url: str) -> FastAPI:
    """FastAPI with one route that sends each check's Jev request to ``stub_url`` and answers its JSON."""
    import httpx2

    from fastslow.engines import aiohttp_transport
    from fastslow.engines.jev import PROFILES, build_request, encode_body, post_with_retries
    from fastslow.policies import BUILTIN_POLICY, load_policy
    from fastslow.router import CheckTask, ReadOptions
    from fastslow.router.engine_api import Deadline, check_state

    task = load_policy(BUILTIN_POLICY).tasks["tool_safety"]
    assert isinstance(task, CheckTask)
    questions = {f"tool_safety.{name}": rule.question for name, rule in task.rules.items()}
    violations = {f"tool_safety.{name}": rule.action.violation for name, rule in task.rules.items()}
    options = ReadOptions(violations=violations)
    pool = httpx2.Limits(max_connections=64, max_keepalive_connections=64)
    client = httpx2.AsyncClient(timeout=10.0, transport=aiohttp_transport(pool))
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    url = httpx2.URL(f"{stub_url}/v1/systemone")
    app = FastAPI()

    @app.post("/v1/policy-check")
    async def policy_check(request: Request) -> Response:
        body = await request.json()
        wire = build_request(check_state(body["tool_call"]), questions, profile=PROFILES["jev"], model=None,
                             options=options)  # fmt: skip
        content, _type = encode_body(wire)
        reply = await post_with_retries(
            client, url, content=content, headers=headers, deadline=Deadline(10.0), max_retries=0, engine="jev"
        )
        return Response(content=reply.content, media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _switchable() -> None:
    """Batching while ``SIGUSR2`` came last (or no signal), the bare model after ``SIGUSR1``."""
    from fastslow.engines.embedded import BatchingEmbedder

    batched = BatchingEmbedder.embed
    state = {"on": True}

    def embed(self: Any, texts: Any, *, stop: Any = None) -> Any:
        if state["on"]:
            return batched(self, texts, stop=stop)
        return self.inner.embed(texts, stop=stop)

    BatchingEmbedder.embed = embed  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, lambda *_: state.update(on=False))
    signal.signal(signal.SIGUSR2, lambda *_: state.update(on=True))


def encoder_scaling(sizes: tuple[int, ...] = (1, 4, 16, 32), repeats: int = 3) -> dict[str, float]:
    """Median milliseconds per text of the shipped encoder, by batch size (texts like the bench's checks)."""
    import statistics
    import time

    from fastslow.engines.embedded import load_embedder

    embedder = load_embedder()
    out: dict[str, float] = {}
    for size in sizes:
        texts = [f"shell ls -la /srv/{n}" for n in range(size)]
        embedder.embed(texts)  # warm
        per_text = []
        for _ in range(repeats):
            started = time.perf_counter()
            embedder.embed(texts)
            per_text.append((time.perf_counter() - started) * 1000 / size)
        out[str(size)] = round(statistics.median(per_text), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("kind", choices=("stub", "bare", "proxy", "serve-switchable", "encoder-scaling"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--body", type=Path, help="bare: the JSON bytes the route answers with")
    parser.add_argument("--stub", help="proxy: the stub System 1's base URL")
    args, rest = parser.parse_known_args(argv)
    if args.kind == "encoder-scaling":
        print(json.dumps({"encoder": "e5-small-q4", "ms_per_text_by_batch": encoder_scaling()}))  # noqa: T201
        return 0
    if not args.port:
        parser.error(f"{args.kind} needs --port")
    import uvicorn

    if args.kind == "stub":
        uvicorn.run(stub_app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
        return 0
    if args.kind == "bare":
        from fastslow.api import Server, server_config
        from fastslow.router import Settings

        config = server_config(bare_app(args.body.read_bytes()), Settings(), port=args.port, log_level="warning")
        Server(config).run()
        return 0
    if args.kind == "proxy":
        from fastslow.api import Server, server_config
        from fastslow.router import Settings

        config = server_config(proxy_app(args.stub), Settings(), port=args.port, log_level="warning")
        Server(config).run()
        return 0
    _switchable()
    from fastslow.api.cli import app

    app(["serve", "--port", str(args.port), "--log-level", "warning", *[a for a in rest if a != "--"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
