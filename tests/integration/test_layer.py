"""DurabilityLayer end to end against a real Redis: every branch of DESIGN §6."""

from __future__ import annotations

import threading
import time

import pytest
import redis

import durabilis
from durabilis import (
    CircuitBreakerConfig,
    CircuitOpen,
    OperationError,
    OperationInProgress,
    RetryExhausted,
)
from durabilis.dlq import DlqStatus, ReplayOutcome
from durabilis.errors import DependencyNotFound, PayloadTooLarge
from durabilis.layer import DurabilityLayer, OperationContext, current_operation
from tests.integration._layer_support import Counter, fast_config

pytestmark = pytest.mark.topologies("cluster", "sentinel")


@pytest.fixture
def layer(store: durabilis.Store) -> DurabilityLayer:
    return DurabilityLayer(store, fast_config())


def test_success_runs_once_and_a_duplicate_returns_the_stored_result(
    layer: DurabilityLayer,
) -> None:
    op = Counter(result={"page": 7})
    assert layer.execute("a1", "job", {"text": "hi"}, op) == {"page": 7}
    assert layer.execute("a1", "job", {"text": "hi"}, op) == {"page": 7}
    assert len(op.calls) == 1
    ctx = op.calls[0]
    assert ctx.idempotency_key == str(durabilis.IdempotencyKey.new("a1", "job", {"text": "hi"}))
    assert ctx.token and ctx.attempt == 0 and ctx.dependency == "svc"
    stats = layer.stats()
    assert (stats.started, stats.succeeded, stats.duplicates, stats.in_flight) == (1, 1, 1, 0)


def test_transient_failure_is_retried_and_reported_to_the_breaker(
    layer: DurabilityLayer,
) -> None:
    op = Counter(["NETWORK_TIMEOUT"])
    assert layer.execute("a1", "job", "p", op) == "done"
    assert [c.attempt for c in op.calls] == [0, 1]
    assert op.calls[0].token == op.calls[1].token  # one claim for every attempt
    info = layer.breakers.state_info("svc")
    assert (info.request_count, info.failure_count) == (2, 1)
    assert layer.stats().retries == 1


def test_non_retryable_error_releases_the_claim_without_dlq(layer: DurabilityLayer) -> None:
    op = Counter(["PERMISSION_DENIED"])
    with pytest.raises(OperationError) as info:
        layer.execute("a1", "job", "p", op)
    assert info.value.code == "PERMISSION_DENIED"
    assert layer.dlq.pending_count() == 0
    assert layer.breakers.state_info("svc").request_count == 0  # not a dependency failure
    # The claim was released: the same operation can run again.
    assert layer.execute("a1", "job", "p", op) == "done"
    assert len(op.calls) == 2


def test_exhaustion_parks_in_the_dlq_and_replay_runs_it_with_the_same_key(
    layer: DurabilityLayer,
) -> None:
    op = Counter(["NETWORK_TIMEOUT"] * 3)
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", {"n": 1}, op)
    err = info.value
    assert err.attempts == 3 and err.final_error == "NETWORK_TIMEOUT" and err.dlq_id
    record = layer.dlq.get(err.dlq_id)
    assert record is not None and record.original_operation == {"n": 1}
    assert record.retry_count == 3 and record.agent_id == "a1"
    assert record.metadata["idempotency_key"] == op.calls[0].idempotency_key
    assert layer.idempotency.check(op.calls[0].idempotency_key) is None  # claim released

    result = layer.replay(err.dlq_id, op)
    assert result.outcome is ReplayOutcome.REPLAYED
    assert op.calls[-1].replay is True
    assert op.calls[-1].idempotency_key == op.calls[0].idempotency_key
    assert len(op.calls) == 4
    # Replayed once: the stored result answers now, nothing runs again.
    assert layer.execute("a1", "job", {"n": 1}, op) == "done"
    assert layer.replay(err.dlq_id, op).outcome is ReplayOutcome.NOT_PENDING
    assert len(op.calls) == 4


def test_replay_of_an_operation_that_completed_meanwhile_does_not_run_it(
    layer: DurabilityLayer,
) -> None:
    failing = Counter(["NETWORK_TIMEOUT"] * 3)
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", "x", failing)
    layer.execute("a1", "job", "x", Counter(result="by a retry"))  # completes it
    record = layer.dlq.get(str(info.value.dlq_id))  # and settles its parked record
    assert record is not None and record.replayed_by == "a later delivery"
    replayer = Counter(result="should not run")
    assert layer.replay(str(info.value.dlq_id), replayer).outcome is ReplayOutcome.NOT_PENDING
    assert replayer.calls == []


def test_exhaustion_during_replay_keeps_the_record_pending(layer: DurabilityLayer) -> None:
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", "x", Counter(["NETWORK_TIMEOUT"] * 3))
    dlq_id = str(info.value.dlq_id)
    result = layer.replay(dlq_id, Counter(["NETWORK_TIMEOUT"] * 3))
    assert result.outcome is ReplayOutcome.FAILED
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.replay_attempts == 1
    assert layer.dlq.stats().pending == 1  # no second record for the same operation


