"""An asyncio store's pool keeps the connections given back ready in front of
it (no lock, condition, timeout or observability hook per round trip,
``durabilis._store._async._ReadyAsyncPool``), and that changes nothing a
caller can see: a connection the server closed is replaced before use, a
reply left unread is never paired with the next command, ``max_connections``
still bounds the connections (and a task waiting for one gets it), no
connection serves two tasks at once, and ``close()`` closes them all. Real
server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.credentials import StreamingCredentialProvider

import durabilis
from durabilis._store._async import _ReadyAsyncPool
from durabilis._store._connect import make_client
from durabilis._store._sync import _ReadyPool
from durabilis.layer import AsyncDurabilityLayer


def _run(redis_url: str, namespace: str, body: Callable[[Any], Awaitable[None]],
         **options: Any) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace, **options)
        try:
            if not isinstance(store.client.connection_pool, _ReadyAsyncPool):
                pytest.skip("connections are kept ready on a standalone server only")
            await body(store)
        finally:
            await store.close()

    asyncio.run(main())


def _made(store: Any) -> int:
    pool = store.client.connection_pool
    return len(pool._in_use_connections) + len(pool._available_connections)


def test_a_connection_the_server_closed_is_replaced_before_use(
    redis_url: str, namespace: str, raw: Any
) -> None:
    async def body(store: Any) -> None:
        layer = AsyncDurabilityLayer(store)
        assert await layer.execute("a", "op", {"n": 1}, lambda ctx: "one") == "one"
        assert store.client.connection_pool._ready, "a connection is kept ready after a call"
        mine = await store.client.execute_command("CLIENT", "ID")
        raw.client_kill_filter(_id=mine)
        await asyncio.sleep(0.05)  # (the close reaches the connection's stream)
        assert await layer.execute("a", "op", {"n": 2}, lambda ctx: "two") == "two"
        assert await store.client.execute_command("CLIENT", "ID") != mine
        await layer.close()

    _run(redis_url, namespace, body)


def test_a_reply_not_read_is_never_paired_with_the_next_command(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """A command whose caller gave up leaves its reply unread: that connection
    is dropped, never kept ready, and the next command gets its own reply."""
    key = f"{namespace}:test:list"

    async def body(store: Any) -> None:
        assert await store.client.execute_command("ECHO", "warm") == b"warm"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(store.client.execute_command("BLPOP", key, 5), 0.3)
        # Dropped: the server sees it go (on 3.12+ asyncio closes the socket at
        # the loop's next turn, not in the cancelled call itself).
        for _ in range(100):
            if not any(c.get("cmd") == "blpop" for c in raw.client_list()):
                break
            await asyncio.sleep(0.01)
        raw.lpush(key, "late")
        assert await store.client.execute_command("ECHO", "mine") == b"mine"
        assert raw.lrange(key, 0, -1) == [b"late"]  # (the dropped BLPOP took nothing)

    _run(redis_url, namespace, body)


@pytest.mark.parametrize("connections", [1, 2])
def test_max_connections_still_bounds_them_and_waiters_get_one(
    redis_url: str, namespace: str, connections: int
) -> None:
    """Sixty-four tasks making durable calls and plain commands on a pool of
    one or two connections all get one (a connection kept ready is never out
    of reach of a task waiting inside the pool), and no more are made."""

    async def body(store: Any) -> None:
        layer = AsyncDurabilityLayer(store)

        async def work(t: int) -> list[Any]:
            out = []
            for i in range(10):
                out.append(await layer.execute("a", "op", {"t": t, "i": i},
                                               lambda ctx, t=t, i=i: (t, i)))
                if i % 5 == 0:
                    assert await store.client.execute_command("PING")
            return out

        results = await asyncio.gather(*(work(t) for t in range(64)))
        assert results == [[(t, i) for i in range(10)] for t in range(64)]
        assert _made(store) <= connections
        await layer.close()

    _run(redis_url, namespace, body, max_connections=connections)


def test_a_task_waiting_inside_the_pool_gets_the_connection_given_back(
    redis_url: str, namespace: str
) -> None:
    """With the one connection out, a second task waits inside the pool. The
    connection given back goes to it at once, not into the ready list (where
    it would wait for the pool's timeout, 5 s here)."""

    async def body(store: Any) -> None:
        pool = store.client.connection_pool
        conn = await pool.get_connection()
        waiter = asyncio.ensure_future(pool.get_connection())
        await asyncio.sleep(0.05)
        assert not waiter.done(), "the pool handed out a second connection"
        await pool.release(conn)
        got = await asyncio.wait_for(waiter, 1.0)
        assert got is conn
        await pool.release(got)

    _run(redis_url, namespace, body, max_connections=1, socket_timeout=5)


def test_a_connection_given_back_twice_is_kept_ready_once(redis_url: str, namespace: str) -> None:
    async def body(store: Any) -> None:
        pool = store.client.connection_pool
        conn = await pool.get_connection()
        await pool.release(conn)
        await pool.release(conn)  # (a caller's mistake: never two users of one connection)
        first, second = await pool.get_connection(), await pool.get_connection()
        assert first is not second
        await pool.release(first)
        await pool.release(second)

    _run(redis_url, namespace, body)


def test_close_closes_the_ready_connections(redis_url: str, namespace: str, raw: Any) -> None:
    async def body(store: Any) -> None:
        mine = await store.client.execute_command("CLIENT", "ID")
        assert store.client.connection_pool._ready
        assert any(int(c["id"]) == mine for c in raw.client_list())
        await store.close()
        assert not any(int(c["id"]) == mine for c in raw.client_list())

    _run(redis_url, namespace, body)


class _Token(StreamingCredentialProvider):
    """A streaming credentials provider (as Entra ID's): never asked here."""

    def get_credentials(self) -> tuple[str, str]:
        return ("user", "token")

    def on_next(self, callback: Callable[[Any], None]) -> None:
        pass

    def on_error(self, callback: Callable[[Exception], None]) -> None:
        pass

    def is_streaming(self) -> bool:
        return True


@pytest.mark.parametrize("asyncio_", [False, True])
def test_streaming_credentials_keep_every_connection_on_the_pool_s_way(
    redis_url: str, asyncio_: bool
) -> None:
    """A connection kept ready skips the pool's "released" event, where redis-py
    re-authenticates one whose token was renewed: with a streaming provider
    the store keeps none ready (sync and asyncio)."""
    plain, _ = make_client(redis_url, {}, asyncio=asyncio_)
    streaming, _ = make_client(redis_url, {"credential_provider": _Token()}, asyncio=asyncio_)
    ready = (_ReadyAsyncPool, _ReadyPool)
    assert isinstance(plain.connection_pool, ready)
    assert not isinstance(streaming.connection_pool, ready)
