"""A run interrupted once ``fn`` started never leaves its operation looking
untouched (issue 35, hole 4): the next delivery runs with ``ctx.recovered``,
the same idempotency key and a higher fencing token. Interrupted before ``fn``
started, the claim is given back clean."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from typing import Any

import pytest

import durabilis
from durabilis.layer import AsyncDurabilityLayer, DurabilityLayer, OperationContext
from tests.integration._interrupt_workers import sigterm_inside_fn
from tests.integration._layer_support import Counter, fast_config

# On Cluster the claim goes with its birth entry and the release in waves.
pytestmark = pytest.mark.topologies("cluster")


def _layer(store: durabilis.Store) -> DurabilityLayer:
    return DurabilityLayer(store, fast_config(lease=5, dependencies={}))


def _next_delivery_is_flagged(first: OperationContext, then: OperationContext) -> None:
    assert then.recovered, "the next delivery must be told an earlier run may have had its effect"
    assert not then.replay
    assert then.idempotency_key == first.idempotency_key
    assert first.token is not None and then.token is not None
    assert int(then.token) > int(first.token)


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit])
def test_an_interruption_raised_in_fn_after_its_effect_flags_the_next_delivery(
    store: durabilis.Store, interruption: type[BaseException]
) -> None:
    layer = _layer(store)
    seen: list[OperationContext] = []

    def fn(ctx: OperationContext) -> str:
        seen.append(ctx)  # the effect
        raise interruption

    with pytest.raises(interruption):
        layer.execute("a1", "job", {"n": 1}, fn)
    again = Counter(result="second")
    assert layer.execute("a1", "job", {"n": 1}, again) == "second"
    (first,) = seen
    (then,) = again.calls
    _next_delivery_is_flagged(first, then)


def test_an_ordinary_error_of_fn_leaves_the_next_delivery_unflagged(
    store: durabilis.Store,
) -> None:
    """(The contract is unchanged for fn's own errors: a non-retryable one gives
    the claim back clean.)"""
    layer = _layer(store)
    with pytest.raises(durabilis.OperationError):
        layer.execute("a1", "job", {"n": 2}, Counter(["PERMISSION_DENIED"]))
    again = Counter()
    layer.execute("a1", "job", {"n": 2}, again)
    assert not again.calls[0].recovered


def test_the_flag_stays_until_a_run_records_its_outcome(store: durabilis.Store) -> None:
    """A flagged delivery that fails in turn passes the flag on: the earlier
    run's effect is still unaccounted for."""
    layer = _layer(store)

    def interrupted(ctx: OperationContext) -> str:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        layer.execute("a1", "job", {"n": 3}, interrupted)
    failing = Counter(["PERMISSION_DENIED"])
    with pytest.raises(durabilis.OperationError):
        layer.execute("a1", "job", {"n": 3}, failing)
    assert failing.calls[0].recovered
    done = Counter()
    layer.execute("a1", "job", {"n": 3}, done)
    assert done.calls[0].recovered
    assert layer.execute("a1", "job", {"n": 3}, Counter(result="x")) == "done"  # recorded


def test_a_wait_for_timeout_after_fn_s_effect_flags_the_next_delivery(
    redis_url: str, namespace: str
) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config(lease=5, dependencies={}))
        seen: list[OperationContext] = []

        async def fn(ctx: OperationContext) -> str:
            seen.append(ctx)  # the effect
            await asyncio.sleep(120)
            return "never"

        try:
            timeout = 0.2
            while not seen:  # (a timeout before fn started gives the claim back: again)
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(layer.execute("a1", "job", {"n": 4}, fn), timeout)
                timeout *= 2
            again = Counter(result="second")
            assert await layer.execute("a1", "job", {"n": 4}, again) == "second"
            _next_delivery_is_flagged(seen[-1], again.calls[0])
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())


def test_a_cancellation_before_fn_started_gives_the_claim_back_clean(
    redis_url: str, namespace: str, raw: Any
) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config(lease=5, dependencies={}))
        try:
            for n in range(200):  # until a cancellation lands after the claim, before fn
                payload = {"n": 5, "try": n}
                key = durabilis.IdempotencyKey.new("a1", "job", payload)
                ran = Counter()
                task = asyncio.ensure_future(layer.execute("a1", "job", payload, ran))
                for _ in range(n % 8):
                    await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                if ran.calls or raw.hget(store.keys.idem(key.value), "s") != b"x":
                    continue  # fn ran, or the claim was never made: not the case shown
                again = Counter()
                await layer.execute("a1", "job", payload, again)
                assert not again.calls[0].recovered
                return
            pytest.fail("no cancellation landed between the claim and fn")
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())


