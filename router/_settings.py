"""Settings from ``FASTSLOW_*`` environment variables and an optional settings file.

Nested keys use ``__`` in the environment: ``FASTSLOW_JEV__BASE_URL=http://gpu-box:8011``.
The settings file is TOML or YAML, found at ``FASTSLOW_SETTINGS_FILE`` (default ``fastslow.toml``
in the working directory, if present); environment variables override it.
"""

from __future__ import annotations

import ipaddress
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, NonNegativeInt, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from ._plugins import EngineName, settings_key, unknown_engine

__all__ = [
    "AuthThrottleSettings",
    "BreakerSettings",
    "CoalesceSettings",
    "ConsoleSettings",
    "EmbeddedSettings",
    "EngineName",
    "JevProfileName",
    "JevSettings",
    "LearningSettings",
    "LimitsSettings",
    "LoggingSettings",
    "LogprobSettings",
    "MetricsSettings",
    "ModelPrice",
    "OpenAIDecisionsSettings",
    "ReviewSettings",
    "ServerSettings",
    "Settings",
    "StoreSettings",
    "System2Settings",
    "TracingSettings",
    "WebhookSettings",
    "get_settings",
]

JevProfileName = Literal["structured", "jev", "openrouter", "laya-serve", "jev-compatible-server", "llm2jev"]


class JevSettings(BaseModel):
    """A server speaking Jev's ``/v1/systemone`` (the DiffusionGemma structured server by default)."""

    base_url: str = "http://127.0.0.1:8011"
    """Server root; ``/v1/systemone`` is appended (OpenRouter: ``https://openrouter.ai/api/alpha``)."""
    profile: JevProfileName = "structured"
    api_key: SecretStr | None = None
    model: str | None = None
    """Model or alias to send; the profile's default when unset."""
    timeout_s: float = 10.0
    """Budget for one decision call, retries included."""
    max_retries: int = 2


class OpenAIDecisionsSettings(BaseModel):
    """OpenAI's ``/v1/decisions`` through the official SDK."""

    model: str = "gpt-6-luna"
    base_url: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = 10.0
    max_retries: int = 2


class LogprobSettings(BaseModel):
    """Any OpenAI-compatible completions server with logprobs (vLLM, llama.cpp, Ollama)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "default"
    api_key: SecretStr | None = None
    timeout_s: float = 10.0
    max_retries: int = 2
    top_logprobs: int = 20


class EmbeddedSettings(BaseModel):
    """The in-process CPU engine."""

    examples: Path | None = None
    """JSON or YAML file of labelled examples per question and option."""
    embedder: Literal["auto", "minilm", "e5", "e5+minilm"] = "auto"
    """``auto`` is e5. ``e5+minilm`` reads with both and pools their example-trained answers, with
    their agreement as a signal policies can escalate on (``min_agreement``); it needs MiniLM
    installed (``docs/policies.md``) and is e5 alone, with a warning, without it."""
    open_set_rate: float = Field(default=0.1, ge=0.0, le=1.0)
    """The share of in-scope states the open-set score begins to doubt (``docs/policies.md``); 0 turns it off."""
    background: bool = True
    """Whether policy-check rules learn against the shipped background of ordinary text (off: for ablations)."""
    batching: bool = True
    """Whether concurrent requests' short reads are embedded together in one model call (off: for ablations)."""
    head: Literal["adapted", "softmax"] = "adapted"
    """How a choice learns its examples: ``adapted`` (a contrastive map and a nearest-example vote
    blended with the softmax head, ``docs/policies.md``) or ``softmax`` alone (faster to train)."""
    cache_dir: Path | None = None
    """Where embeddings of examples and trained heads are kept; ``<data_dir>/cache/embeddings`` when unset."""
    cache_states: bool = False
    """Keep the embeddings of the states read in that cache too (their sha256 and vectors, never the
    text), so reading the same rows again runs no model. ``fastslow eval``, ``calibrate`` and
    ``tune`` turn it on for their own engines (offline rows, read again at every threshold and
    policy change); leave it off when serving, where states are requests and would grow the cache
    without bound."""
    check_read_tokens: int = Field(default=640, ge=64, le=1_000_000)
    """The most tokens of its windows a policy check reads, in the encoder's own tokens, besides the
    256 of the state's start and end it always reads. Past them the check read part of the state,
    and the task's ``on_oversize`` decides unless a rule denies. 640 (about 3,000 characters of
    English) costs about 1.3 s of CPU on two cores, inside the shipped 2 s budget of System 1;
    raise it together with the task's ``timeout_s`` for long documents (docs/limits.md)."""


