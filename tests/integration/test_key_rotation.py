"""Rotating the content-key secret is an operation, not a hazard (issue 35, hole 2).

While ``previous_key_secrets`` are configured, a claim, a duplicate check and a
DLQ settle recognise an operation completed, in progress or parked under any
of them; a replay of a record parked under an old secret never runs again an
operation completed under the new one. Without previous secrets a durable call
costs what it always did.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from typing import Any

import pytest

import durabilis
from durabilis import IdempotencyConfig, IdempotencyKey, RetryExhausted
from durabilis.dlq import DlqStatus, ReplayOutcome
from durabilis.layer import AsyncDurabilityLayer, DurabilityLayer, OperationContext
from tests.integration._layer_support import Counter, fast_config
from tests.integration._rotation_workers import (
    NEW,
    OLD,
    dead_in_fn_worker,
    race_worker,
    rotation_config,
)
from tests.integration.test_layer_round_trips import EXPECTED, Sends, round_trips, sends
from tests.support.backends import raw_client
from tests.support.waits import wait_until

__all__ = ["sends"]  # (the fixture, shared with the round-trip tests)

# Cluster: the aliases live in other slots than the key (read in a wave after
# the claim's, never in its script); the DLQ settles go beside the record.
pytestmark = pytest.mark.topologies("cluster")

PAYLOAD = {"to": "acct 456", "amount": 7}
EXHAUST = ["NETWORK_TIMEOUT"] * 3  # FAST_POLICY's three attempts, all failing


def old_config() -> Any:
    return rotation_config(OLD)


def new_config() -> Any:
    return rotation_config(NEW)


def assert_the_delivery_under_the_new_secret_runs_once_flagged(store: durabilis.Store) -> None:
    """A delivery of PAYLOAD on a replica already rotated (NEW, previous OLD)
    runs ``fn`` once, told an earlier run may have had its effect."""
    after = DurabilityLayer(store, rotation_config(NEW, OLD))
    op = Counter(result="sent")
    try:
        assert after.execute("a1", "job", PAYLOAD, op) == "sent"
        assert len(op.calls) == 1 and op.calls[0].recovered
    finally:
        after.close()


def test_the_previous_secrets_are_never_shown_and_load_from_toml_and_the_environment(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durabilis.config import config_to_dict, load_config
    from durabilis.layer import DurabilityConfig

    cfg = IdempotencyConfig(key_secret=NEW, previous_key_secrets=[OLD])  # type: ignore[arg-type]
    assert cfg.previous_key_secrets == (OLD,)
    assert OLD not in repr(cfg) and OLD not in repr(DurabilityConfig(idempotency=cfg))
    shown = config_to_dict(DurabilityConfig(idempotency=cfg))["idempotency"]
    assert shown["previous_key_secrets"] == ["***"] and OLD not in str(shown)
    for bad in (("short",), OLD, (OLD, 7), (OLD,) * 9):
        with pytest.raises(durabilis.ConfigError, match="previous_key_secrets"):
            IdempotencyConfig(previous_key_secrets=bad)  # type: ignore[arg-type]
    path = tmp_path / "durabilis.toml"
    path.write_text(f'[idempotency]\nprevious_key_secrets = ["{OLD}"]\n', encoding="utf-8")
    assert load_config(path, environ={}).idempotency.previous_key_secrets == (OLD,)
    path.write_text('[idempotency]\nprevious_key_secrets = ["short"]\n', encoding="utf-8")
    with pytest.raises(durabilis.ConfigError, match="previous_key_secrets"):
        load_config(path, environ={})
    monkeypatch.setenv("DURABILIS_PREVIOUS_KEY_SECRETS", f"{OLD}, {'p' * 20}")
    assert IdempotencyConfig().content_key_previous_secrets == (OLD, "p" * 20)
    monkeypatch.setenv("DURABILIS_PREVIOUS_KEY_SECRETS", "short")
    with pytest.raises(durabilis.ConfigError, match="previous_key_secrets"):
        IdempotencyConfig().content_key_previous_secrets  # noqa: B018


def test_an_operation_parked_before_a_rotation_is_settled_by_its_delivery_and_never_replayed(
    store: durabilis.Store,
) -> None:
    before = DurabilityLayer(store, old_config())
    with pytest.raises(RetryExhausted) as parked:
        before.execute("a1", "job", PAYLOAD, Counter(EXHAUST))
    dlq_id = str(parked.value.dlq_id)
    after = DurabilityLayer(store, rotation_config(NEW, OLD))
    op = Counter(result="sent")
    try:
        assert after.execute("a1", "job", PAYLOAD, op) == "sent"
        summary = after.replay_pending(op)
        assert len(op.calls) == 1 and summary.replayed + summary.failed == 0
        record = after.dlq.get(dlq_id)
        assert record is not None and record.status is DlqStatus.REPLAYED
        assert after.dlq.pending_count() == 0
    finally:
        before.close()
        after.close()


def test_a_success_after_a_rotation_settles_the_records_parked_under_both_secrets(
    store: durabilis.Store,
) -> None:
    layers = [DurabilityLayer(store, old_config()), DurabilityLayer(store, new_config())]
    parked = []
    for layer in layers:  # parked once under each secret: two records
        with pytest.raises(RetryExhausted) as info:
            layer.execute("a1", "job", PAYLOAD, Counter(EXHAUST))
        parked.append(str(info.value.dlq_id))
    assert len(set(parked)) == 2
    after = DurabilityLayer(store, rotation_config(NEW, OLD))
    op = Counter(result="sent")
    try:
        assert after.execute("a1", "job", PAYLOAD, op) == "sent"
        for dlq_id in parked:
            record = after.dlq.get(dlq_id)
            assert record is not None and record.status is DlqStatus.REPLAYED
        assert after.replay_pending(op).replayed == 0 and len(op.calls) == 1
    finally:
        for layer in (*layers, after):
            layer.close()


def test_a_replay_of_a_record_parked_under_the_old_secret_never_runs_an_operation_completed_under_the_new(  # noqa: E501
    store: durabilis.Store,
) -> None:
    before = DurabilityLayer(store, old_config())
    with pytest.raises(RetryExhausted) as parked:
        before.execute("a1", "job", PAYLOAD, Counter(EXHAUST))
    dlq_id = str(parked.value.dlq_id)
    unaware = DurabilityLayer(store, new_config())  # rotated without previous secrets
    op = Counter(result="sent")
    assert unaware.execute("a1", "job", PAYLOAD, op) == "sent"
    record = unaware.dlq.get(dlq_id)
    assert record is not None and record.status is DlqStatus.PENDING  # nothing settled it
    after = DurabilityLayer(store, rotation_config(NEW, OLD))
    try:
        result = after.replay(dlq_id, op)
        assert result.outcome is ReplayOutcome.REPLAYED and len(op.calls) == 1
        record = after.dlq.get(dlq_id)
        assert record is not None and record.status is DlqStatus.REPLAYED
    finally:
        for layer in (before, unaware, after):
            layer.close()


def test_an_operation_completed_under_the_old_secret_is_a_duplicate_after_the_rotation(
    store: durabilis.Store,
) -> None:
    before = DurabilityLayer(store, old_config())
    after = DurabilityLayer(store, rotation_config(NEW, OLD))
    op = Counter(result={"sent": 1})
    try:
        assert before.execute("a1", "job", PAYLOAD, op) == {"sent": 1}
        assert after.execute("a1", "job", PAYLOAD, op) == {"sent": 1}
        assert after.execute("a1", "job", PAYLOAD, op) == {"sent": 1}  # (again: a tombstone)
        assert len(op.calls) == 1
        # The key under the new secret was given back, never completed.
        fresh = IdempotencyKey.new("a1", "job", PAYLOAD, secret=NEW)
        assert after.idempotency.check(fresh) is None
    finally:
        before.close()
        after.close()


def test_an_operation_in_progress_under_the_old_secret_is_in_progress_after_the_rotation(
    store: durabilis.Store,
) -> None:
    before = DurabilityLayer(store, old_config())
    after = DurabilityLayer(store, rotation_config(NEW, OLD))
    started, release = threading.Event(), threading.Event()

    def slow(ctx: OperationContext) -> str:
        started.set()
        assert release.wait(30)
        return "first"

    worker = threading.Thread(target=lambda: before.execute("a1", "job", PAYLOAD, slow))
    worker.start()
    try:
        assert started.wait(30)
        op = Counter(result="second")
        with pytest.raises(durabilis.OperationInProgress):
            after.execute("a1", "job", PAYLOAD, op)
        release.set()
        assert after.execute("a1", "job", PAYLOAD, op, wait=30) == "first"
        assert op.calls == []
    finally:
        release.set()
        worker.join(30)
        before.close()
        after.close()


def test_an_alias_whose_worker_died_does_not_block_and_the_run_is_told_it_may_have_run(
    store: durabilis.Store,
) -> None:
    # A claim under the old secret whose owner died: its lease runs out.
    guard = durabilis.idempotency.IdempotencyGuard(
        store, IdempotencyConfig(in_progress_ttl_seconds=0.05))
    old_key = IdempotencyKey.new("a1", "job", PAYLOAD, secret=OLD)
    assert guard.check_and_record(old_key).is_new
    wait_until(lambda: (seen := guard.check(old_key)) is not None and seen.lease_expired,
               what="the dead claim's lease has run out")
    assert_the_delivery_under_the_new_secret_runs_once_flagged(store)


def test_a_run_interrupted_after_its_effect_under_the_old_secret_flags_the_delivery_under_the_new(
    store: durabilis.Store,
) -> None:
    # Found by the simulator (seed 283): the alias read dropped the "touched"
    # mark, so the run under the new secret was not told it may have run.
    before = DurabilityLayer(store, old_config())
    effects: list[str] = []

    def interrupted(ctx: OperationContext) -> str:
        effects.append(ctx.idempotency_key)
        raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            before.execute("a1", "job", PAYLOAD, interrupted)
    finally:
        before.close()
    assert len(effects) == 1
    assert_the_delivery_under_the_new_secret_runs_once_flagged(store)


def test_a_flagged_run_parked_under_the_other_secret_passes_the_mark_on_past_the_alias_s_expiry(
    store: durabilis.Store, raw: Any
) -> None:
    # The touched mark of an interrupted run lives on its own key only; a run
    # under the other secret, flagged through that alias, then parked, must
    # carry it on: its key is held for the DLQ's TTL, the alias only for the
    # dedup window.
    def cfg(current: str, previous: str) -> Any:
        return fast_config(
            idempotency=IdempotencyConfig(
                key_secret=current, previous_key_secrets=(previous,), dedup_window_seconds=1,
                in_progress_ttl_seconds=1,
            ),
            dependencies={},
        )

    x = DurabilityLayer(store, cfg(NEW, OLD))
    y = DurabilityLayer(store, cfg(OLD, NEW))
    payload = {**PAYLOAD, "case": "parked"}

    def interrupted(ctx: OperationContext) -> str:
        raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            x.execute("a1", "job", payload, interrupted)
        flagged = Counter(EXHAUST)
        with pytest.raises(RetryExhausted):
            y.execute("a1", "job", payload, flagged)
        assert flagged.calls[0].recovered
        new_key = IdempotencyKey.new("a1", "job", payload, secret=NEW)
        wait_until(lambda: not raw.exists(store.keys.idem(new_key.value)),
                   what="the interrupted run's own key has expired", timeout=10)
        later = Counter(result="sent")
        assert y.execute("a1", "job", payload, later) == "sent"
        assert len(later.calls) == 1 and later.calls[0].recovered
    finally:
        x.close()
        y.close()


@pytest.mark.parametrize("recovery", ["after", "before"])
def test_a_dead_claim_under_the_old_secret_run_under_the_new_is_never_replayed_after_the_window(
    store: durabilis.Store, redis_url: str, namespace: str, raw: Any, recovery: str
) -> None:
    # A worker on the old secret dies inside fn; a replica on the new secret
    # runs the operation (flagged), before or after recovery parks the dead
    # claim; once the new key's dedup window has passed, a replay of what was
    # parked must still find the operation done.
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    worker = ctx.Process(target=dead_in_fn_worker, args=(redis_url, namespace, OLD, NEW, ready))
    worker.start()
    try:
        assert ready.wait(60)
    finally:
        worker.kill()
        worker.join(30)
    idem = IdempotencyConfig(
        key_secret=NEW, previous_key_secrets=(OLD,), in_progress_ttl_seconds=1,
        dedup_window_seconds=1,
    )
    layer = DurabilityLayer(store, fast_config(idempotency=idem, dependencies={}))
    guard = durabilis.idempotency.IdempotencyGuard(store, idem)
    old_key = IdempotencyKey.new("a1", "job", {"x": 1}, secret=OLD)
    new_key = IdempotencyKey.new("a1", "job", {"x": 1}, secret=NEW)
    wait_until(lambda: (seen := guard.check(old_key)) is not None and seen.lease_expired,
               what="the dead claim's lease has run out")
    op = Counter(result="sent")
    try:
        parked = layer.recover_orphans() if recovery == "before" else []
        assert layer.execute("a1", "job", {"x": 1}, op) == "sent"
        assert len(op.calls) == 1 and op.calls[0].recovered
        if recovery == "after":
            # The dead claim was recorded done by the run: nothing to park.
            assert layer.recover_orphans() == []
        else:
            assert parked, "recovery parked the dead claim first"
        time.sleep(1.5)  # the new key's dedup window (1 s) passes
        if recovery == "after":  # held past its window, should a recovery park late
            assert raw.exists(store.keys.idem(new_key.value))
        for dlq_id in parked:
            layer.replay(dlq_id, op)
        assert len(op.calls) == 1, "the completed operation ran again"
    finally:
        layer.close()


def test_a_success_that_settles_an_alias_s_record_is_held_as_long_as_that_record(
    store: durabilis.Store, raw: Any
) -> None:
    # On Cluster the alias's settle is a wave after the record: a crash
    # between them leaves the old record pending, and its replay after the new
    # key's window must still find the operation done (found by an adversarial
    # pass on a local cluster). The new key's record outlives the DLQ record.
    idem_old = IdempotencyConfig(key_secret=OLD, dedup_window_seconds=2)
    idem_new = IdempotencyConfig(key_secret=NEW, previous_key_secrets=(OLD,),
                                 dedup_window_seconds=2)
    before = DurabilityLayer(store, fast_config(idempotency=idem_old, dependencies={}))
    after = DurabilityLayer(store, fast_config(idempotency=idem_new, dependencies={}))
    try:
        with pytest.raises(RetryExhausted):
            before.execute("a1", "job", PAYLOAD, Counter(EXHAUST))
        assert after.execute("a1", "job", PAYLOAD, Counter(result="sent")) == "sent"
        new_key = IdempotencyKey.new("a1", "job", PAYLOAD, secret=NEW)
        ttl_ms = raw.pttl(store.keys.idem(new_key.value))
        assert ttl_ms > after.dlq._ops.ttl_ms(None) - 60_000, ttl_ms
    finally:
        before.close()
        after.close()


def test_two_replicas_with_swapped_secrets_run_each_operation_exactly_once_threads(
    store: durabilis.Store, raw: Any, namespace: str,
) -> None:
    layers = [DurabilityLayer(store, rotation_config(OLD, NEW)),
              DurabilityLayer(store, rotation_config(NEW, OLD))]
    runs: dict[int, int] = {}
    lock = threading.Lock()
    operations = 60
    barrier = threading.Barrier(2)

    def op(ctx: OperationContext) -> int:
        with lock:
            runs[ctx.payload["op"]] = runs.get(ctx.payload["op"], 0) + 1
        return int(ctx.payload["op"])

    errors: list[BaseException] = []

    def replica(layer: DurabilityLayer) -> None:
        try:
            barrier.wait(30)
            for n in range(operations):
                assert layer.execute("agent", "job", {"op": n}, op, wait=30) == n
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(layer,)) for layer in layers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for layer in layers:
        layer.close()
    assert errors == []
    assert runs == {n: 1 for n in range(operations)}


@pytest.mark.serial
def test_two_replica_processes_with_swapped_secrets_run_each_operation_exactly_once(
    redis_url: str, namespace: str,
) -> None:
    operations = 40
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [
        ctx.Process(target=race_worker,
                    args=(redis_url, namespace, cur, prev, operations, barrier, i))
        for i, (cur, prev) in enumerate(((OLD, NEW), (NEW, OLD)))
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    r = raw_client(redis_url)
    runs = {int(k): int(v) for k, v in r.hgetall(f"{namespace}:test:runs").items()}
    assert runs == {n: 1 for n in range(operations)}


# -- asyncio ----------------------------------------------------------------------------


def arun(redis_url: str, namespace: str, body: Any) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layers = {
            "old": AsyncDurabilityLayer(store, old_config()),
            "new": AsyncDurabilityLayer(store, new_config()),
            "rotated": AsyncDurabilityLayer(store, rotation_config(NEW, OLD)),
            "swapped": AsyncDurabilityLayer(store, rotation_config(OLD, NEW)),
        }
        try:
            await body(layers)
        finally:
            for layer in layers.values():
                await layer.close()
            await store.close()

    asyncio.run(main())


def test_async_a_parked_operation_is_settled_by_its_delivery_after_a_rotation(
    redis_url: str, namespace: str
) -> None:
    async def body(layers: dict[str, AsyncDurabilityLayer]) -> None:
        with pytest.raises(RetryExhausted) as parked:
            await layers["old"].execute("a1", "job", PAYLOAD, Counter(EXHAUST))
        op = Counter(result="sent")
        assert await layers["rotated"].execute("a1", "job", PAYLOAD, op) == "sent"
        summary = await layers["rotated"].replay_pending(op)
        assert len(op.calls) == 1 and summary.replayed + summary.failed == 0
        record = await layers["rotated"].dlq.get(str(parked.value.dlq_id))
        assert record is not None and record.status is DlqStatus.REPLAYED

    arun(redis_url, namespace, body)


def test_async_a_replay_under_the_old_secret_answers_from_the_new_key_s_record(
    redis_url: str, namespace: str
) -> None:
    async def body(layers: dict[str, AsyncDurabilityLayer]) -> None:
        with pytest.raises(RetryExhausted) as parked:
            await layers["old"].execute("a1", "job", PAYLOAD, Counter(EXHAUST))
        op = Counter(result="sent")
        assert await layers["new"].execute("a1", "job", PAYLOAD, op) == "sent"
        result = await layers["rotated"].replay(str(parked.value.dlq_id), op)
        assert result.outcome is ReplayOutcome.REPLAYED and len(op.calls) == 1

    arun(redis_url, namespace, body)


def test_async_completed_under_the_old_secret_is_a_duplicate_and_swapped_replicas_run_once(
    redis_url: str, namespace: str
) -> None:
    async def body(layers: dict[str, AsyncDurabilityLayer]) -> None:
        op = Counter(result="sent")
        assert await layers["old"].execute("a1", "job", PAYLOAD, op) == "sent"
        assert await layers["rotated"].execute("a1", "job", PAYLOAD, op) == "sent"
        assert len(op.calls) == 1
        runs: dict[int, int] = {}

        async def count(ctx: OperationContext) -> int:
            runs[ctx.payload["op"]] = runs.get(ctx.payload["op"], 0) + 1
            await asyncio.sleep(0.001)
            return int(ctx.payload["op"])

        async def replica(layer: AsyncDurabilityLayer) -> None:
            for n in range(40):
                assert await layer.execute("agent", "job", {"op": n}, count, wait=30) == n

        await asyncio.gather(replica(layers["rotated"]), replica(layers["swapped"]))
        assert runs == {n: 1 for n in range(40)}

    arun(redis_url, namespace, body)


# -- the cost ---------------------------------------------------------------------------

# (Round trips one after another, requests sent) of a durable call during a
# rotation (one previous secret), docs/production.md "Rotating the key secret":
# standalone, the read of the alias rides in the claim's script; Cluster, it is
# a wave of its own after the claim's (beside the breaker's admission when that
# is not cached). A duplicate answered by the current key costs what it did; one
# answered by an alias adds giving the fresh claim back (its release, then its
# index entries).
ROTATING: dict[str, dict[str, tuple[int, int]]] = {
    "standalone": {"happy": (2, 2), "duplicate": (1, 1), "alias_duplicate": (3, 3)},
    "cluster": {"happy": (3, 7), "duplicate": (1, 3), "alias_duplicate": (4, 7)},
}
ROTATING["sentinel"] = ROTATING["standalone"]


def _warm(store: durabilis.Store) -> None:
    """Cluster: every script loaded on every primary, four connections open to each
    (as test_layer_round_trips does, with room for a wave whose calls all go to one
    node: a node's first use, a new connection's handshake, cost round trips)."""
    if not store.is_cluster:
        return
    for name in list(store.scripts._scripts):
        source = store.scripts.get(name).script
        for node in store.client.get_primaries():
            store.client.execute_command("SCRIPT", "LOAD", source, target_nodes=node)
    for node in store.client.get_primaries():
        pool = store.client.get_redis_connection(node).connection_pool
        taken = [pool.get_connection() for _ in range(4)]
        for conn in taken:
            conn.connect()
            pool.release(conn)


def test_without_previous_secrets_a_durable_call_costs_what_it_did_and_a_rotation_what_is_documented(  # noqa: E501
    redis_url: str, namespace: str, backend: str, sends: type[Sends],
) -> None:
    store = durabilis.connect(redis_url, namespace=namespace)
    try:
        plain = DurabilityLayer(store, rotation_config(NEW, breaker=True))
        rotating = DurabilityLayer(store, rotation_config(NEW, OLD, breaker=True))
        seen = {}
        for i, (name, layer) in enumerate((("plain", plain), ("rotating", rotating))):
            # (each measured after its own warm-up: a breaker's cached admission
            # is confirmed by its own layer's previous call)
            for op in (f"warm-up-{i}", f"warm-up-{i}", f"warm-up-{i}-2"):
                round_trips(sends, layer, op, Counter())
            _warm(store)
            # (the breaker's cached admission lasts a second: confirmed again)
            round_trips(sends, layer, f"warm-up-{i}-3", Counter())
            seen[name] = {"happy": round_trips(sends, layer, f"op-{i}", Counter()),
                          "duplicate": round_trips(sends, layer, f"op-{i}", Counter())}
        # An operation completed under the old secret, delivered again: its
        # alias answers (the fresh claim given back).
        before = DurabilityLayer(store, rotation_config(OLD, breaker=True))
        for op in ("old-warm-up", "op-old"):
            before.execute("a1", "job", op, Counter())
        round_trips(sends, rotating, "old-warm-up", Counter())  # (its scripts' first use)
        _warm(store)
        round_trips(sends, rotating, "warm-up-again", Counter())  # (the breaker's cache)
        seen["rotating"]["alias_duplicate"] = round_trips(sends, rotating, "op-old", Counter())
        before.close()
        want = EXPECTED[backend]
        assert seen == {
            "plain": {"happy": want["happy"], "duplicate": want["duplicate"]},
            "rotating": ROTATING[backend],
        }
        plain.close()
        rotating.close()
    finally:
        store.close()
