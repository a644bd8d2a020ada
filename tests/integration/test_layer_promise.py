"""Regression tests for the holes an independent review reproduced in the layer.

One test per reproduced case of the issue "The core promise under every input,
interruption and interleaving", grouped as it groups them:

1. checks made after ``fn`` ran;
2. fused steps that partly commit;
3. Cluster interleavings (driven here on the Cluster code path: the scripts of
   a step one by one, other workers in between);
4. asyncio interruptions;
5. recovery that starves or merges;
6. the smaller ones.

Each failed on the main branch before the plans were rewritten.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta, tzinfo
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
import redis

import durabilis
from durabilis import (
    DlqConfig,
    IdempotencyConfig,
    IdempotencyKey,
    OperationError,
    OperationInProgress,
    OutcomeUnrecorded,
    ResultNotStored,
    RetryExhausted,
    RetryPolicy,
)
from durabilis._steps import IO, Hold, Run, Stepper
from durabilis.dlq import DlqRecord, ReplayOutcome
from durabilis.errors import InvalidKey, InvalidPayload, KeyReuseMismatch, LayerClosed
from durabilis.layer import (
    AsyncDurabilityLayer,
    DurabilityLayer,
    OperationContext,
)
from durabilis.retry import RetryBudget
from durabilis.testing import RedisServer, offset_server_clock
from tests.integration._layer_support import Counter, fast_config
from tests.support.cancels import swallow_own_cancel

pytestmark = pytest.mark.topologies("cluster")


def layer_on(store: durabilis.Store, **kw: Any) -> DurabilityLayer:
    return DurabilityLayer(store, fast_config(**kw))


def in_flight(
    raw: Any, store: durabilis.Store, layer: DurabilityLayer | None = None
) -> list[bytes]:
    """The in-flight index; with ``layer``, after the removals waiting in its process
    went (Cluster: a settled claim's entry goes later, docs/layer.md)."""
    if layer is not None:
        layer.stats()
    return list(raw.zrange(store.keys.layer("inflight"), 0, -1))


def state_of(raw: Any, store: durabilis.Store, key: str) -> bytes | None:
    value = raw.hget(store.keys.idem(key), "s")
    return value if isinstance(value, bytes) else None


# --- 1. checks after the side effect -------------------------------------------------


def test_values_users_return_round_trip_exactly(store: durabilis.Store) -> None:
    layer = layer_on(store)
    value = {"sent_at": datetime.now(), "day": date(2026, 11, 30), "amount": Decimal("1.10"),
             "id": UUID(int=7), "tags": {"a", "b"}, "pair": (1, 2),
             "at": datetime(2026, 1, 1, tzinfo=UTC)}
    op = Counter(result=value)
    assert layer.execute("a1", "job", "v", op) == value
    again = layer.execute("a1", "job", "v", op)  # the stored result, decoded
    assert again == value and type(again["pair"]) is tuple and again["sent_at"].tzinfo is None
    assert len(op.calls) == 1


class _Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class _UnreadableDict(dict[str, int]):
    """A result whose items cannot be read, by an error that cannot be printed."""

    def keys(self) -> Any:
        raise KeyError(_Unprintable())

    def __iter__(self) -> Any:
        raise KeyError(_Unprintable())


class _ExitingDict(dict[str, int]):
    """A result whose items raise SystemExit as they are read (its own code)."""

    def keys(self) -> Any:
        raise SystemExit("the result's own keys() exits")

    def __iter__(self) -> Any:
        raise SystemExit("the result's own __iter__ exits")

    def items(self) -> Any:
        raise SystemExit("the result's own items() exits")


@pytest.mark.parametrize(
    "result", [object(), b"x" * 4096, _UnreadableDict(a=1), _ExitingDict(a=1)],
    ids=["not encodable", "over the cap", "its error unprintable", "its code exits"],
)
def test_an_unstorable_result_is_recorded_as_completed_and_never_run_again(
    redis_url: str, namespace: str, raw: Any, result: Any
) -> None:
    store = durabilis.connect(redis_url, namespace=namespace)
    layer = DurabilityLayer(store, fast_config(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=0.3, max_value_bytes=1024)))
    try:
        op = Counter(result=result)
        with pytest.raises(ResultNotStored) as first:
            layer.execute("a1", "job", "p", op)
        assert first.value.result is result  # the caller whose fn produced it has it
        time.sleep(0.4)  # past the lease: nothing is left to recover
        assert layer.recover_orphans() == []
        with pytest.raises(ResultNotStored) as dup:
            layer.execute("a1", "job", "p", op)
        assert dup.value.result is None and first.value.reason == dup.value.reason
        assert len(op.calls) == 1  # one side effect, whatever happens next
        assert layer.dlq.pending_count() == 0
    finally:
        store.close()


def test_a_failure_whose_message_cannot_be_printed_is_parked(store: durabilis.Store) -> None:
    class Unprintable(TimeoutError):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    def fn(ctx: OperationContext) -> str:
        raise Unprintable

    layer = layer_on(store)
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", "p", fn)
    assert info.value.dlq_id is not None
    record = layer.dlq.get(info.value.dlq_id)
    assert "Unprintable" in record.last_error and record.retry_count == 3


@pytest.mark.parametrize("task_id, phase", [("", "p"), ("t", ""), ("t", "x" * 5000)])
def test_bad_checkpoint_ids_are_refused_before_anything_runs(
    store: durabilis.Store, raw: Any, task_id: str, phase: str
) -> None:
    layer = layer_on(store)
    op = Counter()
    with pytest.raises(InvalidKey):
        layer.execute("a1", "job", "p", op, task_id=task_id, phase=phase)
    assert op.calls == []
    assert layer.idempotency.check(IdempotencyKey.new("a1", "job", "p")) is None
    assert in_flight(raw, store) == []


def test_names_over_the_dlq_caps_are_refused_before_the_claim(store: durabilis.Store) -> None:
    layer = layer_on(store)
    op = Counter()
    for agent, op_type in (("a" * 300, "job"), ("a1", "j" * 300)):
        with pytest.raises(InvalidKey):
            layer.execute(agent, op_type, "p", op, idempotency_key="caller-key")
    assert op.calls == []


def test_a_payload_that_fits_the_claim_can_always_be_parked(store: durabilis.Store) -> None:
    # ~400 KB of control characters: small as msgpack, 6x larger as JSON text.
    payload = "\x01" * 400_000
    layer = layer_on(store)
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", payload, Counter(["NETWORK_TIMEOUT"] * 3))
    record = layer.dlq.get(str(info.value.dlq_id))
    assert record is not None and record.original_operation == payload


def test_a_payload_no_pillar_can_keep_is_refused_before_anything_runs(
    store: durabilis.Store,
) -> None:
    layer = DurabilityLayer(store, fast_config(dlq=DlqConfig(max_payload_bytes=1000)))
    op = Counter()
    with pytest.raises(durabilis.errors.PayloadTooLarge):
        layer.execute("a1", "job", {"blob": "y" * 2000}, op)
    with pytest.raises(InvalidPayload):
        layer.execute("a1", "job", {"obj": object()}, op, idempotency_key="k")
    assert op.calls == []


def test_recovery_parks_an_unparkable_orphan_and_reaches_the_ones_behind_it(
    store: durabilis.Store, raw: Any
) -> None:
    layer = layer_on(store, lease=0.2)
    ops = layer.idempotency._ops
    # Written by an older version: an agent id over today's DLQ cap.
    for key, agent in (("old", "a" * 300), ("real", "a1")):
        envelope = ops.pack_value({"agent_id": agent, "operation_type": "job",
                                   "payload": {"n": 1}}, "payload")
        store.run(ops.claim(IdempotencyKey(key), None, envelope, f"n-{key}"))
        store.run(layer._core._note("add", [layer._core.member(key, f"n-{key}")]))
    time.sleep(0.3)
    parked = layer.recover_orphans()
    records = [layer.dlq.get(i) for i in parked]
    assert sorted(r.metadata["idempotency_key"] for r in records if r) == ["old", "real"]
    assert in_flight(raw, store) == []


def test_the_outcome_of_an_operation_that_ran_is_recorded_at_maxmemory(
    private_redis: RedisServer, namespace: str
) -> None:
    store = durabilis.connect(private_redis.url, namespace=namespace)
    admin = redis.Redis.from_url(private_redis.url)
    layer = DurabilityLayer(store, fast_config())
    try:
        def fn(ctx: OperationContext) -> str:
            # Memory fills up while the operation runs (noeviction): the claim
            # was taken, the effect happened, the next write would be refused.
            used = int(admin.info("memory")["used_memory"])
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", str(used // 2))
            return "charged"

        assert layer.execute("a1", "job", "p", fn) == "charged"
        with pytest.raises(durabilis.StorageUnavailable):  # a new claim IS refused: nothing runs
            layer.execute("a1", "job", "another", Counter())
        admin.config_set("maxmemory", "0")
        assert layer.execute("a1", "job", "p", Counter(result="again")) == "charged"
    finally:
        admin.config_set("maxmemory", "0")
        admin.close()
        store.close()