class ModelPrice(BaseModel):
    """What a model costs, in US dollars per million tokens."""

    input: float = 0.0
    output: float = 0.0
    cached_input: float | None = None
    """Price of cached input tokens, when the provider reports them; ``input`` when unset."""


class BreakerSettings(BaseModel):
    """A circuit breaker in front of each network System-1 engine, and of each System-2 model, per process
    (docs/deploy.md)."""

    enabled: bool = True
    failures: int = Field(default=5, ge=1)
    """Consecutive failures (timeouts, unreachable, 5xx, 429, an upstream 401/403/404) that open it."""
    open_s: float = Field(default=30.0, ge=0.0)
    """Seconds an open breaker refuses calls at once, before one probe call may test the engine."""
    probes: int = Field(default=1, ge=1)
    """Calls let through at once while half-open; the first to end closes or re-opens the breaker."""


class System2Settings(BaseModel):
    """Frontier (System-2) models. Keys and base URLs fall back to the SDKs' usual variables
    (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``, ``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``)."""

    default: str = "openai:gpt-5.5"
    """Model reference used when a task names none: ``openai:MODEL``, ``anthropic:MODEL`` or ``local:MODEL``."""
    draft: str | None = None
    """The local draft worker's model reference (a self-hosted OpenAI-compatible server), if any."""
    openai_api_key: SecretStr | None = None
    openai_base_url: str | None = None
    anthropic_api_key: SecretStr | None = None
    anthropic_base_url: str | None = None
    local_base_url: str | None = None
    """A self-hosted OpenAI-compatible server (vLLM, llama.cpp, Ollama) for ``local:`` references."""
    local_api_key: SecretStr | None = None
    timeout_s: float = 60.0
    max_retries: int = 2
    openai_api: Literal["auto", "responses", "chat"] = "auto"
    """The API ``openai:`` references speak: ``auto`` is Responses on OpenAI itself and Chat
    Completions on any other base URL (vLLM and other OpenAI-compatible servers)."""
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """Model reference (``openai:gpt-5.5``) -> price; calls to unpriced models record no cost."""
    thought_sink: Path | None = None
    """Debugging only, off by default: a JSONL file where tasks that opt in keep model thoughts.
    Nothing ever reads it back into a prompt, a graph state or the decision log."""
    fallbacks: dict[str, list[str]] = Field(default_factory=dict)
    """Model reference -> the models asked, in order, when it fails or its breaker is open, within the
    same budget: ``{"openai:gpt-5.5": ["anthropic:claude-sonnet-4-6"]}``. Unconfigured ones are skipped."""
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    """One breaker per System-2 model reference (a provider's outage opens each of its models' as they fail)."""


