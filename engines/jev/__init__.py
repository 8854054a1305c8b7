"""The Jev wire client: System-1 decisions from any server speaking ``POST /v1/systemone``.

Profiles cover the DiffusionGemma structured-reads server on vLLM (``structured``), hosted TypeSafe
Jev (``jev``), OpenRouter's alpha decisions endpoint (``openrouter``), ``laya-serve``,
``jev-compatible-server`` and ``llm2jev``.
"""

from ._client import MULTIPART_THRESHOLD_BYTES, JevEngine
from ._http import backoff_s, client_headers, error_message, post_with_retries, retry_after_s
from ._profiles import EXTENSIONS, PROFILES, Extension, ImageMode, JevProfile
from ._wire import (
    DEFAULT_NOUL_CRITERIA,
    GENERIC_INSTRUCTIONS,
    WireQuestion,
    WireRequest,
    build_request,
    encode_body,
    parse_reply,
)

__all__ = [
    "DEFAULT_NOUL_CRITERIA",
    "EXTENSIONS",
    "GENERIC_INSTRUCTIONS",
    "MULTIPART_THRESHOLD_BYTES",
    "PROFILES",
    "Extension",
    "ImageMode",
    "JevEngine",
    "JevProfile",
    "WireQuestion",
    "WireRequest",
    "backoff_s",
    "build_request",
    "client_headers",
    "encode_body",
    "error_message",
    "parse_reply",
    "post_with_retries",
    "retry_after_s",
]