def test_a_record_step_that_times_out_is_sent_again_until_it_lands(
    private_redis: RedisServer, namespace: str
) -> None:
    store = durabilis.connect(private_redis.url, namespace=namespace, socket_timeout=0.2)
    admin = redis.Redis.from_url(private_redis.url)
    layer = DurabilityLayer(store, fast_config(lease=5))
    try:
        def fn(ctx: OperationContext) -> str:
            admin.execute_command("CLIENT", "PAUSE", 800, "WRITE")  # Redis stalls for 0.8 s
            return "done"

        assert layer.execute("a1", "job", "p", fn) == "done"
        assert layer.idempotency.check(IdempotencyKey.new("a1", "job", "p")).in_progress is False
    finally:
        admin.close()
        store.close()


def test_giving_up_on_the_record_says_the_operation_ran(
    private_redis: RedisServer, namespace: str
) -> None:
    store = durabilis.connect(private_redis.url, namespace=namespace, socket_timeout=0.2)
    admin = redis.Redis.from_url(private_redis.url)
    layer = DurabilityLayer(store, fast_config(lease=0.6, renew_every_seconds=0.2))
    try:
        def fn(ctx: OperationContext) -> str:
            admin.execute_command("CLIENT", "PAUSE", 4000, "WRITE")  # far past the lease
            return "done"

        began = time.monotonic()
        with pytest.raises(OutcomeUnrecorded) as info:
            layer.execute("a1", "job", "p", fn)
        assert info.value.succeeded and info.value.result == "done"
        assert time.monotonic() - began < 4.0  # it gave up while Redis was still paused
        time.sleep(max(0.0, 4.6 - (time.monotonic() - began)))
        # The pause is over: the keep-alive has recorded the outcome since.
        again = Counter(result="second run")
        assert layer.execute("a1", "job", "p", again) == "done"
        assert again.calls == []  # answered from the late record, never run again
    finally:
        admin.close()
        store.close()


# --- 2. fused steps are all-or-nothing -----------------------------------------------------


def test_a_record_is_never_written_without_its_checkpoint(
    store: durabilis.Store, redis_url: str, namespace: str
) -> None:
    cfg = fast_config(checkpoint=durabilis.CheckpointConfig(max_checkpoints=1))
    writer = DurabilityLayer(durabilis.connect(redis_url, namespace=namespace), cfg)
    layer = DurabilityLayer(store, cfg)
    writer.checkpoints.save("other", "a1", "p", 1)  # our eviction hints are stale now
    seen: list[tuple[str, ...]] = []
    real = store.run_step

    def watch(calls: Any, gates: Any = None, waves: Any = None) -> Any:
        replies = real(calls, gates, waves)
        seen.append(tuple(f"{c.name}:{st}" for c, st in zip(calls, replies.status, strict=True)))
        return replies

    store.run_step = watch  # type: ignore[method-assign]
    assert layer.execute("a1", "job", "p", Counter(result={"s": 1}), task_id="t", phase="p1") == {
        "s": 1}
    record_steps = [s for s in seen if any(x.startswith("ckpt_save") for x in s)]
    assert any(":r" in x for s in record_steps for x in s if x.startswith("ckpt_save"))
    for step in record_steps:  # no record committed in a step whose checkpoint did not
        statuses = dict(x.split(":") for x in step)
        assert statuses["ckpt_save"] == "c" or statuses["idem_record"] != "c"
    assert layer.checkpoints.restore("t", "a1").state == {"s": 1}


def test_a_key_reuse_mismatch_takes_no_probe_slot(store: durabilis.Store, raw: Any) -> None:
    layer = layer_on(store)
    layer.execute("a1", "job", "p", Counter(), idempotency_key=IdempotencyKey.from_raw(
        "k", payload={"n": 1}))
    layer.breakers.force_open("svc")
    time.sleep(1.05)  # reset timeout: the next caller would be the half-open probe
    with pytest.raises(KeyReuseMismatch):
        layer.execute("a1", "job", "p", Counter(), idempotency_key=IdempotencyKey.from_raw(
            "k", payload={"n": 2}))
    assert raw.hlen(store.keys.breaker_probes("svc")) == 0
    assert layer.execute("a1", "job", "other", Counter(result="probe")) == "probe"


# --- 3. Cluster interleavings (the Cluster code path) -----------------------------------------


def step_plan(plan: Any, store: durabilis.Store, until: Any = None) -> Stepper:
    """Drive a plan by hand (Run steps answered with success), stopping before ``until``."""
    run = Stepper(plan)
    while not run.done and not (until and until(run.step)):
        step = run.step
        if type(step) is IO:
            run.send(store.run_step(step.calls, step.gates, step.waves))
        elif type(step) is Run:
            run.send((True, "ran"))
        elif type(step) is Hold:
            run.send(None)
        else:
            run.send(store.run(step))
    return run


def test_an_old_owner_never_removes_the_new_owners_in_flight_entry(
    store: durabilis.Store, raw: Any
) -> None:
    store._fuse = False  # the scripts of a step one by one, as on Cluster
    old = DurabilityLayer(store, fast_config(lease=0.2))
    new = DurabilityLayer(store, fast_config(lease=0.2))
    req = old._core.request("a1", "job", "p", dependency=None, idempotency_key=None,
                            task_id=None, phase=None, wait=None, park_on_open=False,
                            deadline_seconds=None)
    a = step_plan(old._core.execute_plan(req, Counter()), store,
                  until=lambda s: type(s) is Run)  # the old owner stalls inside fn
    time.sleep(0.3)  # its lease ends; the new owner takes over and dies in fn
    b = step_plan(new._core.execute_plan(req, Counter()), store, until=lambda s: type(s) is Run)
    assert not b.done
    step_plan_continue(a, store)  # the old owner wakes up: LeaseLost, and it must not touch...
    time.sleep(0.3)
    assert old.recover_orphans(), "...the new owner's entry: its orphan is recovered"
    assert state_of(raw, store, req.key.value) in (None, b"x")


def test_a_worker_killed_before_its_index_entry_landed_is_found_by_its_birth_entry(
    store: durabilis.Store, raw: Any
) -> None:
    """Cluster (and the unfused path on standalone): the claim goes in the same
    wave as its in-flight index entry, on another node. A worker killed after
    the claim was written but before the index entry was (or whose index entry
    failed) is still found: the claim's own script wrote its birth entry, in an
    index bucket of its slot. Here the index entry is never sent at all."""
    store._fuse = False  # the scripts of a step in waves, as on Cluster
    layer = DurabilityLayer(store, fast_config(lease=0.3))
    req = layer._core.request("a1", "job", {"n": 7}, dependency=None, idempotency_key=None,
                              task_id=None, phase=None, wait=None, park_on_open=False,
                              deadline_seconds=None)
    run = Stepper(layer._core.execute_plan(req, Counter()))
    while type(run.step) is not IO:
        run.send(None)  # the keep-alive's Hold
    step = run.step
    assert step.waves is not None
    claim_wave = [i for i, c in enumerate(step.calls) if "idem_claim" in c.name]
    assert len(claim_wave) == 1 and step.waves[claim_wave[0]] == 0  # one wave: no wait
    index = store.keys.layer("inflight")
    assert all(index not in c.keys for c in step.calls[claim_wave[0]:claim_wave[0] + 1])
    store.run(step.calls[claim_wave[0]])  # only the claim lands; then the worker dies
    assert raw.zcard(index) == 0
    time.sleep(0.4)  # its lease ends
    parked: list[str] = []
    for _ in range(32):  # each pass reads 512 buckets: every one within 32 (Cluster)
        parked += layer.recover_orphans()
        if parked:
            break
    assert len(parked) == 1, "a claim whose index entry never landed was not found"
    record = layer.dlq.get(parked[0])
    assert record is not None and record.last_error == "WORKER_LOST"
    rkey = store.keys.idem(req.key.value)
    assert raw.hget(rkey, "s") == b"x"  # released (held for the DLQ record), not stuck
    assert not list(raw.scan_iter(match=store.keys.inflight_bucket_pattern()))
    layer.close()


def step_plan_continue(run: Stepper, store: durabilis.Store) -> None:
    try:
        while not run.done:
            step = run.step
            if type(step) is IO:
                run.send(store.run_step(step.calls, step.gates, step.waves))
            elif type(step) is Run:
                run.send((True, "late"))
            else:
                run.send(None)
    except durabilis.errors.LeaseLost:
        return


def test_a_failed_breaker_call_after_the_claim_leaves_no_claim_behind(
    store: durabilis.Store, raw: Any
) -> None:
    store._fuse = False  # on Cluster the claim commits before the breaker is asked
    layer = layer_on(store)
    raw.set(store.keys.breaker("svc"), "garbage")  # the breaker's call fails
    op = Counter()
    with pytest.raises(durabilis.errors.CorruptData):
        layer.execute("a1", "job", "p", op)
    assert op.calls == []
    assert layer.idempotency.check(IdempotencyKey.new("a1", "job", "p")) is None
    assert in_flight(raw, store) == []


def test_a_takeover_refused_before_it_runs_parks_the_dead_owners_operation(
    store: durabilis.Store, raw: Any
) -> None:
    store._fuse = False  # on Cluster the takeover commits before the breaker refuses
    layer = layer_on(store, lease=0.2)
    req = layer._core.request("a1", "job", "p", dependency=None, idempotency_key=None,
                              task_id=None, phase=None, wait=None, park_on_open=False,
                              deadline_seconds=None)
    # The first owner claims, starts fn (the effect may have happened) and dies.
    step_plan(layer._core.execute_plan(req, Counter()), store, until=lambda s: type(s) is Run)
    time.sleep(0.3)
    layer.breakers.force_open("svc")
    op = Counter()
    with pytest.raises(durabilis.CircuitOpen):  # the duplicate takes the claim over, refused
        layer.execute("a1", "job", "p", op)
    assert op.calls == []
    # The dead owner's operation was not dropped with the refused claim: it is parked.
    (record,) = layer.dlq.list_pending()
    assert record.last_error == "WORKER_LOST"
    assert record.metadata["idempotency_key"] == req.key.value
    assert state_of(raw, store, req.key.value) in (None, b"x")