class LimitsSettings(BaseModel):
    """Work limits and time budgets of every request (``docs/limits.md``).

    What is over a limit is refused before any work is done, with a 4xx naming the limit; what runs
    stops at its deadline. Together they bound the CPU one request can cost, whatever it holds.
    """

    request_timeout_s: float = Field(default=30.0, gt=0)
    """One deadline per HTTP request, honoured by every stage: queueing, System 1, System 2."""
    gateway_timeout_s: float = Field(default=10.0, gt=0)
    """Budget of the System-1 call behind ``POST /v1/systemone`` (no policy gives it one)."""
    max_depth: int = Field(default=64, ge=2, le=512)
    """Deepest nesting of objects and arrays in a JSON body, a state or tool-call arguments."""
    max_questions: int = Field(default=64, ge=1)
    """Questions in one ``/v1/systemone`` request (Jev's own limit)."""
    max_options: int = Field(default=255, ge=2)
    """Options of a choice, or levels of a score, in one ``/v1/systemone`` question."""
    max_argument_chars: int = Field(default=100_000, ge=1)
    """Size of a tool call's ``arguments`` as compact JSON."""
    max_engine_reply_bytes: int = Field(default=8_388_608, ge=1024)
    """Largest reply body fastslow reads from a System-1 server."""
    local_engine_concurrency: int = Field(default=4, ge=1)
    """Requests using one in-process engine (embedded, sparrow, examples) at once, per process."""
    remote_engine_concurrency: int = Field(default=64, ge=1)
    """Requests using one network engine (jev, openai-decisions, logprob, a plugin's) at once, per process."""
    engine_queue: int = Field(default=64, ge=0)
    """Requests waiting for an engine, per engine and process; beyond it the answer is 503."""
    tenant_weights: dict[str, float] = Field(default_factory=dict)
    """Tenant -> weight of its share of each engine (1 when not named): a tenant of weight 2 gets
    twice the engine time of one of weight 1 while both wait. Per process, as the gates are."""

    @field_validator("tenant_weights")
    @classmethod
    def _positive_weights(cls, weights: dict[str, float]) -> dict[str, float]:
        bad = sorted(tenant for tenant, weight in weights.items() if not weight > 0)
        if bad:
            raise ValueError(f"weights must be above 0: {', '.join(bad)}")
        return weights


class LearningSettings(BaseModel):
    """How a running service picks up what tasks with ``learn:`` learned (docs/learning.md)."""

    poll_s: float = Field(default=5.0, gt=0)
    """How often each replica reads the learned examples from the database."""
    max_wait_s: float = Field(default=60.0, gt=0)
    """A change smaller than the task's ``retrain_after`` is trained on at the latest after this long."""


class StoreSettings(BaseModel):
    """The decision log's one writer per database, and how long it keeps decisions (docs/store.md)."""

    queue: int = Field(default=10_000, ge=1)
    """Record calls waiting to be committed, per database and process; beyond it callers wait for room."""
    batch: int = Field(default=500, ge=1)
    """Decisions committed in one transaction at most."""
    retention_days: int | None = Field(default=None, ge=0)
    """Days ``fastslow db prune`` keeps decisions (and their answers and outcomes); unset or 0: forever."""
    tenant_retention_days: dict[str, NonNegativeInt] = Field(default_factory=dict)
    """Per-tenant ``retention_days`` overriding it (0: keep that tenant's forever); in the environment as
    JSON: ``FASTSLOW_STORE__TENANT_RETENTION_DAYS='{"acme": 30}'``."""
    idempotency_ttl_s: float = Field(default=86_400.0, gt=0)
    """How long a request's ``Idempotency-Key`` answers its retries with the stored response (24 h);
    after it the key is new again, and ``fastslow db prune`` deletes it."""


class CoalesceSettings(BaseModel):
    """One engine call for many questions about one state, and an optional answer cache (docs/deploy.md).

    A call that finds nothing in flight for its engine is sent at once; only while a call is in
    flight do calls about the same state wait, at most ``window_s``, to go out together.
    """

    enabled: bool = True
    """Whether concurrent calls about the same state share engine calls."""
    window_s: float = Field(default=0.001, ge=0.0, le=1.0)
    """How long a call waits for others about its state, and only while its engine is busy."""
    max_questions: int = Field(default=64, ge=1)
    """Most questions one shared call carries (fewer when the engine takes fewer)."""
    cache_ttl_s: float = Field(default=0.0, ge=0.0)
    """How long answers are reused for the same engine, model, policy version, state and question; 0: no cache."""
    cache_entries: int = Field(default=10_000, ge=1)
    """Most answers the cache holds, per engine; the least recently used go first."""


