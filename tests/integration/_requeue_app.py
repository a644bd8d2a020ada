"""A gateway replica of the requeue tests: the application, run as a script.

The test copies this file into a directory of its own (as ``fleet_app.py``)
and runs it there, so the operator's CLI process (elsewhere) cannot import it:

- ``python fleet_app.py serve NAME URL NAMESPACE``: a replica with the
  handler of op type ``job`` and ``OrphanRecovery(requeue_handlers=...)``;
  prints ``ready``, serves requeued records until stdin closes;
- ``python fleet_app.py deliver PAGE URL NAMESPACE``: a live delivery of the
  operation ``job {"page": PAGE}``; prints ``ready``, runs on a ``go`` line.

Each run of the operation's effect adds 1 to field PAGE of the hash
``<ns>:test-effects:{fx}`` (so a doubled effect shows).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import redis

import durabilis
from durabilis import CircuitBreakerConfig, IdempotencyConfig, RetryPolicy
from durabilis.http import OrphanRecovery
from durabilis.layer import (
    AsyncDurabilityLayer,
    DurabilityConfig,
    DurabilityLayer,
    OperationContext,
)


def fleet_config() -> DurabilityConfig:
    """Op type ``job`` guarded by breaker ``svc`` (the fleet's TOML, in code)."""
    return DurabilityConfig(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=5),
        retry_policies=(RetryPolicy("job", 2, 1, 2, jitter=False,
                                    retryable_errors=("NETWORK_TIMEOUT",)),),
        breakers=(CircuitBreakerConfig("svc", 0.99, 10, 60, 1, 20, 1),),
        dependencies={"job": "svc"},
    )


def effect_handler(url: str, namespace: str, pause: float = 0.0) -> Any:
    client = redis.Redis.from_url(url)
    key = f"{namespace}:test-effects:{{fx}}"

    def job(ctx: OperationContext) -> dict[str, Any]:
        time.sleep(pause)  # (a live delivery takes a while: the replay meets it in flight)
        client.hincrby(key, str(ctx.payload["page"]), 1)
        return {"done": ctx.payload["page"]}

    return job


async def serve(url: str, namespace: str, name: str) -> None:
    store = durabilis.aio.connect(url, namespace=namespace)
    layer = AsyncDurabilityLayer(store, fleet_config(), replica_id=name)
    recovery = OrphanRecovery(
        layer, every_seconds=60, dlq_cleanup_every_seconds=None,
        requeue_handlers={"job": effect_handler(url, namespace)}, requeue_every_seconds=0.05,
    )
    recovery.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed
    await recovery.stop()
    health = await recovery.health()
    print(f"runs {health['dlq_requeue']['runs']} error {health['dlq_requeue']['last_error']}",
          flush=True)
    await layer.close()
    await store.close()


def deliver(url: str, namespace: str, page: int) -> None:
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, fleet_config(), replica_id="live-delivery")
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(3)
    result = layer.execute("agent-1", "job", {"page": page},
                           effect_handler(url, namespace, pause=0.3), wait=10)
    print(f"delivered {result}", flush=True)
    layer.close()
    store.close()


if __name__ == "__main__":
    role, arg, url, namespace = sys.argv[1:5]
    if role == "serve":
        asyncio.run(serve(url, namespace, arg))
    else:
        deliver(url, namespace, int(arg))