# --- 4. asyncio interruptions -----------------------------------------------------------------


def run_async(redis_url: str, namespace: str, body: Any, **kw: Any) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config(**kw))
        try:
            await body(layer, store)
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())


def test_a_cancelled_operation_gives_back_its_claim_and_probe_slot(
    redis_url: str, namespace: str, raw: Any
) -> None:
    async def body(layer: AsyncDurabilityLayer, store: durabilis.aio.Store) -> None:
        await layer.breakers.force_open("svc")
        await asyncio.sleep(1.05)  # half-open: the next call is the probe

        async def slow(ctx: OperationContext) -> str:
            await asyncio.sleep(5)
            return "never"

        with pytest.raises(asyncio.TimeoutError):  # (not the builtin before 3.11)
            await asyncio.wait_for(layer.execute("a1", "job", "p", slow), 0.2)
        assert raw.hlen(store.keys.breaker_probes("svc")) == 0
        assert raw.zcard(store.keys.layer("inflight")) == 0
        # Not OperationInProgress for a lease, not a breaker refusing for 30 s:
        assert await layer.execute("a1", "job", "p", Counter(result="now")) == "now"

    run_async(redis_url, namespace, body)


def test_a_cancel_after_fn_succeeded_still_records_its_result(
    redis_url: str, namespace: str
) -> None:
    async def body(layer: AsyncDurabilityLayer, store: durabilis.aio.Store) -> None:
        calls: list[int] = []
        started = threading.Event()

        def plain(ctx: OperationContext) -> str:  # runs in a worker thread
            calls.append(1)
            started.set()
            time.sleep(0.3)
            return "charged"

        task = asyncio.ensure_future(layer.execute("a1", "job", "p", plain))
        # The cancel lands while fn runs (not during the claim step, which on a
        # loaded machine's Cluster could outlast a fixed 0.1 s: then nothing ran).
        assert await asyncio.to_thread(started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await layer.execute("a1", "job", "p", Counter(result="x")) == "charged"
        assert calls == [1]

    run_async(redis_url, namespace, body)


@pytest.mark.parametrize("also", ["cancel", "timeout", "timeout_and_cancel"])
def test_a_cancel_while_the_record_is_in_flight_records_it_then_ends_the_task(
    redis_url: str, namespace: str, also: str
) -> None:
    """Cancelled (or timed out) in the loop turn after an async ``fn`` returned:
    the record is out (on standalone and Sentinel, held in the operation's own
    task, not a task of its own). It lands; then the task ends cancelled, or
    with the timeout's TimeoutError, and a cancellation from elsewhere that
    came with the timeout is not taken for the timeout's."""
    async def body(layer: AsyncDurabilityLayer, store: durabilis.aio.Store) -> None:
        loop = asyncio.get_running_loop()
        calls: list[int] = []
        task: list[asyncio.Task[Any]] = []
        timeout: list[Any] = []

        async def fn(ctx: OperationContext) -> str:
            calls.append(1)
            if also != "timeout":
                loop.call_soon(task[0].cancel)  # lands while the record is out
            if also != "cancel":
                timeout[0].reschedule(loop.time())  # fires then too
            return "charged"

        async def call() -> str:
            if also == "cancel":
                return await layer.execute("a1", "job", "p", fn)
            async with asyncio.timeout(None) as deadline:
                timeout.append(deadline)
                return await layer.execute("a1", "job", "p", fn)

        await layer.execute("a0", "job", "p", Counter())  # (the store's first use is behind)
        task.append(asyncio.ensure_future(call()))
        expected = TimeoutError if also == "timeout" else asyncio.CancelledError
        with pytest.raises(expected):
            await task[0]
        assert await layer.execute("a1", "job", "p", Counter(result="x")) == "charged"
        assert calls == [1]

    run_async(redis_url, namespace, body)


def test_a_cancel_while_a_failure_is_parked_ends_the_task_cancelled_after_the_park(
    redis_url: str, namespace: str
) -> None:
    """The cancellation lands as the failed operation is parked (a shielded
    step): the park lands, then the task ends cancelled, as a timeout or a
    TaskGroup expects, not with the operation's error (its cause)."""
    async def body(layer: AsyncDurabilityLayer, store: durabilis.aio.Store) -> None:
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[Any]] = []

        class LastTimeout(OperationError):
            def __str__(self) -> str:  # read as the park is built: cancel then
                if len(tasks) == 1:
                    tasks.append(tasks[0])  # once
                    loop.call_soon(tasks[0].cancel)
                return "NETWORK_TIMEOUT: the last attempt"

        async def fn(ctx: OperationContext) -> str:
            if ctx.attempt < 2:
                raise OperationError("NETWORK_TIMEOUT")
            raise LastTimeout("NETWORK_TIMEOUT")  # retries exhausted: parked

        tasks.append(asyncio.ensure_future(layer.execute("a1", "job", "p", fn)))
        with pytest.raises(asyncio.CancelledError) as raised:
            await tasks[0]
        cause = raised.value.__cause__
        assert isinstance(cause, RetryExhausted), repr(cause)
        assert cause.dlq_id is not None  # the park landed before the cancellation
        record = await layer.dlq.get(cause.dlq_id)
        assert record.last_error == "NETWORK_TIMEOUT: the last attempt"

    run_async(redis_url, namespace, body)


def _sweep(*spared: asyncio.Task[Any] | None) -> None:
    """What a shutdown idiom does: cancel every task of the loop but ``spared``."""
    for task in asyncio.all_tasks():
        if task not in spared:
            task.cancel()


@pytest.mark.parametrize("sweeps", [
    "once", "every_50ms",
    # The loop turn after the claim is held: standalone's timing (on Cluster the
    # sweep lands in the claim step's own tasks: the operation is interrupted
    # before fn, which is right, but not this case).
    pytest.param("in_the_claim_s_turn", marks=pytest.mark.standalone_only),
])
def test_a_sweep_that_cancels_every_task_waits_for_a_plain_fn_and_keeps_its_claim(
    redis_url: str, namespace: str, sweeps: str
) -> None:
    # A shutdown idiom cancels every task of the loop, the library's own among
    # them: the task that waits for fn's worker thread and the keep-alive (once
    # while fn runs; again and again, faster than the keep-alive's tick; or in
    # the loop turn the claim is held, before the keep-alive's first step, with
    # the operation's own task spared). The claim must stay held (renewed) while
    # fn runs, and fn's outcome recorded.
    async def body(layer: AsyncDurabilityLayer, store: durabilis.aio.Store) -> None:
        calls: list[int] = []
        started, release = threading.Event(), threading.Event()

        def plain(ctx: OperationContext) -> str:  # runs in a worker thread
            calls.append(1)
            started.set()
            release.wait(10)
            return "charged"

        me = asyncio.current_task()
        task = asyncio.ensure_future(layer.execute("a1", "job", "p", plain))
        if sweeps == "in_the_claim_s_turn":
            await asyncio.sleep(0)  # the operation holds its claim, starts its keep-alive
            _sweep(me, task)
        assert await asyncio.to_thread(started.wait, 10)
        other = AsyncDurabilityLayer(store, fast_config(lease=0.4, renew_every_seconds=0.1))
        try:
            for _ in range(20):  # 1 s: two and a half leases, gone without renewals
                if sweeps == "every_50ms" or (sweeps == "once" and not _):
                    _sweep(me)
                await asyncio.sleep(0.05)
            with pytest.raises(OperationInProgress):  # not taken over by another replica
                await other.execute("a1", "job", "p", Counter())
            assert not task.done()  # it waits for fn, whose thread still runs
        finally:
            release.set()
        if sweeps == "in_the_claim_s_turn":
            assert await task == "charged"
        else:
            with pytest.raises(asyncio.CancelledError):  # once the outcome is recorded
                await task
        assert await other.execute("a1", "job", "p", Counter(result="x")) == "charged"
        assert calls == [1]
        await other.close()

    run_async(redis_url, namespace, body, lease=0.4, renew_every_seconds=0.1)


def test_asyncio_run_ending_with_a_plain_fn_running_records_it_once(
    redis_url: str, namespace: str
) -> None:
    # asyncio.run cancels the tasks still running when main returns (a gateway
    # shutting down): the operation waits for fn's thread and records its result.
    calls: list[str] = []

    def plain(ctx: OperationContext) -> str:
        calls.append("first")
        time.sleep(1.2)  # three leases long
        return "charged"

    async def shut_down_while_fn_runs() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config(lease=0.4, renew_every_seconds=0.1))
        running = asyncio.ensure_future(layer.execute("a1", "job", "p", plain))
        await asyncio.sleep(0.3)
        assert not running.done()  # left running: asyncio.run cancels it

    asyncio.run(shut_down_while_fn_runs())
    assert calls == ["first"]

    async def body(layer: AsyncDurabilityLayer, store: durabilis.aio.Store) -> None:
        assert await layer.execute("a1", "job", "p", Counter(result="again")) == "charged"

    run_async(redis_url, namespace, body, lease=0.4, renew_every_seconds=0.1)
    assert calls == ["first"]