class ServerSettings(BaseModel):
    """How the HTTP server protects its connections (``fastslow serve``)."""

    header_timeout_s: float = Field(default=10.0, gt=0)
    """Time a client has to send a request's headers, from its first byte (or its connection)."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """Time a client has to send a request's whole body once its headers are in; then 408."""
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    """An idle keep-alive connection is closed after this long."""
    max_header_bytes: int = Field(default=16_384, ge=1024)
    """Largest request line plus headers."""


class WebhookSettings(BaseModel):
    """Where a tenant's review events are sent (``POST``, signed with HMAC-SHA256 of the body)."""

    url: str
    secret: SecretStr
    """Shared with the receiver: ``X-Fastslow-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``."""


class ReviewSettings(BaseModel):
    """The review queue: how long a ``review`` verdict waits for a person, and who hears of it."""

    ttl_s: float = Field(default=86_400.0, gt=0)
    """A review not settled within this long expires with ``expire_verdict``."""
    expire_verdict: Literal["deny", "allow"] = "deny"
    """What an expired review settles as: never another System-1 or System-2 call."""
    sweep_s: float = Field(default=30.0, gt=0)
    """How often ``fastslow serve`` expires due reviews and sends webhook events."""
    webhooks: dict[str, WebhookSettings] = Field(default_factory=dict)
    """Tenant -> webhook, called when one of its reviews is opened, settled or expires."""
    webhook_timeout_s: float = Field(default=5.0, gt=0)
    webhook_attempts: int = Field(default=8, ge=1)
    """Tries per event, with exponential back-off, before it is given up and logged."""


class ConsoleSettings(BaseModel):
    """The operator's console at ``/console`` (``fastslow serve``)."""

    enabled: bool = True
    secret: SecretStr | None = None
    """Signs session cookies; give every replica the same one, so that any replica accepts a session.
    Unset: a random secret per process (sessions end when it restarts, and only one replica works)."""
    secure_cookie: bool = False
    """Send the session cookie only over HTTPS (set it when the console is served over TLS)."""
    session_ttl_s: float = Field(default=43_200.0, gt=0)
    """A session ends this long after sign-in."""


class AuthThrottleSettings(BaseModel):
    """Failed sign-ins and unknown API keys, slowed per client address and per key prefix."""

    failures: int = Field(default=10, ge=1)
    """Failures allowed per address (and per key prefix) in ``window_s`` before further failures get 429."""
    window_s: float = Field(default=60.0, gt=0)
    trusted_proxies: list[str] = Field(default_factory=list)
    """Addresses or networks (CIDR) of reverse proxies whose ``X-Forwarded-For`` names the client."""

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, entries: list[str]) -> list[str]:
        # Refused when the settings load, naming the entry, rather than when the API starts.
        for entry in entries:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an address or network (CIDR)") from None
        return entries


class MetricsSettings(BaseModel):
    """The gauges ``fastslow serve`` refreshes from the shared decision log (docs/observability.md)."""

    refresh_s: float = Field(default=60.0, gt=0)
    """How often the log's figures per task (kept share, System-2 cost, estimated saving) are read again."""
    window_s: float = Field(default=3600.0, gt=0)
    """How far back those figures look; the log keeps them per hour, so the window starts on a whole hour."""
    drift_s: float = Field(default=300.0, gt=0)
    """How often each task with a ``fitted:`` record is compared with the log (``fastslow report drift``)."""
    drift_since_days: float = Field(default=7.0, gt=0)
    """The decisions the drift gauge judges: those of the last N days, as ``report drift --since-days``."""


class TracingSettings(BaseModel):
    """What decision spans carry beyond their figures (docs/observability.md); exporters come from ``OTEL_*``."""

    state_text: bool = False
    """Put the state text (the message, the checked text or tool call) on decision spans and LangSmith
    runs. Off by default: spans go to third-party backends. Thoughts never go there, whatever this says."""


class LoggingSettings(BaseModel):
    """How ``fastslow serve`` and the commands that decide write their logs (docs/observability.md)."""

    format: Literal["text", "json"] = "text"
    """``json``: one JSON object per line with the trace, span and decision ids, so logs join traces and
    the decision log; ``text``: uvicorn's own lines (``serve``), none configured (other commands)."""


