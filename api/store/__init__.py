"""The decision log: decisions, their answers and outcomes, and API keys, on SQLite or PostgreSQL.

    store = await DecisionStore.open(database_url_for(settings))   # runs migrations first
    router = router.with_sink(store.sink(tenant, store_state=keeps_state))   # committed on return
    graph_router = router.with_sink(store.sink(tenant, write_behind=True))    # queued on return
    await store.prune(retention_cutoff(settings.store, now))                 # retention (db prune)
    await store.aclose()                                                      # commits what is queued

See ``docs/store.md`` for the tables, the durability promise and how keys are kept.
"""

from ._codec import hash_key
from ._engine import database_url_for, sqlite_path, upgrade
from ._idempotency import IdempotencyKeyTaken, IdempotentRequest, StoredResponse, request_hash
from ._learned import LearnedExample, LearnedExamples, LearnOutcome, LearnSource
from ._models import AnswerRow, DecisionRow, LatencyRollupRow, OutcomeRow, RateWindowRow, RollupRow
from ._pages import DecisionFilter, DecisionPage
from ._prune import Cutoff, PruneCounts, PruneReport, retention_cutoff
from ._reviews import ReviewDraft, Settled, review_event_body
from ._rollup import rollups_of
from ._store import DecisionStore
from ._summary import HourFigures, LatencyFigures, LogSummary, PolicyVersionSeen
from ._values import (
    DEFAULT_SCOPES,
    SCOPES,
    ApiKey,
    Review,
    ReviewStatus,
    Scope,
    StoredDecision,
    StoredOutcome,
    possible_id,
)
from ._writer import DecisionWriter, Record, WriterClosed

__all__ = [
    "DEFAULT_SCOPES",
    "SCOPES",
    "AnswerRow",
    "ApiKey",
    "Cutoff",
    "DecisionFilter",
    "DecisionPage",
    "DecisionRow",
    "DecisionStore",
    "DecisionWriter",
    "HourFigures",
    "IdempotencyKeyTaken",
    "IdempotentRequest",
    "LatencyFigures",
    "LatencyRollupRow",
    "LearnOutcome",
    "LearnSource",
    "LearnedExample",
    "LearnedExamples",
    "LogSummary",
    "OutcomeRow",
    "PolicyVersionSeen",
    "PruneCounts",
    "PruneReport",
    "RateWindowRow",
    "Record",
    "Review",
    "ReviewDraft",
    "ReviewStatus",
    "RollupRow",
    "Scope",
    "Settled",
    "StoredDecision",
    "StoredOutcome",
    "StoredResponse",
    "WriterClosed",
    "database_url_for",
    "hash_key",
    "possible_id",
    "request_hash",
    "retention_cutoff",
    "review_event_body",
    "rollups_of",
    "sqlite_path",
    "upgrade",
]
