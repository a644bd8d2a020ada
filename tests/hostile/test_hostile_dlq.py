"""Hostile input against the dead-letter queue: ids, operations, metadata, garbage.

DLQ ids, agent ids, operation types, errors and metadata of any Unicode and
length, operations of any msgpack shape (and of none), retry counts, TTLs and
configs with NaN / negative / huge values, and foreign data at every key the
DLQ keeps. It works, or raises a ``DurabilisError``; Redis is left consistent.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import durabilis
from durabilis import ConfigError, DurabilisError
from durabilis.dlq import DeadLetterQueue, DlqConfig, DlqRecord, DlqStatus
from tests.support.garbage import (
    KINDS,
    as_the_pillar_wrote_it,
    keys_of_namespace,
    no_ttl_lost,
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
    hostile_or,
    msgpack_values,
    normalised,
    pick,
    plant_drawn_garbage,
    same,
    unencodable,
)

pytestmark = pytest.mark.topologies("cluster")

_fresh = itertools.count()

CONFIG_FIELDS = {
    "default_ttl_seconds": st.floats(0.001, 1e9),
    "max_pending": st.integers(1, 10**9),
    "claim_ttl_seconds": st.floats(0.001, 1e9),
    "max_payload_bytes": st.integers(1, 10**9),
    "max_error_bytes": st.integers(16, 10**9),
    "max_name_bytes": st.integers(1, 10**9),
    "cleanup_batch_size": st.integers(1, 10**6),
    "purge_per_enqueue": st.integers(0, 10**6),
}


def keys_now(raw: Any, namespace: str) -> list[str]:
    return keys_of_namespace(raw, namespace)


@hostile(80)
@given(agent=any_text, op_type=any_text, error=st.none() | any_text,
       metadata=st.none() | st.dictionaries(any_text, any_text, max_size=4)
       | st.dictionaries(st.integers(), st.integers(), max_size=2),
       retry_count=hostile_or(st.integers(0, 100)), ttl=st.none() | hostile_numbers)
@example(agent="\ud800", op_type="wiki_write", error="e", metadata=None, retry_count=3, ttl=None)
@example(agent="a", op_type="{dlq}:x\x00|", error="\udfff", metadata={"k": "\ud800"},
         retry_count=3, ttl=None)
@example(agent="a", op_type="t", error="e" * 100_000, metadata=None, retry_count=2**70,
         ttl=1e300)
def test_any_enqueue_arguments_are_parked_and_read_back_or_refused_before_any_write(
    store: durabilis.Store, raw: Any, namespace: str, agent: str, op_type: str,
    error: str | None, metadata: Any, retry_count: Any, ttl: Any,
) -> None:
    dlq = DeadLetterQueue(store)
    before = keys_now(raw, namespace)
    try:
        dlq_id = dlq.enqueue(agent, op_type, {"n": 1}, retry_count, error, ttl,
                             metadata=metadata)
    except DurabilisError as exc:
        refusals = (durabilis.StorageUnavailable, durabilis.errors.CorruptData)
        assert not isinstance(exc, refusals), exc
        assert keys_now(raw, namespace) == before  # refused before any write
        return
    record = dlq.get(dlq_id)
    assert record is not None and record.agent_id == agent and record.operation_type == op_type
    assert record.original_operation == {"n": 1} and record.retry_count == retry_count
    assert record.status is DlqStatus.PENDING
    assert dlq_id in [r.dlq_id for r in dlq.list_pending(op_type)]
    assert dlq.abandon(dlq_id) and dlq.get(dlq_id).status is DlqStatus.ABANDONED  # type: ignore[union-attr]
    assert no_ttl_lost(raw, {k: ("?", True) for k in keys_now(raw, namespace)}) == []


@hostile(60)
@given(operation=msgpack_values | unencodable | any_text)
@example(operation={(1, (2, b"x")): "a tuple as a map key", "nan": float("nan")})
@example(operation="\ud800")
def test_any_operation_round_trips_or_is_invalid_payload_before_any_write(
    store: durabilis.Store, raw: Any, namespace: str, operation: Any
) -> None:
    dlq = DeadLetterQueue(store)
    before = keys_now(raw, namespace)
    try:
        dlq_id = dlq.enqueue("agent", "memory_write", operation, 3, "e")
    except (durabilis.errors.InvalidPayload, durabilis.errors.PayloadTooLarge):
        assert keys_now(raw, namespace) == before
        return
    record = dlq.get(dlq_id)
    assert record is not None and same(record.original_operation, normalised(operation))
    replayed: list[Any] = []
    assert dlq.replay(dlq_id, lambda r: replayed.append(r.original_operation)).replayed
    assert len(replayed) == 1 and same(replayed[0], normalised(operation))


@hostile(60)
@given(dlq_id=any_text | st.text(alphabet="0123456789abcdef", min_size=32, max_size=32))
@example(dlq_id="\ud800")
@example(dlq_id="")
@example(dlq_id="0" * 10_000)
def test_any_dlq_id_is_found_or_not_or_refused_as_a_typed_error(
    store: durabilis.Store, dlq_id: str
) -> None:
    dlq = DeadLetterQueue(store)
    seen = outcomes([
        lambda: dlq.get(dlq_id),
        lambda: dlq.mark_replayed(dlq_id),
        lambda: dlq.abandon(dlq_id),
        lambda: dlq.replay(dlq_id, lambda r: None),
        lambda: dlq.list_all(after=dlq_id),
        lambda: dlq.list_pending(after=dlq_id),
    ], DurabilisError)
    assert seen[0] is None and seen[1] is False and seen[2] is False
    try:  # an id chosen by the caller: enqueue is idempotent on it, or refuses it
        first = dlq.enqueue("a", "t", 1, 1, "e", dlq_id=dlq_id)
    except durabilis.errors.InvalidKey:
        return
    assert dlq.enqueue("a", "t", 2, 1, "e", dlq_id=dlq_id) == first == dlq_id
    assert dlq.get(dlq_id).original_operation == 1  # type: ignore[union-attr]


@hostile(80)
@given(config=st.fixed_dictionaries({}, optional={
    f: hostile_or(v) for f, v in CONFIG_FIELDS.items()}))
@example(config={"default_ttl_seconds": 1e300})
@example(config={"claim_ttl_seconds": float("nan")})
def test_any_dlq_config_is_refused_naming_a_field_or_works_end_to_end(
    store: durabilis.Store, raw: Any, namespace: str, config: dict[str, Any]
) -> None:
    try:
        dlq = DeadLetterQueue(store, DlqConfig(**config))
    except ConfigError as exc:
        assert exc.field in CONFIG_FIELDS
        return
    try:
        dlq_id = dlq.enqueue(f"a-{next(_fresh)}", "t", {"n": 1}, 1, "e")
    # over the configured limits
    except (durabilis.errors.PayloadTooLarge, durabilis.errors.InvalidKey):
        return
    # (a record living a few ms may be gone already: not found, never an error)
    assert dlq.replay(dlq_id, lambda r: None).replayed or dlq.config.default_ttl_seconds < 1
    dlq.stats()
    dlq.cleanup_expired()
    assert no_ttl_lost(raw, {k: ("?", True) for k in keys_now(raw, namespace)}) == []


# --- foreign data at the keys -----------------------------------------------------------------


def populated(store: durabilis.Store) -> tuple[DeadLetterQueue, list[str]]:
    """Pending, replayed, abandoned and failed-replay records: every DLQ key exists."""
    dlq = DeadLetterQueue(store, DlqConfig(claim_ttl_seconds=60))
    ids = [dlq.enqueue("agent", op, {"n": i}, 3, "NETWORK_TIMEOUT", metadata={"k": str(i)})
           for i, op in enumerate(["wiki_write", "wiki_write", "mcp_call", "memory_write"])]
    dlq.mark_replayed(ids[0])
    dlq.abandon(ids[1])

    def fails(record: DlqRecord) -> None:
        raise RuntimeError("still down")

    dlq.replay(ids[2], fails)
    return dlq, ids


def exercise(dlq: DeadLetterQueue, ids: list[str]) -> list[Any]:
    """Every public call; each returns or raises a DurabilisError."""
    calls: list[Any] = [
        lambda: dlq.enqueue("agent", "wiki_write", {"new": 1}, 3, "e"),
        dlq.list_pending,
        dlq.list_all,
        lambda: dlq.list_pending("wiki_write"),
        dlq.pending_count,
        dlq.stats,
        lambda: dlq.replay_pending(lambda r: None),
        dlq.cleanup_expired,
    ]
    for dlq_id in ids:
        calls += [
            lambda d=dlq_id: dlq.get(d),
            lambda d=dlq_id: dlq.replay(d, lambda r: None),
            lambda d=dlq_id: dlq.mark_replayed(d),
            lambda d=dlq_id: dlq.abandon(d),
        ]
    return outcomes(calls, DurabilisError)


@pytest.mark.parametrize("kind", KINDS)
def test_every_redis_type_at_every_dlq_key_is_a_durabilis_error_and_redis_stays_consistent(
    store: durabilis.Store, raw: Any, namespace: str, kind: str
) -> None:
    dlq, ids = populated(store)
    keys = keys_now(raw, namespace)
    assert len(keys) >= 8
    shape = shape_of(raw, keys)
    for key in keys:
        plant(raw, key, kind)
    before = snapshot(raw, keys)
    seen = exercise(dlq, ids)
    assert any(isinstance(o, DurabilisError) for o in seen)
    assert untouched_or_valid(raw, before, as_the_pillar_wrote_it(shape)) == []


@hostile(80)
@given(data=st.data())
def test_garbage_in_any_field_of_any_dlq_key_works_or_raises_and_keeps_every_ttl(
    store: durabilis.Store, raw: Any, namespace: str, data: st.DataObject
) -> None:
    store = durabilis.connect(store.url, namespace=f"{namespace}-{next(_fresh)}")
    try:
        dlq, ids = populated(store)
        keys = keys_now(raw, store.namespace)
        shape = shape_of(raw, keys)
        key = pick(data, keys)
        kind = shape[key][0]
        blob = data.draw(garbage_bytes)
        plant_drawn_garbage(raw, data, key, kind, blob)
        exercise(dlq, ids)
        assert no_ttl_lost(raw, shape) == []
    finally:
        store.close()
