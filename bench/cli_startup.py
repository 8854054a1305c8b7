"""How long the ``fastslow`` command line takes to answer, beside the interpreter starting at all.

Every command is a fresh process, as a person or a script runs it: ``fastslow --help``,
``fastslow keys create`` (on a SQLite decision log already migrated, as after the first run),
``fastslow graph list`` and ``fastslow policy check`` (both load and check the built-in policy).
The baselines, in the same run and interleaved with the commands: ``python -c pass`` (what no
command can beat) and ``python -c "import typer"`` (what any typer command line pays). Each figure
is the median wall time over ``--runs`` runs after one warm-up (so the bytecode cache is written).

    python bench/cli_startup.py                       # 15 runs a command
    python bench/cli_startup.py --quick               # 5 runs a command, about 15 s
    python bench/cli_startup.py --fastslow OTHER/bin/fastslow   # another install, e.g. an older checkout

The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _commands(fastslow: Path, python: Path) -> dict[str, list[str]]:
    return {
        "python -c pass": [str(python), "-c", "pass"],
        "python -c 'import typer'": [str(python), "-c", "import typer"],
        "fastslow --help": [str(fastslow), "--help"],
        "fastslow keys create": [str(fastslow), "keys", "create", "--tenant", "bench"],
        "fastslow graph list": [str(fastslow), "graph", "list"],
        "fastslow policy check": [str(fastslow), "policy", "check"],
    }


def _once(command: list[str], env: dict[str, str]) -> float | None:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    # A command this install lacks (``policy check`` before it existed) is left out, not timed.
    return elapsed if done.returncode == 0 else None


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 runs a command instead of 15")
    parser.add_argument("--runs", type=int, default=None, help="runs a command (default 15, --quick 5)")
    parser.add_argument(
        "--fastslow",
        type=Path,
        default=Path(sys.executable).with_name("fastslow"),
        help="the fastslow executable to time (default: the one beside this Python)",
    )
    args = parser.parse_args(argv)
    runs = args.runs or (5 if args.quick else 15)
    fastslow = args.fastslow.absolute()
    python = fastslow.with_name("python")
    with tempfile.TemporaryDirectory(prefix="fastslow-cli-bench-") as work:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FASTSLOW_")}
        env |= {
            "FASTSLOW_DATABASE_URL": f"sqlite:///{work}/decisions.db",
            "FASTSLOW_DATA_DIR": work,
            "NO_COLOR": "1",
        }
        commands = _commands(fastslow, python)
        times: dict[str, list[float]] = {name: [] for name in commands}
        failed: set[str] = set()
        for name, command in commands.items():  # warm-up: bytecode written, the database migrated
            if _once(command, env) is None:
                failed.add(name)
        for _ in range(runs):  # interleaved, so a slow moment of the machine touches every command alike
            for name, command in commands.items():
                if name not in failed and (elapsed := _once(command, env)) is not None:
                    times[name].append(elapsed)
    medians = {name: round(statistics.median(t), 3) for name, t in times.items() if t}
    base = medians["python -c pass"]
    width = max(len(name) for name in commands)
    print(f"{'command':<{width}}  median s  x python -c pass")
    for name in commands:
        if name in medians:
            print(f"{name:<{width}}  {medians[name]:8.3f}  {medians[name] / base:6.1f}")
        else:
            print(f"{name:<{width}}  (fails in this install: left out)")
    result: dict[str, object] = {
        "bench": "cli_startup",
        "fastslow": str(fastslow),
        "runs": runs,
        "median_s": medians,
        "ratio_to_python": {name: round(m / base, 2) for name, m in medians.items()},
        "failed": sorted(failed),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
