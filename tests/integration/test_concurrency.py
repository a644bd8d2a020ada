"""Many operations at once in one process: with defaults, none fails for want of a
connection. Asyncio scripts leave in batches (auto-pipelining, standalone); a
caller beyond the pool waits for a free connection instead of failing."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import time
from typing import Any

import pytest
import redis

import durabilis
from durabilis._autopipe import DEFAULT_SENDERS, AutoPipeline
from durabilis.layer import AsyncDurabilityLayer, DurabilityLayer, OperationContext
from durabilis.testing import RedisServer

pytestmark = pytest.mark.topologies("cluster", "sentinel")


def test_1000_concurrent_async_operations_complete_with_0_errors_each_applied_once(
    redis_url: str, namespace: str
) -> None:
    async def main() -> list[Any]:
        # Every default (the name only tells its connections apart on the server).
        store = durabilis.aio.connect(redis_url, namespace=namespace, client_name=namespace)
        layer = AsyncDurabilityLayer(store)

        async def fn(ctx: OperationContext) -> str:
            await asyncio.sleep(0.001)
            return ctx.idempotency_key

        try:
            calls = [layer.execute("a1", "write", {"n": i % 500}, fn) for i in range(1000)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            if store.autopipe is not None:
                # Few connections for all of it: the scripts left in batches.
                assert store.autopipe.batches < store.autopipe.commands / 10
                mine = [c for c in await store.client.client_list() if c["name"] == namespace]
                assert len(mine) <= DEFAULT_SENDERS
            return results
        finally:
            await layer.close()
            await store.close()

    results = asyncio.run(main())
    errors = [r for r in results if isinstance(r, BaseException)]
    in_progress = [e for e in errors if isinstance(e, durabilis.OperationInProgress)]
    # 500 distinct operations, each delivered twice at once: the second delivery
    # of a key is a duplicate or finds it in progress; nothing else may fail.
    assert errors == in_progress, errors[:3]
    assert len({r for r in results if isinstance(r, str)}) == 500


@pytest.mark.standalone_only  # redis-py's sync Cluster client has no connection limit
def test_a_thread_beyond_the_sync_pool_waits_for_a_connection_instead_of_failing(
    redis_url: str, namespace: str
) -> None:
    store = durabilis.connect(
        redis_url, namespace=namespace, max_connections=4, client_name=namespace
    )
    layer = DurabilityLayer(store)
    barrier = threading.Barrier(40)
    errors: list[BaseException] = []
    done: list[str] = []

    def fn(ctx: OperationContext) -> str:
        return ctx.idempotency_key

    def worker(i: int) -> None:
        barrier.wait()
        try:
            done.append(layer.execute("a1", "write", {"n": i}, fn))
        except BaseException as exc:  # counted
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(40)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [] and len(set(done)) == 40
        mine = [c for c in store.client.client_list() if c["name"] == namespace]
        assert 1 <= len(mine) <= 4
    finally:
        layer.close()
        store.close()


@pytest.mark.standalone_only
def test_a_cancelled_caller_whose_command_has_not_left_is_never_sent(redis_url: str) -> None:
    key = "autopipe:cancelled"

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        pipe = AutoPipeline(client)
        try:
            await client.delete(key)
            first = asyncio.ensure_future(pipe.execute("INCRBY", key, 1))
            second = asyncio.ensure_future(pipe.execute("INCRBY", key, 10))
            third = asyncio.ensure_future(pipe.execute("INCRBY", key, 100))
            await asyncio.sleep(0)  # the three are queued; the sender has not run yet
            second.cancel()
            assert await first == 1 and await third == 101
            assert second.cancelled()
            assert pipe.batches == 1 and pipe.commands == 2
            assert int(await client.get(key)) == 101  # the cancelled one never ran
        finally:
            await client.delete(key)
            await client.aclose()

    asyncio.run(main())


async def _kill_the_blocked_connection(admin: Any) -> None:
    """Kill the connection whose batch waits on a ``BLPOP`` (its replies are awaited)."""
    for _ in range(100):
        await asyncio.sleep(0.02)
        blocked = [c for c in await admin.client_list() if c["cmd"] == "blpop"]
        if blocked:
            break
    await admin.client_kill_filter(_id=blocked[0]["id"])


@pytest.mark.standalone_only
def test_a_command_s_error_is_its_own_and_a_lost_batch_fails_each_of_its_callers(
    redis_url: str,
) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        admin = redis.asyncio.Redis.from_url(redis_url)
        pipe = AutoPipeline(client)
        try:
            await client.set("autopipe:str", "x")
            replies = await asyncio.gather(
                pipe.execute("INCR", "autopipe:n"),
                pipe.execute("LPUSH", "autopipe:str", "y"),  # WRONGTYPE: this caller only
                pipe.execute("INCR", "autopipe:n"),
            )
            assert replies[0] + 1 == replies[2]
            assert isinstance(replies[1], redis.exceptions.ResponseError)
            assert "WRONGTYPE" in str(replies[1])
            # The batch's connection is killed while its replies are awaited:
            # every caller of that batch gets the error (outcome unknown).
            batch = [asyncio.ensure_future(pipe.execute("BLPOP", "autopipe:none", 5))]
            batch += [asyncio.ensure_future(pipe.execute("PING")) for _ in range(2)]
            await _kill_the_blocked_connection(admin)
            outcomes = await asyncio.gather(*batch, return_exceptions=True)
            assert all(isinstance(o, redis.exceptions.ConnectionError) for o in outcomes), outcomes
            assert await pipe.execute("PING") is True  # the next batch: a new connection
        finally:
            await admin.delete("autopipe:str", "autopipe:n")
            await client.aclose()
            await admin.aclose()

    asyncio.run(main())


@pytest.mark.standalone_only  # auto-pipelining is the standalone store's
def test_a_lost_batch_of_several_commands_of_one_caller_leaves_no_error_unretrieved(
    redis_url: str,
) -> None:
    """execute_many raises the first failure; its other commands' failures (the
    same lost batch) are not reported as "Future exception was never retrieved"."""

    async def main() -> list[str]:
        reported: list[str] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: reported.append(str(context.get("message")))
        )
        client = redis.asyncio.Redis.from_url(redis_url)
        admin = redis.asyncio.Redis.from_url(redis_url)
        pipe = AutoPipeline(client)
        try:
            many = asyncio.ensure_future(pipe.execute_many(
                [("BLPOP", "autopipe:none", 5), ("PING",), ("PING",)]
            ))
            await _kill_the_blocked_connection(admin)
            with pytest.raises(redis.exceptions.ConnectionError):
                await many
            del many
            await asyncio.sleep(0.05)  # the done-callbacks run
            gc.collect()  # what asyncio reports an unretrieved failure from
            await asyncio.sleep(0)
        finally:
            await client.aclose()
            await admin.aclose()
        return reported

    assert asyncio.run(main()) == []


@pytest.mark.standalone_only  # auto-pipelining is the standalone store's
def test_a_sender_cancelled_before_its_first_step_does_not_stop_the_store_for_good(
    redis_url: str,
) -> None:
    """Found by an adversarial review: a sweep cancelling every task (a shutdown
    or reload idiom) that caught a sender before its first step left its place
    taken for good; every later command, lease renewals included, waited
    forever (and a lease so lost let another worker run the operation again)."""

    async def main() -> list[Any]:
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
        pipe = AutoPipeline(client)
        try:
            waiting = asyncio.ensure_future(pipe.execute("PING"))
            await asyncio.sleep(0)  # queued; its sender made, not started
            (sender,) = pipe._tasks
            sender.cancel()
            first = await asyncio.wait_for(waiting, 5)  # another sender took it
            cancelled = asyncio.ensure_future(pipe.execute("PING"))
            await asyncio.sleep(0)
            for task in (cancelled, *pipe._tasks):  # the sweep: caller and sender
                task.cancel()
            await asyncio.gather(cancelled, return_exceptions=True)
            return [first, await asyncio.wait_for(pipe.execute("PING"), 5)]
        finally:
            await client.aclose()

    assert asyncio.run(main()) == [True, True]


@pytest.mark.standalone_only  # auto-pipelining is the standalone store's
def test_a_command_whose_arguments_cannot_be_sent_fails_alone_its_batch_goes(
    redis_url: str,
) -> None:
    """Found by an adversarial review: the batch was packed as a whole, so one
    caller's bad argument (a bool, a lone surrogate) failed every command of
    its batch, none sent."""

    async def main() -> list[Any]:
        client = redis.asyncio.Redis.from_url(redis_url)
        pipe = AutoPipeline(client)
        try:
            return await asyncio.gather(
                pipe.execute("SET", "autopipe:a", "1"),
                pipe.execute("SET", "autopipe:b", True),
                pipe.execute("SET", "autopipe:c", "x\udcff"),
                pipe.execute("GET", "autopipe:a"),
                return_exceptions=True,
            )
        finally:
            await client.delete("autopipe:a")
            await client.aclose()

    ok, boolean, surrogate, read = asyncio.run(main())
    assert ok is True and read == b"1"
    assert isinstance(boolean, redis.exceptions.DataError)
    assert isinstance(surrogate, UnicodeEncodeError)


_SLOW = """local t = redis.call('TIME')
local began = t[1] * 1e6 + t[2]
repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - began > tonumber(ARGV[1]) * 1000
redis.call('SET', KEYS[1], 'written')
return 1"""


@pytest.mark.standalone_only  # auto-pipelining is the standalone store's
def test_a_sender_cancelled_mid_batch_fails_its_callers_as_a_lost_connection_not_cancelled(
    redis_url: str,
) -> None:
    """Found by an adversarial review: a sweep cancelling every task but one
    (a shutdown idiom) cancelled the batch's sender too, and the spared task,
    never cancelled, got CancelledError for its command (which had run)."""

    async def main() -> tuple[Any, Any]:
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
        pipe = AutoPipeline(client)
        try:
            sha = await client.script_load(_SLOW)
            spared = asyncio.ensure_future(pipe.execute("EVALSHA", sha, 1, "autopipe:slow", 50))
            await asyncio.sleep(0.01)  # the batch is out, its script running
            for sender in pipe._tasks:
                sender.cancel()
            outcome = (await asyncio.gather(spared, return_exceptions=True))[0]
            return outcome, await asyncio.wait_for(pipe.execute("PING"), 5)
        finally:
            await client.delete("autopipe:slow")
            await client.aclose()

    outcome, after = asyncio.run(main())
    assert isinstance(outcome, redis.exceptions.ConnectionError), outcome  # outcome unknown
    assert after is True


@pytest.mark.standalone_only  # auto-pipelining is the standalone store's
def test_a_sender_cancelled_while_waiting_for_a_connection_leaves_its_batch_for_the_next(
    redis_url: str,
) -> None:
    async def main() -> Any:
        pool = redis.asyncio.BlockingConnectionPool.from_url(redis_url, max_connections=1)
        client = redis.asyncio.Redis(connection_pool=pool)
        pipe = AutoPipeline(client)
        held = await pool.get_connection()
        try:
            waiting = asyncio.ensure_future(pipe.execute("PING"))
            await asyncio.sleep(0.02)  # its sender waits for the pool's one connection
            for sender in list(pipe._tasks):
                sender.cancel()
            await asyncio.sleep(0.02)
            await pool.release(held)
            return await asyncio.wait_for(waiting, 5)  # sent by the next sender
        finally:
            await client.aclose()

    assert asyncio.run(main()) is True


@pytest.mark.standalone_only  # SIGSTOP of a server of its own
def test_a_batch_of_scripts_keeps_each_reply_its_caller_s_and_fails_whole_when_redis_stops(
    private_redis: RedisServer,
) -> None:
    """A batch's script replies are read from the parser under one timeout for
    the batch (Python 3.11+): an error reply is still its own caller's, and a
    server that stops answering fails every caller once the socket timeout has
    passed, the connection dropped, none hanging."""

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(private_redis.url, socket_timeout=0.5)
        pipe = AutoPipeline(client)
        try:
            sha = await client.script_load("return tonumber(ARGV[1]) * 2")
            replies = await asyncio.gather(
                pipe.execute("EVALSHA", sha, 0, 21),
                pipe.execute("EVALSHA", "0" * 40, 0),  # NOSCRIPT: this caller only
                pipe.execute("EVALSHA", sha, 0, "x"),  # the script fails: this caller only
                pipe.execute("EVALSHA", sha, 0, 1),
            )
            assert replies[0] == 42 and replies[3] == 2
            assert isinstance(replies[1], redis.exceptions.NoScriptError)
            assert isinstance(replies[2], redis.exceptions.ResponseError)
            assert "arithmetic" in str(replies[2])
            private_redis.signal(signal.SIGSTOP)
            try:
                began = time.monotonic()
                outcomes = await asyncio.gather(
                    *(pipe.execute("EVALSHA", sha, 0, i) for i in range(5)),
                    return_exceptions=True,
                )
                waited = time.monotonic() - began
            finally:
                private_redis.signal(signal.SIGCONT)
            assert all(isinstance(o, redis.exceptions.TimeoutError) for o in outcomes), outcomes
            assert 0.4 < waited < 3.0  # the socket timeout (0.5 s), no hang
            assert await pipe.execute("EVALSHA", sha, 0, 2) == 4  # a new connection
        finally:
            await client.aclose()

    asyncio.run(main())


@pytest.mark.standalone_only  # auto-pipelining is the standalone store's
def test_each_reply_of_a_batch_gets_the_whole_socket_timeout_not_the_batch(
    redis_url: str,
) -> None:
    """Found by a review: with one timer for the whole batch, a batch whose
    replies each came in time but took longer than the socket timeout in all
    (a busy event loop between socket reads) failed its callers, whose scripts
    had run. Each reply is given the timeout counted from the previous one, as
    redis-py's own read does."""

    async def main() -> list[Any]:
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=0.3)
        pipe = AutoPipeline(client)
        done = False

        async def busy() -> None:  # CPU-bound work sharing the loop
            while not done:
                time.sleep(0.05)
                await asyncio.sleep(0)

        try:
            sha = await client.script_load("return string.rep('x', tonumber(ARGV[1]))")
            hog = asyncio.ensure_future(busy())
            await asyncio.sleep(0)
            began = time.monotonic()
            replies = await asyncio.gather(
                *(pipe.execute("EVALSHA", sha, 0, 10_000) for _ in range(100)),
                return_exceptions=True,
            )
            assert time.monotonic() - began > 0.3  # the batch outlasted one timeout
            done = True
            await hog
            return replies
        finally:
            done = True
            await client.aclose()

    replies = asyncio.run(main())
    assert replies == [b"x" * 10_000] * 100, {type(r).__name__ for r in replies}


