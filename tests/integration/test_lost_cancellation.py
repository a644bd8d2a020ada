"""A cancellation that redis-py loses is raised all the same.

redis-py's asyncio client sends through ``asyncio.wait_for``, which on Python
3.11 returns the finished result when a ``cancel()`` arrives as the send
completes: the cancellation is gone. Under CPU load on Cluster, that made an
``AsyncConfigSync.stop()`` wait forever (its poller went on polling). Here the
client's entry point is wrapped so that it loses every cancellation that
arrives while a command is out (it waits for the command and returns its
reply, the effect of that race made certain); Redis itself is real.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import durabilis
from durabilis.aio import Store as AsyncStore
from durabilis.config import AsyncConfigSync
from durabilis.layer import AsyncDurabilityLayer, OperationContext
from tests.integration._layer_support import fast_config

pytestmark = [
    pytest.mark.topologies("cluster"),  # seen under CPU load on Cluster (no auto-pipelining)
]


_WATCHED: contextvars.ContextVar[bool] = contextvars.ContextVar("watched", default=False)


class Losing:
    """Wraps the store's way into redis-py: a cancellation during a command is lost."""

    def __init__(self, store: AsyncStore) -> None:
        self.entered = asyncio.Event()
        self.lost = 0
        # Once ``watching`` is used, only a command sent by the task it starts,
        # or by a task that task started (on Cluster the calls of a wave of
        # several go from tasks of their own), sets ``entered``.
        self.watch = False
        self.off = False  # (a failing test turns it off to end cleanly)
        self.then_fail = False  # the command fails after the cancellation was lost
        if store.autopipe is not None:  # standalone: every command goes through it
            store.autopipe.execute = self._wrap(store.autopipe.execute)  # type: ignore[method-assign]
            store.autopipe.execute_many = self._wrap(  # type: ignore[method-assign]
                store.autopipe.execute_many
            )
        else:  # Cluster: commands and scripts alike
            store.client.execute_command = self._wrap(store.client.execute_command)

    def _wrap(self, inner: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            sent = asyncio.ensure_future(inner(*args, **kwargs))
            if not self.watch or _WATCHED.get():
                self.entered.set()
            try:
                return await asyncio.shield(sent)
            except asyncio.CancelledError:
                if self.off:
                    raise
                self.lost += 1
                reply = await sent  # the reply, and the cancellation dropped
                if self.then_fail:  # (the connection reset as the reply came)
                    raise ConnectionError("Connection reset by peer") from None
                return reply

        return call

    def watching(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        """Start ``coro`` as the watched task (its context, copied into the tasks
        it starts, carries the mark)."""
        self.watch = True
        mark = _WATCHED.set(True)
        try:
            return asyncio.ensure_future(coro)
        finally:
            _WATCHED.reset(mark)


def test_the_store_raises_a_cancellation_the_client_lost(redis_url: str, namespace: str) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        losing = Losing(store)
        try:
            assert await store.command("GET", f"{namespace}:plain") is None  # (connected)
            losing.entered.clear()
            task = asyncio.ensure_future(store.command("GET", f"{namespace}:plain"))
            await losing.entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert losing.lost == 1  # the client did lose it
        finally:
            await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("method", ["command", "run", "run_many", "run_step"])
def test_a_cancellation_the_client_lost_outranks_the_error_that_followed(
    redis_url: str, namespace: str, method: str
) -> None:
    """The client loses the cancellation, then the command fails: the caller gets
    its cancellation, not a StorageUnavailable it would catch and go on from (a
    loop that logs store errors, as the keep-alive does, would never stop)."""
    from durabilis._scripts import ScriptCall

    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        key = f"{namespace}:{{k}}:a"
        call = ScriptCall("layer_note", [key, f"{namespace}:{{k}}:b"], ["add", "60000", "1", "m"])
        sends: dict[str, Callable[[], Awaitable[Any]]] = {
            "command": lambda: store.command("GET", key),
            "run": lambda: store.run(call),
            "run_many": lambda: store.run_many([call, call]),
            "run_step": lambda: store.run_step([call, call]),
        }
        losing = Losing(store)
        try:
            await sends[method]()  # (connected, scripts loaded)
            losing.then_fail = True
            losing.entered.clear()
            task = losing.watching(sends[method]())
            await losing.entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            if store.fuses or method in ("command", "run"):  # (Cluster: a wave's calls
                assert losing.lost >= 1  # go from tasks of their own, none lost there)
        finally:
            losing.off = True
            await store.close()

    asyncio.run(main())


def test_a_config_poller_stops_though_its_cancellation_is_lost(
    redis_url: str, namespace: str
) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            sync = await AsyncConfigSync(store, interval_seconds=0.01).start()
            losing = Losing(store)
            await losing.entered.wait()  # a poll is out: stop() cancels it there
            stopping = asyncio.ensure_future(sync.stop())
            await asyncio.wait([stopping], timeout=10)
            losing.off = True
            assert stopping.done(), "stop() did not return: the poller went on polling"
            assert losing.lost == 1
        finally:
            await store.close()

    asyncio.run(main())


def test_a_cancelled_call_does_not_run_fn_though_the_client_lost_the_cancellation(
    redis_url: str, namespace: str
) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config(lease=1))
        ran: list[str] = []

        async def fn(ctx: OperationContext) -> str:
            ran.append(ctx.idempotency_key)
            return "done"

        try:
            await layer.execute("a", "write", {"n": 0}, fn, idempotency_key="warm-up")
            ran.clear()
            losing = Losing(store)
            losing.entered.clear()
            task = losing.watching(
                layer.execute("a", "write", {"n": 1}, fn, idempotency_key="k1")
            )
            await losing.entered.wait()  # a step before fn (the claim) is out
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Standalone: the claim step is one command, sent from the caller's
            # task, whose cancellation the client loses. Cluster: it is a wave of
            # two calls (the index entry, the claim), each from a task of its
            # own that the caller's cancellation does not reach: none is lost.
            assert losing.lost >= 1 if store.fuses else losing.lost == 0
            assert ran == []  # cancelled before fn: fn never ran
            # The claim was released: the same key runs now, once.
            assert await layer.execute("a", "write", {"n": 1}, fn, idempotency_key="k1") == "done"
            assert len(ran) == 1
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())


def test_a_stop_during_the_first_poll_of_start_is_final(redis_url: str, namespace: str) -> None:
    """Found by a review: stop() while start() awaited its first poll returned at
    once, and start() then left a poller running until the next stop()."""

    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            sync = AsyncConfigSync(store, interval_seconds=0.01)
            starting = asyncio.ensure_future(sync.start())
            await asyncio.sleep(0)  # start() is in its first poll (a Redis read)
            assert not starting.done()
            await sync.stop()
            await starting
            await asyncio.sleep(0.1)
            assert sync._task is None  # no poller was left behind
        finally:
            await store.close()

    asyncio.run(main())
