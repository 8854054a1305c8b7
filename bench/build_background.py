"""Embed the texts fastslow ships vectors for, with every bundled embedder, and record them in the manifests.

The background (run after editing ``engines/embedded/background/*.jsonl``; ``tests/test_background.py``
fails until the vectors match the texts again) and what a cold start of the built-in policy embeds
(``engines/embedded/shipped/``: after editing ``examples/policy.yaml``'s examples;
``tests/test_shipped_embeddings.py`` fails until then). Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from fastslow.engines import examples_for
from fastslow.engines.embedded import Embedder, EmbeddingCache, ExampleEngine, load_embedder, minilm_available
from fastslow.engines.embedded.tools import BACKGROUND_DIR, background_units, build_background, build_shipped
from fastslow.policies import BUILTIN_POLICY, load_policy
from fastslow.router import Settings
from fastslow.router.settings import EmbeddedSettings


def builtin_cold_start(embedder: Embedder) -> dict[str, object]:
    """Ship what building the built-in policy's engine embeds on an empty cache (its examples)."""
    examples = examples_for(Settings(), load_policy(BUILTIN_POLICY))
    assert examples is not None
    knobs = EmbeddedSettings()

    def cold_start(cache: EmbeddingCache) -> None:
        # As EmbeddedModels.example_engine builds it, on the default settings.
        ExampleEngine(
            examples,
            embedder,
            cache=cache,
            open_set_rate=knobs.open_set_rate,
            use_background=knobs.background,
            head=knobs.head,
            check_read_tokens=knobs.check_read_tokens,
        )

    started = time.monotonic()
    path = build_shipped(embedder, cold_start)
    return {"file": str(path.relative_to(BACKGROUND_DIR.parent)), "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--embedder", action="append", choices=["e5", "minilm"], help="default: both")
    parser.add_argument(
        "--part", action="append", choices=["background", "builtin"], help="what to rebuild (default: both)"
    )
    args = parser.parse_args(argv)
    parts = set(args.part or ["background", "builtin"])
    logging.basicConfig(level=logging.INFO)
    names = args.embedder or ["e5", "minilm"]
    built, shipped = {}, {}
    for name in names:
        if name == "minilm" and not minilm_available():
            continue
        embedder = load_embedder(name)
        if "background" in parts:
            started = time.monotonic()
            path = build_background(embedder)
            built[name] = {
                "file": str(path.relative_to(BACKGROUND_DIR.parent)),
                "seconds": round(time.monotonic() - started, 1),
            }
        if "builtin" in parts:
            shipped[name] = builtin_cold_start(embedder)
    print(json.dumps({"units": len(background_units()), "built": built, "builtin_policy": shipped}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
