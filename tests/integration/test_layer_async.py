"""AsyncDurabilityLayer: the same plans, awaited."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durabilis
from durabilis import CircuitOpen, OperationError, OperationInProgress, RetryExhausted
from durabilis.dlq import ReplayOutcome
from durabilis.layer import (
    AsyncDurabilityLayer,
    DurabilityLayer,
    OperationContext,
    current_operation,
)
from durabilis.testing import RedisServer
from tests.integration._layer_support import Counter, fast_config, keys_of

pytestmark = pytest.mark.topologies("cluster", "sentinel")


def run(redis_url: str, namespace: str, body: Any) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config(lease=1))
        try:
            await body(layer)
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())


def test_async_success_duplicate_retry_and_coroutine_fn(redis_url: str, namespace: str) -> None:
    async def body(layer: AsyncDurabilityLayer) -> None:
        calls: list[int] = []

        async def op(ctx: OperationContext) -> str:
            calls.append(ctx.attempt)
            await asyncio.sleep(0)
            if ctx.attempt == 0:
                raise OperationError("NETWORK_TIMEOUT")
            return "ok"

        assert await layer.execute("a1", "job", "p", op) == "ok"
        assert await layer.execute("a1", "job", "p", op) == "ok"
        assert calls == [0, 1]
        assert (await layer.stats()).duplicates == 1

    run(redis_url, namespace, body)


def test_async_exhaustion_non_retryable_open_breaker_and_replay(
    redis_url: str, namespace: str
) -> None:
    async def body(layer: AsyncDurabilityLayer) -> None:
        with pytest.raises(RetryExhausted) as info:
            await layer.execute("a1", "job", "x", Counter(["NETWORK_TIMEOUT"] * 3))
        with pytest.raises(OperationError):
            await layer.execute("a1", "job", "y", Counter(["PERMISSION_DENIED"]))
        replayer = Counter(result="replayed")
        result = await layer.replay(str(info.value.dlq_id), replayer)
        assert result.outcome is ReplayOutcome.REPLAYED and len(replayer.calls) == 1
        await layer.breakers.force_open("svc")
        with pytest.raises(CircuitOpen):
            await layer.execute("a1", "job", "z", Counter())

    run(redis_url, namespace, body)


def test_a_replay_cancelled_inside_fn_leaves_the_record_replayable_at_once(
    redis_url: str, namespace: str
) -> None:
    async def body(layer: AsyncDurabilityLayer) -> None:
        with pytest.raises(RetryExhausted) as info:
            await layer.execute("a1", "job", "x", Counter(["NETWORK_TIMEOUT"] * 3))
        dlq_id = str(info.value.dlq_id)
        started = asyncio.Event()

        async def hangs(ctx: OperationContext) -> None:
            started.set()
            await asyncio.sleep(30)

        task = asyncio.create_task(layer.replay(dlq_id, hangs))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Both claims were released: the operation's key and the DLQ record's
        # (not held for claim_ttl_seconds, 300 s); nothing was counted.
        record = await layer.dlq.get(dlq_id)
        assert record is not None and record.claimed_by is None
        assert record.replay_attempts == 0
        replayer = Counter(result="replayed")
        result = await layer.replay(dlq_id, replayer)
        assert result.outcome is ReplayOutcome.REPLAYED and len(replayer.calls) == 1

    run(redis_url, namespace, body)


def test_async_gather_of_one_operation_runs_it_once(redis_url: str, namespace: str) -> None:
    async def body(layer: AsyncDurabilityLayer) -> None:
        started = 0

        async def op(ctx: OperationContext) -> str:
            nonlocal started
            started += 1
            await asyncio.sleep(0.2)
            return "once"

        results = await asyncio.gather(
            *(layer.execute("a1", "job", "same", op, wait=5) for _ in range(20)),
            return_exceptions=True,
        )
        assert results == ["once"] * 20 and started == 1
        with pytest.raises(OperationInProgress):
            await asyncio.gather(
                layer.execute("a1", "job", "other", op), layer.execute("a1", "job", "other", op)
            )

    run(redis_url, namespace, body)


def test_async_decorator_and_lease_renewal(redis_url: str, namespace: str) -> None:
    async def body(layer: AsyncDurabilityLayer) -> None:
        seen: list[OperationContext | None] = []

        @layer.durable("job", agent_id="bot")
        async def slow(n: int) -> int:
            seen.append(current_operation())
            await asyncio.sleep(2.5)  # 2.5 leases: renewed meanwhile
            return n * 2

        task = asyncio.create_task(slow(21))
        await asyncio.sleep(1.6)
        with pytest.raises(OperationInProgress):
            await slow(21)
        assert await task == 42
        assert seen[0] is not None and seen[0].agent_id == "bot"

    run(redis_url, namespace, body)


def test_an_idle_async_layer_s_keep_alive_ends_and_the_next_claim_starts_it_again(
    redis_url: str, namespace: str
) -> None:
    async def body(layer: AsyncDurabilityLayer) -> None:
        await layer.execute("a1", "job", "p-1", Counter())
        first = layer._renewer
        assert first is not None and not first.done()  # its counts wait in the process
        await asyncio.wait_for(asyncio.shield(first), 5)
        stored = await layer.store.command("HGET", layer.store.keys.layer("stats"), "succeeded")
        assert int(stored or 0) == 1

        async def slow(ctx: OperationContext) -> str:
            await asyncio.sleep(2.5)  # 2.5 leases: renewed by a new keep-alive
            return "slow but alive"

        task = asyncio.create_task(layer.execute("a1", "job", "p-2", slow))
        await asyncio.sleep(1.6)
        assert layer._renewer is not None and layer._renewer is not first
        with pytest.raises(OperationInProgress):
            await layer.execute("a1", "job", "p-2", Counter())
        assert await task == "slow but alive"

    run(redis_url, namespace, body)


def test_closing_an_idle_layer_stops_its_keep_alive_at_once(
    redis_url: str, namespace: str
) -> None:
    """Its loop may close right after: no keep-alive task left pending (asyncio
    reported "Task was destroyed but it is pending!" at interpreter exit)."""

    async def main() -> tuple[bool, bool]:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config())
        await layer.execute("a1", "job", "p", Counter())
        task = layer._renewer
        assert task is not None
        alive = not task.done()
        await layer.close()
        await store.close()
        return alive, task.done()

    assert asyncio.run(main()) == (True, True)


def test_closing_while_redis_is_down_leaves_no_keep_alive_pending(
    private_redis: RedisServer,
) -> None:
    """Found by a review: the flush of close() that fails starts the keep-alive
    again for the index removals it leaves waiting; close() stops that one too."""

    async def main() -> bool:
        store = durabilis.aio.connect(private_redis.url, namespace="closing-down")
        store._fuse = False  # index removals wait in the process, as on Cluster
        layer = AsyncDurabilityLayer(store, fast_config())
        await layer.execute("a1", "job", "p", Counter())
        assert layer._core.waiting()
        private_redis.stop(kill=True)
        await layer.close()
        await store.close()
        return layer._renewer is not None and not layer._renewer.done()

    assert asyncio.run(main()) is False


def test_a_layer_used_on_another_event_loop_refuses_before_claiming(
    redis_url: str, namespace: str
) -> None:
    """A module-level layer driven by asyncio.run per job: the second job's loop
    is not the store's. It is told so (WrongEventLoop) before anything is sent:
    fn does not run, no claim is left to wait out, nothing is parked."""
    store = durabilis.aio.connect(redis_url, namespace=namespace)
    layer = AsyncDurabilityLayer(store, fast_config())
    first, second = Counter(result="one"), Counter(result="two")

    async def job(fn: Counter, payload: str) -> Any:
        return await layer.execute("a1", "job", payload, fn)

    async def refused_job() -> bool:
        for refused in (
            lambda: job(second, "p-2"), layer.stats, layer.close,
            layer.recover_orphans, lambda: layer.replay_pending(second),
        ):
            with pytest.raises(durabilis.errors.WrongEventLoop):
                await refused()
        renewer = layer._renewer
        return renewer is not None and renewer.get_loop() is asyncio.get_running_loop()

    assert asyncio.run(job(first, "p-1")) == "one"
    assert asyncio.run(refused_job()) is False  # no keep-alive started on the refused loop
    assert second.calls == []
    # The first job's counts went when its asyncio.run ended (the shutdown's
    # sweep of the keep-alive sends what waits), not through the refused loop.
    assert not layer._core.waiting()

    with durabilis.connect(redis_url, namespace=namespace) as sync_store:
        stats = DurabilityLayer(sync_store, fast_config()).stats()
        assert (stats.started, stats.succeeded) == (1, 1)
        idem = [k for k in keys_of(sync_store.client, namespace) if ":idem:" in k]
        assert len(idem) == 1  # the first job's record only
        assert durabilis.dlq.DeadLetterQueue(sync_store).stats().total == 0