def test_a_plain_function_returning_a_coroutine_has_it_awaited(
    redis_url: str, namespace: str
) -> None:
    async def body(layer: AsyncDurabilityLayer, store: durabilis.aio.Store) -> None:
        seen: list[object] = []

        async def work() -> str:
            seen.append(durabilis.layer.current_operation())
            return "awaited"

        def plain(ctx: OperationContext) -> Any:  # a lambda or partial around a coroutine
            return work()

        assert await layer.execute("a1", "job", "p", plain) == "awaited"
        assert len(seen) == 1 and seen[0] is not None  # awaited as the operation's own

    run_async(redis_url, namespace, body)


def test_a_plain_function_never_blocks_the_loop_that_renews_its_lease(
    redis_url: str, namespace: str
) -> None:
    async def body(layer: AsyncDurabilityLayer, store: durabilis.aio.Store) -> None:
        def blocking(ctx: OperationContext) -> str:
            time.sleep(1.2)  # three leases long
            return "done"

        first = asyncio.ensure_future(layer.execute("a1", "job", "p", blocking))
        await asyncio.sleep(0.9)  # the lease would have ended without renewals
        other = AsyncDurabilityLayer(store, fast_config(lease=0.4, renew_every_seconds=0.1))
        with pytest.raises(OperationInProgress):  # not taken over by another replica
            await other.execute("a1", "job", "p", Counter())
        assert await first == "done"

    run_async(redis_url, namespace, body, lease=0.4, renew_every_seconds=0.1)


def test_a_closed_layer_refuses_new_operations(
    store: durabilis.Store, redis_url: str, namespace: str
) -> None:
    layer = layer_on(store)
    layer.close()
    with pytest.raises(LayerClosed):
        layer.execute("a1", "job", "p", Counter())

    async def body(alayer: AsyncDurabilityLayer, astore: durabilis.aio.Store) -> None:
        await alayer.close()
        with pytest.raises(LayerClosed):
            await alayer.execute("a1", "job", "p", Counter())

    run_async(redis_url, namespace, body)


# --- 5. recovery that starves or merges -------------------------------------------------------


def test_live_long_operations_never_hide_a_real_orphan_from_recovery(
    store: durabilis.Store, raw: Any
) -> None:
    layer = layer_on(store, lease=0.5, renew_every_seconds=0.1)
    release = threading.Event()

    def long_op(ctx: OperationContext) -> str:
        release.wait(5)
        return "done"

    workers = [threading.Thread(target=layer.execute, args=("a1", "job", f"live-{i}", long_op))
               for i in range(3)]
    for w in workers:
        w.start()
    ops = layer.idempotency._ops
    store.run(ops.claim(IdempotencyKey("orphan"), None, ops.pack_value(
        {"agent_id": "a1", "operation_type": "job", "payload": 1}, "payload"), "dead"))
    store.run(layer._core._note("add", [layer._core.member("orphan", "dead")]))
    try:
        time.sleep(1.2)  # the live ones were renewed twice over; the orphan's lease ended
        parked = layer.recover_orphans(limit=3)
        assert [layer.dlq.get(i).metadata["idempotency_key"] for i in parked] == ["orphan"]
    finally:
        release.set()
        for w in workers:
            w.join()


def test_every_failure_gets_its_own_dlq_record_without_idempotency(
    store: durabilis.Store,
) -> None:
    layer = DurabilityLayer(store, fast_config(
        idempotency=IdempotencyConfig(enabled=False), dependencies={}))
    ids = set()
    for _ in range(3):
        with pytest.raises(RetryExhausted) as info:
            layer.execute("a1", "job", "same", Counter(["NETWORK_TIMEOUT"] * 3))
        ids.add(info.value.dlq_id)
    assert len(ids) == 3 and layer.dlq.pending_count() == 3


# --- 6. the smaller ones ---------------------------------------------------------------------


def test_duplicates_are_not_charged_to_the_retry_budget(store: durabilis.Store, raw: Any) -> None:
    policy = RetryPolicy("job", 3, 1, 2, 2.0, jitter=False, retryable_errors=("NETWORK_TIMEOUT",),
                         budget=RetryBudget(ratio=0.1, min_retries=1))
    layer = DurabilityLayer(store, fast_config(retry_policies=(policy,)))
    for _ in range(10):
        layer.execute("a1", "job", "p", Counter())
    fields = raw.hgetall(store.keys.retry_budget("job"))
    calls = sum(int(v) for k, v in fields.items() if k.startswith(b"c"))
    assert calls == 1


def test_an_operation_the_budget_refuses_is_parked_with_that_reason(
    store: durabilis.Store,
) -> None:
    policy = RetryPolicy("job", 3, 1, 2, jitter=False, retryable_errors=("NETWORK_TIMEOUT",),
                         budget=RetryBudget(ratio=0, min_retries=0))
    layer = DurabilityLayer(store, fast_config(retry_policies=(policy,)))
    op = Counter(["NETWORK_TIMEOUT"] * 3)
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", "p", op)
    assert len(op.calls) == 1
    parked = layer.dlq.get(info.value.dlq_id)
    assert parked is not None and parked.metadata["reason"] == "RETRY_BUDGET_EXHAUSTED"


def test_foreign_data_at_the_budget_key_parks_the_operation_it_does_not_leave_it_claimed(
    store: durabilis.Store, raw: Any
) -> None:
    policy = RetryPolicy("job", 3, 1, 2, jitter=False, retryable_errors=("NETWORK_TIMEOUT",),
                         budget=RetryBudget(min_retries=10))
    layer = DurabilityLayer(store, fast_config(retry_policies=(policy,)))

    def op(ctx: OperationContext) -> str:
        raw.set(store.keys.retry_budget("job"), "foreign")  # after the call was recorded
        raise OperationError("NETWORK_TIMEOUT", "down")

    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", "p", op)
    assert isinstance(info.value.__cause__, durabilis.errors.CorruptData)
    parked = layer.dlq.get(info.value.dlq_id)
    assert parked is not None and parked.metadata["reason"] == "CORRUPT_DATA"
    state = layer.idempotency.check(IdempotencyKey.new("a1", "job", "p"))
    assert state is None or not state.in_progress  # parked: not left for recovery to run again


def _slow_after_first(admin: redis.Redis, pause_ms: int, *, at: float = 0.0) -> Counter:
    """Fails with NETWORK_TIMEOUT; its first call stalls Redis's writes for
    ``pause_ms``, at once or ``at`` seconds later (during the backoff)."""

    class Stalling(Counter):
        def __call__(self, ctx: OperationContext) -> Any:
            if not self.calls:
                def pause() -> None:
                    admin.execute_command("CLIENT", "PAUSE", pause_ms, "WRITE")

                if at:
                    threading.Timer(at, pause).start()
                else:
                    pause()
            return super().__call__(ctx)

    return Stalling(["NETWORK_TIMEOUT"] * 3)


@pytest.fixture
def stalling(
    private_redis: RedisServer, namespace: str
) -> Iterator[tuple[durabilis.Store, redis.Redis]]:
    """A store on a private server, and an admin client to stall its writes."""
    store = durabilis.connect(private_redis.url, namespace=namespace)
    admin = redis.Redis.from_url(private_redis.url)
    yield store, admin
    admin.close()
    store.close()


def _deadline_parked(layer: DurabilityLayer, op: Counter, deadline: float) -> None:
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", "p", op, deadline_seconds=deadline)
    assert len(op.calls) == 1
    parked = layer.dlq.get(info.value.dlq_id)
    assert parked is not None and parked.metadata["reason"] == "DEADLINE_EXCEEDED"
    layer.close()


@pytest.mark.parametrize("budget", [True, False], ids=["budget", "no-budget"])
def test_a_retry_whose_round_trip_reaches_the_deadline_is_not_made(
    stalling: tuple[durabilis.Store, redis.Redis], budget: bool
) -> None:
    store, admin = stalling
    policy = RetryPolicy("job", 3, 500, 500, jitter=False, retryable_errors=("NETWORK_TIMEOUT",),
                         budget=RetryBudget(min_retries=10) if budget else None)
    layer = DurabilityLayer(store, fast_config(retry_policies=(policy,)))
    # The report (and the spend) wait 0.8 s: with the 0.5 s backoff, past 1 s.
    _deadline_parked(layer, _slow_after_first(admin, 800), 1.0)


def test_no_retry_starts_past_the_deadline_when_its_admission_was_slow(
    stalling: tuple[durabilis.Store, redis.Redis],
) -> None:
    store, admin = stalling
    policy = RetryPolicy("job", 3, 300, 300, jitter=False, retryable_errors=("NETWORK_TIMEOUT",))
    layer = DurabilityLayer(store, fast_config(retry_policies=(policy,)))
    began = time.monotonic()
    # Stalled during the backoff: the admission of the retry waits past 0.8 s.
    _deadline_parked(layer, _slow_after_first(admin, 900, at=0.1), 0.8)
    assert time.monotonic() - began >= 0.8