class Settings(BaseSettings):
    """Every knob of fastslow; build with ``get_settings()``."""

    model_config = SettingsConfigDict(
        env_prefix="FASTSLOW_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    engine: str = "embedded"
    """The System-1 engine used when a task names none: a shipped one (``EngineName``) or an installed plugin's."""
    data_dir: Path | None = None
    """Where fastslow keeps its database and caches; the user's data directory when unset."""
    max_state_chars: int = 100_000
    """Largest state (a string, or an object or array as compact JSON) any engine is asked about."""
    jev: JevSettings = Field(default_factory=JevSettings)
    openai_decisions: OpenAIDecisionsSettings = Field(default_factory=OpenAIDecisionsSettings)
    logprob: LogprobSettings = Field(default_factory=LogprobSettings)
    embedded: EmbeddedSettings = Field(default_factory=EmbeddedSettings)
    system2: System2Settings = Field(default_factory=System2Settings)
    policy_file: Path | None = None
    """The YAML policy file; the shipped example when unset."""
    database_url: str | None = None
    """SQLAlchemy URL of the decision log; a SQLite file under ``data_dir`` when unset."""
    max_body_bytes: int = 1_048_576
    """Largest HTTP request body the API accepts (after decompression)."""
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    learning: LearningSettings = Field(default_factory=LearningSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    coalesce: CoalesceSettings = Field(default_factory=CoalesceSettings)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    engines: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Each engine plugin's own settings, by its name with ``-`` as ``_`` (``settings_key``): in the
    environment ``FASTSLOW_ENGINES__<NAME>__<KEY>=value``, in the settings file ``[engines.<name>]``.
    The plugin's ``settings`` model validates its namespace when the engine is built."""
    engine_fallbacks: dict[str, list[str]] = Field(default_factory=dict)
    """System-1 engine -> the engines asked, in order, when it fails or its breaker is open, within the
    same budget: ``{"jev": ["embedded"]}``. The decision names the engine that answered; the task's
    thresholds apply to it as they are."""
    rate_limit_per_minute: int = 600
    """Requests per API key per minute (counted in the database, shared by replicas); 0: no limit."""
    auth_cache_s: float = Field(default=5.0, ge=0.0, le=300.0)
    """How long a replica trusts an API key it found live; a revocation empties every replica's cache
    at once. 0: no cache."""
    auth_throttle: AuthThrottleSettings = Field(default_factory=AuthThrottleSettings)
    reviews: ReviewSettings = Field(default_factory=ReviewSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)

    @field_validator("engine")
    @classmethod
    def _installed(cls, name: str) -> str:
        problem = unknown_engine(name)
        if problem is not None:
            raise ValueError(problem)
        return name

    @field_validator("engines")
    @classmethod
    def _namespaces(cls, namespaces: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        # The environment gives lower-case keys without "-"; a settings file may spell the name as is.
        return {settings_key(name): values for name, values in namespaces.items()}

    @field_validator("engine_fallbacks")
    @classmethod
    def _chains_name_others(cls, chains: dict[str, list[str]]) -> dict[str, list[str]]:
        for primary, fallbacks in chains.items():
            if primary in fallbacks or len(set(fallbacks)) != len(fallbacks):
                raise ValueError(f"{primary}: a fallback chain names each engine once, and not the engine itself")
            for name in (primary, *fallbacks):
                problem = unknown_engine(name)
                if problem is not None:
                    raise ValueError(problem)
        return chains

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # .env files and secret dirs are not part of fastslow's configuration story.
        del dotenv_settings, file_secret_settings
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = Path(os.environ.get("FASTSLOW_SETTINGS_FILE", "fastslow.toml"))
        if path.is_file():
            if path.suffix in (".yaml", ".yml"):
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
            else:
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    def resolved_data_dir(self) -> Path:
        if self.data_dir is not None:
            return self.data_dir
        import platformdirs

        return Path(platformdirs.user_data_dir("fastslow"))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once; tests call ``get_settings.cache_clear()`` to swap them."""
    return Settings()
