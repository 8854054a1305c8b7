"""A process that records decisions until it is killed: the target of the durability tests.

    python tests/fakes/kill_target.py URL [WORKERS] [record|sink]

Opens the decision log at URL and runs WORKERS concurrent recorders (tenant ``durable``), through
``store.record`` or, with ``sink``, through the store's (durable, group-committing) sink as the
API does. Each writes a decision's id to stdout, flushed, only after recording returned: a line on
stdout is an acknowledgement, exactly like an HTTP response the API sends after the commit.
"""

from __future__ import annotations

import asyncio
import sys

from fastslow.api.store import DecisionStore
from fastslow.router import Decision


async def _worker(store: DecisionStore, worker: int, via_sink: bool) -> None:
    sink = store.sink("durable")
    n = 0
    while True:
        n += 1
        decision = Decision(
            task="durability",
            question="durability",
            outcome="yes",
            system=1,
            reason="confident",
            confidence=0.9,
            probabilities={"yes": 0.9, "no": 0.1},
        )
        if via_sink:
            await sink.record(decision, state={"worker": worker, "n": n})
        else:
            await store.record(decision, tenant="durable", state={"worker": worker, "n": n})
        sys.stdout.write(decision.id + "\n")
        sys.stdout.flush()


async def _main(url: str, workers: int, via_sink: bool) -> None:
    store = await DecisionStore.open(url)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.gather(*(_worker(store, i, via_sink) for i in range(workers)))


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4, sys.argv[3:4] == ["sink"]))
