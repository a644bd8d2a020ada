"""Worker processes and the counting operation of the layer's crash tests.

The operation keeps every count in Redis (never in a process, which may be
killed): starts, raw side effects, effects accepted by a downstream that
dedups on the forwarded idempotency key, and violations of the promises.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import durabilis
from durabilis import CircuitBreakerConfig, IdempotencyConfig, OperationError, RetryPolicy
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext
from tests.support.backends import raw_client

LEASE_SECONDS = 1.0
FAILURE_RATE = 0.3


def crash_config() -> DurabilityConfig:
    return DurabilityConfig(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=LEASE_SECONDS),
        retry_policies=(
            RetryPolicy("job", 3, 1, 5, 2.0, True, ("NETWORK_TIMEOUT",), ()),
        ),
        breakers=(CircuitBreakerConfig("svc", 0.9, 10, 1, 1, 20, 1),),
        dependencies={"job": "svc"},
    )


class Ledger:
    """The operation under test: its every count lives in Redis."""

    def __init__(self, url: str, namespace: str, run: int, who: str) -> None:
        self.r = raw_client(url)
        self.prefix = f"{namespace}:ledger:{run}"
        self.who = who
        store = durabilis.connect(url, namespace=namespace)
        self.guard = durabilis.idempotency.IdempotencyGuard(store)
        self.rng = random.Random()

    def __call__(self, ctx: OperationContext) -> Any:
        p, op = self.prefix, str(ctx.payload["op"])
        running = f"{p}:running:{op}"
        # Another worker running the same operation right now would hold this flag
        # (it expires before the lease does, so a legitimate takeover never sees it).
        if not self.r.set(running, self.who, nx=True, px=int(LEASE_SECONDS * 1000) - 100):
            self.r.hincrby(f"{p}:violations", "concurrent", 1)
        self.r.hincrby(f"{p}:starts", op, 1)
        seen = self.guard.check(ctx.idempotency_key)
        if seen is not None and not seen.in_progress:
            self.r.hincrby(f"{p}:violations", "ran_after_record", 1)
        if self.rng.random() < FAILURE_RATE:
            self.r.delete(running)
            raise OperationError("NETWORK_TIMEOUT", "simulated flaky dependency")
        self.r.hincrby(f"{p}:effects", op, 1)  # the raw side effect
        # A downstream that dedups on the forwarded key keeps the first write only.
        self.r.hsetnx(f"{p}:downstream", ctx.idempotency_key, f"{self.who}:{ctx.token}")
        self.r.delete(running)
        return {"op": int(op), "by": self.who}


def crash_worker(url: str, namespace: str, run: int, operations: int, seed: int) -> None:
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, crash_config())
    ledger = Ledger(url, namespace, run, f"w{seed}")
    order = list(range(operations))
    random.Random(seed).shuffle(order)
    for op in order:
        with contextlib.suppress(durabilis.OperationInProgress, durabilis.RetryExhausted):
            layer.execute("agent", "job", {"run": run, "op": op}, ledger, park_on_open=True)
    layer.close()
    store.close()


def die_inside(url: str, namespace: str, started: Any) -> None:
    """Claim an operation, signal, and hang inside it until killed (a worker lost)."""
    import time

    from tests.integration._layer_support import fast_config

    layer = DurabilityLayer(durabilis.connect(url, namespace=namespace), fast_config(lease=0.5))

    def hang(ctx: OperationContext) -> None:
        started.set()
        time.sleep(60)

    layer.execute("a1", "job", {"to": "bob", "text": "hello"}, hang)
