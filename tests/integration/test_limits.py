"""Retrying holds an operation's claim for a bounded time: past its deadline (a
policy's ``deadline_ms``, one hour by default, at most a day) the layer parks
the operation in the DLQ and gives the claim back; it never holds it."""

from __future__ import annotations

import pytest

import durabilis
from durabilis import ConfigError, IdempotencyConfig, RetryExhausted, RetryPolicy
from durabilis.layer import DurabilityConfig, DurabilityLayer
from durabilis.testing import instant_retries
from tests.integration._layer_support import Counter

pytestmark = pytest.mark.topologies("cluster")  # the layer fuses its steps differently there

TEN_MINUTES_MS = 600_000


def layer_with(store: durabilis.Store, policy: RetryPolicy) -> DurabilityLayer:
    return DurabilityLayer(store, DurabilityConfig(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=30), retry_policies=(policy,),
    ))


def test_retries_that_would_outlast_the_default_deadline_are_parked_not_held(
    store: durabilis.Store,
) -> None:
    # 100 attempts 10 minutes apart would hold the claim for 16.5 hours; "no
    # deadline" is the default hour: attempts at 0, 10, ..., 50 min, then parked.
    policy = RetryPolicy("slow_job", 100, TEN_MINUTES_MS, TEN_MINUTES_MS, jitter=False)
    layer = layer_with(store, policy)
    op = Counter(["SERVICE_UNAVAILABLE"] * 100)
    try:
        with instant_retries(), pytest.raises(RetryExhausted) as info:
            layer.execute("a1", "slow_job", {"n": 1}, op)
        assert len(op.calls) == 6 and info.value.attempts == 6
        record = layer.dlq.get(info.value.dlq_id or "")
        assert record is not None and record.retry_count == 6
        key = op.calls[0].idempotency_key
        assert layer.idempotency.check(key) is None  # the claim is given back: not held
    finally:
        layer.close()


def test_a_policy_deadline_bounds_the_hold_and_a_call_deadline_over_a_day_is_refused(
    store: durabilis.Store,
) -> None:
    policy = RetryPolicy("slow_job", 100, TEN_MINUTES_MS, TEN_MINUTES_MS, jitter=False,
                         deadline_ms=86_400_000)
    layer = layer_with(store, policy)
    op = Counter(["SERVICE_UNAVAILABLE"] * 100)
    try:
        with instant_retries(), pytest.raises(ConfigError) as refused:
            layer.execute("a1", "slow_job", {"n": 2}, op, deadline_seconds=86_401)
        assert refused.value.field == "deadline_seconds" and op.calls == []
        with instant_retries(), pytest.raises(RetryExhausted) as info:
            layer.execute("a1", "slow_job", {"n": 2}, op)
        # A day of 10-minute retries: 144 would fit, max_attempts (100) stops first.
        assert info.value.attempts == 100 and info.value.dlq_id
        with instant_retries(), pytest.raises(RetryExhausted) as again:
            layer.execute("a1", "slow_job", {"n": 3}, Counter(["SERVICE_UNAVAILABLE"] * 100),
                          deadline_seconds=1800)
        assert again.value.attempts == 3  # 0, 10, 20 min; the next would reach 30
    finally:
        layer.close()
