"""Counting side effects in Redis, so a doubled or lost operation shows.

Each time an operation really runs, the worker logs ``execution id -> op``
in one hash with HSET. HSET of the same field is idempotent, so the worker
may retry it blindly through a fault; two *different* executions of one
operation leave two fields. The hash lives beside the data under test, in the
same namespace (one key, tagged ``{fx}``).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import redis

RETRYABLE = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError,
             redis.exceptions.ResponseError, redis.exceptions.RedisClusterException)


def effect_key(namespace: str) -> str:
    return f"{namespace}:test-effects:{{fx}}"


class EffectLog:
    """The executions of a test's operations, kept in Redis.

    Args:
        client: A plain redis-py client (see ``tests.support.backends.raw_client``).
        namespace: The namespace under test.
    """

    def __init__(self, client: Any, namespace: str) -> None:
        self.client = client
        self.key = effect_key(namespace)

    def executed(self, op: str, execution_id: str, *, deadline: float) -> None:
        """Log one execution of ``op``; retried until logged or ``deadline`` (monotonic).

        Raises:
            TimeoutError: Redis did not take it before the deadline.
        """
        while True:
            try:
                self.client.hset(self.key, execution_id, op)
                return
            except RETRYABLE:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not log the execution of {op!r}") from None
                time.sleep(0.05)

    def counts(self) -> Counter[str]:
        """How many distinct executions each operation had."""
        return Counter(v.decode() for v in self.client.hgetall(self.key).values())

    def executions(self) -> dict[str, list[str]]:
        """op -> the ids of its executions, without the ``<worker>:`` prefix (claim tokens)."""
        runs: dict[str, list[str]] = {}
        for execution, op in self.client.hgetall(self.key).items():
            runs.setdefault(op.decode(), []).append(execution.decode().split(":", 1)[-1])
        return runs


def tally(counts: Counter[str], ops: list[str]) -> tuple[list[str], list[str]]:
    """``(doubled, lost)``: operations run more than once, and never."""
    doubled = sorted(op for op, n in counts.items() if n > 1)
    lost = sorted(op for op in ops if counts.get(op, 0) == 0)
    return doubled, lost
