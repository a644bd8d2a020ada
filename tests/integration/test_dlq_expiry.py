"""Issue 35, hole 9: nothing leaves the DLQ silently.

A pending record that reaches its TTL unreplayed is reported as it goes (an
event, a counter in ``dlq stats`` and the metrics, an ``expired`` entry in the
log stream with its operation type and idempotency key) by a cleanup that runs
on a schedule of its own, one replica per period; ``replay_pending`` meeting
one reports it; ``keep_pending`` keeps pending records past their TTL. And the
layer's ``parked`` counts operations, ``parkings`` every parking.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

import durabilis
from durabilis import CircuitBreakerConfig, IdempotencyConfig, IdempotencyKey, OperationError
from durabilis._steps import drive
from durabilis.dlq import DeadLetterQueue, DlqConfig, DlqStatus, ReplayOutcome
from durabilis.errors import LeaseLost
from durabilis.http import OrphanRecovery
from durabilis.layer import (
    AsyncDurabilityLayer,
    DurabilityConfig,
    DurabilityLayer,
    OperationContext,
)
from durabilis.metrics import DurabilisMetrics
from durabilis.testing import instant_retries
from tests.integration._layer_support import fast_config
from tests.integration._rotation_workers import NEW, OLD, dead_in_fn_worker
from tests.support.lossy import lose_replies

# Every DLQ script, the leases and the layer's counts step differ on Cluster.
pytestmark = pytest.mark.topologies("cluster")

SHORT = 0.3  # seconds: the TTL of the records that are meant to expire


def wait_for(condition: Callable[[], bool], what: str, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def park(dlq: DeadLetterQueue, n: int, ttl: float | None = SHORT, op: str = "wiki_write"
         ) -> list[str]:
    return [
        dlq.enqueue("agent-1", op, {"n": i}, 3, "NETWORK_TIMEOUT", ttl,
                    metadata={"idempotency_key": f"agent-1:{op}:key{i}"})
        for i in range(n)
    ]


def expired_entries(raw: Any, dlq: DeadLetterQueue) -> list[dict[bytes, bytes]]:
    return [f for _, f in raw.xrange(dlq._ops.log_key) if f.get(b"change") == b"expired"]


def expired_events(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "durability_dlq_expired"]


def test_expired_pending_records_are_reported_by_the_scheduled_cleanup_once_across_replicas(
    redis_url: str, namespace: str, store: durabilis.Store, raw: Any
) -> None:
    # Parked with a short TTL; one of them replayed (a replayed record's end
    # of life is no news). Then no new parking, no manual cleanup: only the
    # schedule of two replicas' recoveries runs.
    dlq = DeadLetterQueue(store, DlqConfig(default_ttl_seconds=SHORT))
    ids = park(dlq, 4)
    assert dlq.mark_replayed(ids[3])
    wait_for(lambda: all(dlq.get(i) is None for i in ids), "the records to expire")
    registry = CollectorRegistry()
    metrics = DurabilisMetrics(registry)

    async def main() -> list[Any]:
        layers = [AsyncDurabilityLayer(durabilis.aio.connect(redis_url, namespace=namespace))
                  for _ in range(2)]
        runs = [OrphanRecovery(x, every_seconds=0.05, dlq_cleanup_every_seconds=0.05,
                               holder=f"r{i}") for i, x in enumerate(layers)]
        try:
            for r in runs:
                r.start()
            end = time.monotonic() + 10
            while len(expired_entries(raw, dlq)) < 3 or (await layers[0].dlq.stats()).total:
                assert time.monotonic() < end, "the schedule never cleaned up"
                await asyncio.sleep(0.02)
            for _ in range(5):  # more periods: nothing is reported twice
                await asyncio.sleep(0.06)
            return [await r.health() for r in runs]
        finally:
            for r in runs:
                await r.stop()
            for x in layers:
                await x.close()
                await x.store.close()

    with capture_logs() as logs:
        health = asyncio.run(main())
    for event in logs:
        metrics.observe(event["event"], event["log_level"], event)
    entries = expired_entries(raw, dlq)
    assert sorted(e[b"dlq_id"].decode() for e in entries) == sorted(ids[:3])
    assert {e[b"operation_type"] for e in entries} == {b"wiki_write"}
    assert sorted(e[b"idempotency_key"] for e in entries) == [
        f"agent-1:wiki_write:key{i}".encode() for i in range(3)
    ]
    events = expired_events(logs)
    assert sorted(e["dlq_id"] for e in events) == sorted(ids[:3])  # each once, fleet-wide
    assert all(e["operation_type"] == "wiki_write" and e["idempotency_key"] for e in events)
    assert sum(h["dlq_cleanup"]["expired"] for h in health) == 3
    assert registry.get_sample_value(
        "durabilis_dlq_expired_total", {"operation_type": "wiki_write"}) == 3
    stats = dlq.stats()
    assert stats.exact and stats.expired_awaiting_cleanup == 0
    assert stats.total == 0 and stats.pending == 0 and stats.by_status[DlqStatus.REPLAYED] == 0
    assert stats.expired == 3 and stats.expired_by_operation_type == {"wiki_write": 3}


def test_cleanup_due_runs_on_one_replica_per_period(store: durabilis.Store, raw: Any) -> None:
    a = DeadLetterQueue(store, DlqConfig(default_ttl_seconds=SHORT), replayer_id="a")
    b = DeadLetterQueue(store, DlqConfig(default_ttl_seconds=SHORT), replayer_id="b")
    ids = park(a, 3)
    wait_for(lambda: all(a.get(i) is None for i in ids), "the records to expire")
    with capture_logs() as logs:
        first = a.cleanup_due(60.0)
        second = b.cleanup_due(60.0)  # the period's lease is a's
    assert first is not None and second is None
    assert first.removed == 3 and sorted(first.expired) == sorted(ids)
    assert len(expired_events(logs)) == 3 and len(expired_entries(raw, a)) == 3


def test_stats_count_expired_pending_records_before_cleanup_exactly(
    store: durabilis.Store,
) -> None:
    dlq = DeadLetterQueue(store, DlqConfig(default_ttl_seconds=SHORT))
    ids = park(dlq, 3)
    dlq.abandon(ids[2])
    kept = park(dlq, 1, ttl=3600, op="memory_write")[0]
    wait_for(lambda: all(dlq.get(i) is None for i in ids), "the records to expire")
    stats = dlq.stats()
    assert stats.exact and stats.expired_awaiting_cleanup == 3
    assert stats.total == 1 and stats.pending == 1 and stats.expired == 2
    assert stats.pending + stats.by_status[DlqStatus.REPLAYED] + stats.by_status[
        DlqStatus.ABANDONED] == stats.total
    assert dlq.get(kept) is not None


def test_replay_pending_reports_an_expired_record(store: durabilis.Store, raw: Any) -> None:
    dlq = DeadLetterQueue(store, DlqConfig(default_ttl_seconds=SHORT))
    ids = park(dlq, 2)
    wait_for(lambda: all(dlq.get(i) is None for i in ids), "the records to expire")
    seen: list[Any] = []
    with capture_logs() as logs:
        summary = dlq.replay_pending(seen.append)
    assert seen == []
    assert summary.expired == 2 and sorted(summary.expired_ids) == sorted(ids)
    assert summary.skipped == 0
    assert {e["outcome"] for e in logs if e["event"] == "durability_dlq_replay_expired"} == {
        ReplayOutcome.EXPIRED.value}
    assert sorted(e["dlq_id"] for e in expired_events(logs)) == sorted(ids)
    assert len(expired_entries(raw, dlq)) == 2
    stats = dlq.stats()
    assert stats.pending == 0 and stats.expired == 2 and stats.expired_awaiting_cleanup == 0


def test_keep_pending_keeps_pending_records_past_their_ttl_while_replayed_ones_expire(
    store: durabilis.Store, raw: Any
) -> None:
    dlq = DeadLetterQueue(store, DlqConfig(default_ttl_seconds=SHORT, keep_pending=True))
    kept, done = park(dlq, 2, ttl=None)
    assert dlq.mark_replayed(done)
    wait_for(lambda: dlq.get(done) is None, "the replayed record to expire")
    time.sleep(SHORT)  # (past the kept record's TTL too; nothing to wait for)
    assert dlq.cleanup_expired() == 1
    record = dlq.get(kept)
    assert record is not None and record.status is DlqStatus.PENDING
    assert expired_entries(raw, dlq) == []
    stats = dlq.stats()
    assert stats.pending == 1 and stats.expired == 0 and stats.total == 1
    # Once handled, it gets its lifetime from then on, and goes.
    assert dlq.abandon(kept)
    wait_for(lambda: dlq.get(kept) is None, "the abandoned record to expire")


def test_keep_pending_keeps_at_most_max_pending_records(store: durabilis.Store) -> None:
    dlq = DeadLetterQueue(
        store, DlqConfig(default_ttl_seconds=SHORT, keep_pending=True, max_pending=1)
    )
    with capture_logs() as logs:
        kept, over = park(dlq, 2, ttl=None)
    warned = [e for e in logs if e["event"] == "durability_dlq_max_pending_exceeded"]
    assert len(warned) == 1 and warned[0]["dlq_id"] == over and warned[0]["kept"] is False
    wait_for(lambda: dlq.get(over) is None, "the record over max_pending to expire")
    assert dlq.get(kept) is not None
    assert dlq.cleanup_expired() == 1 and dlq.stats().expired == 1


def test_n_deliveries_of_one_failing_operation_count_one_parked_and_n_parkings(
    store: durabilis.Store,
) -> None:
    # (a breaker that never trips: every delivery runs and is parked)
    layer = DurabilityLayer(store, fast_config(breaker=CircuitBreakerConfig(
        "svc", 1.0, 4, 1, 1, 10, 1)))

    def down(_ctx: Any) -> Any:
        raise OperationError("NETWORK_TIMEOUT", "down")

    with instant_retries():
        for _ in range(3):
            with pytest.raises(durabilis.RetryExhausted):
                layer.execute("agent-1", "job", {"n": 1}, down)
    totals = layer.stats()
    assert totals.parked == 1 and totals.parkings == 3
    assert layer.dlq.stats().pending == 1
    layer.close()


def test_keep_pending_is_a_config_field() -> None:
    assert DurabilityConfig(dlq=DlqConfig(keep_pending=True)).dlq.keep_pending is True


def test_a_parking_sent_again_after_a_lost_reply_counts_its_operation_once(
    store: durabilis.Store,
) -> None:
    layer = DurabilityLayer(store, fast_config(breaker=CircuitBreakerConfig(
        "svc", 1.0, 4, 1, 1, 10, 1)))
    lost = lose_replies(store, "dlq_enqueue", landed=True, times=1)

    def down(_ctx: Any) -> Any:
        raise OperationError("NETWORK_TIMEOUT", "down")

    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as parked:
        layer.execute("agent-1", "job", {"n": 1}, down)
    assert lost == [0] and parked.value.dlq_id is not None
    totals = layer.stats()  # the resend found its own record ("exists"): still one operation
    assert totals.parked == 1 and totals.parkings == 1
    assert layer.dlq.stats().pending == 1
    layer.close()


@pytest.mark.parametrize("then", ["settled", "purged"])
def test_a_parking_sent_again_late_after_the_operation_succeeded_parks_nothing(
    store: durabilis.Store, then: str,
) -> None:
    """Found by the third review of stop 39 (the simulator with faults in the
    keep-alive, seed 2777): a park step that landed but lost its reply is sent
    again later (its record step's retry, or the keep-alive). Meanwhile the
    released claim was taken by a redelivery, which succeeded and settled the
    DLQ record. The late parking made a new pending record of the completed
    operation, which a replay ran again once the dedup window had passed.

    ``settled``: the record still there, the enqueue alone finds its own
    parking in it ("exists"). ``purged`` (the fourth review): an operator
    purged the replayed record meanwhile, and the enqueue alone parked anew
    (a new pending record). Both are now met first by the parking's guard,
    which finds the operation completed: nothing of the step is written."""
    sent: list[tuple[Any, Any]] = []
    run_step = store.run_step

    def spy(calls: Any, gates: Any = None, waves: Any = None) -> Any:
        if any(c.name == "dlq_enqueue" for c in calls):
            sent.append((list(calls), gates))
        return run_step(calls, gates, waves)

    store.run_step = spy  # type: ignore[method-assign]
    layer = DurabilityLayer(store, fast_config(breaker=CircuitBreakerConfig(
        "svc", 1.0, 4, 1, 1, 10, 1)))

    def down(_ctx: Any) -> Any:
        raise OperationError("NETWORK_TIMEOUT", "down")

    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as parked:
        layer.execute("agent-1", "job", {"n": 7}, down)
    (calls, gates), = sent
    assert [c.name for c in calls[:2]] == ["idem_check", "dlq_enqueue"]
    assert layer.execute("agent-1", "job", {"n": 7}, lambda _ctx: "done") == "done"
    dlq_id = str(parked.value.dlq_id)
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.status is DlqStatus.REPLAYED  # settled by it
    if then == "purged":
        assert layer.dlq.purge([dlq_id], status="replayed") == {dlq_id: "purged"}
    else:  # (the enqueue alone: the record's own check, without the guard)
        alone = run_step(calls[1:], {i - 1: g for i, g in gates.items() if i})
        assert alone[0][0] == b"exists"
    again = run_step(calls, gates)  # the late parking, as the keep-alive sends it
    assert again.status[0] == "r" and again[0] == [b"done"]
    assert "c" not in again.status  # (nothing of the step written)
    assert layer.dlq.stats().pending == 0  # (before, purged: a new pending record)
    layer.close()


def test_a_parkings_guard_refuses_on_a_completed_record_or_without_a_claim_a_live_one(
    store: durabilis.Store,
) -> None:
    """The guard refuses on a completed record; a parking without a claim of
    its own (its breaker open before it claimed: mode G) also while another
    delivery holds a live claim. No record (a claim that expired), a claim
    whose lease ended, a tombstone or foreign data let the parking go (the
    reverted guard of stop 39 dropped such parkings and lost operations), and
    so does a record of another payload under a caller key reused (or none):
    not this operation."""
    layer = DurabilityLayer(store, fast_config())
    key = IdempotencyKey.caller("agent-1", "guarded-key", {"n": 1})  # (a fingerprint)
    assert key.fingerprint
    guards = {wait: layer._core._idem.parking_guard(key, wait=wait) for wait in (False, True)}
    (rkey,) = guards[True].keys
    now_ms = int(time.time() * 1000)
    fp, live = key.fingerprint, now_ms + 60_000
    states: dict[str, list[Any]] = {
        "none": [],
        "live claim": ["HSET", rkey, "s", "p", "le", live, "fp", fp],
        "ended claim": ["HSET", rkey, "s", "p", "le", now_ms - 1_000, "fp", fp],
        "tombstone": ["HSET", rkey, "s", "x", "fp", fp],
        "foreign": ["SET", rkey, "foreign"],
        "completed": ["HSET", rkey, "s", "d", "fp", fp],
        # (a caller key reused for another payload, or none: not this operation)
        "completed, other payload": ["HSET", rkey, "s", "d", "fp", "other"],
        "completed, no fingerprint": ["HSET", rkey, "s", "d"],
        "live claim, other payload": ["HSET", rkey, "s", "p", "le", live, "fp", "other"],
    }
    answers = {}
    for state, setup in states.items():
        store.command("DEL", rkey)
        if setup:
            store.command(*setup)
        answers[state] = tuple(store.run(g)[0].decode() for g in guards.values())
    store.command("DEL", rkey)
    assert answers == {  # (g: with a claim of its own, G: without)
        "none": ("open", "open"), "live claim": ("open", "held"),
        "ended claim": ("open", "open"), "tombstone": ("open", "open"),
        "foreign": ("open", "open"), "completed": ("done", "done"),
        "completed, other payload": ("open", "open"),
        "completed, no fingerprint": ("open", "open"),
        "live claim, other payload": ("open", "open"),
    }
    layer.close()


@pytest.mark.parametrize("other", ["holds", "completed"])
def test_a_parking_without_a_claim_gives_way_to_another_delivery_of_its_operation(
    store: durabilis.Store, redis_url: str, namespace: str, other: str,
) -> None:
    """Found by the simulator (seed 9676, beyond the default 2,000): a delivery
    whose claim step the open breaker refused (standalone: the fused step wrote
    nothing, no claim) parks the operation (``park_on_open``). Another delivery
    claimed the key in between, ran it and succeeded: its success did not
    settle a record parked behind its back, and the completed operation stayed
    pending, for a replay to run again once the dedup window had passed. Now
    the parking's guard gives way (nothing written) and the call claims again:
    a duplicate's answer (in progress; or the stored result)."""
    if not store.fuses:
        pytest.skip("on Cluster the claim lands before the breaker refuses: the parking "
                    "holds a claim of its own, so no other delivery can claim in between")
    layer = DurabilityLayer(store, fast_config())
    layer.breakers.force_open("svc")
    other_store = durabilis.connect(redis_url, namespace=namespace)
    theirs = DurabilityLayer(other_store, fast_config(dependencies={}))  # (no breaker)
    running, finish = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def run(_ctx: Any) -> str:
        running.set()
        if other == "holds":
            finish.wait(10)
        return "theirs"

    def deliver() -> None:
        outcome["other"] = theirs.execute("agent-1", "job", {"n": 9}, run)

    run_step = store.run_step
    delivery = threading.Thread(target=deliver)

    def spy(calls: Any, gates: Any = None, waves: Any = None) -> Any:
        if any(c.name == "dlq_enqueue" for c in calls) and not delivery.is_alive():
            delivery.start()  # (the other delivery claims between the two steps)
            assert running.wait(10)
            if other == "completed":
                delivery.join(10)
        return run_step(calls, gates, waves)

    store.run_step = spy  # type: ignore[method-assign]
    try:
        if other == "holds":
            with pytest.raises(durabilis.OperationInProgress):
                layer.execute("agent-1", "job", {"n": 9}, run, park_on_open=True)
            finish.set()
            delivery.join(10)
        else:
            assert layer.execute("agent-1", "job", {"n": 9}, run, park_on_open=True) == "theirs"
        assert outcome == {"other": "theirs"}
        assert layer.dlq.stats().pending == 0  # (before: parked, and left pending)
    finally:
        finish.set()
        layer.close()
        theirs.close()
        other_store.close()


@pytest.mark.parametrize("other", ["completed", "is interrupted", "succeeds"])
def test_a_parking_whose_claim_expired_meets_another_delivery_of_its_operation(
    store: durabilis.Store, redis_url: str, namespace: str, other: str,
) -> None:
    """A failure whose claim expired (an outage, a pause) while another
    delivery claimed the key afresh and runs the operation.

    ``completed`` before the parking: the guard drops it and the call raises
    LeaseLost (its claim passed to the other, which recorded the outcome),
    never StorageUnavailable ("nothing ran") nor a claim of its own after fn
    ran (the second review of the guard, F5). Still running: the parking goes
    at once (waiting for that holder in the process lost the parking when the
    process ended: the same review, F1), and leaves its hold on the other's
    claim (F2: before, a dead release left none). That one ``is interrupted``
    (it parks nothing): the record is pending, and the key's tombstone holds
    for it, so a later delivery settles it. It ``succeeds``: its record lasts
    as long as the parked one, whose replay finds the operation done and runs
    nothing (before: run again once the dedup window had passed)."""
    idem = IdempotencyConfig(dedup_window_seconds=60, in_progress_ttl_seconds=30)
    layer = DurabilityLayer(store, fast_config(idempotency=idem))
    other_store = durabilis.connect(redis_url, namespace=namespace)
    theirs = DurabilityLayer(other_store, fast_config(idempotency=idem, dependencies={}))
    running, finish = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def hold(_ctx: Any) -> str:
        running.set()
        if other != "completed":
            assert finish.wait(20)
        if other == "is interrupted":
            raise KeyboardInterrupt  # (interrupted in fn: it parks nothing)
        return "theirs"

    def deliver() -> None:
        try:
            outcome["other"] = theirs.execute("agent-1", "job", {"n": 11}, hold)
        except BaseException as exc:
            outcome["other"] = type(exc).__name__

    delivery = threading.Thread(target=deliver)
    attempts: list[int] = []
    rkey = ""

    def down(ctx: OperationContext) -> Any:
        nonlocal rkey
        attempts.append(ctx.attempt)
        if len(attempts) == 3:  # the last attempt: its claim expires, another claims
            rkey = store.keys.idem(ctx.idempotency_key)
            store.command("DEL", rkey)
            delivery.start()
            assert running.wait(10)
            if other == "completed":
                delivery.join(10)
        raise OperationError("NETWORK_TIMEOUT", "down")

    try:
        with instant_retries():
            if other == "completed":
                with pytest.raises(LeaseLost):
                    layer.execute("agent-1", "job", {"n": 11}, down)
                assert outcome == {"other": "theirs"}
                assert layer.dlq.stats().pending == 0  # (before: parked, and left pending)
                return
            with pytest.raises(durabilis.RetryExhausted) as parked:
                layer.execute("agent-1", "job", {"n": 11}, down)
        assert parked.value.dlq_id is not None and not layer._leases.deferred()
        finish.set()
        delivery.join(10)
        assert layer.dlq.stats().pending == 1  # (never dropped on a guess)
        window_ms = 60_000
        assert int(store.command("PTTL", rkey)) > 2 * window_ms  # (held for the record)
        if other == "is interrupted":
            assert outcome == {"other": "KeyboardInterrupt"}
            assert store.command("HGET", rkey, "s") == b"x"
        else:
            assert outcome == {"other": "theirs"}
            ran: list[Any] = []
            summary = layer.replay_pending(ran.append)
            assert ran == [] and summary.replayed == 1  # found done, not run again
    finally:
        finish.set()
        layer.close()
        theirs.close()
        other_store.close()


def test_a_parking_without_a_claim_left_to_the_keep_alive_parks_whoever_holds_the_key(
    store: durabilis.Store,
) -> None:
    """Left to the keep-alive (its call has returned: it cannot claim again), a
    parking without a claim of its own goes with the guard that refuses only
    a completed record: another delivery's live claim no longer drops it (it
    was LOST when that holder was interrupted: the first review of the guard)
    and it never waits in the process for that claim (lost when the process
    ended: the second), and leaves its hold on the other's claim."""
    layer = DurabilityLayer(store, fast_config())
    layer._core._lease_s = 0.0  # (a step that fails once goes to the keep-alive at once)
    layer._core._late_tries = 1
    layer.breakers.force_open("svc")
    lose_replies(store, "dlq_enqueue", landed=False, times=1)
    with pytest.raises(durabilis.OutcomeUnrecorded):
        layer.execute("agent-1", "job", {"n": 12}, lambda _ctx: "never", park_on_open=True)
    [waiting] = layer._leases.deferred()
    guard = waiting.step.calls[0]
    assert waiting.step.guarded and (guard.name, guard.args[0]) == ("idem_check", "g")
    key = IdempotencyKey.from_raw(waiting.step.key)
    store.command("HSET", store.keys.idem(key.value), "s", "p",
                  "le", int(time.time() * 1000) + 60_000)  # another delivery's live claim
    drive(layer._core.keep_alive_plan(layer._leases), store)
    assert not layer._leases.deferred() and layer.dlq.stats().pending == 1
    # (its hold left on the other's claim: that one's record then lasts as long)
    assert store.command("HGET", store.keys.idem(key.value), "hd") is not None
    layer.close()


def test_a_parking_left_to_the_keep_alive_meets_the_record_of_the_delivery_that_took_it_over(
    store: durabilis.Store,
) -> None:
    """The fourth review of the guard (F1, ran twice): A's operation failed
    for good and its parking went to the keep-alive (cut off from Redis),
    which sent it for a dedup window from the deferral. A's claim lapsed;
    delivery B took the key over and completed it (no DLQ record yet: B
    settled nothing); B's record expired a window after its claim; then A's
    parking landed on the missing key, parked the completed operation, and a
    replay ran it again. Now a delivery that completed a claim it took over
    keeps its record as long as a DLQ record: A's late parking meets it
    completed (``done``) and nothing of its step is written. (A first fix
    refused a missing key past A's window instead: it lost the operation in
    a Redis outage longer than a lease and a window.)"""
    window = 1.0  # (the lease, 30 s, renewed every 10 s: no tick of the keep-alive's
    # own thread in this test; it is driven below)
    idem = IdempotencyConfig(dedup_window_seconds=window, in_progress_ttl_seconds=30)
    a, waiting = _parked_late_and_lapsed(store, {"n": 21}, idempotency=idem)
    assert waiting.step.guarded
    rkey = store.keys.idem(waiting.step.key)
    b = DurabilityLayer(store, fast_config(idempotency=idem, dependencies={}))
    ran: list[OperationContext] = []

    def ok(ctx: OperationContext) -> str:
        ran.append(ctx)
        return "ok"

    assert b.execute("agent-1", "job", {"n": 21}, ok) == "ok"
    assert ran[0].recovered  # (B took the claim over)
    hold_ms = b._core._dlq.hold_ms()
    assert int(store.command("PTTL", rkey)) > hold_ms - 60_000  # (before: its window, 1 s)
    time.sleep(window + 0.1)  # (its window has passed: the record is still there)
    with capture_logs() as logs:
        drive(a._core.keep_alive_plan(a._leases), store)
    assert not a._leases.deferred()  # (its step ended: never sent again)
    assert a.dlq.stats().pending == 0
    dropped = [e for e in logs if e["event"] == "durability_parking_dropped"]
    assert [e["refusal"] for e in dropped] == ["done"]
    assert b.replay_pending(ok).replayed == 0 and len(ran) == 1
    a.close()
    b.close()


def _cut_off(store: durabilis.Store) -> list[bool]:
    """``store`` cut off from Redis while ``cut[0]`` (a partition: every call of
    it fails before it is sent, as a connection refused does)."""
    cut = [False]
    for name in ("run", "run_many", "run_step", "command"):
        real = getattr(store, name)

        def gated(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if cut[0]:
                raise durabilis.StorageUnavailable("cut off (the test's partition)")
            return _real(*args, **kwargs)

        setattr(store, name, gated)
    return cut


@pytest.mark.parametrize(("window", "lease", "slow"), [
    (1.0, 0.5, 0.8),  # held past its window minus its lease (a slow fn)
    (0.6, 1.0, 0.0),  # a lease longer than the window (the config allows it)
])
def test_a_claim_held_past_its_window_is_recovered_when_its_worker_is_cut_off(
    store: durabilis.Store, redis_url: str, namespace: str, window: float, lease: float,
    slow: float,
) -> None:
    """The first review of the guard's bound (F1, lost; F1b, pre-existing): a
    claim's hash lasted until max(claim + window, lease end). Held past claim
    + window - lease, it expired at its lease end, so recover_orphans found no
    claim to reclaim (and dropped its index entry); the worker's own parking,
    sent late once it was back, met a missing key past its bound ("stale")
    and was dropped. Nothing of the failed operation was left. Now a claim
    lasts a window past its lease end: recovery parks it, and the late
    parking joins that record."""
    idem = IdempotencyConfig(dedup_window_seconds=window, in_progress_ttl_seconds=lease)
    a_store = durabilis.connect(redis_url, namespace=namespace)
    cut = _cut_off(a_store)
    a = DurabilityLayer(a_store, fast_config(
        idempotency=idem, renew_every_seconds=0.1, dependencies={}))
    r = DurabilityLayer(store, fast_config(idempotency=idem, dependencies={}))
    failed: list[BaseException] = []

    def fails_cut_off(_ctx: OperationContext) -> Any:
        if not cut[0]:
            time.sleep(slow)  # (renewed meanwhile)
            cut[0] = True  # A loses Redis as its first attempt fails
        raise OperationError("NETWORK_TIMEOUT", "down")

    def run_a() -> None:
        try:
            with instant_retries():
                a.execute("agent-1", "job", {"n": 41}, fails_cut_off)
        except durabilis.DurabilisError as exc:
            failed.append(exc)

    worker = threading.Thread(target=run_a)
    worker.start()
    parked: list[str] = []
    wait_for(lambda: bool(parked.extend(r.recover_orphans()) or parked),
             "recovery to park the cut-off worker's claim")
    worker.join(30)
    assert [type(e) for e in failed] == [durabilis.OutcomeUnrecorded]
    record = r.dlq.get(parked[0])
    assert record is not None and record.last_error == "WORKER_LOST"
    with capture_logs() as logs:
        cut[0] = False  # back: its keep-alive sends its parking
        wait_for(lambda: not a._leases.deferred(), "the late parking to land")
    assert [e for e in logs if e["event"] == "durability_parking_dropped"] == []
    assert r.dlq.stats().pending == 1  # (the late parking joined the record)
    a.close()
    r.close()
    a_store.close()


@pytest.mark.parametrize("then", ["interrupted", "fails non-retryably"])
def test_a_taken_over_claim_given_back_is_held_for_its_lapsed_owners_late_parking(
    store: durabilis.Store, then: str,
) -> None:
    """The third review of the guard's bound (F1, lost, pre-existing): A's
    parking was left to the keep-alive; delivery B took A's lapsed claim over
    and gave it back (interrupted, or a non-retryable failure), parking
    nothing; B's tombstone expired a window after B's lease, before A's
    keep-alive gave up; A's parking then met a missing key past its bound
    ("stale") and was dropped, and recovery had nothing left to park. A claim
    taken over and given back is now held as long as a DLQ record, so the
    late parking meets it and parks."""
    a, waiting = _parked_late_and_lapsed(store, {"n": 61})
    rkey = store.keys.idem(waiting.step.key)
    b = DurabilityLayer(store, fast_config(dependencies={}))

    def gives_up(ctx: OperationContext) -> str:
        assert ctx.recovered  # (B took the claim over)
        if then == "interrupted":
            raise KeyboardInterrupt
        raise OperationError("PERMISSION_DENIED", "refused")

    with pytest.raises((KeyboardInterrupt, OperationError)):
        b.execute("agent-1", "job", {"n": 61}, gives_up)
    assert store.command("HGET", rkey, "s") in (b"x", "x")  # (given back, nothing parked)
    assert b.dlq.stats().pending == 0
    hold_s = b._core._dlq.hold_ms() / 1000
    assert int(store.command("PTTL", rkey)) > (hold_s - 60) * 1000  # (before: a window)
    drive(a._core.keep_alive_plan(a._leases), store)  # (A's parking, late: it meets it)
    assert not a._leases.deferred() and b.dlq.stats().pending == 1
    a.close()
    b.close()


def test_a_replay_whose_outcome_goes_to_the_keep_alive_keeps_its_claim_and_settles_its_record(
    store: durabilis.Store,
) -> None:
    """The fourth review of the guard (F2, the simulator's seed 107961): a
    replay's fn succeeded, but its outcome step (the record, and the DLQ
    record's finish fenced by the replay's claim) could not be sent within the
    lease and went to the keep-alive. The replay answered "failed": its note
    released the DLQ claim and counted an attempt, so the keep-alive's finish
    was refused, and the completed operation's record stayed pending. Now the
    replay is deferred with its claim kept, and the keep-alive's finish
    settles the record; fn ran once."""
    layer = DurabilityLayer(store, fast_config(dependencies={}))
    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as parked:
        layer.execute("agent-1", "job", {"n": 31}, _down)
    dlq_id = str(parked.value.dlq_id)
    layer._core._lease_s = 0.0  # (a step that fails once goes to the keep-alive at once)
    layer._core._late_tries = 1
    lose_replies(store, "idem_record", landed=False, times=1)
    ran: list[OperationContext] = []

    def ok(ctx: OperationContext) -> str:
        ran.append(ctx)
        return "ok"

    result = layer.replay(dlq_id, ok)
    assert result.outcome is ReplayOutcome.DEFERRED and len(ran) == 1
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.status is DlqStatus.PENDING
    assert record.replay_attempts == 0  # (no failure counted: it succeeded)
    assert layer.replay_pending(ok).replayed == 0  # (claimed: no pass takes it meanwhile)
    drive(layer._core.keep_alive_plan(layer._leases), store)
    assert not layer._leases.deferred()
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.status is DlqStatus.REPLAYED
    assert layer.execute("agent-1", "job", {"n": 31}, ok) == "ok" and len(ran) == 1
    layer.close()


def test_a_replay_whose_fn_raises_a_nested_calls_unrecorded_outcome_fails(
    store: durabilis.Store,
) -> None:
    """The second review of that change (F3): every ``OutcomeUnrecorded(succeeded=
    True)`` was taken for the replay's own outcome left to the keep-alive: a
    replayed fn that failed because a nested durable call raised one kept the
    DLQ claim (blocked for ``claim_ttl_seconds``), counting no attempt. Only
    the replay's own outcome step, deferred, keeps the claim now."""
    layer = DurabilityLayer(store, fast_config(dependencies={}))
    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as parked:
        layer.execute("agent-1", "job", {"n": 51}, _down)
    dlq_id = str(parked.value.dlq_id)

    def outer(_ctx: OperationContext) -> str:  # one nested durable write, then more work
        layer.execute("agent-1", "inner", {"m": 1}, lambda _c: "inner ok")
        return "outer ok"  # (never reached: the inner raises)

    layer._core._lease_s = 0.0  # (the inner's record step goes to the keep-alive at once)
    layer._core._late_tries = 1
    lose_replies(store, "idem_record", landed=False, times=1)
    result = layer.replay(dlq_id, outer)
    assert result.outcome is ReplayOutcome.FAILED and "OutcomeUnrecorded" in (result.error or "")
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.status is DlqStatus.PENDING
    assert record.replay_attempts == 1  # (counted: the outer operation failed)
    layer.close()


def test_a_parkings_release_leaves_its_hold_whatever_holds_the_key(
    store: durabilis.Store,
) -> None:
    """The third review of the guard (C1, C2): a parking whose claim is gone
    left no hold when the key was missing (its hash expired) or completed by
    another delivery in between (Cluster: between the guard's wave and the
    enqueue's): a later delivery settled nothing, and a replay after the
    window ran the completed operation again. Now the release leaves a held
    tombstone on a missing key, and extends a completed record of the same
    payload as long as the DLQ record (never one of another payload)."""
    layer = DurabilityLayer(store, fast_config())
    key = IdempotencyKey.caller("agent-1", "held-key", {"n": 1})
    hold_ms = 600_000
    release = layer._core._idem.release(key, None, "gone-nonce", hold_ms=hold_ms, late=True)
    (rkey,) = release.keys
    assert store.run(release) == 0  # (not released: no claim of its own)
    fields = store.command("HGETALL", rkey)
    assert fields[b"s"] == b"x" and fields[b"fp"] == key.fingerprint.encode()
    assert int(store.command("PTTL", rkey)) > hold_ms - 10_000
    for fp, held in ((key.fingerprint, True), ("another payload", False)):
        store.command("DEL", rkey)
        store.command("HSET", rkey, "s", "d", "fp", fp)
        store.command("PEXPIRE", rkey, 5_000)
        store.run(release)
        assert (int(store.command("PTTL", rkey)) > hold_ms - 10_000) is held
    store.command("DEL", rkey)
    layer.close()


# --- adversarial review 31 (F2, F4, F5, F6) -----------------------------------------------

NEVER_TRIPS = CircuitBreakerConfig("svc", 1.0, 4, 1, 1, 10, 1)


def _parked_late_and_lapsed(
    store: durabilis.Store, payload: Any, **config: Any
) -> tuple[DurabilityLayer, Any]:
    """Worker A's operation failed for good and its parking's reply was lost:
    the parking waits in A's keep-alive (returned: A and that deferred step),
    and A's claim lapsed (its renewals failed)."""
    a = DurabilityLayer(store, fast_config(dependencies={}, **config))
    a._core._lease_s = 0.0  # (a step that fails once goes to the keep-alive at once)
    a._core._late_tries = 1
    lose_replies(store, "dlq_enqueue", landed=False, times=1)
    with instant_retries(), pytest.raises(durabilis.OutcomeUnrecorded):
        a.execute("agent-1", "job", payload, _down)
    [waiting] = a._leases.deferred()
    store.command("HSET", store.keys.idem(waiting.step.key), "le", 0)
    return a, waiting


def _down(_ctx: Any) -> Any:
    raise OperationError("NETWORK_TIMEOUT", "down")


def _park_op(layer: DurabilityLayer, n: int = 1) -> str:
    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as parked:
        layer.execute("agent-1", "job", {"n": n}, _down)
    assert parked.value.dlq_id is not None
    return parked.value.dlq_id


def _layer(store: durabilis.Store, **dlq: Any) -> DurabilityLayer:
    return DurabilityLayer(store, fast_config(breaker=NEVER_TRIPS, dlq=DlqConfig(**dlq)))


def test_cleanup_of_an_expired_record_keeps_the_by_key_entry_of_the_operations_new_record(
    store: durabilis.Store,
) -> None:
    # The operation's record expires unreplayed; before any cleanup the
    # operation is parked again (a replica with a longer TTL). Cleaning up
    # the old record must leave the new one reachable from the key: the
    # operation's success settles it.
    short = _layer(store, default_ttl_seconds=SHORT, purge_per_enqueue=0)
    long = _layer(store, default_ttl_seconds=60, purge_per_enqueue=0)
    first = _park_op(short)
    wait_for(lambda: short.dlq.get(first) is None, "the record to expire")
    again = _park_op(long)
    assert long.dlq.cleanup_expired() == 1  # the old record, reported
    assert long.execute("agent-1", "job", {"n": 1}, lambda _ctx: "ok") == "ok"
    record = long.dlq.get(again)
    assert record is not None and record.status is DlqStatus.REPLAYED
    stats = long.dlq.stats()
    assert stats.expired == 1 and stats.pending == 0
    short.close()
    long.close()


def test_another_operations_purge_of_an_expired_record_keeps_its_successors_by_key_entry(
    store: durabilis.Store,
) -> None:
    # As above, but the old record is purged by other operations' enqueues
    # (a backlog of older expired records keeps the re-parking's own purge
    # from reaching it).
    short = _layer(store, default_ttl_seconds=SHORT)
    long = _layer(store, default_ttl_seconds=60)
    older = [_park_op(short, 100 + i) for i in range(3)]
    first = _park_op(short)
    wait_for(lambda: all(short.dlq.get(i) is None for i in [*older, first]),
             "the records to expire")
    again = _park_op(long)
    _park_op(long, 200)
    _park_op(long, 201)  # (every expired record is purged by now)
    assert long.dlq.stats().expired == 4
    assert _park_op(long) == again  # the operation's next failure: its one record
    assert long.execute("agent-1", "job", {"n": 1}, lambda _ctx: "ok") == "ok"
    record = long.dlq.get(again)
    assert record is not None and record.status is DlqStatus.REPLAYED
    short.close()
    long.close()


def test_keep_pending_holds_the_key_so_a_late_success_settles_the_kept_record(
    store: durabilis.Store,
) -> None:
    layer = DurabilityLayer(store, fast_config(
        breaker=NEVER_TRIPS,
        idempotency=durabilis.IdempotencyConfig(
            in_progress_ttl_seconds=SHORT, dedup_window_seconds=SHORT),
        dlq=DlqConfig(default_ttl_seconds=SHORT, keep_pending=True),
    ))
    dlq_id = _park_op(layer)
    time.sleep(3 * SHORT)  # past the record's TTL and the dedup window (nothing to wait for)
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.status is DlqStatus.PENDING  # kept
    assert layer.execute("agent-1", "job", {"n": 1}, lambda _ctx: "ok") == "ok"
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.status is DlqStatus.REPLAYED  # settled: no re-run
    layer.close()


def test_a_replay_outlasting_its_records_ttl_keeps_the_record_and_lands_its_outcome(
    store: durabilis.Store, raw: Any
) -> None:
    dlq = DeadLetterQueue(store, DlqConfig(default_ttl_seconds=SHORT))
    [dlq_id] = park(dlq, 1)
    parked = dlq.get(dlq_id)
    assert parked is not None and parked.expires_at is not None
    ends = parked.expires_at.timestamp() + 0.05
    cleaned: list[int] = []

    def handler(_record: Any) -> None:
        wait_for(lambda: time.time() > ends, "the record's TTL to pass")
        cleaned.append(dlq.cleanup_expired())

    result = dlq.replay(dlq_id, handler)
    assert result.outcome is ReplayOutcome.REPLAYED
    assert cleaned == [0]  # claimed: it lives at least as long as its claim
    assert expired_entries(raw, dlq) == []
    record = dlq.get(dlq_id)
    assert record is not None and record.status is DlqStatus.REPLAYED


@pytest.mark.serial
def test_a_taken_over_claim_parked_into_the_operations_pending_record_counts_no_new_operation(
    redis_url: str, namespace: str, store: durabilis.Store, raw: Any
) -> None:
    # The operation is parked (one record) under the NEW secret. A worker
    # then claims it there and dies; meanwhile a replica on the OLD secret
    # alone completes it. A delivery on NEW takes the dead claim over, finds
    # the operation done under OLD, steps back and parks the dead claim,
    # which lands in the operation's record: one operation parked, twice.
    rotated = IdempotencyConfig(key_secret=NEW, previous_key_secrets=(OLD,))
    new = DurabilityLayer(store, fast_config(idempotency=rotated, dependencies={}))
    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as parked:
        new.execute("a1", "job", {"x": 1}, _down)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=dead_in_fn_worker, args=(redis_url, namespace, NEW, OLD, ready))
    proc.start()
    assert ready.wait(30)
    proc.kill()
    proc.join(10)
    old = DurabilityLayer(store, fast_config(
        idempotency=IdempotencyConfig(key_secret=OLD), dependencies={}))
    assert old.execute("a1", "job", {"x": 1}, lambda _ctx: "done-old") == "done-old"
    key = new.idempotency._ops.keys.idem(str(IdempotencyKey.new(
        "a1", "job", {"x": 1}, secret=NEW)))

    def lease_over() -> bool:
        secs, micros = raw.time()
        return int(raw.hget(key, "le") or 0) < secs * 1000 + micros // 1000

    wait_for(lease_over, "the dead worker's lease to run out")
    assert new.execute("a1", "job", {"x": 1}, lambda _ctx: "never") == "done-old"
    record = new.dlq.get(str(parked.value.dlq_id))
    assert record is not None and record.parkings == 2  # the dead claim merged in
    totals = new.stats()
    assert totals.parked == 1 and totals.parkings == 2
    assert new.dlq.stats().pending == 1
    new.close()
    old.close()