def test_thousands_of_metadata_fields_are_a_typed_error(store: durabilis.Store) -> None:
    dlq = durabilis.dlq.DeadLetterQueue(store)
    with pytest.raises(InvalidPayload):
        dlq.enqueue("a1", "job", {}, 1, "e", metadata={f"k{i}": "v" for i in range(5000)})
    dlq_id = dlq.enqueue("a1", "job", {}, 1, "e", metadata={f"k{i}": "v" for i in range(1000)})
    assert len(dlq.get(dlq_id).metadata) == 1000  # type: ignore[union-attr]


@pytest.mark.standalone_only
def test_fencing_tokens_increase_per_key_even_when_the_clock_steps_back(
    store: durabilis.Store, raw: Any
) -> None:
    offset_server_clock(store, f"{store.namespace}:clock")
    guard = durabilis.idempotency.IdempotencyGuard(
        store, IdempotencyConfig(in_progress_ttl_seconds=1))
    first = guard.check_and_record("k")
    assert isinstance(first, durabilis.idempotency.New) and first.token
    guard.release("k", first.token)
    raw.set(f"{store.namespace}:clock", -60_000_000)  # a failover to a replica 60 s behind
    second = guard.check_and_record("k")
    assert isinstance(second, durabilis.idempotency.New) and int(second.token) > int(first.token)
    raw.set(f"{store.namespace}:clock", 5_000_000)  # ... and its lease expires: taken over
    third = guard.check_and_record("k")
    assert isinstance(third, durabilis.idempotency.New) and third.taken_over
    assert int(third.token) > int(second.token)


# --- found since by the simulator and a second adversarial review ------------------------------


def test_foreign_data_at_the_checkpoint_key_does_not_keep_the_outcome_from_being_recorded(
    store: durabilis.Store, raw: Any, namespace: str
) -> None:
    layer = layer_on(store)
    raw.set(f"{namespace}:ckpt:{{ckpt}}:task:t-1", "not a hash")  # planted by someone else
    op = Counter(result={"n": 1})
    assert layer.execute("a1", "job", "p", op, task_id="t-1", phase="send") == {"n": 1}
    # Recorded without its checkpoint: a duplicate gets the result, nothing runs again.
    assert layer.execute("a1", "job", "p", op, task_id="t-1", phase="send") == {"n": 1}
    assert len(op.calls) == 1
    assert in_flight(raw, store, layer) == []


def test_an_orphan_parked_without_its_payload_keeps_its_whole_idempotency_key(
    store: durabilis.Store,
) -> None:
    layer = layer_on(store, lease=0.2)
    ops = layer.idempotency._ops
    key = "k" * 250  # within max_key_length, longer than any shortening would keep
    envelope = ops.pack_value({"agent_id": "a" * 300, "operation_type": "job",
                               "payload": {"n": 1}}, "payload")
    store.run(ops.claim(IdempotencyKey(key), None, envelope, "n-1"))
    store.run(layer._core._note("add", [layer._core.member(key, "n-1")]))
    time.sleep(0.3)
    [dlq_id] = layer.recover_orphans()
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.metadata["idempotency_key"] == key


@pytest.mark.parametrize(
    "envelope", [b"\xc1 not msgpack", b"\x80"], ids=["unreadable", "empty map"]
)
def test_an_orphan_whose_payload_cannot_be_read_is_parked_without_it_and_never_replayed(
    store: durabilis.Store, envelope: bytes
) -> None:
    """Its replay must not run fn with a payload of None under the original key."""
    layer = layer_on(store, lease=0.2)
    ops = layer.idempotency._ops
    store.run(ops.claim(IdempotencyKey("a1:job:k"), None, envelope, "n-1"))
    store.run(layer._core._note("add", [layer._core.member("a1:job:k", "n-1")]))
    time.sleep(0.3)
    [dlq_id] = layer.recover_orphans()
    record = layer.dlq.get(dlq_id)
    assert record.metadata["payload_error"] == "CorruptData"
    assert record.metadata["idempotency_key"] == "a1:job:k"
    op = Counter()
    result = layer.replay(dlq_id, op)
    assert result.outcome is ReplayOutcome.FAILED and op.calls == []
    assert "parked without its payload" in (result.error or "")


@pytest.fixture
def make_layer(store: durabilis.Store) -> Iterator[Callable[..., DurabilityLayer]]:
    """``layer_on(store, ...)``, closed at the end of the test: recovery leaves counts
    waiting in the process, which an unclosed layer's keep-alive sends later on (a
    warning printed into a later test's output once this test's server is gone)."""
    made: list[DurabilityLayer] = []

    def make(**kw: Any) -> DurabilityLayer:
        made.append(layer_on(store, **kw))
        return made[-1]

    yield make
    for layer in made:
        layer.close()


def _payloadless_orphan(
    layer: DurabilityLayer, caller_key: str | None, payload: Any = None
) -> str:
    """Park an orphan of ``execute("a1", "job", payload or {"n": 1})`` whose claim
    envelope is damaged (its fingerprint, kept apart, is intact); return its DLQ id."""
    req = layer._core.request("a1", "job", payload or {"n": 1}, dependency=None,
                              idempotency_key=caller_key, task_id=None, phase=None,
                              wait=None, park_on_open=True, deadline_seconds=None)
    ops, store = layer.idempotency._ops, layer.store
    store.run(ops.claim(req.key, None, b"\xc1 not msgpack", "n-1"))
    store.run(layer._core._note("add", [layer._core.member(req.key.value, "n-1")]))
    time.sleep(0.3)
    [lost] = layer.recover_orphans()
    record = layer.dlq.get(lost)
    assert record is not None and record.metadata["payload_error"] == "CorruptData"
    assert record.operation_type == "unknown" and record.original_operation is None
    return lost


@pytest.mark.parametrize("caller_key", [None, "k"], ids=["derived key", "caller's key"])
def test_a_later_parking_with_its_payload_fills_in_the_payloadless_record(
    make_layer: Callable[..., DurabilityLayer], caller_key: str | None
) -> None:
    """Merged as it was, the operation's one record kept no payload: it could never
    be replayed, and no ``operation_type`` filter listed it."""
    layer = make_layer(lease=0.2)
    lost = _payloadless_orphan(layer, caller_key)
    seen: list[ReplayOutcome] = []

    def failing(ctx: OperationContext) -> None:
        if not seen:  # its key in progress: the payload-less record's replay waits for it
            seen.append(layer.replay(lost, Counter()).outcome)
        raise OperationError("NETWORK_TIMEOUT", "still down")

    with pytest.raises(RetryExhausted) as failed:
        layer.execute("a1", "job", {"n": 1}, failing, idempotency_key=caller_key)
    assert seen == [ReplayOutcome.DEFERRED]
    assert failed.value.dlq_id == lost  # still one record per operation ...
    record = layer.dlq.get(lost)  # ... now filled in
    assert record is not None and record.original_operation == {"n": 1}
    assert (record.agent_id, record.operation_type, record.parkings) == ("a1", "job", 2)
    assert "payload_error" not in (record.metadata or {})
    assert [r.dlq_id for r in layer.dlq.list_pending("job")] == [lost]
    assert layer.dlq.pending_count("unknown") == 0
    op = Counter(result="done")
    assert layer.replay(lost, op).outcome is ReplayOutcome.REPLAYED
    assert [ctx.payload for ctx in op.calls] == [{"n": 1}]
    assert layer.dlq.pending_count() == 0


def test_a_fill_in_gives_the_record_a_whole_lifetime_and_every_dlq_key_still_expires(
    make_layer: Callable[..., DurabilityLayer], raw: Any, namespace: str
) -> None:
    """The payload parked now must not expire with the orphan's record (a day later,
    minutes after); and no index key emptied on the way may lose its TTL."""
    layer = make_layer(lease=0.2, dlq=DlqConfig(default_ttl_seconds=4))
    lost = _payloadless_orphan(layer, None)
    orphan = layer.dlq.get(lost)
    assert orphan is not None
    time.sleep(1.2)
    with pytest.raises(RetryExhausted):
        layer.execute("a1", "job", {"n": 1}, Counter(fail_codes=["NETWORK_TIMEOUT"] * 3))
    filled = layer.dlq.get(lost)
    assert filled is not None and filled.original_operation == {"n": 1}
    assert filled.expires_at - orphan.expires_at >= timedelta(seconds=1)
    dlq_keys = list(raw.scan_iter(match=f"{namespace}:dlq:*"))
    assert len(dlq_keys) >= 7
    assert {k: raw.pttl(k) for k in dlq_keys if raw.pttl(k) < 0} == {}


def test_a_replay_holding_a_payloadless_record_keeps_it_alone_and_its_failure_is_not_noted(
    make_layer: Callable[..., DurabilityLayer],
) -> None:
    """Filled in while a hand replay holds it: that replay stays the only one (it may be
    doing the operation by hand), and its failure, about a record without payload,
    must not note "handle it by hand" on a record that can now be replayed."""
    layer = make_layer(lease=0.2)
    lost = _payloadless_orphan(layer, None)
    op = Counter()

    def by_hand(record: DlqRecord) -> None:
        assert record.original_operation is None
        with pytest.raises(RetryExhausted):  # meanwhile, a delivery fails and parks it
            layer.execute("a1", "job", {"n": 1}, Counter(fail_codes=["NETWORK_TIMEOUT"] * 3))
        assert layer.replay(lost, op).outcome is ReplayOutcome.CLAIMED_ELSEWHERE
        raise RuntimeError("could not do it by hand")

    result = layer.dlq.replay(lost, by_hand)
    assert result.outcome is ReplayOutcome.DEFERRED and op.calls == []
    assert "could not do it by hand" in (result.error or "")  # told, not noted
    filled = layer.dlq.get(lost)
    assert filled is not None and filled.original_operation == {"n": 1}
    assert filled.replay_attempts == 0 and "by hand" not in (filled.last_error or "")
    assert layer.replay(lost, op).outcome is ReplayOutcome.REPLAYED and len(op.calls) == 1


