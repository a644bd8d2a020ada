"""Faults of one Redis server under a load of idempotent operations from real processes.

Each test runs the same load (``tests/support/workload.py``: three worker
processes, two on the sync guard and one on the async guard, racing for every
operation), injects one fault in the middle, and shows: callers only ever get
``StorageUnavailable`` (bounded in time), service comes back by itself, and
every operation ran exactly once (side effects counted in Redis and by the
workers), with its result stored.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest

import durabilis
from durabilis.idempotency import IdempotencyGuard, New
from durabilis.testing import RedisServer
from tests.support import figures
from tests.support.workload import LoadResult, run_load, stored_records_disagreeing

pytestmark = [pytest.mark.topologies("cluster"), pytest.mark.serial]

SOCKET_TIMEOUT = 0.5
# Slack for a loaded 2-core machine on top of the socket timeout: a bound that
# shows nothing hangs, not a speed target.
SLACK = 0.75


def assert_exactly_once(url: str, namespace: str, res: LoadResult) -> None:
    assert res.spanned_the_fault, "the load ended before the fault did: " + res.summary()
    assert res.unexpected == [], res.summary()
    assert res.unfinished == [], res.summary()
    assert res.lease_lost == [], res.summary()
    assert res.doubled == [], res.summary()
    assert res.lost == [], res.summary()
    assert stored_records_disagreeing(url, namespace, res) == []


def note(test: str, fault: str, backend: str, res: LoadResult) -> None:
    spans = res.unavailable
    figures.record(test, fault, backend, ops=len(res.ops), lost=len(res.lost),
                   doubled=len(res.doubled), unavailable=len(spans),
                   longest_unavailable_s=max((e - s for s, e in spans), default=0.0),
                   ran_during_fault=res.executed_during_fault)


@pytest.mark.standalone_only  # its own server; the session one only counts side effects
def test_redis_paused_2s_under_load_gives_storage_unavailable_in_time_then_recovers_exactly_once(
    private_redis: RedisServer, namespace: str, redis_url: str
) -> None:
    def pause() -> None:
        private_redis.signal(signal.SIGSTOP)
        try:
            time.sleep(2.0)
        finally:
            private_redis.signal(signal.SIGCONT)

    ops = [f"paused-{i}" for i in range(300)]
    res = run_load(private_redis.url, namespace, ops, pause, effects_url=redis_url,
                   hot="paused-hot", socket_timeout=SOCKET_TIMEOUT, lease_s=4.0, work_s=0.003,
                   deadline_s=25)
    spans = res.unavailable
    assert spans, "the pause was not felt: " + res.summary()
    longest = max(e - s for s, e in spans)
    assert longest <= SOCKET_TIMEOUT + SLACK, res.summary()  # nothing hangs
    _, resumed = res.fault_window
    assert max(s for s, _ in spans) <= resumed + SLACK, res.summary()  # then service is back
    assert_exactly_once(private_redis.url, namespace, res)
    note("sigstop", "SIGSTOP 2 s (standalone)", "standalone", res)


@pytest.mark.standalone_only
def test_redis_killed_and_restarted_loses_no_completed_record_and_runs_nothing_twice(
    private_redis: RedisServer, namespace: str, redis_url: str
) -> None:
    def kill_and_restart() -> None:
        private_redis.stop(kill=True)  # SIGKILL: no shutdown save, only the AOF (fsync always)
        time.sleep(0.5)
        private_redis.start()

    ops = [f"killed-{i}" for i in range(300)]
    res = run_load(private_redis.url, namespace, ops, kill_and_restart, effects_url=redis_url,
                   hot="killed-hot",
                   socket_timeout=SOCKET_TIMEOUT, lease_s=4.0, work_s=0.003, deadline_s=25)
    assert res.unavailable, "the kill was not felt: " + res.summary()
    assert max(e - s for s, e in res.unavailable) <= SOCKET_TIMEOUT + SLACK, res.summary()
    # A completed record lost by the restart would have been claimed and run
    # again (doubled), and its stored token would not be its first executor's.
    assert_exactly_once(private_redis.url, namespace, res)
    note("sigkill", "SIGKILL + restart (AOF fsync always)", "standalone", res)


def test_script_flush_in_a_loop_under_load_is_transparent(
    redis_url: str, namespace: str, raw: Any, backend: str
) -> None:
    flushes = 0
    pipelined_errors: list[BaseException] = []
    stop = threading.Event()

    def pipelined_claims() -> None:
        # Store.run_many (one pipeline on a standalone server) under the same flushes.
        with durabilis.connect(redis_url, namespace=namespace) as store:
            ops = IdempotencyGuard(store)._ops
            i = 0
            while not stop.is_set():
                keys = [ops.validate_key(f"piped-{i}-{j}") for j in range(3)]
                try:
                    replies = store.run_many([ops.claim(k, None) for k in keys])
                    assert all(isinstance(ops.decode_claim(k, r), New)
                               for k, r in zip(keys, replies, strict=True))
                except BaseException as exc:
                    pipelined_errors.append(exc)
                i += 1

    def flush_loop() -> None:
        nonlocal flushes
        piped = threading.Thread(target=pipelined_claims)
        piped.start()
        try:
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                raw.script_flush()
                flushes += 1
                time.sleep(0.002)
        finally:
            stop.set()
            piped.join(timeout=30)

    ops = [f"flushed-{i}" for i in range(1000)]
    # The hot key keeps every worker busy until the flushing stops.
    res = run_load(redis_url, namespace, ops, flush_loop, fault_after_s=0.1, hot="flushed-hot",
                   socket_timeout=2.0, lease_s=10.0, work_s=0.003, deadline_s=25)
    assert flushes > 50
    assert res.executed_during_fault > 100, res.summary()
    assert res.unavailable == [], res.summary()  # transparent: zero errors
    assert pipelined_errors == []
    assert_exactly_once(redis_url, namespace, res)
    note("script-flush", f"SCRIPT FLUSH x{flushes} in 2 s ({backend})", backend, res)


@pytest.mark.standalone_only
def test_a_timed_out_claim_is_never_resent_and_the_one_sent_lands_once_after_the_pause(
    private_redis: RedisServer, namespace: str
) -> None:
    # Why the client never retries: the claim sent into the pause still runs
    # when Redis wakes up. Re-sent, it would meet itself and answer Duplicate.
    with durabilis.connect(private_redis.url, namespace=namespace, socket_timeout=0.3,
                           socket_connect_timeout=0.3) as store:
        guard = IdempotencyGuard(store)
        guard.check_and_record("warm-up")
        private_redis.signal(signal.SIGSTOP)
        try:
            began = time.monotonic()
            with pytest.raises(durabilis.StorageUnavailable):
                guard.check_and_record("sent-into-the-pause", placeholder="the only claim")
            assert time.monotonic() - began <= 0.3 + SLACK
        finally:
            private_redis.signal(signal.SIGCONT)
        landed = guard.check("sent-into-the-pause")
        assert landed is not None and landed.in_progress
        assert landed.original_result == "the only claim"