def test_a_worker_stopped_by_sigterm_inside_fn_flags_the_next_delivery(
    store: durabilis.Store, redis_url: str, namespace: str, raw: Any
) -> None:
    """A gateway whose SIGTERM handler exits: the library's signal gate lets
    the handler run inside fn (SystemExit there), and the claim it gives back
    says an earlier run may have had its effect."""
    marks = f"{namespace}:test:marks"
    payload = {"n": 6}
    ctx = multiprocessing.get_context("spawn")
    worker = ctx.Process(target=sigterm_inside_fn, args=(redis_url, namespace, payload, marks))
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while raw.llen(marks) == 0:
            assert time.monotonic() < deadline, "the worker never entered fn"
            time.sleep(0.02)
        os.kill(worker.pid, signal.SIGTERM)  # type: ignore[arg-type]
        worker.join(timeout=60)
        assert worker.exitcode == 143  # its handler ran: SystemExit(143)
    finally:
        if worker.is_alive():
            worker.kill()
    key, token = raw.lindex(marks, 0).decode().rsplit("|", 1)
    again = Counter(result="second")
    # Not OperationInProgress for a lease: the claim was given back at once.
    assert _layer(store).execute("a1", "job", payload, again) == "second"
    (then,) = again.calls
    assert then.recovered and then.idempotency_key == key and int(then.token or 0) > int(token)


def test_a_cancellation_held_back_until_the_backoff_announces_no_retry(
    redis_url: str, namespace: str
) -> None:
    # fn swallows the caller's cancellation and fails retryably: the layer holds
    # the cancellation back until the backoff's sleep, where it ends the call. A
    # retry announced before that sleep would never have run.
    import contextlib

    from structlog.testing import capture_logs

    from durabilis import OperationError
    from durabilis.retry import RetryPolicy

    slow = RetryPolicy("job", max_attempts=3, initial_delay_ms=5000, max_delay_ms=5000,
                       jitter=False, retryable_errors=("NETWORK_TIMEOUT",))

    async def main() -> tuple[int, list[str]]:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config(retry_policies=(slow,),
                                                        dependencies={}))
        started = asyncio.Event()
        calls = 0

        async def fn(ctx: OperationContext) -> Any:
            nonlocal calls
            calls += 1
            started.set()
            with contextlib.suppress(asyncio.CancelledError):  # swallowed: the layer
                await asyncio.sleep(60)  # holds the cancellation back
            raise OperationError("NETWORK_TIMEOUT", "ledger down")

        try:
            with capture_logs() as logs:
                task = asyncio.ensure_future(layer.execute("a1", "job", {"n": 9}, fn))
                await asyncio.wait_for(started.wait(), 10)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(task, 10)
        finally:
            await layer.close()
            await store.close()
        return calls, [e["event"] for e in logs]

    calls, events = asyncio.run(main())
    assert calls == 1
    assert "durability_retry_attempt" not in events


def test_a_breaker_opened_during_the_backoff_announces_no_retry(store: durabilis.Store) -> None:
    # The retry's event (and metric, and OTel event) is emitted as the retry
    # starts: a breaker opened by another replica during the backoff parks the
    # operation as CIRCUIT_OPEN, and no retry was announced that never ran.
    from structlog.testing import capture_logs

    from durabilis import OperationError, RetryExhausted
    from durabilis.retry import RetryPolicy

    slow = RetryPolicy("job", max_attempts=3, initial_delay_ms=300, max_delay_ms=300,
                       jitter=False, retryable_errors=("NETWORK_TIMEOUT",))
    layer = DurabilityLayer(store, fast_config(retry_policies=(slow,)))
    calls = 0

    def fn(ctx: OperationContext) -> Any:
        nonlocal calls
        calls += 1
        layer.breakers.force_open("svc")  # as another replica would, during the backoff
        raise OperationError("NETWORK_TIMEOUT", "ledger down")

    try:
        with capture_logs() as logs, pytest.raises(RetryExhausted) as parked:
            layer.execute("a1", "job", {"n": 10}, fn)
    finally:
        layer.close()
    assert calls == 1
    assert "CIRCUIT_OPEN" in str(parked.value) and parked.value.dlq_id
    assert "durability_retry_attempt" not in [e["event"] for e in logs]
