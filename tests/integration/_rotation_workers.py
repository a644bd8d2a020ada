"""Worker processes of the key-secret rotation tests: replicas of a rolling
rotation, one still on the old secret (knowing the new one), one on the new
secret (knowing the old one), racing the same operations."""

from __future__ import annotations

import random
import time
from typing import Any

import durabilis
from durabilis import IdempotencyConfig
from durabilis.layer import DurabilityLayer, OperationContext
from tests.integration._layer_support import fast_config
from tests.support.backends import raw_client

OLD = "old-secret-" + "o" * 21
NEW = "new-secret-" + "n" * 21


def rotation_config(current: str, previous: str | None = None, *, breaker: bool = False) -> Any:
    """Quick retries for ``job`` under the ``current`` secret, knowing ``previous``;
    no breaker unless asked (three parked failures would open it, deferring replays)."""
    idem = IdempotencyConfig(
        key_secret=current, previous_key_secrets=() if previous is None else (previous,)
    )
    return fast_config(idempotency=idem) if breaker else fast_config(
        idempotency=idem, dependencies={}
    )


def race_worker(
    url: str, namespace: str, current: str, previous: str, operations: int, barrier: Any,
    seed: int,
) -> None:
    """Run every operation once, waiting for another replica's result when it
    holds the operation; each run of ``fn`` is counted in Redis."""
    r = raw_client(url)
    counts = f"{namespace}:test:runs"
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, rotation_config(current, previous))
    rng = random.Random(seed)

    def op(ctx: OperationContext) -> int:
        r.hincrby(counts, str(ctx.payload["op"]), 1)
        time.sleep(rng.random() / 500)  # up to 2 ms: widens the window of a race
        return int(ctx.payload["op"])

    barrier.wait(timeout=60)
    for n in range(operations):
        assert layer.execute("agent", "job", {"op": n}, op, wait=30) == n
    layer.close()
    store.close()


def dead_in_fn_worker(url: str, namespace: str, current: str, previous: str, ready: Any) -> None:
    """Claim the operation ``{"x": 1}`` under ``current`` with a 1 s lease and
    block inside ``fn`` (before its effect) until killed."""
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, fast_config(
        idempotency=IdempotencyConfig(
            key_secret=current, previous_key_secrets=(previous,), in_progress_ttl_seconds=1,
        ),
        dependencies={},
    ))

    def fn(ctx: OperationContext) -> None:
        ready.set()
        time.sleep(120)

    layer.execute("a1", "job", {"x": 1}, fn)
