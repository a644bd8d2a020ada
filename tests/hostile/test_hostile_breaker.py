"""Hostile input against the circuit breaker: it works, or raises a DurabilisError.

Configs with NaN / negative / huge values, names and replica ids of any
Unicode, and foreign data planted at every key a breaker keeps (every Redis
type, garbage in every field). Nothing but a ``DurabilisError`` escapes, and
Redis is left consistent: each key untouched, or the breaker's again with its TTL.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import durabilis
from durabilis import CircuitOpen, ConfigError, DurabilisError
from durabilis.breaker import BreakerState, CircuitBreakerConfig, CircuitBreakerRegistry
from durabilis.errors import DependencyNotFound
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
    hostile_or,
    pick,
    plant_drawn_garbage,
)

pytestmark = pytest.mark.topologies("cluster")

_fresh = itertools.count()

FIELDS = {
    "failure_rate_threshold": st.floats(min_value=0.01, max_value=1.0),
    "min_request_count": st.integers(min_value=1, max_value=5),
    "reset_timeout_seconds": st.floats(min_value=1, max_value=1e6),
    "probe_success_required": st.integers(min_value=1, max_value=10**6),
    "window_size": st.integers(min_value=5, max_value=10**6),
    "probe_timeout_seconds": st.floats(min_value=1, max_value=1e6),
    "window_seconds": st.none() | st.floats(min_value=0.001, max_value=1e6),
    "slow_call_duration_ms": st.none() | st.floats(min_value=0, max_value=1e9),
    "slow_call_rate_threshold": st.none() | st.floats(min_value=0.01, max_value=1.0),
    "min_distinct_reporters": st.integers(min_value=1, max_value=10**6),
    "idle_ttl_seconds": st.floats(min_value=1e6, max_value=1e9),
}


def exercise(registry: CircuitBreakerRegistry, name: str) -> list[Any]:
    """Every public call on one breaker; each returns or raises a DurabilisError."""
    def failing() -> None:
        raise RuntimeError("the dependency failed")

    def call_failing() -> Any:
        try:
            return registry.call(name, failing)
        except RuntimeError:
            return "failed"

    def report_with_permit() -> Any:
        return registry.after_call(name, True, registry.before_call(name), 1.0)

    return outcomes([
        lambda: registry.before_call(name),
        report_with_permit,
        lambda: registry.after_call(name, False),
        call_failing,
        lambda: registry.state(name),
        lambda: registry.state_info(name),
        registry.all_states,
        lambda: registry.transitions(name),
        registry.stored_names,
        lambda: registry.force_open(name),
        lambda: registry.force_close(name),
    ], DurabilisError)


# --- configs, names, replica ids --------------------------------------------------------------


@hostile(80)
@given(values=st.fixed_dictionaries({}, optional={
    f: hostile_or(valid) for f, valid in FIELDS.items()}))
@example(values={"failure_rate_threshold": float("nan")})
@example(values={"reset_timeout_seconds": 1e300, "idle_ttl_seconds": 1e300})
@example(values={"window_seconds": 1e-300})
def test_any_breaker_config_is_refused_naming_a_field_or_works_end_to_end(
    store: durabilis.Store, raw: Any, namespace: str, values: dict[str, Any]
) -> None:
    name = f"dep-{next(_fresh)}"
    try:
        config = CircuitBreakerConfig(name, **values)
    except ConfigError as exc:
        assert exc.field in FIELDS
        return
    registry = CircuitBreakerRegistry(store, [config], replica_id="hostile")
    exercise(registry, name)
    keys = [k for k in keys_of_namespace(raw, namespace) if f"{{{name}}}" in k]
    assert keys and no_ttl_lost(raw, {k: ("?", True) for k in keys}) == []


@hostile(60)
@given(name=any_text)
@example(name="\ud800")
@example(name="{tag}:%3A|x\x00")
@example(name="é" * 5000)
def test_any_breaker_name_is_refused_as_a_config_error_or_is_a_breaker_of_its_own(
    store: durabilis.Store, name: str
) -> None:
    try:
        config = CircuitBreakerConfig(name, min_request_count=1, window_size=2)
    except ConfigError as exc:
        assert exc.field == "name"
        return
    registry = CircuitBreakerRegistry(store, [config], replica_id="hostile")
    with pytest.raises(ZeroDivisionError):  # counts as a failure: the breaker trips
        registry.call(name, lambda: 1 / 0)
    with pytest.raises(CircuitOpen):
        registry.before_call(name)
    assert registry.state(name) is BreakerState.OPEN
    assert name in registry.stored_names()
    (opened,) = registry.transitions(name)
    assert opened.dependency == name and opened.replica_id == "hostile"
    with pytest.raises(DependencyNotFound):
        registry.before_call(name + "-unknown")


@hostile(40)
@given(replica_id=any_text | st.none() | st.integers(), maxlen=hostile_or(st.integers(1, 10**9)))
@example(replica_id="a|b|c\n", maxlen=1)
@example(replica_id="\udfff", maxlen=5)
@example(replica_id="r", maxlen=2**70)
def test_any_replica_id_and_events_cap_are_refused_or_show_in_the_events_stream(
    store: durabilis.Store, replica_id: Any, maxlen: Any
) -> None:
    name = f"dep-{next(_fresh)}"
    config = CircuitBreakerConfig(name, min_request_count=1, window_size=2)
    try:
        registry = CircuitBreakerRegistry(store, [config], replica_id=replica_id,
                                          events_maxlen=maxlen)
    except ConfigError as exc:
        assert exc.field in ("replica_id", "events_maxlen")
        return
    registry.force_open(name)
    (opened,) = registry.transitions(name)
    assert opened.replica_id == registry.replica_id
    if replica_id:
        assert opened.replica_id == replica_id


@hostile(60)
@given(probe_id=any_text | st.none() | st.integers() | st.binary(max_size=8))
@example(probe_id="a|b")
@example(probe_id="x" * 65)
@example(probe_id="é" * 64)
@example(probe_id="\udfff")
@example(probe_id="1")
def test_any_probe_id_is_refused_as_a_value_error_or_is_that_probe_and_is_released_by_it(
    store: durabilis.Store, raw: Any, probe_id: Any
) -> None:
    name = f"dep-{next(_fresh)}"
    config = CircuitBreakerConfig(name, probe_success_required=1)
    ops = CircuitBreakerRegistry(store, [config], replica_id="hostile").ops
    probes = store.keys.breaker_probes(name)
    raw.hset(store.keys.breaker(name), mapping={"st": "H", "g": 1})  # HALF_OPEN, no probe
    try:
        call = ops.before_call(name, probe_id)
    except ValueError:
        with pytest.raises(ValueError):
            ops.release_probe(name, probe_id)
        assert raw.exists(probes) == 0  # refused before any I/O
        return
    chosen = ops.decode_before(name, store.run(call))[0].probe_id
    assert chosen is not None and chosen == ("1" if probe_id is None else probe_id)
    assert raw.hlen(probes) == 1
    assert ops.decode_after(name, store.run(ops.release_probe(name, chosen)))[0]
    assert raw.exists(probes) == 0
    assert not ops.decode_after(name, store.run(ops.release_probe(name, chosen)))[0]


# --- foreign data at the keys -----------------------------------------------------------------


def populated(store: durabilis.Store) -> tuple[CircuitBreakerRegistry, str]:
    """A breaker with every key it keeps: state, window, probes, events, reporters."""
    name = "victim"
    config = CircuitBreakerConfig(name, 0.5, 2, 1, 1, 4, 1, slow_call_duration_ms=1000,
                                  slow_call_rate_threshold=0.5)
    registry = CircuitBreakerRegistry(store, [config], replica_id="hostile")
    for _ in range(2):
        registry.after_call(name, False, registry.before_call(name), 1.0)
    assert registry.state(name) is BreakerState.OPEN
    registry.force_open(name)
    registry.force_close(name)
    registry.after_call(name, False, registry.before_call(name), 1.0)
    return registry, name


@pytest.mark.parametrize("kind", KINDS)
def test_every_redis_type_at_every_breaker_key_is_a_durabilis_error_and_redis_stays_consistent(
    store: durabilis.Store, raw: Any, namespace: str, kind: str
) -> None:
    registry, name = populated(store)
    keys = keys_of_namespace(raw, namespace)
    assert len(keys) >= 5
    shape = shape_of(raw, keys)
    for key in keys:
        plant(raw, key, kind)
    before = snapshot(raw, keys)
    seen = exercise(registry, name)
    assert any(isinstance(o, DurabilisError) for o in seen)
    assert untouched_or_valid(raw, before, as_the_pillar_wrote_it(shape)) == []
    # A fresh registry (another process) meets the same garbage the same way.
    exercise(CircuitBreakerRegistry(store, [registry.get_config(name)]), name)
    assert untouched_or_valid(raw, before, as_the_pillar_wrote_it(shape)) == []


@hostile(60)
@given(data=st.data())
def test_garbage_in_any_field_of_any_breaker_key_works_or_raises_and_keeps_every_ttl(
    store: durabilis.Store, raw: Any, namespace: str, data: st.DataObject
) -> None:
    store = durabilis.connect(store.url, namespace=f"{namespace}-{next(_fresh)}")
    try:
        registry, name = populated(store)
        keys = keys_of_namespace(raw, store.namespace)
        shape = shape_of(raw, keys)
        key = pick(data, [k for k in keys if shape[k][0] != "set"])
        kind = shape[key][0]
        blob = data.draw(garbage_bytes)
        plant_drawn_garbage(raw, data, key, kind, blob)
        exercise(registry, name)
        assert no_ttl_lost(raw, shape) == []
    finally:
        store.close()
