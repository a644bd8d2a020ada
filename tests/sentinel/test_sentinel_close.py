"""A Sentinel-managed store's close() closes its connections to the sentinels
too (they used to stay open for the process's life, one set per closed store)."""

from __future__ import annotations

import asyncio
import time
import uuid

import redis

import durabilis
from tests.support.sentinel import LocalSentinel


def _connections_named(topology: LocalSentinel, name: str) -> int:
    count = 0
    for host, port in topology.sentinel_addresses:
        with redis.Redis(host=host, port=port, socket_timeout=2) as sentinel:
            count += sum(1 for c in sentinel.client_list() if c.get("name") == name)
    return count


def _left_after_close(topology: LocalSentinel, name: str) -> int:
    """The connections still open once the sentinels saw the close (2 s at most)."""
    deadline = time.monotonic() + 2
    while (left := _connections_named(topology, name)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_closing_a_sentinel_store_closes_its_connections_to_the_sentinels(
    redis_url: str, redis_sentinel: LocalSentinel, namespace: str
) -> None:
    redis_sentinel.wait_healthy(30)
    name = f"close-test-{uuid.uuid4().hex[:8]}"
    store = durabilis.connect(redis_url, namespace=namespace,
                              sentinel_kwargs={"client_name": name})
    assert store.ping()
    assert _connections_named(redis_sentinel, name) >= 1  # it asked them for the primary
    store.close()
    assert _left_after_close(redis_sentinel, name) == 0


def test_closing_an_async_sentinel_store_closes_its_connections_to_the_sentinels(
    redis_url: str, redis_sentinel: LocalSentinel, namespace: str
) -> None:
    redis_sentinel.wait_healthy(30)
    name = f"close-test-{uuid.uuid4().hex[:8]}"

    async def main() -> tuple[int, int]:
        store = durabilis.aio.connect(redis_url, namespace=namespace,
                                      sentinel_kwargs={"client_name": name})
        assert await store.ping()
        before = await asyncio.to_thread(_connections_named, redis_sentinel, name)
        await store.close()
        return before, await asyncio.to_thread(_left_after_close, redis_sentinel, name)

    before, after = asyncio.run(main())
    assert before >= 1 and after == 0
