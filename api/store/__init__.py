"""The decision log: decisions, their answers and outcomes, and API keys, on SQLite or PostgreSQL.

    store = await DecisionStore.open(database_url_for(settings))   # runs migrations first
    router = router.with_sink(store.sink(tenant, store_state=keeps_state))   # committed on return
    graph_router = router.with_sink(store.sink(tenant, write_behind=True))    # queued on return
    await store.prune(retention_cutoff(settings.store, now))                 # retention (db prune)
    await store.aclose()                                                      # commits what is queued

See ``docs/store.md`` for the tables, the durability promise and how keys are kept.
"""

from ._codec import hash_key
from ._engine import database_url_for, upgrade
from ._idempotency import IdempotencyKeyTaken, IdempotentRequest, StoredResponse, request_hash
from ._learned import LearnedExample, LearnedExamples, LearnOutcome, LearnSource
from ._models import RateWindowRow
from ._prune import Cutoff, PruneCounts, PruneReport, retention_cutoff
from ._store import DecisionStore
from ._values import ApiKey, StoredDecision, StoredOutcome
from ._writer import DecisionWriter, Record, WriterClosed

__all__ = [
    "ApiKey",
    "Cutoff",
    "DecisionStore",
    "DecisionWriter",
    "IdempotencyKeyTaken",
    "IdempotentRequest",
    "LearnOutcome",
    "LearnSource",
    "LearnedExample",
    "LearnedExamples",
    "PruneCounts",
    "PruneReport",
    "RateWindowRow",
    "Record",
    "StoredDecision",
    "StoredOutcome",
    "StoredResponse",
    "WriterClosed",
    "database_url_for",
    "hash_key",
    "request_hash",
    "retention_cutoff",
    "upgrade",
]
