"""Store.run_many and scan_count behave the same on a server and on Cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durabilis
from durabilis import DurabilisError, IdempotencyGuard, New, StorageUnavailable
from durabilis._scripts import ScriptCall
from tests.support.slots import slot_of


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
        store = durabilis.connect_async(redis_url, namespace=namespace)
        try:
            ops = durabilis.AsyncIdempotencyGuard(store)._ops
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
