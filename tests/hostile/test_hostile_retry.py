"""Hostile input against the retry engine and its fleet-wide budget.

Policies and budgets with NaN / negative / huge values, operation types of any
Unicode, and foreign data at the budget key (every Redis type, garbage in every
field). It works, or raises a ``DurabilisError``; Redis is left consistent.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import durabilis
from durabilis import ConfigError, DurabilisError, OperationError, RetryPolicy
from durabilis.retry import RetryBudget, RetryEngine
from durabilis.testing import instant_retries
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
from tests.support.hypo import any_text, garbage_bytes, hostile, hostile_or

pytestmark = pytest.mark.topologies("cluster")

_fresh = itertools.count()

POLICY_FIELDS = {
    "max_attempts": st.integers(min_value=1, max_value=5),
    "initial_delay_ms": st.floats(min_value=0.001, max_value=1e6),
    "max_delay_ms": st.floats(min_value=1e6, max_value=1e9),
    "multiplier": st.floats(min_value=0.001, max_value=1e6),
    "jitter": st.booleans(),
    "deadline_ms": st.none() | st.floats(min_value=1, max_value=1e9),
}
BUDGET_FIELDS = {
    "ratio": st.floats(min_value=0, max_value=1e6),
    "min_retries": st.integers(min_value=0, max_value=10**9),
    "window_seconds": st.floats(min_value=0.01, max_value=1e6),
}


def flaky(failures: int) -> Any:
    calls = {"n": 0}

    def op() -> str:
        calls["n"] += 1
        if calls["n"] <= failures:
            raise OperationError("NETWORK_TIMEOUT", "flaky")
        return "ok"

    return op


@hostile(80)
@given(policy=st.fixed_dictionaries({}, optional={
           f: hostile_or(v) for f, v in POLICY_FIELDS.items()}),
       budget=st.none() | st.fixed_dictionaries({}, optional={
           f: hostile_or(v) for f, v in BUDGET_FIELDS.items()}))
@example(policy={"max_attempts": 2**70}, budget=None)
@example(policy={"multiplier": float("inf")}, budget={"ratio": float("nan")})
@example(policy={}, budget={"window_seconds": 1e300, "min_retries": 2**70})
def test_any_policy_and_budget_are_refused_naming_a_field_or_retry_end_to_end(
    store: durabilis.Store, raw: Any, namespace: str, policy: dict[str, Any],
    budget: dict[str, Any] | None,
) -> None:
    op_type = f"op-{next(_fresh)}"
    try:
        made = RetryPolicy(op_type, **{"max_attempts": 3, "initial_delay_ms": 1,
                                       "max_delay_ms": 10, **policy},
                           budget=None if budget is None else RetryBudget(**budget))
    except ConfigError as exc:
        assert exc.field in (*POLICY_FIELDS, *BUDGET_FIELDS, "retry_policy_id")
        return
    engine = RetryEngine(store, policies=[made])
    with instant_retries():
        outcome = engine.execute(op_type, flaky(1))
    assert 1 <= outcome.attempts <= made.max_attempts
    assert outcome.success == (outcome.attempts == 2)
    if budget is not None:
        (key,) = [k for k in keys_of_namespace(raw, namespace) if f"{{{op_type}}}" in k]
        assert raw.pttl(key) > 0


@hostile(60)
@given(op_type=any_text, deadline=st.none() | hostile_or(st.floats(0.001, 1e6)))
@example(op_type="\ud800", deadline=None)
@example(op_type="{x}:%3A", deadline=float("nan"))
def test_any_operation_type_and_deadline_are_refused_as_config_errors_or_retried(
    store: durabilis.Store, op_type: str, deadline: Any
) -> None:
    try:
        policy = RetryPolicy(op_type, 3, 1, 10, budget=RetryBudget())
    except ConfigError as exc:
        assert exc.field in ("operation_type", "retry_policy_id")
        return
    engine = RetryEngine(store, policies=[policy])
    with instant_retries():
        try:
            outcome = engine.execute(op_type, flaky(1), deadline_seconds=deadline)
        except ConfigError as exc:
            assert exc.field in ("deadline_seconds", "operation_type")
            return
    assert outcome.success or outcome.sent_to_dlq


# --- foreign data at the budget key -----------------------------------------------------------


def budgeted(store: durabilis.Store) -> tuple[RetryEngine, str]:
    op_type = "victim"
    engine = RetryEngine(store, policies=[RetryPolicy(op_type, 3, 1, 10, budget=RetryBudget())])
    with instant_retries():
        assert engine.execute(op_type, flaky(1)).success
    return engine, op_type


def every_call(engine: RetryEngine, op_type: str) -> list[Any]:
    def run() -> Any:
        with instant_retries():
            return engine.execute(op_type, flaky(2))

    return outcomes([run, run], DurabilisError)


@pytest.mark.parametrize("kind", KINDS)
def test_every_redis_type_at_the_budget_key_is_corrupt_data_and_left_untouched(
    store: durabilis.Store, raw: Any, namespace: str, kind: str
) -> None:
    engine, op_type = budgeted(store)
    keys = keys_of_namespace(raw, namespace)
    assert len(keys) == 1
    shape = shape_of(raw, keys)
    plant(raw, keys[0], kind)
    before = snapshot(raw, keys)
    seen = every_call(engine, op_type)
    assert all(isinstance(o, durabilis.errors.CorruptData) and o.key == keys[0] for o in seen)
    assert untouched_or_valid(raw, before, as_the_pillar_wrote_it(shape)) == []


@hostile(60)
@given(garbage=st.dictionaries(
    st.sampled_from(["b", "c0", "r0", "x"]) | st.text(alphabet="cr0123456789", min_size=1,
                                                      max_size=12),
    garbage_bytes, min_size=1))
def test_garbage_in_any_field_of_the_budget_works_or_raises_and_keeps_its_ttl(
    store: durabilis.Store, raw: Any, namespace: str, garbage: dict[str, bytes]
) -> None:
    store = durabilis.connect(store.url, namespace=f"{namespace}-{next(_fresh)}")
    try:
        engine, op_type = budgeted(store)
        (key,) = keys_of_namespace(raw, store.namespace)
        shape = shape_of(raw, [key])
        raw.hset(key, mapping=garbage)
        every_call(engine, op_type)
        assert no_ttl_lost(raw, shape) == []
    finally:
        store.close()