@pytest.mark.standalone_only  # SCRIPT FLUSH of the one server
def test_concurrent_async_operations_survive_script_flushes_each_run_once(
    redis_url: str, namespace: str, raw: Any
) -> None:
    runs: dict[str, int] = {}

    async def main() -> list[Any]:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store)
        stop = asyncio.Event()

        async def fn(ctx: OperationContext) -> str:
            runs[ctx.idempotency_key] = runs.get(ctx.idempotency_key, 0) + 1
            await asyncio.sleep(0)
            return ctx.idempotency_key

        async def flusher() -> int:
            n = 0
            while not stop.is_set():
                await asyncio.to_thread(raw.script_flush)
                n += 1
                await asyncio.sleep(0.002)
            return n

        flushing = asyncio.ensure_future(flusher())
        try:
            results: list[Any] = []
            for wave in range(10):
                calls = [layer.execute("a1", "write", {"w": wave, "n": i}, fn) for i in range(100)]
                results += await asyncio.gather(*calls, return_exceptions=True)
            return results
        finally:
            stop.set()
            assert await flushing > 5
            await layer.close()
            await store.close()

    results = asyncio.run(main())
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert len(runs) == 1000 and set(runs.values()) == {1}


def test_async_operations_against_an_unreachable_redis_fail_at_once_none_hangs(
    namespace: str,
) -> None:
    async def main() -> list[Any]:
        store = durabilis.aio.connect(
            "redis://127.0.0.1:1/0", namespace=namespace, socket_connect_timeout=1
        )
        layer = AsyncDurabilityLayer(store)

        async def fn(ctx: OperationContext) -> str:
            raise AssertionError("ran without a claim")

        try:
            calls = [layer.execute("a1", "write", {"n": i}, fn) for i in range(50)]
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
        finally:
            await layer.close()
            await store.close()

    results = asyncio.run(main())
    assert all(isinstance(r, durabilis.StorageUnavailable) for r in results), results[:3]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    first = True
    try:
        while data := await reader.read(65536):
            if first and delay:
                await asyncio.sleep(delay)  # a new connection's first bytes: slow to set up
            first = False
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@pytest.mark.standalone_only  # a TCP proxy in front of the one server
def test_a_caller_cancelled_after_its_claim_was_taken_is_released_after_the_claim(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """Found by an adversarial review: the claim's batch waited for a NEW (slow)
    connection while the caller was cancelled; its release went out first on a
    free pooled connection and the claim landed after it: the key stayed in
    progress, refused as OperationInProgress until its lease ran out."""
    host, port = redis_url.split("//")[1].split("/", maxsplit=1)[0].split(":")

    async def main() -> Any:
        tasks: set[asyncio.Task[None]] = set()

        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            sr, sw = await asyncio.open_connection(host, int(port))
            for t in (_pipe(cr, sw, 0.4), _pipe(sr, cw, 0)):
                task = asyncio.ensure_future(t)
                tasks.add(task)

        proxy = await asyncio.start_server(handle, "127.0.0.1", 0)
        proxy_port = proxy.sockets[0].getsockname()[1]
        store = durabilis.aio.connect(f"redis://127.0.0.1:{proxy_port}/0", namespace=namespace)
        layer = AsyncDurabilityLayer(store)
        ran: list[int] = []

        async def fn(ctx: OperationContext) -> str:
            ran.append(1)
            return "done"

        try:
            await layer.execute("a1", "write", {"warm": 1}, fn)  # one pooled connection
            busy = asyncio.ensure_future(store.command(  # keeps it busy for ~250 ms
                "EVAL", "local t=redis.call('TIME') local s=t[1]*1e6+t[2] "
                "repeat t=redis.call('TIME') until t[1]*1e6+t[2]-s > 250000 return 1", 0))
            await asyncio.sleep(0.02)
            caller = asyncio.ensure_future(layer.execute("a1", "write", {"page": 7}, fn))
            await asyncio.sleep(0.3)  # its claim waits for a new connection; the old is free
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            await busy
            await asyncio.sleep(0.5)  # anything still on its way has landed
            assert ran == [1]  # only the warm-up ran
            return await asyncio.wait_for(layer.execute("a1", "write", {"page": 7}, fn), 5)
        finally:
            await layer.close()
            await store.close()
            proxy.close()
            for task in tasks:
                task.cancel()

    assert asyncio.run(main()) == "done"  # not OperationInProgress: nothing left behind
