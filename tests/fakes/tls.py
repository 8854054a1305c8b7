"""One TLS context for every test's HTTP client.

An ``httpx2`` client without a transport of its own builds a TLS context when it is made, loading
the whole CA bundle: about 35 ms of CPU, for clients that mostly talk plain HTTP to loopback. The
suite makes well over a thousand (a client per test, a poll per readiness check), which cost it
about 40 CPU-seconds. Built once here, a client costs 0.1 ms; its verification is the default one.
"""

from __future__ import annotations

import httpx2

__all__ = ["TLS"]

TLS = httpx2.create_ssl_context()