def test_a_payloadless_record_that_lost_its_mark_still_notes_its_failed_replays(
    make_layer: Callable[..., DurabilityLayer], raw: Any
) -> None:
    """"Filled in since" is another stream entry, not only a missing mark: else such a
    record was deferred at every replay, never asking for a hand."""
    layer = make_layer(lease=0.2)
    lost = _payloadless_orphan(layer, None)
    raw.hdel(layer.dlq._ops.record_key(lost), "np")
    result = layer.replay(lost, Counter())
    assert result.outcome is ReplayOutcome.FAILED and result.replay_attempts == 1


def test_a_pass_over_one_operation_type_skips_a_record_filled_in_with_another(
    make_layer: Callable[..., DurabilityLayer],
) -> None:
    layer = make_layer(lease=0.2)
    first = _payloadless_orphan(layer, None, {"n": 1})
    second = _payloadless_orphan(layer, None, {"n": 2})
    seen: list[Any] = []

    def fn(ctx: OperationContext) -> None:
        seen.append(ctx.payload)

    def progress(result: Any) -> None:
        if result.dlq_id == first:  # between the listing and the next claim
            with pytest.raises(RetryExhausted):
                layer.execute("a1", "job", {"n": 2},
                              Counter(fail_codes=["NETWORK_TIMEOUT"] * 3))

    summary = layer.replay_pending(fn, operation_type="unknown", on_result=progress)
    assert seen == []  # fn for "unknown" records never got a "job" payload
    assert summary.deferred == 1
    record = layer.dlq.get(second)
    assert record is not None and record.operation_type == "job"
    assert layer.replay(second, fn).outcome is ReplayOutcome.REPLAYED and seen == [{"n": 2}]


def test_a_parking_merges_when_the_dlq_expiry_index_is_gone(
    store: durabilis.Store, raw: Any
) -> None:
    """Deleted by hand or evicted: a merge extends the shared keys' TTLs from its own
    record's expiry (it raised past its checks, half-written)."""
    ops = layer_on(store).dlq._ops
    prepared = ops.prepare("a1", "job", {"n": 1}, {"idempotency_key": "a1:job:k"})

    def park(parking: str) -> Any:
        return store.run(ops.enqueue_prepared(prepared, 3, "NETWORK_TIMEOUT", dlq_id=parking,
                                              merge_key="a1:job:k"))

    assert park("p-1")[0] == b"ok"
    raw.delete(ops.expiry_key)
    reply = park("p-2")
    assert reply[0] == b"merged" and int(reply[3]) == 2


def test_a_payloadless_record_is_settled_once_its_key_has_completed(
    make_layer: Callable[..., DurabilityLayer],
) -> None:
    layer = make_layer(lease=0.2)
    lost = _payloadless_orphan(layer, None)
    op = Counter(result="done")
    # Nothing can run it: its replay fails, asking for a hand ...
    assert layer.replay(lost, op).outcome is ReplayOutcome.FAILED and op.calls == []
    # ... until the operation completes (here recorded without settling the DLQ).
    key = IdempotencyKey.new("a1", "job", {"n": 1})
    claimed = layer.idempotency.check_and_record(key)
    assert isinstance(claimed, durabilis.idempotency.New)
    layer.idempotency.record(key, "done", claimed.token)
    assert layer.replay(lost, op).outcome is ReplayOutcome.REPLAYED and op.calls == []
    assert layer.dlq.pending_count() == 0


def test_an_interrupt_during_the_record_step_lets_the_record_land_first(
    private_redis: RedisServer, namespace: str
) -> None:
    import signal

    store = durabilis.connect(private_redis.url, namespace=namespace, socket_timeout=2)
    admin = redis.Redis.from_url(private_redis.url)
    layer = DurabilityLayer(store, fast_config(lease=5))
    fired: list[float] = []

    def interrupt(signum: int, frame: Any) -> None:
        fired.append(time.monotonic())
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        def fn(ctx: OperationContext) -> str:
            admin.execute_command("CLIENT", "PAUSE", 600, "WRITE")  # the record step waits
            signal.setitimer(signal.ITIMER_REAL, 0.2)  # Ctrl-C while it is in flight
            return "charged"

        with pytest.raises(KeyboardInterrupt):
            layer.execute("a1", "job", "p", fn)
        assert fired  # it arrived during the record step, and was delivered after it
        found = layer.idempotency.check(IdempotencyKey.new("a1", "job", "p"))
        assert found is not None and not found.in_progress
        assert found.original_result == "charged"
        assert layer.execute("a1", "job", "p", Counter()) == "charged"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        admin.close()
        store.close()


