"""The retry policies shipped: the gateway's ``"*"`` default and the seed's five (no I/O)."""

from __future__ import annotations

from durabilis.core.retry.types import RetryPolicy

__all__ = ["default_policies", "gateway_policies"]


def gateway_policies() -> list[RetryPolicy]:
    """What a :class:`~durabilis.DurabilityConfig` retries with unless told otherwise: one
    ``"*"`` policy for every operation type.

    3 attempts, 200 ms doubling to 5 s, jitter on; transport trouble is retried
    (``NETWORK_TIMEOUT``, ``SERVICE_UNAVAILABLE``, ``RATE_LIMITED``: timeouts and
    connection errors of the standard library, httpx, requests and aiohttp are
    recognised, see docs/retry.md); ``PERMISSION_DENIED``, ``INVALID_SCHEMA`` and
    ``NOT_FOUND`` stop at once; anything else is not retried either.
    """
    return [
        RetryPolicy(
            "*", 3, 200, 5_000,
            retryable_errors=("NETWORK_TIMEOUT", "SERVICE_UNAVAILABLE", "RATE_LIMITED"),
            non_retryable_errors=("PERMISSION_DENIED", "INVALID_SCHEMA", "NOT_FOUND"),
        )
    ]


def default_policies() -> list[RetryPolicy]:
    """The seed's five policies (multiplier 2.0, jitter on)."""
    transient = ("NETWORK_TIMEOUT", "SERVICE_UNAVAILABLE")
    return [
        RetryPolicy(
            "mcp_call", 3, 500, 10_000,
            retryable_errors=(*transient, "RATE_LIMITED"),
            non_retryable_errors=("PERMISSION_DENIED", "INVALID_SCHEMA", "NOT_FOUND"),
        ),
        RetryPolicy(
            "memory_write", 5, 200, 5_000,
            retryable_errors=transient,
            non_retryable_errors=("PERMISSION_DENIED", "INVALID_SCHEMA"),
        ),
        RetryPolicy(
            "wiki_write", 3, 1_000, 30_000,
            retryable_errors=(*transient, "RATE_LIMITED"),
            non_retryable_errors=("PERMISSION_DENIED", "INVALID_SCHEMA"),
        ),
        RetryPolicy(
            "message_send", 2, 1_000, 5_000,
            retryable_errors=("NETWORK_TIMEOUT",),
            non_retryable_errors=("PERMISSION_DENIED",),
        ),
        RetryPolicy(
            "external_api", 3, 1_000, 60_000,
            retryable_errors=(*transient, "RATE_LIMITED"),
            non_retryable_errors=("PERMISSION_DENIED", "INVALID_SCHEMA"),
        ),
    ]
