"""Processes of the fleet-wide hot reload test: a replica that keeps its layer
in sync, and an operator process that publishes a change."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import durabilis
from durabilis import CircuitBreakerConfig, OperationError, RetryExhausted, RetryPolicy
from durabilis.config import ConfigSync, Reload
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext
from durabilis.testing import instant_retries


def replica(url: str, namespace: str, interval: float, reports: Any, stop: Any) -> None:
    """Run a layer with a started ConfigSync; report every reload it applies.

    Each report says when it was applied (wall clock), what the layer's
    policy and breaker config are now, and how many attempts an always-failing
    ``mcp_call`` makes under the policy in force: the change is *used*, not
    only stored.
    """
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, DurabilityConfig.seed(dependencies={}))
    sync = ConfigSync(layer, interval_seconds=interval)

    def attempts_now(version: int) -> int:
        calls: list[int] = []

        def always_times_out(ctx: OperationContext) -> None:
            calls.append(ctx.attempt)
            raise OperationError("NETWORK_TIMEOUT", "down")

        with instant_retries(), contextlib.suppress(RetryExhausted):
            layer.execute("agent", "mcp_call", {"probe": version, "t": time.time()},
                          always_times_out)
        return len(calls)

    @sync.on_reload
    def report(reload: Reload) -> None:
        reports.put({
            "applied_at": time.time(),
            "version": reload.version,
            "initial": reload.initial,
            "retry_policies": list(reload.retry_policies),
            "breakers": list(reload.breakers),
            "mcp_call_max_attempts": layer.retry.get_policy("mcp_call").max_attempts,
            "memory_service_threshold":
                layer.breakers.get_config("memory_service").failure_rate_threshold,
            "attempts": attempts_now(reload.version),
        })

    sync.start()
    stop.wait(60)
    sync.stop()
    layer.close()
    store.close()


def operator(url: str, namespace: str, attempts: int, threshold: float, out: Any) -> None:
    """Publish a retry policy and a breaker config from another process."""
    store = durabilis.connect(url, namespace=namespace)
    sync = ConfigSync(store)
    v1 = sync.publish_policy(RetryPolicy(
        "mcp_call", attempts, 1, 2, jitter=False, retryable_errors=("NETWORK_TIMEOUT",),
    ))
    v2 = sync.publish_breaker(CircuitBreakerConfig("memory_service", threshold, 10, 30, 2, 20, 30))
    out.put({"published_at": time.time(), "versions": [v1, v2]})
    store.close()