def test_a_record_the_layer_cannot_rebuild_fails_its_replay_and_the_pass_goes_on(
    layer: DurabilityLayer,
) -> None:
    """A record parked by hand whose payload no content key can be made of
    (bytes inside): its replay FAILS (noted on the record, the claim given
    back) instead of raising out of the pass, and the records behind it (the
    pass goes oldest first) are replayed."""
    bad = layer.dlq.enqueue("a1", "job", {"blob": b"\x00"}, retry_count=3, last_error="X")
    good = [layer.dlq.enqueue("a1", "job", {"page": i}, retry_count=3, last_error="X")
            for i in range(3)]
    op = Counter(result="ok")
    summary = layer.replay_pending(op)
    assert (summary.replayed, summary.failed_ids) == (3, (bad,))
    assert sorted(c.payload["page"] for c in op.calls) == [0, 1, 2]
    assert all(layer.dlq.get(i).status is DlqStatus.REPLAYED for i in good)
    record = layer.dlq.get(bad)
    assert record.status is DlqStatus.PENDING and record.replay_attempts == 1
    assert record.last_error.startswith("InvalidPayload")
    # The claim was given back: the next replay tries (and fails) again at once.
    assert layer.replay(bad, op).outcome is ReplayOutcome.FAILED
    assert layer.dlq.get(bad).replay_attempts == 2 and len(op.calls) == 3


def test_a_record_parked_under_a_dependency_renamed_since_is_a_config_error_not_an_attempt(
    store: durabilis.Store, layer: DurabilityLayer,
) -> None:
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", "x", Counter(["NETWORK_TIMEOUT"] * 3))
    dlq_id = str(info.value.dlq_id)
    renamed = DurabilityLayer(store, fast_config(
        breaker=CircuitBreakerConfig("svc2"), dependencies={"job": "svc2"},
    ))
    op = Counter(result="ok")
    result = renamed.replay(dlq_id, op)
    assert result.outcome is ReplayOutcome.CONFIG_ERROR and op.calls == []
    assert result.error is not None and "svc" in result.error
    record = renamed.dlq.get(dlq_id)
    assert record.status is DlqStatus.PENDING and record.replay_attempts == 0
    assert record.last_replay_error == result.error and "NETWORK_TIMEOUT" in record.last_error
    # Replayed through a layer that knows the dependency again, it runs.
    assert layer.replay(dlq_id, op).outcome is ReplayOutcome.REPLAYED


def test_open_breaker_refuses_before_any_attempt_and_releases_the_claim(
    layer: DurabilityLayer,
) -> None:
    layer.breakers.force_open("svc")
    op = Counter()
    with pytest.raises(CircuitOpen) as info:
        layer.execute("a1", "job", "p", op)
    assert info.value.dependency == "svc" and info.value.retry_after > 0
    assert op.calls == []
    assert layer.dlq.pending_count() == 0
    layer.breakers.force_close("svc")
    assert layer.execute("a1", "job", "p", op) == "done"


def test_park_on_open_puts_a_refused_operation_in_the_dlq(layer: DurabilityLayer) -> None:
    layer.breakers.force_open("svc")
    op = Counter()
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", {"msg": "fire and forget"}, op, park_on_open=True)
    assert info.value.final_error == "CIRCUIT_OPEN" and op.calls == []
    record = layer.dlq.get(str(info.value.dlq_id))
    assert record is not None and record.metadata["reason"] == "CIRCUIT_OPEN"


def test_breaker_opening_mid_way_parks_the_operation(store: durabilis.Store) -> None:
    # One failure in a window of one opens the breaker: the retry is refused.
    config = fast_config(breaker=CircuitBreakerConfig("svc", 0.5, 1, 5, 1, 1, 5))
    layer = DurabilityLayer(store, config)
    op = Counter(["NETWORK_TIMEOUT"] * 3)
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", "p", op)
    assert len(op.calls) == 1
    assert info.value.final_error == "CIRCUIT_OPEN" and info.value.dlq_id
    assert layer.breakers.state("svc").value == "open"


def test_in_progress_duplicate_raises_or_waits_for_the_winner(layer: DurabilityLayer) -> None:
    release = threading.Event()
    started = threading.Event()

    def slow(ctx: OperationContext) -> str:
        started.set()
        assert release.wait(10)
        return "winner's result"

    winner = threading.Thread(target=layer.execute, args=("a1", "job", "p", slow))
    winner.start()
    assert started.wait(10)
    with pytest.raises(OperationInProgress):
        layer.execute("a1", "job", "p", Counter())
    threading.Timer(0.3, release.set).start()
    waiter = Counter()
    assert layer.execute("a1", "job", "p", waiter, wait=5) == "winner's result"
    assert waiter.calls == []
    winner.join(10)


