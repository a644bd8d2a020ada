"""Cross-process DLQ replay guarantees, shown with real processes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from datetime import UTC, datetime

import pytest
import redis

import durabilis
from durabilis.dlq import DeadLetterQueue, DlqConfig, DlqRecord, DlqStatus, _DlqOps
from tests.integration._dlq_workers import (
    calls_key,
    done_key,
    replay_all,
    replay_and_hang_on,
)

pytestmark = pytest.mark.serial

RECORDS = 1000
REPLAYERS = 4
CLAIM_TTL = 2.0


def server_now(raw: redis.Redis) -> datetime:
    secs, micros = raw.time()
    return datetime.fromtimestamp(secs + micros / 1e6, tz=UTC)


def park(store: durabilis.Store, n: int) -> list[str]:
    ops = _DlqOps(store.keys, DlqConfig(), "test")
    calls = [ops.enqueue("agent-1", "wiki_write", {"n": i}, 3, "NETWORK_TIMEOUT") for i in range(n)]
    replies = store.run_many(calls)
    return [ops.decode_enqueue(c, r).dlq_id for c, r in zip(calls, replies, strict=True)]


def test_four_processes_replaying_at_once_run_each_of_1000_records_exactly_once(
    redis_url: str, namespace: str, store: durabilis.Store, raw: redis.Redis
) -> None:
    ids = park(store, RECORDS)
    ctx = multiprocessing.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=replay_all, args=(redis_url, namespace, 30.0, ready, go, out, i))
        for i in range(REPLAYERS)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    go.set()  # every replayer is connected: start them together
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0

    calls = {k.decode(): int(v) for k, v in raw.hgetall(calls_key(namespace)).items()}
    assert sum(calls.values()) == RECORDS  # handler invocations, counted in Redis
    assert sorted(calls) == sorted(ids) and set(calls.values()) == {1}
    assert sum(r[1] for r in results) == RECORDS
    assert sum(r[2] for r in results) == 0 and sum(r[4] for r in results) == 0
    assert sum(1 for r in results if r[1] > 0) >= 2  # they really ran side by side
    dlq = DeadLetterQueue(store)
    assert dlq.pending_count() == 0
    assert dlq.stats().by_status[DlqStatus.REPLAYED] == RECORDS


def test_a_replayer_killed_mid_replay_leaves_its_record_to_another_after_the_claim_expires(
    redis_url: str, namespace: str, store: durabilis.Store, raw: redis.Redis
) -> None:
    ids = park(store, 10)
    target = ids[4]
    ctx = multiprocessing.get_context("spawn")
    doomed = ctx.Process(target=replay_and_hang_on, args=(redis_url, namespace, CLAIM_TTL, target))
    doomed.start()
    deadline = time.monotonic() + 20
    while raw.get(f"{namespace}:test:hanging") is None:
        assert time.monotonic() < deadline and doomed.is_alive()
        time.sleep(0.02)
    assert doomed.pid is not None
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(timeout=10)
    assert doomed.exitcode == -signal.SIGKILL

    dlq = DeadLetterQueue(store, DlqConfig(claim_ttl_seconds=CLAIM_TTL), replayer_id="survivor")
    held = dlq.get(target)
    assert held is not None and held.status is DlqStatus.PENDING
    assert held.claimed_by == "doomed-replayer" and held.claim_expires_at is not None

    def handler(record: DlqRecord) -> None:
        raw.hincrby(calls_key(namespace), record.dlq_id, 1)
        raw.hincrby(done_key(namespace), record.dlq_id, 1)

    # While the dead replayer's claim lasts, its record is skipped, not run twice at once.
    first = dlq.replay_pending(handler)
    if server_now(raw) < held.claim_expires_at:  # (a very slow machine may already be past it)
        assert (first.replayed, first.skipped) == (5, 1)
        assert dlq.get(target).status is DlqStatus.PENDING  # type: ignore[union-attr]
    # After it expires, another process (this one) replays it.
    while server_now(raw) <= held.claim_expires_at:
        time.sleep(0.02)
    second = dlq.replay_pending(handler)
    assert first.replayed + second.replayed == 6
    assert first.failed == second.failed == 0
    assert dlq.replay_pending(handler).replayed == 0  # nothing is replayed twice

    done = {k.decode(): int(v) for k, v in raw.hgetall(done_key(namespace)).items()}
    calls = {k.decode(): int(v) for k, v in raw.hgetall(calls_key(namespace)).items()}
    assert done == {i: 1 for i in ids}  # none lost, none completed twice
    assert calls[target] == 2  # the killed attempt, then the one that finished
    assert all(calls[i] == 1 for i in ids if i != target)
    rec = dlq.get(target)
    assert rec is not None and rec.status is DlqStatus.REPLAYED
    assert rec.replayed_by == "survivor"
    assert all(dlq.get(i).status is DlqStatus.REPLAYED for i in ids)  # type: ignore[union-attr]