@pytest.mark.standalone_only  # (Cluster: the waves are read apart, the signal lands elsewhere)
@pytest.mark.parametrize("path", ["lean", "plans"])
def test_a_handler_raising_while_the_claim_reply_is_read_gives_the_claim_back(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Found by an adversarial review: a SIGALRM timeout whose handler raises
    TimeoutError (an Exception, not an interruption) landed in the claim step
    after the claim was written (its reply being decoded). It left the driver
    as a bug below the plan does: nothing undone, the claim in progress for
    its whole lease (the caller's retry got OperationInProgress), then parked
    by recovery as WORKER_LOST although nothing ran. It is handled as an
    interruption now: the claim goes back, the handler's own error is raised."""
    import signal

    from durabilis import _scripts

    layer = layer_on(store, lease=30)
    layer.execute("a1", "job", "warm", Counter())  # (the pair known: the lean way)
    options: dict[str, Any] = {} if path == "lean" else {"task_id": "t1", "phase": "p1"}
    key = IdempotencyKey.new("a1", "job", "p")

    def timeout(signum: int, frame: Any) -> None:
        raise TimeoutError("the caller's budget ran out")

    replies_init = _scripts.Replies.__init__
    armed = [True]

    def init(self: Any, replies: Any, status: str) -> None:
        if armed[0] and any(type(r) is list and r and r[0] == b"new" for r in replies):
            armed[0] = False  # the claim step's replies: the claim written
            os.kill(os.getpid(), signal.SIGALRM)  # its handler runs at the next bytecode
        replies_init(self, replies, status)

    previous = signal.signal(signal.SIGALRM, timeout)
    op = Counter(result="done")
    try:
        monkeypatch.setattr(_scripts.Replies, "__init__", init)
        with pytest.raises(TimeoutError, match="budget ran out"):
            layer.execute("a1", "job", "p", op, **options)
        monkeypatch.undo()
        assert not armed[0] and op.calls == []
        found = layer.idempotency.check(key)
        assert found is None  # given back clean: nothing in progress, nothing held
        assert layer.execute("a1", "job", "p", op, **options) == "done"  # at once
        assert len(op.calls) == 1 and op.calls[0].recovered is False
        assert layer.recover_orphans() == [] and layer.dlq.pending_count() == 0
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGALRM, previous)


class _Deadline(Exception):
    pass


class _Shutdown(Exception):
    pass


@pytest.mark.parametrize("second", [False, True], ids=["one handler", "a second in the drain"])
def test_a_handler_raising_while_redis_is_awaited_is_raised_as_it_is(
    private_redis: RedisServer, namespace: str, second: bool
) -> None:
    """Found by adversarial reviews: a SIGALRM deadline going off while the
    claim step waits for Redis (where a blocked caller spends its time) raises
    inside redis-py's socket read, which made it a TimeoutError of its own, and
    the store a StorageUnavailable: the caller never got its own exception. It
    gets it now, once the step's reply was waited for (the claim lands, then
    goes back: a release never overtakes it). A second handler raising during
    that wait (a shutdown request) was swallowed by it, and the first taken for
    a storage failure again: the second is raised now, the claim given back."""
    import signal

    store = durabilis.connect(private_redis.url, namespace=namespace, socket_timeout=2)
    admin = redis.Redis.from_url(private_redis.url)
    layer = DurabilityLayer(store, fast_config(lease=5, dependencies={}))
    layer.execute("a1", "job", "warm", Counter())
    key = IdempotencyKey.new("a1", "job", "p")
    alarms: list[float] = []

    def alarm(signum: int, frame: Any) -> None:
        alarms.append(time.monotonic())
        if len(alarms) == 1:  # the caller's deadline, while the claim step waits
            if second:
                signal.setitimer(signal.ITIMER_REAL, 0.1)  # a shutdown while it drains
            raise _Deadline("the caller's budget ran out")
        raise _Shutdown("shutdown requested")

    previous = signal.signal(signal.SIGALRM, alarm)
    op = Counter(result="done")
    try:
        admin.execute_command("CLIENT", "PAUSE", 500, "WRITE")  # the claim step waits
        signal.setitimer(signal.ITIMER_REAL, 0.1)  # and the alarm goes off meanwhile
        with pytest.raises(_Shutdown if second else _Deadline):
            layer.execute("a1", "job", "p", op)
        assert len(alarms) == (2 if second else 1) and op.calls == []
        assert layer.idempotency.check(key) is None  # given back: nothing in progress
        assert layer.execute("a1", "job", "p", op) == "done"
        assert len(op.calls) == 1 and op.calls[0].recovered is False
        assert layer.recover_orphans() == [] and layer.dlq.pending_count() == 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        admin.close()
        layer.close()
        store.close()


def test_a_handler_raising_a_durabilis_error_in_a_backoff_gives_the_claim_back(
    store: durabilis.Store,
) -> None:
    """Found by an adversarial review: a handler raising a DurabilisError (one
    that saves a checkpoint while Redis blips: StorageUnavailable) during a
    retry's backoff was taken for the sleep's own failure and not compensated:
    the claim stayed in progress for its lease. It is an interruption there
    now: the claim goes back touched (fn had run), the error is raised."""
    import signal

    policy = RetryPolicy("job", max_attempts=3, initial_delay_ms=400, max_delay_ms=400,
                         jitter=False, retryable_errors=("NETWORK_TIMEOUT",))
    layer = layer_on(store, lease=30, dependencies={}, retry_policies=(policy,))
    key = IdempotencyKey.new("a1", "job", "p")

    def handler(signum: int, frame: Any) -> None:
        raise durabilis.StorageUnavailable("the handler's own save failed")

    def fn(ctx: OperationContext) -> str:
        if ctx.attempt == 0:
            signal.setitimer(signal.ITIMER_REAL, 0.1)  # goes off in the 400 ms backoff
            raise durabilis.OperationError("NETWORK_TIMEOUT", "first attempt")
        return "done"

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        with pytest.raises(durabilis.StorageUnavailable, match="handler's own save"):
            layer.execute("a1", "job", "p", fn)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert layer.idempotency.check(key) is None  # given back (touched), not in progress
    op = Counter(result="again")
    assert layer.execute("a1", "job", "p", op) == "again"
    assert op.calls[0].recovered is True  # told: the first attempt may have had its effect


class _SignalWhenEncoded(tzinfo):
    """A time zone that sends the process ``signum`` the first time an offset
    is asked for: while the layer encodes fn's result, after fn returned."""

    def __init__(self, signum: int) -> None:
        self.signum, self.sent = signum, False

    def utcoffset(self, dt: datetime | None) -> timedelta:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)  # its handler runs at the next bytecode
        return timedelta(0)


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_an_interrupt_while_the_result_is_encoded_is_raised_after_the_record(
    store: durabilis.Store, signum: str
) -> None:
    """Found by an adversarial review: a signal whose handler raises (a SIGTERM
    handler calling sys.exit, Ctrl-C) landed in the plan's own code after fn
    returned, while its result was encoded: the plan was closed there, nothing
    recorded, the claim left to lapse and the operation run again."""
    import signal

    number = getattr(signal, signum)
    layer = layer_on(store, lease=5)
    calls: list[int] = []

    def exit_now(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    def fn(ctx: OperationContext) -> Any:
        calls.append(1)
        return {"at": datetime(2026, 12, 2, tzinfo=_SignalWhenEncoded(number))}

    previous = signal.signal(number, exit_now)
    try:
        with pytest.raises(SystemExit):  # raised once the outcome is recorded
            layer.execute("a1", "job", "p", fn)
        assert signal.getsignal(number) is exit_now  # held back for the call only
    finally:
        signal.signal(number, previous)
    found = layer.idempotency.check(IdempotencyKey.new("a1", "job", "p"))
    assert found is not None and not found.in_progress
    at = datetime(2026, 12, 2, tzinfo=UTC)
    assert layer.execute("a1", "job", "p", Counter()) == {"at": at}
    assert calls == [1]


def test_a_signal_while_fn_runs_still_interrupts_fn_at_once(store: durabilis.Store) -> None:
    """The signals held back in the plan's own code are not held back in fn: a
    Ctrl-C or SIGTERM handler stops fn there, and the claim is given back."""
    import signal

    layer = layer_on(store, lease=5)

    def exit_now(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    def fn(ctx: OperationContext) -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted here, not after
        return "never"

    previous = signal.signal(signal.SIGTERM, exit_now)
    started = time.monotonic()
    try:
        with pytest.raises(SystemExit):
            layer.execute("a1", "job", "p", fn)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert time.monotonic() - started < 2
    assert signal.getsignal(signal.SIGTERM) is previous
    assert layer.execute("a1", "job", "p", Counter(result="ran")) == "ran"  # released


# --- 7. a parked operation that a later delivery completes ------------------------------------


def test_a_later_delivery_that_completes_settles_the_parked_record(
    store: durabilis.Store,
) -> None:
    """Parked (retries exhausted), then delivered again and completed: its DLQ
    record is finished with that outcome, so a replay after the dedup window
    (when the result that would answer it is gone) cannot run it a second time."""
    layer = layer_on(store, dependencies={}, idempotency=IdempotencyConfig(dedup_window_seconds=1))
    with pytest.raises(RetryExhausted) as parked:
        layer.execute("a1", "job", {"n": 1}, Counter(["NETWORK_TIMEOUT"] * 3))
    assert [r.dlq_id for r in layer.dlq.list_pending()] == [parked.value.dlq_id]
    done = Counter()
    assert layer.execute("a1", "job", {"n": 1}, done) == "done"
    assert layer.dlq.list_pending() == []
    record = layer.dlq.get(parked.value.dlq_id)
    assert record is not None and record.status.value == "replayed"
    assert record.replayed_by == "a later delivery"
    time.sleep(1.2)  # the dedup window ends: the result is gone
    again = Counter()
    summary = layer.replay_pending(again)
    assert summary.replayed == 0 and again.calls == []
    assert len(done.calls) == 1


def test_a_later_delivery_settles_an_orphan_parked_by_recovery(store: durabilis.Store) -> None:
    layer = layer_on(store, lease=0.2, dependencies={})
    req = layer._core.request("a1", "job", "p", dependency=None, idempotency_key=None,
                              task_id=None, phase=None, wait=None, park_on_open=False,
                              deadline_seconds=None)
    step_plan(layer._core.execute_plan(req, Counter()), store, until=lambda s: type(s) is Run)
    time.sleep(0.3)  # the owner died: its lease ends
    [dlq_id] = layer.recover_orphans()
    assert layer.execute("a1", "job", "p", Counter()) == "done"
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.status.value == "replayed"
    assert layer.dlq.list_pending() == []


def test_the_settle_finds_the_keys_record_under_another_id(store: durabilis.Store) -> None:
    """The key's first record was abandoned (its id, derived from the key, is
    taken); a new parking gets another id; the success settles that one."""
    layer = layer_on(store, dependencies={})
    with pytest.raises(RetryExhausted) as first:
        layer.execute("a1", "job", "q", Counter(["NETWORK_TIMEOUT"] * 3))
    assert layer.dlq.abandon(first.value.dlq_id)
    with pytest.raises(RetryExhausted) as second:
        layer.execute("a1", "job", "q", Counter(["NETWORK_TIMEOUT"] * 3))
    assert second.value.dlq_id != first.value.dlq_id
    assert layer.execute("a1", "job", "q", Counter()) == "done"
    record = layer.dlq.get(second.value.dlq_id)
    assert record is not None and record.status.value == "replayed"
    old = layer.dlq.get(first.value.dlq_id)
    assert old is not None and old.status.value == "abandoned"  # a final record stays so


def test_a_replay_finishes_its_own_record_not_as_a_later_delivery(
    store: durabilis.Store,
) -> None:
    layer = layer_on(store, dependencies={})
    with pytest.raises(RetryExhausted) as parked:
        layer.execute("a1", "job", "r", Counter(["NETWORK_TIMEOUT"] * 3))
    result = layer.replay(parked.value.dlq_id, Counter())
    assert result.outcome.value == "replayed"
    record = layer.dlq.get(parked.value.dlq_id)
    assert record is not None and record.replayed_by != "a later delivery"


def test_a_delivery_after_the_dedup_window_still_settles_the_parked_record(
    store: durabilis.Store, raw: Any
) -> None:
    """A parked operation's tombstone lives as long as its DLQ record, so a
    delivery after the window still learns there was an earlier claim."""
    layer = layer_on(store, dependencies={}, idempotency=IdempotencyConfig(dedup_window_seconds=1))
    with pytest.raises(RetryExhausted) as parked:
        layer.execute("a1", "job", {"n": 2}, Counter(["NETWORK_TIMEOUT"] * 3))
    key = store.keys.idem(IdempotencyKey.new("a1", "job", {"n": 2}).value)
    assert raw.pttl(key) > 3_600_000  # held with the record (a day), not the window
    time.sleep(1.2)
    assert layer.execute("a1", "job", {"n": 2}, Counter()) == "done"
    record = layer.dlq.get(parked.value.dlq_id)
    assert record is not None and record.replayed_by == "a later delivery"


def test_a_failure_after_parking_keeps_the_tombstone_held_for_the_settle(
    store: durabilis.Store, raw: Any
) -> None:
    """Parked, then delivered again and failed for good (the claim released
    without a hold), then completed after the dedup window: still settled."""
    layer = layer_on(store, dependencies={}, lease=1,
                     idempotency=IdempotencyConfig(dedup_window_seconds=1,
                                                   in_progress_ttl_seconds=1))
    with pytest.raises(RetryExhausted) as parked:
        layer.execute("a1", "job", {"n": 3}, Counter(["NETWORK_TIMEOUT"] * 3))
    with pytest.raises(durabilis.OperationError):  # non-retryable: released, not parked
        layer.execute("a1", "job", {"n": 3}, Counter(["PERMISSION_DENIED"]))
    key = store.keys.idem(IdempotencyKey.new("a1", "job", {"n": 3}).value)
    assert raw.pttl(key) > 3_600_000  # the hold outlived that release
    time.sleep(1.2)
    done = Counter()
    assert layer.execute("a1", "job", {"n": 3}, done) == "done"
    record = layer.dlq.get(parked.value.dlq_id)
    assert record is not None and record.replayed_by == "a later delivery"
    again = Counter()
    assert layer.replay(parked.value.dlq_id, again).outcome.value == "not_pending"
    assert again.calls == []


def test_a_replay_whose_result_cannot_be_stored_is_replayed_not_lost(
    store: durabilis.Store,
) -> None:
    layer = layer_on(store, dependencies={},
                     idempotency=IdempotencyConfig(max_value_bytes=1024))
    with pytest.raises(RetryExhausted) as parked:
        layer.execute("a1", "job", "big", Counter(["NETWORK_TIMEOUT"] * 3))
    replayer = Counter(result="x" * 5000)  # over max_value_bytes: completed, not stored
    result = layer.replay(parked.value.dlq_id, replayer)
    assert result.outcome.value == "replayed" and len(replayer.calls) == 1
    record = layer.dlq.get(parked.value.dlq_id)
    assert record is not None and record.status.value == "replayed"


# --- 8. the retry review: a swallowed cancellation, classification and events that raise --------


@pytest.mark.parametrize("ending", ["raises", "returns"])
def test_an_async_fn_that_swallows_the_caller_s_cancellation_is_not_retried(
    redis_url: str, namespace: str, ending: str
) -> None:
    """fn turns the caller's cancellation into an ordinary outcome (a client maps
    it to its own error; redis-py's wait_for loses it on 3.11): the call ends
    cancelled, with no further attempt. A failure gives the claim back touched;
    a result is recorded first."""

    async def body(layer: AsyncDurabilityLayer, store: durabilis.aio.Store) -> None:
        calls: list[int] = []

        async def fn(ctx: OperationContext) -> str:
            calls.append(ctx.attempt)
            return await swallow_own_cancel(ending)

        with pytest.raises(asyncio.CancelledError):
            await layer.execute("a1", "job", "p", fn)
        assert calls == [0]
        after = Counter(result="next")
        got = await layer.execute("a1", "job", "p", after)
        if ending == "raises":
            assert got == "next" and after.calls[0].recovered  # given back touched
        else:
            assert got == "swallowed" and after.calls == []  # its result was recorded

    run_async(redis_url, namespace, body)


def test_an_fn_that_swallows_the_cancellation_a_nested_call_s_record_held_is_seen(
    redis_url: str, namespace: str
) -> None:
    """fn makes a durable call of its own; the caller's cancellation lands while
    that inner call's record is out (held back in the task until its reply,
    then raised by the inner call), and fn turns it into a result: the outer
    call records that result and ends cancelled, as for any cancellation fn
    swallows (the held one is not left out of the count once delivered)."""

    async def body(layer: AsyncDurabilityLayer, store: durabilis.aio.Store) -> None:
        loop = asyncio.get_running_loop()
        task: list[asyncio.Task[Any]] = []

        async def inner(ctx: OperationContext) -> str:
            loop.call_soon(task[0].cancel)  # lands while the inner record is out
            return "inner done"

        async def outer(ctx: OperationContext) -> str:
            try:
                return await layer.execute("a1", "inner", "p", inner)
            except asyncio.CancelledError:
                return "swallowed"

        await layer.execute("a0", "job", "p", Counter())  # (the store's first use is behind)
        task.append(asyncio.ensure_future(layer.execute("a1", "outer", "p", outer)))
        with pytest.raises(asyncio.CancelledError):
            await task[0]
        assert await layer.execute("a1", "inner", "p", Counter(result="x")) == "inner done"
        after = Counter(result="again")
        assert await layer.execute("a1", "outer", "p", after) == "swallowed"
        assert after.calls == []  # recorded, not run again

    run_async(redis_url, namespace, body)


def test_a_retry_after_too_large_for_a_float_is_capped_and_the_operation_retried(
    store: durabilis.Store,
) -> None:
    layer = layer_on(store)
    calls: list[int] = []

    def fn(ctx: OperationContext) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt == 0:  # int(a 400-digit Retry-After header)
            raise OperationError("NETWORK_TIMEOUT", "slow", retry_after=10**400)
        return "ok"

    assert layer.execute("a1", "job", "p", fn) == "ok"
    assert calls == [0, 1]
    layer.close()


class _PolicyThatRaises(RetryPolicy):
    """A policy whose decision raises (a subclass's bug): the decision fails."""

    def is_retryable(self, code: str) -> bool:
        raise RuntimeError("a policy bug")


def test_a_decision_that_raises_parks_the_operation_instead_of_holding_its_claim(
    store: durabilis.Store,
) -> None:
    policy = _PolicyThatRaises("job", 3, 1, 2, jitter=False)
    layer = layer_on(store, retry_policies=(policy,))
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", "p", Counter(["NETWORK_TIMEOUT"]))
    assert isinstance(info.value.__cause__, OperationError)
    assert layer.dlq.get(info.value.dlq_id) is not None  # parked, for an operator
    state = layer.idempotency.check(IdempotencyKey.new("a1", "job", "p"))
    assert state is None or not state.in_progress  # not held for the lease
    layer.close()


class _PolicyThatExits(RetryPolicy):
    """A policy whose own code raises SystemExit while the layer decides."""

    def is_retryable(self, code: str) -> bool:
        raise SystemExit("the policy's own code exits")


class _ExitingCode(Exception):
    """An error whose ``code`` property exits: its classification raises SystemExit."""

    @property
    def code(self) -> str:
        raise SystemExit("the error's own code property exits")


class _ExitingText(Exception):
    """A retryable error whose ``__str__`` exits: writing it down for the DLQ
    (once the retries ran out) raises SystemExit."""

    code = "NETWORK_TIMEOUT"

    def __str__(self) -> str:
        raise SystemExit("the error's own __str__ exits")


@pytest.mark.parametrize("guarded", [False, True], ids=["no-breaker", "breaker"])
@pytest.mark.parametrize("source", ["policy", "classification"])
def test_a_decision_that_raises_system_exit_gives_the_claim_back_touched(
    store: durabilis.Store, guarded: bool, source: str,
) -> None:
    """An interruption raised while the layer decides (by the policy's code, or
    by the failed attempt's error as it is classified), not by a step: no step
    is running to compensate, yet the claim goes back at once (touched: the
    next delivery runs with ``recovered``), not held for its lease."""
    policy = (_PolicyThatExits if source == "policy" else RetryPolicy)("job", 3, 1, 2, jitter=False)
    layer = layer_on(
        store, retry_policies=(policy,), dependencies={"job": "svc"} if guarded else {},
    )

    def failing(ctx: OperationContext) -> str:
        if source == "policy":
            raise OperationError("NETWORK_TIMEOUT", "down")
        raise _ExitingCode("down")

    with pytest.raises(SystemExit):
        layer.execute("a1", "job", "p", failing)
    state = layer.idempotency.check(IdempotencyKey.new("a1", "job", "p"))
    assert state is None or not state.in_progress  # given back, not held for the lease
    seen: list[bool] = []

    def again(ctx: OperationContext) -> str:
        seen.append(ctx.recovered)
        return "done"

    assert layer.execute("a1", "job", "p", again) == "done"
    assert seen == [True]  # fn had run: the next delivery knows
    layer.close()


def test_a_failure_whose_str_exits_is_parked_not_held(store: durabilis.Store) -> None:
    """An error whose ``__str__`` raises SystemExit, once the retries ran out:
    written down by its type, parked in the DLQ, its claim not held."""
    layer = layer_on(store, dependencies={})
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", "p", lambda ctx: (_ for _ in ()).throw(_ExitingText()))
    record = layer.dlq.get(info.value.dlq_id)
    assert record is not None and "_ExitingText" in (record.last_error or "")
    state = layer.idempotency.check(IdempotencyKey.new("a1", "job", "p"))
    assert state is None or not state.in_progress
    layer.close()


def test_a_logging_filter_that_raises_on_the_retry_event_never_holds_the_claim(
    store: durabilis.Store,
) -> None:
    class Raising(logging.Filter):
        seen = 0

        def filter(self, record: logging.LogRecord) -> bool:
            if record.getMessage().startswith("durability_retry"):
                Raising.seen += 1
                raise RuntimeError("a buggy logging filter")
            return True

    bad = Raising()
    logger = logging.getLogger("durabilis")
    logger.addFilter(bad)
    try:
        layer = layer_on(store)
        op = Counter(["NETWORK_TIMEOUT"])
        assert layer.execute("a1", "job", "p", op) == "done"
        assert len(op.calls) == 2
        with pytest.raises(RetryExhausted):  # the stop event raises too: parked all the same
            layer.execute("a1", "job", "q", Counter(["NETWORK_TIMEOUT"] * 3))
    finally:
        logger.removeFilter(bad)
    assert Raising.seen >= 2  # the filter ran, and raised
    state = layer.idempotency.check(IdempotencyKey.new("a1", "job", "q"))
    assert state is None or not state.in_progress
    layer.close()
