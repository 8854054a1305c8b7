"""Which policy file a process uses, and why: the settings, the working directory, or the built-in one."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Literal, TypeAlias

from fastslow.router import ConfigError, Settings

__all__ = ["BUILTIN_POLICY", "POLICY_FILE_NAME", "PolicyOrigin", "PolicySource", "locate_policy"]

POLICY_FILE_NAME = "fastslow-policy.yaml"
"""The policy file looked for in the working directory (what ``fastslow init`` writes)."""

# Resolved: in an editable install the package is a tree of links into the checkout.
BUILTIN_POLICY = Path(str(files("fastslow").joinpath("examples", "policy.yaml"))).resolve()
"""The example policy shipped inside the package: the fallback, and what ``fastslow init`` copies."""

PolicyOrigin: TypeAlias = Literal["command line", "settings", "working directory", "built-in"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySource:
    """A policy file and where it was found."""

    path: Path
    origin: PolicyOrigin

    def describe(self) -> str:
        """One line for a person: the file, and how to use another one where it is the fallback."""
        if self.origin == "command line":
            return f"{self.path} (given on the command line)"
        if self.origin == "settings":
            return f"{self.path} (FASTSLOW_POLICY_FILE)"
        if self.origin == "working directory":
            return f"{self.path} ({POLICY_FILE_NAME} in the working directory)"
        return (
            f"{self.path} (the built-in example policy: run `fastslow init` for an editable copy, "
            "or set FASTSLOW_POLICY_FILE)"
        )


def locate_policy(settings: Settings, *, cwd: Path | None = None) -> PolicySource:
    """The policy file to use: ``settings.policy_file``, else ``./fastslow-policy.yaml``, else the built-in one.

    Raises:
        ConfigError: ``settings.policy_file`` names a file that does not exist; no fallback then,
            since a policy set on purpose must never be silently replaced by the example.
    """
    if settings.policy_file is not None:
        if not settings.policy_file.is_file():
            raise ConfigError(f"no such policy file: {settings.policy_file}", key="policy_file")
        return PolicySource(path=settings.policy_file, origin="settings")
    here = (cwd or Path.cwd()) / POLICY_FILE_NAME
    if here.is_file():
        return PolicySource(path=here, origin="working directory")
    if not BUILTIN_POLICY.is_file():  # a broken install, not a user mistake
        raise ConfigError(f"the built-in policy is missing from this install: {BUILTIN_POLICY}", key="policy_file")
    return PolicySource(path=BUILTIN_POLICY, origin="built-in")
