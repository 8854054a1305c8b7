"""The one error tree of fastslow.

    FastslowError
    ├── ConfigError            a developer or operator mistake: bad settings, bad policy file
    ├── InvalidRequest         a bad question or state, with the offending ``field``
    └── EngineError            an engine could not answer
        ├── EngineTimeout      the call's time budget ran out
        ├── EngineUnavailable  no connection could be made
        ├── EngineHTTPError    the server answered with an error status
        └── EngineProtocolError  the server answered 2xx with a body we cannot read

HTTP and SDK errors are translated into this tree at the engine boundary (``raise ... from exc``);
only ``api/`` turns them into HTTP responses.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EngineError",
    "EngineHTTPError",
    "EngineProtocolError",
    "EngineTimeout",
    "EngineUnavailable",
    "FastslowError",
    "InvalidRequest",
    "failure_summary",
]


class FastslowError(Exception):
    """Base of every error fastslow raises on purpose."""


class ConfigError(FastslowError):
    """Settings, a policy file or an examples file are wrong.

    Attributes:
        path: the file at fault, when there is one.
        line: 1-based line in that file, when known.
        key: dotted key inside the file, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        self.message = message
        self.path = path
        self.line = line
        self.key = key
        where = ":".join(str(p) for p in (path, line) if p is not None)
        prefix = f"{where}: " if where else ""
        suffix = f" (key {key!r})" if key else ""
        super().__init__(f"{prefix}{message}{suffix}")


class InvalidRequest(FastslowError, ValueError):
    """A question, a state or a request body is invalid.

    Attributes:
        field: dotted path of the offending field, such as ``questions.urgency.criteria``.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class EngineError(FastslowError):
    """A decision or chat engine could not answer.

    Attributes:
        engine: the engine's name.
    """

    def __init__(self, message: str, *, engine: str = "") -> None:
        self.engine = engine
        super().__init__(f"{engine}: {message}" if engine else message)


class EngineTimeout(EngineError):
    """The call's time budget ran out before an answer came."""


class EngineUnavailable(EngineError):
    """The engine could not be reached (connection refused, DNS, TLS)."""


class EngineHTTPError(EngineError):
    """The engine answered with an error status.

    Attributes:
        status: the HTTP status code.
        body: the decoded error message from the body (both Jev error shapes are read).
        retry_after: seconds the server asked us to wait, if it said.
    """

    def __init__(
        self,
        status: int,
        body: str,
        *,
        engine: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.retry_after = retry_after
        super().__init__(f"HTTP {status}: {body}", engine=engine)

    @property
    def retryable(self) -> bool:
        """Whether another attempt may succeed (408, 429, 5xx, 529)."""
        return self.status in (408, 429) or self.status >= 500


class EngineProtocolError(EngineError):
    """The engine answered successfully but its body does not follow the wire format."""


def failure_summary(exc: BaseException) -> str:
    """What may be told about an engine failure outside the server: its kind, never its text.

    An engine error's message carries what the upstream said (its error body) and where it lives
    (an internal URL); those go to the log. Decisions (their ``detail``, stored and returned to API
    clients) and API error messages get this instead: the kind of failure and, for an HTTP error,
    the upstream's status.
    """
    if isinstance(exc, (TimeoutError, EngineTimeout)):
        return "timed out"
    if isinstance(exc, EngineHTTPError):
        return f"answered HTTP {exc.status}"
    if isinstance(exc, EngineUnavailable):
        return "could not be reached"
    if isinstance(exc, EngineProtocolError):
        return "answered with a reply that is not a valid answer"
    return "failed"
