"""Shared pieces of the layer tests: fast configs and counting operations."""

from __future__ import annotations

from typing import Any

import redis

from durabilis import CircuitBreakerConfig, IdempotencyConfig, OperationError, RetryPolicy
from durabilis.layer import DurabilityConfig, OperationContext

FAST_POLICY = RetryPolicy(
    "job", max_attempts=3, initial_delay_ms=1, max_delay_ms=2, multiplier=2.0, jitter=False,
    retryable_errors=("NETWORK_TIMEOUT", "SERVICE_UNAVAILABLE"),
    non_retryable_errors=("PERMISSION_DENIED",),
)


def fast_config(
    *, lease: float = 30, breaker: CircuitBreakerConfig | None = None, **kw: Any
) -> DurabilityConfig:
    """Quick retries for op type ``job``, guarded by breaker ``svc``."""
    kw.setdefault("idempotency", IdempotencyConfig(in_progress_ttl_seconds=lease))
    kw.setdefault("retry_policies", (FAST_POLICY,))
    kw.setdefault("dependencies", {"job": "svc"})
    return DurabilityConfig(
        breakers=(breaker or CircuitBreakerConfig("svc", 0.5, 4, 1, 1, 10, 1),),
        **kw,
    )


class Counter:
    """An operation that counts its calls and fails as scripted."""

    def __init__(self, fail_codes: list[str] | None = None, result: Any = "done") -> None:
        self.fail_codes = list(fail_codes or [])
        self.calls: list[OperationContext] = []
        self.result = result

    def __call__(self, ctx: OperationContext) -> Any:
        self.calls.append(ctx)
        if self.fail_codes:
            raise OperationError(self.fail_codes.pop(0), "scripted failure")
        return self.result


def keys_of(raw: redis.Redis, namespace: str) -> list[str]:
    return sorted(k.decode() for k in raw.scan_iter(match=f"{namespace}:*"))
