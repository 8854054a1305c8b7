"""System-1 decision engines and System-2 chat engines, built on ``fastslow.router``'s protocols.

``ENGINES`` maps each engine name to its factory; ``build_engine`` makes one from settings and
``EnginePool`` keeps the ones a running router uses. The engines themselves live in
``fastslow.engines.embedded`` (CPU, in process), ``fastslow.engines.jev`` (the Jev wire client),
``fastslow.engines.openai_decisions``, ``fastslow.engines.logprob`` and, for System 2,
``fastslow.engines.chat``.
"""

from ._aiohttp_net import AiohttpTransport, aiohttp_transport
from ._asyncio_net import fast_transport
from ._learned import LearnedExampleText, LearnedSet, merge_learned
from ._pool import EnginePool, needs_examples
from ._registry import ENGINES, LEARNS_FROM_EXAMPLES, EngineBuild, EngineFactory, build_engine, examples_for

__all__ = [
    "ENGINES",
    "LEARNS_FROM_EXAMPLES",
    "AiohttpTransport",
    "EngineBuild",
    "EngineFactory",
    "EnginePool",
    "LearnedExampleText",
    "LearnedSet",
    "aiohttp_transport",
    "build_engine",
    "examples_for",
    "fast_transport",
    "merge_learned",
    "needs_examples",
]
