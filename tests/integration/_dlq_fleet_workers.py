"""Processes of the operator's-day tests (spawned: importable functions)."""

from __future__ import annotations

from typing import Any

import durabilis
from durabilis import CircuitBreakerConfig, IdempotencyConfig, RetryPolicy
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext


def fleet_config() -> DurabilityConfig:
    """Op type ``job`` guarded by breaker ``svc``; quick retries."""
    return DurabilityConfig(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=5),
        retry_policies=(RetryPolicy("job", 2, 1, 2, jitter=False,
                                    retryable_errors=("NETWORK_TIMEOUT",)),),
        breakers=(CircuitBreakerConfig("svc", 0.99, 10, 60, 1, 20, 1),),
        dependencies={"job": "svc"},
    )


def _never(ctx: OperationContext) -> Any:
    raise AssertionError("the breaker is open: the operation must not run")


def park_one_key(url: str, namespace: str, deliveries: int, ready: Any, go: Any,
                 out: Any) -> None:
    """Deliver the same write ``deliveries`` times while its breaker is open."""
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, fleet_config())
    ready.put(True)
    go.wait(30)
    ids = []
    for _ in range(deliveries):
        try:
            # A sibling's claim may be in flight (claimed, parking): wait for it.
            layer.execute("agent-1", "job", {"page": 1}, _never, park_on_open=True, wait=10)
        except durabilis.RetryExhausted as exc:
            ids.append(exc.dlq_id)
    layer.close()
    store.close()
    out.put(ids)
