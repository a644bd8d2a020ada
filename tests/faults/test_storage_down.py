"""Redis down: durabilis fails closed, fast, with StorageUnavailable (docs/operations.md)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

import durabilis
from durabilis import StorageUnavailable
from durabilis.idempotency import IdempotencyGuard
from durabilis.testing import free_port


def nobody_listens() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
def test_with_redis_down_a_claim_raises_storage_unavailable_and_nothing_runs(scheme: str) -> None:
    ran = []
    began = time.monotonic()
    with pytest.raises(StorageUnavailable) as info:
        # A standalone store connects lazily (the claim fails); a cluster store
        # reads the slot map in connect (connect fails): either way, no claim.
        store = durabilis.connect(f"{scheme}://{nobody_listens()}", namespace="down",
                                  socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            if isinstance(IdempotencyGuard(store).check_and_record("k"), durabilis.idempotency.New):
                ran.append("the operation")
        finally:
            store.close()
    assert ran == []
    assert time.monotonic() - began < 5
    assert isinstance(info.value.__cause__, (redis.RedisError, redis.RedisClusterException))


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
def test_with_redis_down_the_async_guard_raises_storage_unavailable(scheme: str) -> None:
    async def claim() -> None:
        store = durabilis.aio.connect(f"{scheme}://{nobody_listens()}", namespace="down",
                                      socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            await durabilis.aio.IdempotencyGuard(store).check_and_record("k")
        finally:
            await store.close()

    with pytest.raises(StorageUnavailable):
        asyncio.run(claim())
