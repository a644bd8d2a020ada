"""Worker processes for the retry budget tests (spawned: top-level and importable)."""

from __future__ import annotations

import logging
from typing import Any

import structlog

import durabilis
from durabilis.errors import OperationError
from durabilis.retry import RetryBudget, RetryEngine, RetryPolicy


def fail_every_call(
    redis_url: str,
    namespace: str,
    calls: int,
    budget: dict[str, Any] | None,
    start: Any,
    results: Any,
) -> None:
    """Run ``calls`` operations that always fail; report (retries, stop reasons)."""
    # Hundreds of retry events per worker would only be noise in the test output.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    store = durabilis.connect(redis_url, namespace=namespace)
    policy = RetryPolicy(
        "flaky_dep", 3, 1, 1, jitter=False,
        budget=None if budget is None else RetryBudget(**budget),
    )
    engine = RetryEngine(store, policies=[policy], sleep=lambda _s: None)

    def op() -> None:
        raise OperationError("SERVICE_UNAVAILABLE", "down")

    try:
        start.wait(timeout=30)
        retries = 0
        reasons: dict[str, int] = {}
        for _ in range(calls):
            outcome = engine.execute("flaky_dep", op)
            retries += outcome.attempts - 1
            reason = str(outcome.stop_reason)
            reasons[reason] = reasons.get(reason, 0) + 1
        results.put((retries, reasons))
    finally:
        store.close()
