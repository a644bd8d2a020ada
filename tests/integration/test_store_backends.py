"""Store.run_many and scan_count behave the same on a server and on Cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durabilis
from durabilis import DurabilisError, StorageUnavailable
from durabilis._scripts import ScriptCall
from durabilis.idempotency import IdempotencyGuard, New
from tests.support.slots import slot_of

pytestmark = pytest.mark.topologies("cluster", "sentinel")


def test_run_many_answers_in_call_order_across_slots(store: durabilis.Store) -> None:
    ops = IdempotencyGuard(store)._ops
    keys = [ops.validate_key(f"order-{i}") for i in range(6)]
    assert len({slot_of(store.keys.idem(k.value)) for k in keys}) > 1  # spread over slots
    replies = store.run_many([ops.claim(k, f"placeholder-{i}") for i, k in enumerate(keys)])
    assert all(isinstance(ops.decode_claim(k, r), New) for k, r in zip(keys, replies, strict=True))
    checks = store.run_many([ops.check(k) for k in keys])
    seen = [ops.decode_check(k, r) for k, r in zip(keys, checks, strict=True)]
    assert [d.original_result if d else None for d in seen] == [
        f"placeholder-{i}" for i in range(6)
    ]


def test_run_many_raises_the_first_failure_typed_and_still_runs_every_call(
    store: durabilis.Store,
) -> None:
    ops = IdempotencyGuard(store)._ops
    good = ops.validate_key("fine")
    # Non-numeric ARGV makes the script itself fail inside Redis.
    broken = ScriptCall("idem_claim", [store.keys.idem("broken")], ["x", "y", "", "", ""])
    with pytest.raises(DurabilisError) as info:
        store.run_many([broken, ops.claim(good, None)])
    assert "idem_claim" in str(info.value)
    assert not isinstance(info.value, StorageUnavailable)
    assert IdempotencyGuard(store).check("fine") is not None  # the other call ran


def test_the_async_run_many_matches_the_sync_one(redis_url: str, namespace: str) -> None:
    async def run() -> list[Any]:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            ops = durabilis.aio.IdempotencyGuard(store)._ops
            keys = [ops.validate_key(f"a-{i}") for i in range(4)]
            replies = await store.run_many([ops.claim(k, i) for i, k in enumerate(keys)])
            return [type(ops.decode_claim(k, r)).__name__
                    for k, r in zip(keys, replies, strict=True)]
        finally:
            await store.close()

    assert asyncio.run(run()) == ["New"] * 4


def test_scan_count_counts_the_namespace_on_every_primary(store: durabilis.Store) -> None:
    guard = IdempotencyGuard(store)
    for i in range(40):
        guard.check_and_record(f"counted-{i}")
    assert guard.record_count() == 40


def test_an_async_store_refuses_another_event_loop_before_sending_anything(
    redis_url: str, namespace: str, store: durabilis.Store
) -> None:
    """redis-py's asyncio connections belong to the loop that opened them; on
    another loop a call failed as an untyped "unexpected error" (RuntimeError:
    Event loop is closed). The store now refuses it first, with a typed error
    that says what to do, whether its own loop has ended or still runs."""
    astore = durabilis.aio.connect(redis_url, namespace=namespace)
    ops = durabilis.aio.IdempotencyGuard(astore)._ops
    key = ops.validate_key("another-loop")

    async def first_loop() -> None:
        assert await astore.ping()

    async def second_loop() -> list[str]:
        refused = []
        for attempt in (
            lambda: astore.run(ops.claim(key, "p")),
            lambda: astore.run_many([ops.claim(key, "p")]),
            lambda: astore.run_step([ops.claim(key, "p")]),
            lambda: astore.command("PING"),
            lambda: astore.scan_count("*"),
            astore.ping,
            astore.close,
        ):
            with pytest.raises(durabilis.errors.WrongEventLoop) as info:
                await attempt()
            refused.append(str(info.value))
        return refused

    asyncio.run(first_loop())
    refused = asyncio.run(second_loop())
    assert len(refused) == 7
    assert "(now closed)" in refused[0] and "one store per event loop" in refused[0]
    assert IdempotencyGuard(store).check("another-loop") is None  # nothing was sent

    # Its own loop still runs: another thread's loop is refused too, and the
    # store goes on serving its own loop.
    live = durabilis.aio.connect(redis_url, namespace=namespace)

    async def own_loop() -> Any:
        try:
            assert await live.ping()
            with pytest.raises(durabilis.errors.WrongEventLoop) as info:
                await asyncio.to_thread(asyncio.run, live.command("PING"))
            assert "(now closed)" not in str(info.value)
            return await live.run(ops.claim(key, "p"))
        finally:
            await live.close()

    assert isinstance(ops.decode_claim(key, asyncio.run(own_loop())), New)
