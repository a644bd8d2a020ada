"""HTTP idempotency for ASGI gateways: the ``Idempotency-Key`` header over the layer.

:class:`DurableIdempotencyMiddleware` wraps any ASGI application (Starlette,
FastAPI, Litestar, Quart...; no framework is imported) so that a request
carrying an ``Idempotency-Key`` runs ONCE across the whole fleet, following the
IETF httpapi draft "The Idempotency-Key HTTP Header Field":

- the first request runs the application; its complete response (status, the
  headers you allow, body) is recorded by :class:`~durabilis.aio.DurabilityLayer`
  before it is sent;
- a duplicate with the same key and the same request (method, path, query, the
  fingerprinted headers, body) gets the stored response again, marked
  ``Idempotent-Replayed: true``;
- a duplicate while the first still runs gets ``409`` (or waits up to
  ``wait_seconds`` for its response); the same key with another request gets
  ``422``; a missing key where one is required, or a malformed one, gets
  ``400``; errors are ``application/problem+json`` (RFC 9457).

:class:`OrphanRecovery` runs ``recover_orphans`` periodically (one replica per
period, through a short lease in Redis), and the DLQ's expiry cleanup on a
period of its own (one replica per period too), and reports health. ``docs/http.md``
has the whole contract.
"""

from __future__ import annotations

# The package's modules: _common (ASGI types, limits, helpers), _middleware
# (DurableIdempotencyMiddleware), _exchange (one run of the application),
# _recovery (OrphanRecovery). The names below are those of the 0.x module.
from durabilis.http._common import *  # noqa: F403  (the module's names, kept importable)
from durabilis.http._common import DEFAULT_RESPONSE_HEADERS as DEFAULT_RESPONSE_HEADERS
from durabilis.http._common import _fingerprint as _fingerprint
from durabilis.http._middleware import DurableIdempotencyMiddleware
from durabilis.http._recovery import OrphanRecovery

__all__ = [
    "DEFAULT_RESPONSE_HEADERS",
    "DurableIdempotencyMiddleware",
    "OrphanRecovery",
]
