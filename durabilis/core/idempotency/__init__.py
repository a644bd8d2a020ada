"""Idempotency's I/O-free core: the key, the config, the claim's outcomes
(``types``), and each ``idem_*`` script's call builder and reply decoder
(``ops``). The shells (:mod:`durabilis.idempotency`) run the calls.
"""

from __future__ import annotations

from durabilis.core.idempotency.ops import IdemOps
from durabilis.core.idempotency.types import (
    CALLER_SCOPE_MAX_BYTES,
    RAW_PREFIX,
    CheckResult,
    Duplicate,
    IdempotencyConfig,
    IdempotencyKey,
    New,
    content_digest,
    fingerprint,
    payload_fingerprint,
)

__all__ = [
    "CALLER_SCOPE_MAX_BYTES",
    "RAW_PREFIX",
    "CheckResult",
    "Duplicate",
    "IdemOps",
    "IdempotencyConfig",
    "IdempotencyKey",
    "New",
    "content_digest",
    "fingerprint",
    "payload_fingerprint",
]
