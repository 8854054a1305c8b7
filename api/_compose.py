"""Wiring: settings in, a running router out (policy store, engines, System 2)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from engines import EnginePool, needs_examples
from engines.chat import Frontier
from policies import PolicyStore, load_policy
from router import ConfigError, Router, Settings

__all__ = ["Runtime", "build_runtime", "default_policy_path"]

EXAMPLE_POLICY = Path("examples") / "policy.yaml"


def default_policy_path(settings: Settings) -> Path:
    """``settings.policy_file``, else the example policy of a checkout in the working directory."""
    if settings.policy_file is not None:
        return settings.policy_file
    if EXAMPLE_POLICY.is_file():
        return EXAMPLE_POLICY
    raise ConfigError("no policy file: set FASTSLOW_POLICY_FILE (see docs/policies.md)", key="policy_file")


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    """Everything a process needs to make decisions; close it when done."""

    settings: Settings
    store: PolicyStore
    engines: EnginePool
    chats: Frontier
    router: Router

    async def aclose(self) -> None:
        await self.engines.aclose()
        await self.chats.aclose()


def build_runtime(settings: Settings) -> Runtime:
    """Load the policy (refusing a bad one), and wire engines and System 2 to a ``Router``."""
    store = PolicyStore(
        default_policy_path(settings),
        loader=partial(
            load_policy,
            needs_examples=partial(needs_examples, default=settings.engine),
            default_engine=settings.engine,
        ),
    )
    engines = EnginePool(settings)
    # Train on the policy's examples now, and again on every reload, so that no decision waits
    # for (or times out on) training.
    engines.warm(store.current)
    store.add_listener(lambda _old, new: engines.warm(new))
    chats = Frontier(settings.system2, openai_api=settings.system2.openai_api)
    router = Router(lambda: store.current, engines, chats)
    return Runtime(settings=settings, store=store, engines=engines, chats=chats, router=router)
