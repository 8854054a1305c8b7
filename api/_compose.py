"""Wiring: settings in, a running router out (policy store, engines, System 2)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from fastslow.engines import EnginePool, needs_examples
from fastslow.engines.chat import Frontier
from fastslow.policies import PolicySource, PolicyStore, load_policy, locate_policy
from fastslow.router import PolicySet, Router, Settings

__all__ = ["Runtime", "build_runtime", "keeps_state", "policy_loader"]

log = logging.getLogger("fastslow.policy")


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    """Everything a process needs to make decisions; close it when done."""

    settings: Settings
    policy_source: PolicySource
    """The policy file in use and why it was chosen."""
    store: PolicyStore
    engines: EnginePool
    chats: Frontier
    router: Router

    async def aclose(self) -> None:
        await self.engines.aclose()
        await self.chats.aclose()


def keeps_state(router: Router) -> Callable[[str], bool]:
    """Whether the decision log keeps a task's state text: its ``store_state`` in the policy in force."""

    def keeps(task: str) -> bool:
        found = router.policy.tasks.get(task)
        return bool(found is not None and found.store_state)

    return keeps


def _warn_stale_fits(settings: Settings, path: Path, policy: PolicySet) -> None:
    # Here, not at the top: the tuning package (numpy and the evaluation code) costs a command that
    # only loads a policy, such as `fastslow graph list`, a fifth of a second.
    from fastslow.policies.tuning import embedder_name, fit_mismatches

    for line in fit_mismatches(policy, default_engine=settings.engine, embedder=embedder_name(settings)):
        log.warning("%s: %s", path, line)


def policy_loader(settings: Settings) -> Callable[[str | os.PathLike[str]], PolicySet]:
    """``load_policy`` as the runtime loads a policy under ``settings``: the same checks, whoever reads it."""
    return partial(
        load_policy,
        needs_examples=partial(needs_examples, default=settings.engine),
        default_engine=settings.engine,
    )


def build_runtime(settings: Settings) -> Runtime:
    """Load the policy (refusing a bad one), and wire engines and System 2 to a ``Router``.

    The policy file is ``FASTSLOW_POLICY_FILE``, else ``./fastslow-policy.yaml``, else the built-in
    example policy (``Runtime.policy_source`` says which).

    Raises:
        ConfigError: a missing or invalid policy file, or an engine that cannot start with these settings.
    """
    source = locate_policy(settings)
    engines = EnginePool(settings)
    store = PolicyStore(
        source.path,
        loader=policy_loader(settings),
        # A reload trains the new policy's engines on the watcher's thread while the old policy and
        # its engines keep serving, and puts the new policy in force only once they are ready: no
        # decision waits for (or times out on) training, or meets an untrained engine.
        activate=engines.switch,
    )
    engines.warm(store.current)
    warn = partial(_warn_stale_fits, settings, source.path)
    warn(store.current)
    store.add_listener(lambda _old, new: warn(new))
    chats = Frontier(settings.system2, openai_api=settings.system2.openai_api)
    router = Router(lambda: store.current, engines, chats, trace_state_text=settings.tracing.state_text)
    return Runtime(settings=settings, policy_source=source, store=store, engines=engines, chats=chats, router=router)
