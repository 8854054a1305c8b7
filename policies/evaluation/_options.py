"""How one evaluation run reads and answers its rows: ``fastslow eval``'s options, checked once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastslow.router import ConfigError

from ._rows import SPLITS

__all__ = ["EvalOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalOptions:
    """The options of one ``evaluate`` run, checked when made (a ``ConfigError`` whose ``key``
    names the option, so the command line can name its flag).

    The command line builds one from its flags and every layer below passes it whole.
    """

    policy: Path | None = None
    """The policy file whose tasks ``task`` (and task rows) name; ``None``: the one every command
    uses (``locate_policy``: ``FASTSLOW_POLICY_FILE``, ``./fastslow-policy.yaml``, the built-in one).
    It is read only when the run needs it: a file of explicit rows never loads a policy."""
    task: str | None = None
    """Run every row as this policy task (explicit rows' labels must name its questions)."""
    split: str | None = None
    """Only rows whose ``meta.split`` is this."""
    concurrency: int = 4
    """Rows in flight at once."""
    strict: bool = False
    """Refuse the file at its first bad row, and refuse rows that are training examples, instead of
    reporting and skipping them."""
    limit: int | None = None
    """Only the first ``limit`` rows (after ``split``), for quick runs."""
    progress: bool = True
    """Show a progress bar on stderr."""
    overwrite: bool = False
    """Start over, discarding a run already in the report directory."""
    system2: bool = True
    """Whether escalated decisions go to System 2 (off: they stay escalated; fitting System 1's
    numbers needs only its distributions, and costs nothing this way)."""

    def __post_init__(self) -> None:
        if self.split is not None and self.split not in SPLITS:
            raise ConfigError(f"must be one of {', '.join(SPLITS)}, not {self.split!r}", key="split")
        if self.concurrency < 1:
            raise ConfigError(f"must be at least 1, not {self.concurrency}", key="concurrency")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"must be at least 1, not {self.limit}", key="limit")
