"""Hostile input against the composed layer: execute arguments, configs, garbage everywhere.

``layer.execute`` with agent ids, operation types, payloads, idempotency keys,
task ids, phases, waits and deadlines of any shape; configs with NaN /
negative / huge values; foreign data planted at every key of every pillar the
layer drives. It works, or raises a ``DurabilisError`` (or ``fn``'s own error,
which the layer re-raises as it is); nothing is left half-done in Redis: no
claim left in progress and no operation left listed as in flight.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import durabilis
from durabilis import (
    CircuitBreakerConfig,
    ConfigError,
    DurabilisError,
    IdempotencyConfig,
    OperationError,
    RetryPolicy,
)
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext
from durabilis.testing import instant_retries
from tests.support.garbage import (
    KINDS,
    as_the_pillar_wrote_it,
    keys_of_namespace,
    outcomes,
    plant,
    shape_of,
    snapshot,
    untouched_or_valid,
)
from tests.support.hypo import (
    any_text,
    garbage_bytes,
    hostile,
    hostile_numbers,
    msgpack_values,
    pick,
    unencodable,
)

pytestmark = pytest.mark.topologies("cluster")

_fresh = itertools.count()


def config(**kw: Any) -> DurabilityConfig:
    # A 3 s lease: foreign data that leaves a claim in progress (a park refused by
    # a corrupt DLQ index) makes a later replay wait for its lease to end; a 30 s
    # lease made such examples 30 s each (3.5 of the suite's minutes, per backend).
    return DurabilityConfig(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=3),
        retry_policies=(RetryPolicy("job", 3, 1, 2, 2.0, False, ("NETWORK_TIMEOUT",), ()),),
        breakers=(CircuitBreakerConfig("svc", 1.0, 100, 1, 1, 100, 1),),
        dependencies={"job": "svc"},
        **kw,
    )


def nothing_half_done(layer: DurabilityLayer, raw: Any) -> list[str]:
    """Claims still in progress, and keys still listed in flight (none may be left)."""
    index = layer.store.keys.layer("inflight")
    listed = [m.decode() for m in raw.zrange(index, 0, -1)] if raw.type(index) in (
        b"zset", "zset") else []
    held = []
    for key in raw.scan_iter(match=f"{layer.store.namespace}:idem:*", count=1000):
        if raw.type(key) in (b"hash", "hash") and raw.hget(key, "s") == b"p":
            held.append(key.decode())
    return listed + held


def result_of(ctx: OperationContext) -> Any:
    if isinstance(ctx.payload, dict) and ctx.payload.get("fail"):
        raise OperationError(str(ctx.payload["fail"]), "scripted")
    return {"echo": ctx.attempt}


@hostile(80)
@given(agent=any_text, op_type=any_text | st.just("job"),
       payload=msgpack_values | unencodable | st.fixed_dictionaries(
           {"fail": st.sampled_from(["NETWORK_TIMEOUT", "PERMISSION_DENIED"])}),
       key=st.none() | any_text, task=st.none() | any_text, phase=st.none() | any_text,
       wait=st.none() | hostile_numbers, deadline=st.none() | hostile_numbers,
       park=st.booleans())
@example(agent="\ud800", op_type="job", payload=1, key=None, task=None, phase=None,
         wait=None, deadline=None, park=False)
@example(agent="a", op_type="job", payload={"fail": "NETWORK_TIMEOUT"}, key="{k}:%3A",
         task="t", phase="p", wait=float("nan"), deadline=1e300, park=True)
@example(agent="a", op_type="job", payload=b"\x00bytes", key="k\udfff", task="t", phase=None,
         wait=0, deadline=float("-inf"), park=False)
def test_any_execute_arguments_work_or_raise_a_durabilis_error_and_leave_nothing_half_done(
    store: durabilis.Store, raw: Any, agent: str, op_type: str, payload: Any, key: str | None,
    task: str | None, phase: str | None, wait: Any, deadline: Any, park: bool,
) -> None:
    layer = DurabilityLayer(store, config())
    if key is not None:
        key = f"{next(_fresh)}:{key}"  # fresh per example
    try:
        with instant_retries():
            result = layer.execute(agent, op_type, payload, result_of, idempotency_key=key,
                                   task_id=task, phase=phase, wait=wait,
                                   park_on_open=park, deadline_seconds=deadline)
        assert result == {"echo": 0}
        if task is not None and phase is not None:
            assert layer.checkpoints.restore(task, agent, phase).state == result
    except (DurabilisError, OperationError):
        pass
    finally:
        layer.close()
    assert nothing_half_done(layer, raw) == []


@hostile(60)
@given(renew=st.none() | hostile_numbers,
       dependencies=st.dictionaries(any_text | st.integers(), any_text | st.none(), max_size=3))
@example(renew=float("nan"), dependencies={})
@example(renew=None, dependencies={"job": "\ud800"})
def test_any_layer_config_is_refused_naming_a_field_or_runs(
    store: durabilis.Store, renew: Any, dependencies: dict[Any, Any]
) -> None:
    try:
        cfg = DurabilityConfig(
            idempotency=IdempotencyConfig(in_progress_ttl_seconds=30),
            breakers=(CircuitBreakerConfig("svc"),), dependencies=dependencies,
            renew_every_seconds=renew,
        )
    except ConfigError as exc:
        assert exc.field in ("renew_every_seconds", "dependencies")
        return
    layer = DurabilityLayer(store, cfg)
    try:
        for op_type in list(dependencies)[:2]:
            outcomes([lambda t=op_type: layer.execute("a", t, {"n": next(_fresh)}, result_of)],
                     DurabilisError)
    finally:
        layer.close()


# --- foreign data at every key of every pillar --------------------------------------------------


def populated(store: durabilis.Store) -> DurabilityLayer:
    """A layer that has used every pillar: records, breaker, checkpoints, DLQ, index."""
    layer = DurabilityLayer(store, config())
    with instant_retries():
        layer.execute("agent", "job", {"n": 1}, result_of, task_id="task", phase="p1")
        layer.execute("agent", "job", {"n": 1}, result_of)  # a duplicate
        with pytest.raises(durabilis.RetryExhausted):
            layer.execute("agent", "job", {"fail": "NETWORK_TIMEOUT"}, result_of)
    layer.store.run(layer._core._note("add", "agent:job:orphan"))  # an index entry
    return layer


def exercise(layer: DurabilityLayer) -> list[Any]:
    """Every public call of the layer; each returns or raises a DurabilisError."""
    def execute(payload: Any, **kw: Any) -> Any:
        with instant_retries():
            return layer.execute("agent", "job", payload, result_of, **kw)

    return outcomes([
        lambda: execute({"n": 1}),
        lambda: execute({"n": 2}, task_id="task", phase="p2"),
        lambda: execute({"fail": "NETWORK_TIMEOUT"}),
        lambda: execute({"n": 3}, wait=0.2),
        layer.recover_orphans,
        lambda: layer.replay_pending(result_of),
        layer.stats,
    ], DurabilisError)


@pytest.mark.parametrize("kind", KINDS)
def test_every_redis_type_at_every_key_of_the_layer_is_a_durabilis_error_and_left_consistent(
    store: durabilis.Store, raw: Any, namespace: str, kind: str
) -> None:
    layer = populated(store)
    keys = keys_of_namespace(raw, namespace)
    assert {k.split(":")[1] for k in keys} >= {"idem", "cb", "ckpt", "dlq", "layer"}
    shape = shape_of(raw, keys)
    for key in keys:
        plant(raw, key, kind)
    before = snapshot(raw, keys)
    try:
        seen = exercise(layer)
    finally:
        layer.close()
    assert any(isinstance(o, DurabilisError) for o in seen)
    assert untouched_or_valid(raw, before, as_the_pillar_wrote_it(shape)) == []


@hostile(80)
@given(data=st.data())
def test_garbage_in_any_field_of_any_layer_key_works_or_raises_a_durabilis_error(
    store: durabilis.Store, raw: Any, namespace: str, data: st.DataObject
) -> None:
    store = durabilis.connect(store.url, namespace=f"{namespace}-{next(_fresh)}")
    layer = populated(store)
    try:
        keys = keys_of_namespace(raw, store.namespace)
        shape = shape_of(raw, keys)
        key = pick(data, [k for k in keys if shape[k][0] in ("hash", "zset")])
        blob = data.draw(garbage_bytes)
        if shape[key][0] == "hash":
            raw.hset(key, pick(data, [f.decode() for f in raw.hkeys(key)]), blob)
        elif data.draw(st.booleans()):  # zset: a foreign member, or a known one's score
            raw.zadd(key, {blob: data.draw(st.floats(allow_nan=False))})
        else:
            raw.zadd(key, {pick(data, raw.zrange(key, 0, -1)): data.draw(
                st.floats(allow_nan=False))})
        exercise(layer)
    finally:
        layer.close()
        store.close()


def test_foreign_members_in_the_in_flight_index_never_block_the_recovery_of_real_orphans(
    store: durabilis.Store, raw: Any
) -> None:
    layer = DurabilityLayer(store, DurabilityConfig(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=0.2), breakers=()))
    try:
        index = store.keys.layer("inflight")
        ops = layer.idempotency._ops
        claim = ops.decode_claim(  # claimed and listed as execute does, by a worker that died
            durabilis.IdempotencyKey("orphan"),
            store.run(ops.claim(durabilis.IdempotencyKey("orphan"), "a dead worker's", b"", "n1")),
        )
        assert isinstance(claim, durabilis.idempotency.New)
        store.run(layer._core._note("add", [layer._core.member("orphan", "n1")]))
        raw.zadd(index, {b"\xff\xfe not text": 0, b"": 1, "gone-key": 2})
        time.sleep(0.3)  # the dead worker's lease ends
        (parked,) = layer.recover_orphans()
        record = layer.dlq.get(parked)
        assert record is not None and record.last_error == "WORKER_LOST"
        assert record.metadata["idempotency_key"] == "orphan"
        assert raw.zcard(index) == 0  # the foreign entries were dropped, not kept forever
    finally:
        layer.close()
