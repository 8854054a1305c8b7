"""Does a policy's fitted numbers still describe the engine that runs it?

``fastslow calibrate`` and ``tune`` record, beside what they fitted, the engine and embedder they
measured. Thresholds fitted for one engine mean nothing for another: loading a policy whose record
names a different engine or embedder than the settings give its task is a warning naming both.
"""

from __future__ import annotations

from fastslow.router import PolicySet, Settings

__all__ = ["EMBEDDED_ENGINES", "embedder_name", "fit_mismatches"]

EMBEDDED_ENGINES = frozenset({"embedded", "examples"})
"""Engines whose answers depend on the embedder."""


def fit_mismatches(policy: PolicySet, *, default_engine: str, embedder: str) -> list[str]:
    """One line per fitted record whose engine or embedder is not the one its task now runs on."""
    out: list[str] = []
    for task in policy.tasks.values():
        engine = task.engine or default_engine
        for kind, record in task.fitted.items():
            fitted_engine = record.get("engine")
            if fitted_engine is not None and fitted_engine != engine:
                out.append(
                    f"task {task.name!r}: its {kind} were fitted for engine {fitted_engine!r} but it runs on "
                    f"{engine!r}; refit them (fastslow {'calibrate' if kind == 'calibration' else 'tune'})"
                )
                continue
            fitted_embedder = record.get("embedder")
            if engine in EMBEDDED_ENGINES and fitted_embedder is not None and fitted_embedder != embedder:
                out.append(
                    f"task {task.name!r}: its {kind} were fitted with embedder {fitted_embedder!r} but the settings "
                    f"give {embedder!r} (FASTSLOW_EMBEDDED__EMBEDDER); refit them"
                )
    return out


def embedder_name(settings: Settings) -> str:
    """The embedder the settings give the embedded engines (``auto`` is e5), as a fit records it."""
    return "e5" if settings.embedded.embedder == "auto" else settings.embedded.embedder
