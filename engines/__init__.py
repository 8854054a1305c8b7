"""System-1 decision engines (and, later, System-2 chat engines), built on ``router``'s protocols."""

from ._pool import EnginePool, needs_examples
from ._registry import ENGINES, LEARNS_FROM_EXAMPLES, build_engine

__all__ = ["ENGINES", "LEARNS_FROM_EXAMPLES", "EnginePool", "build_engine", "needs_examples"]