def test_waiter_takes_over_when_the_winner_dies(store: durabilis.Store, raw: redis.Redis) -> None:
    layer = DurabilityLayer(store, fast_config(lease=0.5))
    # A winner that died right after its claim: claim by hand, never renewed.
    dead = layer.idempotency.check_and_record(
        durabilis.IdempotencyKey.new("a1", "job", "p")
    )
    assert isinstance(dead, durabilis.idempotency.New)
    op = Counter(result="ran by the waiter")
    assert layer.execute("a1", "job", "p", op, wait=5) == "ran by the waiter"
    assert len(op.calls) == 1


def test_a_live_worker_keeps_its_lease_beyond_the_lease_time(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, fast_config(lease=0.6))
    other = DurabilityLayer(store, fast_config(lease=0.6))

    def slow(ctx: OperationContext) -> str:
        time.sleep(1.8)  # three leases long
        return "slow but alive"

    thread = threading.Thread(target=layer.execute, args=("a1", "job", "p", slow))
    thread.start()
    time.sleep(1.2)
    with pytest.raises(OperationInProgress):  # not taken over: the lease was renewed
        other.execute("a1", "job", "p", Counter())
    thread.join(10)
    assert other.execute("a1", "job", "p", Counter()) == "slow but alive"


def test_an_idle_layer_s_keep_alive_ends_and_the_next_claim_starts_it_again(
    store: durabilis.Store,
) -> None:
    """A layer left unclosed kept its keep-alive thread (and so itself) for the
    life of the process; now the thread ends once nothing is held or waits."""
    layer = DurabilityLayer(store, fast_config(lease=0.6))
    other = DurabilityLayer(store, fast_config(lease=0.6))
    layer.execute("a1", "job", "p-1", Counter())
    first = layer._renewer
    assert first is not None and first.is_alive()  # its counts wait in the process
    first.join(5)
    assert not first.is_alive() and layer._renewer is None
    assert int(store.command("HGET", store.keys.layer("stats"), "succeeded") or 0) == 1

    def slow(ctx: OperationContext) -> str:
        time.sleep(1.8)  # three leases long: renewed by a new keep-alive
        return "slow but alive"

    thread = threading.Thread(target=layer.execute, args=("a1", "job", "p-2", slow))
    thread.start()
    time.sleep(1.2)
    with pytest.raises(OperationInProgress):
        other.execute("a1", "job", "p-2", Counter())
    thread.join(10)
    assert other.execute("a1", "job", "p-2", Counter()) == "slow but alive"
    other.close()
    layer.close()


def test_success_with_a_phase_saves_the_checkpoint(layer: DurabilityLayer) -> None:
    layer.execute("a1", "job", "fetch", Counter(result={"rows": 3}), task_id="t1", phase="fetch")
    checkpoint = layer.checkpoints.restore("t1", "a1")
    assert checkpoint.phase == "fetch" and checkpoint.state == {"rows": 3}


def test_bad_input_is_refused_before_any_redis_call() -> None:
    store = durabilis.connect("redis://127.0.0.1:1/0", namespace="t", socket_connect_timeout=0.2)
    layer = DurabilityLayer(store, fast_config())
    with pytest.raises(DependencyNotFound):
        layer.execute("a1", "job", "p", Counter(), dependency="nope")
    with pytest.raises(PayloadTooLarge):
        layer.execute("a1", "job", "x" * (2 * 1024 * 1024), Counter())
    with pytest.raises(durabilis.errors.InvalidKey):
        layer.execute("a1", "job", "p", Counter(), idempotency_key="k" * 300)
    with pytest.raises(durabilis.StorageUnavailable):
        layer.execute("a1", "job", "p", Counter())


def test_decorator_makes_each_call_durable_and_exposes_the_context(
    layer: DurabilityLayer,
) -> None:
    seen: list[OperationContext | None] = []

    @layer.durable("job", agent_id="wiki-bot")
    def edit(page: int, text: str) -> str:
        seen.append(current_operation())
        return f"{page}:{text}"

    assert edit(1, text="a") == "1:a"
    assert edit(1, text="a") == "1:a"
    assert edit(2, text="a") == "2:a"
    assert len(seen) == 2
    assert seen[0] is not None and seen[0].agent_id == "wiki-bot"
    # Bound to the signature: every parameter passable by position, in "args".
    assert seen[0].payload == {"args": [1, "a"], "kwargs": {}}
    assert current_operation() is None


def test_disabled_idempotency_runs_every_call(store: durabilis.Store) -> None:
    cfg = fast_config()
    layer = DurabilityLayer(
        store,
        durabilis.DurabilityConfig(
            idempotency=durabilis.IdempotencyConfig(enabled=False),
            retry_policies=cfg.retry_policies, breakers=cfg.breakers,
            dependencies=cfg.dependencies,
        ),
    )
    op = Counter()
    layer.execute("a1", "job", "p", op)
    layer.execute("a1", "job", "p", op)
    assert len(op.calls) == 2 and op.calls[0].token is None
