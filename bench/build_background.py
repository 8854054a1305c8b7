"""Embed the shipped background texts with every bundled embedder and record them in the manifest.

Run after editing ``engines/embedded/background/*.jsonl``; ``tests/test_background.py`` fails
until the vectors match the texts again. Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from fastslow.engines.embedded import load_embedder, minilm_available
from fastslow.engines.embedded.tools import BACKGROUND_DIR, background_units, build_background


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--embedder", action="append", choices=["e5", "minilm"], help="default: both")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    names = args.embedder or ["e5", "minilm"]
    built = {}
    for name in names:
        if name == "minilm" and not minilm_available():
            continue
        started = time.monotonic()
        path = build_background(load_embedder(name))
        built[name] = {
            "file": str(path.relative_to(BACKGROUND_DIR.parent)),
            "seconds": round(time.monotonic() - started, 1),
        }
    print(json.dumps({"units": len(background_units()), "built": built}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
