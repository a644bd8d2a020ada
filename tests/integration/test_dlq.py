"""The dead-letter queue against a real Redis: the seed's behaviours and ours."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

import durabilis
from durabilis._keys import KeySpace
from durabilis.dlq import (
    AsyncDeadLetterQueue,
    DeadLetterQueue,
    DlqConfig,
    DlqRecord,
    DlqStatus,
    ReplayOutcome,
    _Claimed,
    _DlqOps,
)
from durabilis.errors import ConfigError, CorruptData
from tests.support.backends import keys_matching
from tests.support.lossy import lose_replies

pytestmark = pytest.mark.topologies("cluster")

LUA = Path(__file__).resolve().parents[2] / "durabilis" / "lua"


@pytest.fixture
def dlq(store: durabilis.Store) -> DeadLetterQueue:
    return DeadLetterQueue(store, replayer_id="replayer-a")


def key(namespace: str, *parts: str) -> str:
    return KeySpace(namespace).dlq(*parts)


def park(dlq: DeadLetterQueue, n: int, op: str = "wiki_write", **kw: Any) -> list[str]:
    return [
        dlq.enqueue("agent-1", op, {"n": i, "op": op}, 3, "NETWORK_TIMEOUT", **kw)
        for i in range(n)
    ]


def server_now(raw: redis.Redis) -> datetime:
    secs, micros = raw.time()
    return datetime.fromtimestamp(secs + micros / 1e6, tz=UTC)


def sleep_until(raw: redis.Redis, moment: datetime) -> None:
    """Sleep until the Redis server clock has passed ``moment`` by a whole millisecond.

    Redis drops a key when its millisecond clock is *past* the key's deadline:
    at 0.4 ms after ``moment`` the clock still reads the deadline's millisecond
    and the key is still there.
    """
    deadline = time.monotonic() + 10
    while server_now(raw) <= moment + timedelta(milliseconds=2):
        assert time.monotonic() < deadline
        time.sleep(0.02)


# --- must show 1: the seed's behaviours ---------------------------------------------------


def test_enqueue_returns_a_non_empty_id_and_the_record_is_pending(dlq: DeadLetterQueue) -> None:
    dlq_id = dlq.enqueue("agent-1", "wiki_write", {"page": "Home"}, 3, "NETWORK_TIMEOUT: slow")
    assert isinstance(dlq_id, str) and dlq_id
    rec = dlq.get(dlq_id)
    assert rec is not None
    assert rec.status is DlqStatus.PENDING
    assert (rec.agent_id, rec.operation_type, rec.retry_count) == ("agent-1", "wiki_write", 3)
    assert rec.original_operation == {"page": "Home"}
    assert rec.last_error == "NETWORK_TIMEOUT: slow"
    assert rec.replay_attempts == 0
    assert rec.failed_at.tzinfo is not None
    assert (rec.expires_at - rec.failed_at).total_seconds() == pytest.approx(86400, abs=0.01)


def test_get_of_an_unknown_id_returns_none(dlq: DeadLetterQueue) -> None:
    assert dlq.get("0123456789abcdef0123456789abcdef") is None


def test_pending_count_counts_pending_records_per_operation_type(dlq: DeadLetterQueue) -> None:
    assert dlq.pending_count() == 0
    wiki = park(dlq, 3, "wiki_write")
    park(dlq, 2, "mcp_call")
    assert dlq.pending_count() == 5
    assert dlq.pending_count("wiki_write") == 3
    assert dlq.pending_count("mcp_call") == 2
    assert dlq.pending_count("message_send") == 0
    dlq.mark_replayed(wiki[0])
    dlq.abandon(wiki[1])
    assert dlq.pending_count() == 3
    assert dlq.pending_count("wiki_write") == 1


def test_list_pending_filters_by_operation_type_in_enqueue_order(dlq: DeadLetterQueue) -> None:
    ids = []
    for i in range(6):
        ids.append(dlq.enqueue("a", "mcp_call" if i % 2 else "wiki_write", i, 1, "e"))
    assert [r.dlq_id for r in dlq.list_pending()] == ids
    assert [r.dlq_id for r in dlq.list_pending("mcp_call")] == ids[1::2]
    assert [r.original_operation for r in dlq.list_pending("wiki_write")] == [0, 2, 4]
    assert dlq.list_pending("external_api") == []
    dlq.mark_replayed(ids[1])
    assert [r.dlq_id for r in dlq.list_pending("mcp_call")] == [ids[3], ids[5]]


def test_mark_replayed_moves_a_pending_record_to_replayed_once(dlq: DeadLetterQueue) -> None:
    (dlq_id,) = park(dlq, 1)
    assert dlq.mark_replayed(dlq_id, replayed_by="operator") is True
    rec = dlq.get(dlq_id)
    assert rec is not None and rec.status is DlqStatus.REPLAYED
    assert rec.replayed_by == "operator" and rec.replayed_at is not None
    assert dlq.mark_replayed(dlq_id) is False  # final
    assert dlq.abandon(dlq_id) is False


def test_who_marked_a_record_must_be_text_kept_clean_and_short(dlq: DeadLetterQueue) -> None:
    first, second = park(dlq, 2)
    with pytest.raises(ConfigError):
        dlq.mark_replayed(first, replayed_by=True)  # type: ignore[arg-type]
    rec = dlq.get(first)
    assert rec is not None and rec.status is DlqStatus.PENDING  # nothing sent
    assert dlq.mark_replayed(first, replayed_by="op\udcff" + "x" * 1000) is True
    assert dlq.abandon(second, by=None) is True
    rec = dlq.get(first)
    assert rec is not None and rec.replayed_by is not None
    assert rec.replayed_by.startswith("op?x") and len(rec.replayed_by.encode()) <= 256


def test_mark_replayed_on_an_abandoned_record_returns_false_and_changes_nothing(
    dlq: DeadLetterQueue,
) -> None:
    (dlq_id,) = park(dlq, 1)
    assert dlq.abandon(dlq_id, by="operator") is True
    before = dlq.get(dlq_id)
    assert before is not None and before.status is DlqStatus.ABANDONED
    assert before.abandoned_by == "operator"
    assert dlq.mark_replayed(dlq_id) is False
    assert dlq.get(dlq_id) == before
    assert dlq.replay(dlq_id, lambda r: None).outcome is ReplayOutcome.NOT_PENDING


def test_unknown_ids_give_false_from_mark_replayed_and_abandon(dlq: DeadLetterQueue) -> None:
    assert dlq.mark_replayed("0123456789abcdef0123456789abcdef") is False
    assert dlq.abandon("0123456789abcdef0123456789abcdef") is False
    assert dlq.replay("0123456789abcdef", lambda r: None).outcome is ReplayOutcome.NOT_FOUND


def test_list_all_returns_the_records_and_the_pending_count(dlq: DeadLetterQueue) -> None:
    ids = park(dlq, 4) + park(dlq, 2, "mcp_call")
    dlq.mark_replayed(ids[0])
    dlq.abandon(ids[4])
    records, pending = dlq.list_all()
    assert [r.dlq_id for r in records] == ids
    assert pending == 4
    assert [r.status for r in records[:2]] == [DlqStatus.REPLAYED, DlqStatus.PENDING]
    listing = dlq.list_all("mcp_call")
    assert [r.dlq_id for r in listing.records] == ids[4:]
    assert listing.pending_count == 1


# --- ordering and pagination ------------------------------------------------------------


def test_pages_follow_enqueue_order_even_within_one_millisecond(
    store: durabilis.Store, dlq: DeadLetterQueue
) -> None:
    # Stream ids of one millisecond (...-9, ...-10): a plain string order gets them wrong.
    # A stream whose last id lies in the future gives every new entry that millisecond.
    stream = store.keys.dlq("stream")
    future = int(time.time() * 1000) + 3_600_000
    store.client.xadd(stream, {"seed": "x"}, id=f"{future}-0")
    store.client.xdel(stream, f"{future}-0")
    o = _DlqOps(store.keys, DlqConfig(), "test")
    calls = [o.enqueue("a", "wiki_write" if i % 3 else "mcp_call", i, 1, "e") for i in range(250)]
    # One by one: run_many's calls go concurrently on Cluster (no order between them).
    ids = [o.decode_enqueue(c, store.run(c)).dlq_id for c in calls]
    sids = [sid for sid, _ in store.client.xrange(stream)]
    assert {sid.split(b"-")[0] for sid in sids} == {str(future).encode()}
    assert max(int(sid.split(b"-")[1]) for sid in sids) == 250
    pages, after = [], None
    while True:
        page = dlq.list_pending(limit=40, after=after)
        if not page:
            break
        pages.append(page)
        after = page[-1]
    assert [len(p) for p in pages] == [40] * 6 + [10]
    assert [r.dlq_id for p in pages for r in p] == ids
    mcp = [ids[i] for i in range(250) if i % 3 == 0]
    first = dlq.list_pending("mcp_call", limit=50)
    rest = dlq.list_pending("mcp_call", after=first[-1].stream_id)
    assert [r.dlq_id for r in first + rest] == mcp
    records, pending = dlq.list_all(limit=120)
    more, _ = dlq.list_all(after=records[-1])
    assert [r.dlq_id for r in records + more] == ids
    assert pending == 250


# --- stats and capacity -------------------------------------------------------------------


def test_stats_count_by_status_and_type_and_age_the_oldest_pending(
    dlq: DeadLetterQueue, raw: redis.Redis
) -> None:
    ids = park(dlq, 3) + park(dlq, 2, "mcp_call")
    dlq.mark_replayed(ids[0])
    dlq.abandon(ids[3])
    time.sleep(0.05)
    stats = dlq.stats()
    assert stats.total == 5
    assert stats.by_status == {
        DlqStatus.PENDING: 3, DlqStatus.REPLAYED: 1, DlqStatus.ABANDONED: 1
    }
    assert stats.by_operation_type == {
        "mcp_call": {DlqStatus.PENDING: 1, DlqStatus.REPLAYED: 0, DlqStatus.ABANDONED: 1},
        "wiki_write": {DlqStatus.PENDING: 2, DlqStatus.REPLAYED: 1, DlqStatus.ABANDONED: 0},
    }
    oldest = dlq.get(ids[1])
    assert oldest is not None and stats.oldest_pending_at is not None
    assert abs((stats.oldest_pending_at - oldest.failed_at).total_seconds()) < 0.01
    assert stats.oldest_pending_age_seconds is not None
    assert stats.oldest_pending_age_seconds >= 0.05
    assert stats.over_max_pending is False


def test_past_max_pending_enqueue_still_succeeds_warns_and_stats_flag_it(
    store: durabilis.Store,
) -> None:
    dlq = DeadLetterQueue(store, DlqConfig(max_pending=3))
    with capture_logs() as logs:
        ids = park(dlq, 5)
    assert all(dlq.get(i) is not None for i in ids)  # nothing dropped
    warnings = [e for e in logs if e["event"] == "durability_dlq_max_pending_exceeded"]
    assert [w["pending"] for w in warnings] == [4, 5]
    assert all(w["log_level"] == "warning" for w in warnings)
    stats = dlq.stats()
    assert stats.pending == 5 and stats.over_max_pending is True


# --- replay ---------------------------------------------------------------------------------


def test_replay_runs_the_handler_with_the_record_and_marks_it_replayed(
    dlq: DeadLetterQueue,
) -> None:
    (dlq_id,) = park(dlq, 1)
    seen: list[DlqRecord] = []
    with capture_logs() as logs:
        result = dlq.replay(dlq_id, seen.append)
    assert result.outcome is ReplayOutcome.REPLAYED and result.replayed
    assert [r.dlq_id for r in seen] == [dlq_id]
    assert seen[0].original_operation == {"n": 0, "op": "wiki_write"}
    assert seen[0].claimed_by == "replayer-a"
    rec = dlq.get(dlq_id)
    assert rec is not None and rec.status is DlqStatus.REPLAYED
    assert rec.replayed_by == "replayer-a" and rec.claimed_by is None
    assert any(e["event"] == "durability_dlq_replayed" for e in logs)
    assert dlq.replay(dlq_id, seen.append).outcome is ReplayOutcome.NOT_PENDING
    assert len(seen) == 1


def test_a_failed_replay_stays_pending_with_attempts_and_the_new_error(
    dlq: DeadLetterQueue,
) -> None:
    (dlq_id,) = park(dlq, 1)

    def down(record: DlqRecord) -> None:
        raise durabilis.OperationError("SERVICE_UNAVAILABLE", "still down")

    for attempt in (1, 2):
        result = dlq.replay(dlq_id, down)
        assert result.outcome is ReplayOutcome.FAILED
        assert result.replay_attempts == attempt
    rec = dlq.get(dlq_id)
    assert rec is not None and rec.status is DlqStatus.PENDING
    assert rec.replay_attempts == 2
    assert rec.last_error == "SERVICE_UNAVAILABLE: still down"
    assert rec.original_error == "NETWORK_TIMEOUT"
    assert rec.claimed_by is None and rec.last_replay_at is not None
    # The claim was released: it can be replayed again at once.
    assert dlq.replay(dlq_id, lambda r: None).outcome is ReplayOutcome.REPLAYED


def test_a_claimed_record_is_skipped_by_others_until_the_claim_expires(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    config = DlqConfig(claim_ttl_seconds=1.0)
    first = _DlqOps(store.keys, config, "dead-replayer")
    other = DeadLetterQueue(store, config, replayer_id="replayer-b")
    (dlq_id,) = park(other, 1)
    claimed = first.decode_claim(dlq_id, store.run(first.claim(dlq_id)))  # then "dies"
    assert isinstance(claimed, _Claimed)
    ran: list[str] = []
    busy = other.replay(dlq_id, lambda r: ran.append(r.dlq_id))
    assert busy.outcome is ReplayOutcome.CLAIMED_ELSEWHERE
    assert ran == []
    rec = other.get(dlq_id)
    assert rec is not None and rec.claimed_by == "dead-replayer"
    assert rec.claim_expires_at is not None
    sleep_until(raw, rec.claim_expires_at)
    with capture_logs() as logs:
        assert other.replay(dlq_id, lambda r: ran.append(r.dlq_id)).replayed
    assert ran == [dlq_id]
    assert [e["claim_taken_over"] for e in logs if e["event"] == "durability_dlq_replayed"] == [
        True
    ]


def test_a_replayer_whose_claim_was_taken_over_cannot_mark_the_record(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    config = DlqConfig(claim_ttl_seconds=0.3)
    slow = DeadLetterQueue(store, config, replayer_id="slow")
    fast = DeadLetterQueue(store, config, replayer_id="fast")
    (dlq_id,) = park(slow, 1)
    inner: list[Any] = []

    def slow_handler(record: DlqRecord) -> None:
        assert record.claim_expires_at is not None
        sleep_until(raw, record.claim_expires_at)
        inner.append(fast.replay(dlq_id, lambda r: None))  # takes over, finishes

    result = slow.replay(dlq_id, slow_handler)
    assert inner[0].outcome is ReplayOutcome.REPLAYED
    assert result.outcome is ReplayOutcome.CLAIM_LOST
    rec = slow.get(dlq_id)
    assert rec is not None and rec.replayed_by == "fast"


def test_replay_pending_replays_oldest_first_by_type_up_to_the_limit(
    dlq: DeadLetterQueue,
) -> None:
    wiki = park(dlq, 5)
    mcp = park(dlq, 3, "mcp_call")
    order: list[str] = []
    summary = dlq.replay_pending(lambda r: order.append(r.dlq_id), operation_type="wiki_write",
                                 limit=3)
    assert order == wiki[:3]
    assert (summary.replayed, summary.failed, summary.skipped) == (3, 0, 0)

    def picky(record: DlqRecord) -> None:
        order.append(record.dlq_id)
        if record.dlq_id == mcp[1]:
            raise TimeoutError("again")

    summary = dlq.replay_pending(picky)
    assert order[3:] == wiki[3:] + mcp
    assert (summary.replayed, summary.failed) == (4, 1)
    assert summary.failed_ids == (mcp[1],)
    assert [r.dlq_id for r in dlq.list_pending()] == [mcp[1]]


def test_replay_pending_paces_handler_starts_to_max_per_second(dlq: DeadLetterQueue) -> None:
    park(dlq, 4)
    ran: list[str] = []
    started = time.monotonic()
    summary = dlq.replay_pending(lambda r: ran.append(r.dlq_id), max_per_second=10)
    elapsed = time.monotonic() - started
    assert summary.replayed == len(ran) == 4
    assert elapsed >= 0.3  # four starts at 10/s: three gaps of 0.1 s at least


# --- expiry (must show 6) -------------------------------------------------------------------


def test_expired_records_are_not_listed_and_cleanup_expired_removes_them(
    store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    dlq = DeadLetterQueue(store)
    short = park(dlq, 3, ttl_seconds=0.5)
    dlq.mark_replayed(short[1])
    dlq.abandon(short[2])
    keep = park(dlq, 2, "mcp_call")
    records = [dlq.get(i) for i in short]
    assert all(r is not None for r in records)
    # The three were enqueued one after another: wait for the LAST to expire.
    sleep_until(raw, max(r.expires_at for r in records if r is not None))

    # Expired, not cleaned up yet: invisible everywhere.
    assert all(dlq.get(i) is None for i in short)
    assert [r.dlq_id for r in dlq.list_pending()] == keep
    assert [r.dlq_id for r in dlq.list_all().records] == keep
    assert dlq.list_all().pending_count == 2
    assert dlq.pending_count() == 2 and dlq.pending_count("wiki_write") == 0
    stats = dlq.stats()
    assert stats.total == 2 and stats.expired_awaiting_cleanup == 3
    assert "wiki_write" not in stats.by_operation_type
    assert dlq.replay(short[0], lambda r: None).outcome is ReplayOutcome.NOT_FOUND
    assert raw.xlen(key(namespace, "stream")) == 5  # still in the log

    assert dlq.cleanup_expired() == 3
    assert raw.xlen(key(namespace, "stream")) == 2
    assert all(raw.exists(key(namespace, "rec", i)) == 0 for i in short)
    assert raw.zcard(key(namespace, "expiry")) == 2
    assert raw.zcard(key(namespace, "pending")) == 2
    assert raw.zcard(key(namespace, "pending-by-op")) == 2
    # (the one that expired pending is reported: counted as expired)
    assert raw.hgetall(key(namespace, "counts")) == {
        b"pending|mcp_call": b"2", b"expired|wiki_write": b"1"}
    assert dlq.stats().expired_awaiting_cleanup == 0
    assert dlq.cleanup_expired() == 0
    assert [r.dlq_id for r in dlq.list_pending()] == keep


def test_cleanup_expired_works_through_every_batch(
    store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    dlq = DeadLetterQueue(store, DlqConfig(cleanup_batch_size=2))
    (keep,) = park(dlq, 1)
    ids = park(dlq, 7, ttl_seconds=0.2)
    sleep_until(raw, dlq.get(ids[-1]).expires_at)  # type: ignore[union-attr]
    assert dlq.cleanup_expired() == 7
    assert [sid for sid, _ in raw.xrange(key(namespace, "stream"))] == [
        dlq.get(keep).stream_id.encode()  # type: ignore[union-attr]
    ]


def test_when_every_record_has_expired_the_dlq_keys_wait_for_the_cleanup_that_reports_them(
    store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    # (issue 35: they used to vanish with the last expiry, unreported)
    dlq = DeadLetterQueue(store)
    ids = park(dlq, 3, ttl_seconds=0.2)
    dlq.mark_replayed(ids[0])
    assert len(keys_matching(raw, f"{namespace}:*")) == 3 + 6  # + the log stream
    sleep_until(raw, dlq.get(ids[-1]).expires_at)  # type: ignore[union-attr]
    assert len(keys_matching(raw, f"{namespace}:*")) == 6  # the record hashes went
    assert dlq.list_all() == ([], 0)
    assert dlq.cleanup_expired() == 3
    assert dlq.stats().expired == 2 and dlq.stats().total == 0
    # What is left (the emptied stream, the counts of expired records, the log)
    # still goes by itself, a day after the last record's expiry at the latest.
    for k in keys_matching(raw, f"{namespace}:*"):
        assert 0 < raw.pttl(k) <= 86400_000 + 1000, k


def test_each_enqueue_purges_a_few_expired_records_on_the_way(
    store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    dlq = DeadLetterQueue(store, DlqConfig(purge_per_enqueue=2))
    park(dlq, 1, "mcp_call")
    old = park(dlq, 3, ttl_seconds=0.2)
    sleep_until(raw, dlq.get(old[-1]).expires_at)  # type: ignore[union-attr]
    park(dlq, 1)
    assert raw.xlen(key(namespace, "stream")) == 3  # 1 + 3 + 1, 2 purged
    assert dlq.stats().expired_awaiting_cleanup == 1
    park(dlq, 1)
    assert raw.xlen(key(namespace, "stream")) == 3  # + 1, the last expired one purged
    assert dlq.cleanup_expired() == 0
    assert dlq.pending_count() == 3


def test_every_dlq_key_has_a_ttl_a_day_past_its_longest_lived_record(
    store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    dlq = DeadLetterQueue(store)
    ids = park(dlq, 2, ttl_seconds=60) + park(dlq, 1, "mcp_call", ttl_seconds=3600)
    dlq.mark_replayed(ids[0])
    dlq.abandon(ids[2])
    keys = keys_matching(raw, f"{namespace}:*")
    assert len(keys) == 3 + 6  # 3 record hashes, stream, expiry, pending, by-op, counts, log
    for k in keys:
        ttl = raw.pttl(k)
        if b":rec:" in k:
            assert 0 < ttl <= 3600_000
        else:
            # (a day past the record: the grace in which a cleanup reports expired ones)
            assert 3590_000 + 86400_000 < ttl <= 3600_000 + 86400_000, k


# --- payloads, metadata, ids -------------------------------------------------------------


def test_operations_that_are_not_json_round_trip_through_msgpack(dlq: DeadLetterQueue) -> None:
    value = {"blob": b"\x00\xff\x10", "n": 1}
    rec = dlq.get(dlq.enqueue("a", "memory_write", value, 2, "e"))
    assert rec is not None and rec.original_operation == value
    rec = dlq.get(dlq.enqueue("a", "memory_write", {1: "int key"}, 2, "e"))
    assert rec is not None and rec.original_operation == {1: "int key"}


def test_metadata_is_stored_and_read_back(dlq: DeadLetterQueue) -> None:
    meta = {"idempotency_key": "agent-1:wiki_write:2cf24dba", "payload": "aGVsbG8="}
    rec = dlq.get(dlq.enqueue("a", "wiki_write", {}, 1, "e", metadata=meta))
    assert rec is not None and dict(rec.metadata) == meta


def test_enqueue_with_a_chosen_id_is_idempotent_while_the_record_lives(
    dlq: DeadLetterQueue, raw: redis.Redis, namespace: str
) -> None:
    first = dlq.enqueue("a", "wiki_write", {"v": 1}, 1, "e", dlq_id="agent-1:wiki_write:abc")
    again = dlq.enqueue("a", "wiki_write", {"v": 2}, 1, "e", dlq_id="agent-1:wiki_write:abc")
    assert first == again == "agent-1:wiki_write:abc"
    rec = dlq.get(first)
    assert rec is not None and rec.original_operation == {"v": 1}
    assert raw.xlen(key(namespace, "stream")) == 1
    assert dlq.pending_count() == 1


def test_a_chosen_id_can_be_reused_after_expiry_without_cleanup_deleting_the_new_record(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    dlq = DeadLetterQueue(store, DlqConfig(purge_per_enqueue=0))
    dlq.enqueue("a", "mcp_call", "keeps the log alive", 1, "e")
    old = dlq.enqueue("a", "wiki_write", "old", 1, "e", ttl_seconds=0.2, dlq_id="same-id")
    rec = dlq.get(old)
    assert rec is not None
    sleep_until(raw, rec.expires_at)
    dlq.enqueue("a", "wiki_write", "new", 1, "e", dlq_id="same-id")
    assert dlq.cleanup_expired() == 1
    rec = dlq.get("same-id")
    assert rec is not None and rec.original_operation == "new"
    assert dlq.pending_count("wiki_write") == 1


# --- foreign data -------------------------------------------------------------------------


def test_foreign_data_at_the_stream_key_raises_corrupt_data_naming_it(
    dlq: DeadLetterQueue, raw: redis.Redis, namespace: str
) -> None:
    raw.set(key(namespace, "stream"), "not a stream")
    with pytest.raises(CorruptData) as err:
        dlq.enqueue("a", "wiki_write", {}, 1, "e")
    assert err.value.key == key(namespace, "stream")


def test_a_garbage_record_hash_raises_corrupt_data_naming_it(
    dlq: DeadLetterQueue, raw: redis.Redis, namespace: str
) -> None:
    (dlq_id,) = park(dlq, 1)
    rec_key = key(namespace, "rec", dlq_id)
    raw.hset(rec_key, "exp", "whenever")
    for action in (lambda: dlq.get(dlq_id), dlq.list_pending,
                   lambda: dlq.replay(dlq_id, lambda r: None), lambda: dlq.abandon(dlq_id)):
        with pytest.raises(CorruptData) as err:
            action()
        assert err.value.key == rec_key
    raw.delete(rec_key)
    raw.set(rec_key, "a string")
    with pytest.raises(CorruptData) as err:
        dlq.get(dlq_id)
    assert err.value.key == rec_key


def test_a_wrong_type_index_raises_corrupt_data_naming_it(
    dlq: DeadLetterQueue, raw: redis.Redis, namespace: str
) -> None:
    raw.set(key(namespace, "pending"), "x")
    with pytest.raises(CorruptData) as err:
        dlq.list_pending()
    assert err.value.key == key(namespace, "pending")
    with pytest.raises(CorruptData) as err:
        dlq.stats()
    assert err.value.key == key(namespace, "pending")


# --- pipelining (the composed layer) -----------------------------------------------------


def test_enqueue_calls_pipeline_with_other_scripts_in_one_round_trip(
    store: durabilis.Store,
) -> None:
    o = _DlqOps(store.keys, DlqConfig(), "layer")
    guard = durabilis.idempotency.IdempotencyGuard(store)
    call = o.enqueue("a", "wiki_write", {"x": 1}, 3, "e", metadata={"idempotency_key": "k"})
    idem_key = durabilis.IdempotencyKey.from_raw("k")
    replies = store.run_many([call, guard._ops.check(idem_key)])
    enqueued = o.decode_enqueue(call, replies[0])
    assert enqueued.created and enqueued.pending == 1
    rec = DeadLetterQueue(store).get(enqueued.dlq_id)
    assert rec is not None and rec.metadata == {"idempotency_key": "k"}


# --- the Lua clock formatting ------------------------------------------------------------


def test_lua_iso_timestamps_match_python_for_tricky_dates(raw: redis.Redis) -> None:
    source = (LUA / "dlq_enqueue.lua").read_text()
    block = re.search(r"-- iso_utc:begin.*?\n(.*)-- iso_utc:end", source, re.S)
    assert block is not None
    script = block.group(1) + "\nlocal out = {}\nfor i, a in ipairs(ARGV) do " \
        "out[i] = iso_utc(tonumber(a)) end\nreturn out"
    moments = [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(2000, 2, 29, 23, 59, 59, 999000, tzinfo=UTC),
        datetime(2024, 2, 29, 12, 0, 0, 1000, tzinfo=UTC),
        datetime(2100, 3, 1, tzinfo=UTC),
        datetime(2023, 12, 31, 23, 59, 59, tzinfo=UTC),
        datetime(2400, 12, 31, 0, 0, 0, 500000, tzinfo=UTC),
    ]
    ms = [int(m.timestamp() * 1000) for m in moments]
    got = [v.decode() for v in raw.eval(script, 0, *ms)]
    want = [m.strftime("%Y-%m-%dT%H:%M:%S.") + f"{m.microsecond // 1000:03d}Z" for m in moments]
    assert got == want


# --- the async twin ----------------------------------------------------------------------


def test_the_async_twin_enqueues_lists_replays_and_cleans_up(
    redis_url: str, namespace: str
) -> None:
    async def scenario() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            dlq = AsyncDeadLetterQueue(store, replayer_id="async-replayer")
            ids = [await dlq.enqueue("a", "wiki_write", {"i": i}, 1, "e") for i in range(3)]
            short = await dlq.enqueue("a", "mcp_call", "x", 1, "e", ttl_seconds=0.2)
            assert (await dlq.get(ids[0])).status is DlqStatus.PENDING  # type: ignore[union-attr]
            assert await dlq.get("0123456789abcdef0123456789abcdef") is None
            assert [r.dlq_id for r in await dlq.list_pending("wiki_write")] == ids
            assert await dlq.pending_count() == 4

            seen: list[str] = []

            async def handler(record: DlqRecord) -> None:
                await asyncio.sleep(0)
                seen.append(record.dlq_id)

            assert (await dlq.replay(ids[0], handler)).replayed
            assert await dlq.abandon(ids[1]) is True
            assert await dlq.mark_replayed(ids[1]) is False
            summary = await dlq.replay_pending(handler, operation_type="wiki_write")
            assert summary.replayed == 1 and seen == [ids[0], ids[2]]
            records, pending = await dlq.list_all()
            assert [r.dlq_id for r in records] == [*ids, short]
            assert pending == 1
            await asyncio.sleep(0.3)
            assert await dlq.cleanup_expired() == 1
            stats = await dlq.stats()
            assert stats.by_status[DlqStatus.REPLAYED] == 2 and stats.pending == 0
        finally:
            await store.close()

    asyncio.run(scenario())


# --- an interrupted replay ---------------------------------------------------------------


def run_async_dlq(
    redis_url: str, namespace: str, body: Any, config: DlqConfig | None = None,
    **store_options: Any,
) -> None:
    """``await body(dlq, store)`` with an AsyncDeadLetterQueue on its own store."""
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace, **store_options)
        try:
            await body(AsyncDeadLetterQueue(store, config, replayer_id="async-replayer"), store)
        finally:
            await store.close()

    asyncio.run(main())


def test_a_replay_cancelled_inside_its_handler_releases_the_claim_and_counts_nothing(
    redis_url: str, namespace: str
) -> None:
    async def scenario(dlq: AsyncDeadLetterQueue, store: Any) -> None:
        dlq_id = await dlq.enqueue("a", "wiki_write", {"i": 1}, 3, "NETWORK_TIMEOUT")
        started = asyncio.Event()

        async def hangs(record: DlqRecord) -> None:
            started.set()
            await asyncio.sleep(30)

        task = asyncio.create_task(dlq.replay(dlq_id, hangs))
        await started.wait()
        with capture_logs() as logs:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        [note] = [e for e in logs if e["event"] == "durability_dlq_replay_interrupted"]
        assert note["interruption"] == "CancelledError" and note["claim_released"] is True
        rec = await dlq.get(dlq_id)
        assert rec is not None and rec.status is DlqStatus.PENDING
        assert rec.claimed_by is None  # not held until claim_ttl_seconds (300 s)
        assert rec.replay_attempts == 0 and rec.last_error == "NETWORK_TIMEOUT"
        ran: list[str] = []

        async def works(record: DlqRecord) -> None:
            ran.append(record.dlq_id)

        assert (await dlq.replay(dlq_id, works)).outcome is ReplayOutcome.REPLAYED
        assert ran == [dlq_id]

    run_async_dlq(redis_url, namespace, scenario)


def test_a_cancellation_after_a_plain_handler_returned_marks_the_record_replayed_first(
    redis_url: str, namespace: str
) -> None:
    # A plain handler runs in a worker thread and is waited for: its outcome is
    # known, so it is noted before the cancellation is raised (not left to run
    # again once the claim expires).
    async def scenario(dlq: AsyncDeadLetterQueue, store: Any) -> None:
        dlq_id = await dlq.enqueue("a", "wiki_write", {"i": 1}, 3, "NETWORK_TIMEOUT")
        ran: list[str] = []

        def slow(record: DlqRecord) -> None:
            time.sleep(0.3)
            ran.append(record.dlq_id)

        with pytest.raises(asyncio.TimeoutError):  # (wait_for's cancellation)
            await asyncio.wait_for(dlq.replay(dlq_id, slow), timeout=0.1)
        rec = await dlq.get(dlq_id)
        assert ran == [dlq_id]
        assert rec is not None and rec.status is DlqStatus.REPLAYED
        assert (await dlq.replay(dlq_id, slow)).outcome is ReplayOutcome.NOT_PENDING
        assert ran == [dlq_id]

    run_async_dlq(redis_url, namespace, scenario)


def test_a_keyboard_interrupt_in_a_sync_handler_releases_the_claim_and_propagates(
    dlq: DeadLetterQueue,
) -> None:
    (dlq_id,) = park(dlq, 1)

    def interrupted(record: DlqRecord) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dlq.replay(dlq_id, interrupted)
    rec = dlq.get(dlq_id)
    assert rec is not None and rec.status is DlqStatus.PENDING and rec.claimed_by is None
    assert rec.replay_attempts == 0
    assert dlq.replay(dlq_id, lambda r: None).outcome is ReplayOutcome.REPLAYED


def test_a_cancelled_pass_stops_after_the_handler_it_was_running(
    redis_url: str, namespace: str
) -> None:
    # Plain handlers run in a worker thread and are waited for: the pass's
    # cancellation is held back while one runs, and delivered before the next
    # record is claimed (not after the page of up to 100 records).
    async def scenario(dlq: AsyncDeadLetterQueue, store: Any) -> None:
        ids = [await dlq.enqueue("a", "wiki_write", {"i": i}, 3, "E") for i in range(8)]
        ran: list[str] = []

        def slow(record: DlqRecord) -> None:
            ran.append(record.dlq_id)
            time.sleep(0.2)

        task = asyncio.create_task(dlq.replay_pending(slow))
        while len(ran) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ran == ids[:2]
        for dlq_id in ids:
            rec = await dlq.get(dlq_id)
            assert rec is not None and rec.claimed_by is None
            assert rec.status is (
                DlqStatus.REPLAYED if dlq_id in ran else DlqStatus.PENDING)

    run_async_dlq(redis_url, namespace, scenario)


def test_a_sweep_that_cancels_the_note_of_a_handler_s_success_does_not_run_it_again(
    redis_url: str, namespace: str
) -> None:
    # A shutdown sweep (every task of the loop cancelled, as at asyncio.run's
    # end) cancels the shielded note's own task while it waits for the store's
    # only connection: the note is sent again, so the record is replayed and
    # the handler, which completed, is not left to run once the claim expires.
    async def scenario(dlq: AsyncDeadLetterQueue, store: Any) -> None:
        dlq_id = await dlq.enqueue("a", "wiki_write", {"i": 1}, 3, "E")
        loop = asyncio.get_running_loop()

        async def hold_the_connection() -> None:
            with contextlib.suppress(BaseException):
                await store.command("BLPOP", key(namespace, "blocker"), 1)

        ran: list[str] = []

        def handler(record: DlqRecord) -> None:
            ran.append(record.dlq_id)
            asyncio.run_coroutine_threadsafe(hold_the_connection(), loop)
            time.sleep(0.1)

        task = asyncio.ensure_future(dlq.replay(dlq_id, handler))
        await asyncio.sleep(0.3)  # the handler returned; its note waits for the connection
        for other in asyncio.all_tasks():
            if other is not asyncio.current_task():
                other.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        rec = await dlq.get(dlq_id)
        assert rec is not None and rec.status is DlqStatus.REPLAYED
        await asyncio.sleep(2.2)  # past the claim's expiry
        outcome = (await dlq.replay(dlq_id, handler)).outcome
        assert outcome is ReplayOutcome.NOT_PENDING and ran == [dlq_id]

    run_async_dlq(redis_url, namespace, scenario, DlqConfig(claim_ttl_seconds=2),
                  max_connections=1)


def test_a_claim_whose_reply_was_lost_is_sent_again_and_gets_its_own_claim_back(
    store: durabilis.Store, dlq: DeadLetterQueue
) -> None:
    (dlq_id,) = park(dlq, 1)
    lost = lose_replies(store, "dlq_claim", landed=True, times=1)
    ran: list[str] = []
    result = dlq.replay(dlq_id, lambda r: ran.append(r.dlq_id))
    assert lost == [0] and result.outcome is ReplayOutcome.REPLAYED and ran == [dlq_id]
    rec = dlq.get(dlq_id)
    assert rec is not None and rec.status is DlqStatus.REPLAYED and rec.claimed_by is None


def test_a_note_that_cannot_be_sent_is_given_up_after_the_resend_limit_not_the_claim_ttl(
    store: durabilis.Store, dlq: DeadLetterQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # While Redis cannot take the note, a signal or a cancellation waits: for
    # at most _RESEND_SECONDS (30 s), not the claim's 300 s.
    monkeypatch.setattr(durabilis.dlq._replay, "_RESEND_SECONDS", 0.5)
    (dlq_id,) = park(dlq, 1)
    lose_replies(store, "dlq_finish", landed=False, times=1000)
    began = time.monotonic()
    with pytest.raises(durabilis.StorageUnavailable):
        dlq.replay(dlq_id, lambda r: None)
    assert time.monotonic() - began < 5


def test_a_failed_replay_whose_note_landed_but_lost_its_reply_is_still_failed(
    store: durabilis.Store, dlq: DeadLetterQueue
) -> None:
    (dlq_id,) = park(dlq, 1)
    lost = lose_replies(store, "dlq_fail", landed=True, times=1)

    def down(record: DlqRecord) -> None:
        raise durabilis.OperationError("SERVICE_UNAVAILABLE", "still down")

    result = dlq.replay(dlq_id, down)
    assert lost == [0] and result.outcome is ReplayOutcome.FAILED  # not CLAIM_LOST
    rec = dlq.get(dlq_id)
    assert rec is not None and rec.replay_attempts == 1 and rec.claimed_by is None
    assert rec.last_error == "SERVICE_UNAVAILABLE: still down"


def test_a_script_error_is_raised_at_once_never_sent_again_for_the_resend_limit(
    dlq: DeadLetterQueue, raw: redis.Redis
) -> None:
    # Only a lost reply (StorageUnavailable) is sent again: foreign data that
    # makes the claim's script fail fails the same way on every try.
    (dlq_id,) = park(dlq, 1)
    raw.hset(dlq._ops.record_key(dlq_id), "cn", "not a number")
    began = time.monotonic()
    with pytest.raises(durabilis.DurabilisError) as failed:
        dlq.replay(dlq_id, lambda r: None)
    assert not isinstance(failed.value, durabilis.StorageUnavailable)
    assert time.monotonic() - began < 5  # not 30 s of tries


def test_an_id_given_twice_to_purge_or_requeue_counts_once(
    dlq: DeadLetterQueue, raw: redis.Redis, namespace: str
) -> None:
    gone, kept, marked = park(dlq, 3)
    assert dlq.purge([gone, gone]) == {gone: "purged"}
    stats = dlq.stats()
    assert (stats.total, stats.by_status[DlqStatus.PENDING]) == (2, 2)
    assert [r.outcome for r in dlq.requeue([marked, marked], by="ann")] == ["requeued"] * 2
    stats = dlq.stats()
    assert (stats.total, stats.by_status[DlqStatus.PENDING]) == (2, 2)
    changes = [(f[b"dlq_id"].decode(), f[b"change"].decode())
               for _, f in raw.xrange(key(namespace, "log"))]
    assert changes.count((gone, "purged")) == 1 and changes.count((marked, "requeued")) == 1
    assert dlq.get(kept) is not None


def test_an_id_given_twice_to_abandon_many_is_abandoned_once_and_reported_so(
    dlq: DeadLetterQueue,
) -> None:
    (gone,) = park(dlq, 1)
    assert dlq.abandon_many([gone, gone]) == {gone: True}
    record = dlq.get(gone)
    assert record is not None and record.status is DlqStatus.ABANDONED
