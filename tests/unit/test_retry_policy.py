"""Retry policies, backoff, classification and decisions: pure code, no Redis."""

from __future__ import annotations

import enum
import math
import random
from datetime import timedelta

import pytest

from durabilis._retry_core import succeeded
from durabilis.errors import ConfigError, OperationError
from durabilis.retry import (
    DEADLINE_EXCEEDED,
    EXHAUSTED,
    NON_RETRYABLE,
    RETRY_BUDGET_EXHAUSTED,
    RetryBudget,
    RetryOutcome,
    RetryPolicy,
    backoff_delay,
    decide,
    default_policies,
    error_code,
    register_error_code,
    retry_after_of,
)


def mcp(**changes: object) -> RetryPolicy:
    policy = {p.operation_type: p for p in default_policies()}["mcp_call"]
    fields = {
        "operation_type": policy.operation_type,
        "max_attempts": policy.max_attempts,
        "initial_delay_ms": policy.initial_delay_ms,
        "max_delay_ms": policy.max_delay_ms,
        "multiplier": policy.multiplier,
        "jitter": policy.jitter,
        "retryable_errors": policy.retryable_errors,
        "non_retryable_errors": policy.non_retryable_errors,
    }
    fields.update(changes)
    return RetryPolicy(**fields)  # type: ignore[arg-type]


# --- must show 1: backoff ---------------------------------------------------------


def test_mcp_call_without_jitter_waits_half_a_second_doubling_up_to_ten() -> None:
    policy = mcp(jitter=False)
    delays = [policy.delay_for_attempt(i) for i in range(7)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


@pytest.mark.parametrize("attempt", range(7))
def test_jittered_delays_stay_in_d_to_1_3d_and_fill_that_range(attempt: int) -> None:
    d = mcp(jitter=False).delay_for_attempt(attempt)
    policy = mcp()
    samples = [policy.delay_for_attempt(attempt) for _ in range(10_000)]
    assert all(d <= s < 1.3 * d for s in samples)
    # Fills the range: both ends are reached closely and every tenth of it is hit.
    assert min(samples) < d * 1.003
    assert max(samples) > d * 1.297
    bins = {min(int((s - d) / (0.3 * d) * 10), 9) for s in samples}
    assert bins == set(range(10))


def test_attempt_ten_thousand_is_capped_not_an_overflow() -> None:
    assert mcp(jitter=False).delay_for_attempt(10_000) == 10.0
    assert 10.0 <= mcp().delay_for_attempt(10_000) < 13.0
    huge = mcp(jitter=False, multiplier=10)
    assert huge.delay_for_attempt(10**9) == 10.0


def test_multiplier_below_one_shrinks_delays_towards_zero() -> None:
    policy = mcp(jitter=False, multiplier=0.5, initial_delay_ms=800)
    assert [policy.delay_for_attempt(i) for i in range(3)] == [0.8, 0.4, 0.2]
    assert policy.delay_for_attempt(10_000) == 0.0


def test_negative_attempt_is_refused() -> None:
    with pytest.raises(ValueError, match="attempt"):
        mcp().delay_for_attempt(-1)


def test_backoff_jitter_uses_the_given_random_source() -> None:
    policy = mcp()
    assert backoff_delay(policy, 1, rng=lambda: 0.0) == 1.0
    assert backoff_delay(policy, 1, rng=lambda: 0.5) == pytest.approx(1.15)


# --- validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"retry_policy_id": ""}, "retry_policy_id"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"multiplier": 0}, "multiplier"),
        ({"multiplier": -1.5}, "multiplier"),
        ({"initial_delay_ms": 0}, "initial_delay_ms"),
        ({"max_delay_ms": 499}, "max_delay_ms"),
        ({"operation_type": ""}, "operation_type"),
        ({"jitter": "yes"}, "jitter"),
        ({"retryable_errors": "NETWORK_TIMEOUT"}, "retryable_errors"),
        ({"non_retryable_errors": ["", "X"]}, "non_retryable_errors"),
        ({"deadline_ms": 0}, "deadline_ms"),
        ({"budget": 0.2}, "budget"),
        ({"max_attempts": True}, "max_attempts"),
        ({"multiplier": math.nan}, "multiplier"),
    ],
)
def test_an_invalid_policy_names_its_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        mcp(**changes)
    assert info.value.field == field


def test_validation_follows_the_seed_order() -> None:
    everything_wrong = {
        "retry_policy_id": "",
        "max_attempts": 0,
        "multiplier": 0,
        "initial_delay_ms": 0,
        "max_delay_ms": -1,
    }
    order = list(everything_wrong)
    for i, field in enumerate(order):
        wrong = {k: everything_wrong[k] for k in order[i:]}
        with pytest.raises(ConfigError) as info:
            mcp(**wrong)
        assert info.value.field == field


def test_policy_id_defaults_to_the_operation_type_and_lists_become_tuples() -> None:
    policy = RetryPolicy("x", 2, 10, 20, retryable_errors=["A"], non_retryable_errors={"B"})
    assert policy.retry_policy_id == "x"
    assert policy.retryable_errors == ("A",)
    assert policy.non_retryable_errors == ("B",)
    assert hash(policy) == hash(RetryPolicy("x", 2, 10, 20, retryable_errors=("A",),
                                            non_retryable_errors=("B",)))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"ratio": -0.1}, "ratio"),
        ({"ratio": math.inf}, "ratio"),
        ({"min_retries": -1}, "min_retries"),
        ({"min_retries": 1.5}, "min_retries"),
        ({"window_seconds": 0.001}, "window_seconds"),
    ],
)
def test_an_invalid_budget_names_its_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        RetryBudget(**changes)  # type: ignore[arg-type]
    assert info.value.field == field


def test_the_five_seed_policies_ship_with_the_seed_values() -> None:
    got = {
        p.operation_type: (
            p.max_attempts, p.initial_delay_ms, p.max_delay_ms, p.multiplier, p.jitter,
            set(p.retryable_errors), set(p.non_retryable_errors),
        )
        for p in default_policies()
    }
    nt, su, rl = "NETWORK_TIMEOUT", "SERVICE_UNAVAILABLE", "RATE_LIMITED"
    pd, sch, nf = "PERMISSION_DENIED", "INVALID_SCHEMA", "NOT_FOUND"
    assert got == {
        "mcp_call": (3, 500, 10_000, 2.0, True, {nt, su, rl}, {pd, sch, nf}),
        "memory_write": (5, 200, 5_000, 2.0, True, {nt, su}, {pd, sch}),
        "wiki_write": (3, 1_000, 30_000, 2.0, True, {nt, su, rl}, {pd, sch}),
        "message_send": (2, 1_000, 5_000, 2.0, True, {nt}, {pd}),
        "external_api": (3, 1_000, 60_000, 2.0, True, {nt, su, rl}, {pd, sch}),
    }


# --- classification --------------------------------------------------------------------


def test_non_retryable_list_wins_over_the_retryable_list() -> None:
    policy = RetryPolicy("x", 3, 1, 1, retryable_errors=("A",), non_retryable_errors=("A",))
    assert not policy.is_retryable("A")


def test_empty_retryable_list_retries_everything_not_excluded() -> None:
    policy = RetryPolicy("x", 3, 1, 1, non_retryable_errors=("B",))
    assert policy.is_retryable("A")
    assert policy.is_retryable("ValueError")
    assert not policy.is_retryable("B")


def test_a_retryable_list_retries_only_its_codes() -> None:
    policy = mcp()
    assert policy.is_retryable("RATE_LIMITED")
    assert not policy.is_retryable("SOMETHING_ELSE")


class _Code(enum.Enum):
    BUSY = "SERVICE_UNAVAILABLE"


class _WithCode(Exception):
    def __init__(self, code: object) -> None:
        super().__init__("x")
        self.code = code


class _Vendor(Exception):
    pass


class _VendorTimeout(_Vendor):
    pass


def test_error_codes_come_from_code_attribute_builtins_then_class_name() -> None:
    assert error_code(OperationError("RATE_LIMITED")) == "RATE_LIMITED"
    assert error_code(_WithCode(_Code.BUSY)) == "SERVICE_UNAVAILABLE"
    assert error_code(_WithCode(503)) == "_WithCode"  # only string codes are codes
    assert error_code(TimeoutError()) == "NETWORK_TIMEOUT"
    assert error_code(TimeoutError()) == "NETWORK_TIMEOUT"
    assert error_code(ConnectionRefusedError()) == "SERVICE_UNAVAILABLE"
    assert error_code(PermissionError()) == "PERMISSION_DENIED"
    assert error_code(KeyError("k")) == "KeyError"


def test_registered_codes_apply_to_subclasses_and_the_nearest_wins() -> None:
    register_error_code(_Vendor, "VENDOR_DOWN")
    register_error_code(_VendorTimeout, "NETWORK_TIMEOUT")
    assert error_code(_Vendor()) == "VENDOR_DOWN"
    assert error_code(_VendorTimeout()) == "NETWORK_TIMEOUT"


@pytest.mark.parametrize(("exc_type", "code", "field"), [
    (ValueError, "", "code"),
    (int, "X", "exc_type"),
    ("ValueError", "X", "exc_type"),
])
def test_registering_bad_codes_is_refused(exc_type: object, code: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        register_error_code(exc_type, code)  # type: ignore[arg-type]
    assert info.value.field == field


def test_retry_after_hints_are_read_in_seconds_and_bad_ones_ignored() -> None:
    assert retry_after_of(OperationError("RATE_LIMITED", retry_after=2)) == 2.0
    assert retry_after_of(OperationError("RATE_LIMITED", retry_after=timedelta(seconds=3))) == 3.0  # type: ignore[arg-type]
    for bad in (None, -1, math.nan, "5", True):
        assert retry_after_of(OperationError("X", retry_after=bad)) is None  # type: ignore[arg-type]
    assert retry_after_of(ValueError()) is None

    class Raising(Exception):
        @property
        def retry_after(self) -> float:
            raise RuntimeError("a foreign property")

    assert retry_after_of(Raising()) is None


# --- decisions ---------------------------------------------------------------------------

TIMEOUT = OperationError("NETWORK_TIMEOUT")


def test_decide_retries_a_retryable_failure_after_the_backoff() -> None:
    d = decide(mcp(jitter=False), 1, TIMEOUT)
    assert (d.retry, d.delay, d.attempts, d.max_attempts, d.error_code) == (
        True, 1.0, 2, 3, "NETWORK_TIMEOUT",
    )
    assert d.stop_reason is None and not d.sent_to_dlq


def test_decide_stops_at_once_on_a_non_retryable_code_without_dlq() -> None:
    d = decide(mcp(), 0, OperationError("PERMISSION_DENIED"))
    assert (d.retry, d.stop_reason, d.sent_to_dlq, d.attempts) == (
        False, NON_RETRYABLE, False, 1,
    )


def test_decide_never_plans_a_sleep_after_the_last_attempt() -> None:
    d = decide(mcp(), 2, TIMEOUT)
    assert (d.retry, d.delay, d.stop_reason, d.sent_to_dlq, d.attempts) == (
        False, 0.0, EXHAUSTED, True, 3,
    )


def test_decide_without_policy_gives_one_unclassified_attempt_ending_exhausted() -> None:
    d = decide(None, 0, OperationError("PERMISSION_DENIED"))
    assert (d.retry, d.stop_reason, d.sent_to_dlq, d.max_attempts) == (False, EXHAUSTED, True, 1)


def test_decide_stops_when_the_delay_would_reach_the_deadline() -> None:
    policy = mcp(jitter=False)
    assert decide(policy, 0, TIMEOUT, elapsed=0.4, deadline=1.0).retry  # 0.4 + 0.5 < 1.0
    d = decide(policy, 0, TIMEOUT, elapsed=0.5, deadline=1.0)
    assert (d.retry, d.stop_reason, d.sent_to_dlq) == (False, DEADLINE_EXCEEDED, True)


def test_decide_honours_retry_after_capped_at_max_delay() -> None:
    policy = mcp(jitter=False)
    hinted = decide(policy, 0, OperationError("RATE_LIMITED", retry_after=3))
    assert (hinted.delay, hinted.retry_after) == (3.0, 3.0)
    capped = decide(policy, 0, OperationError("RATE_LIMITED", retry_after=3600))
    assert capped.delay == 10.0
    shorter = decide(
        mcp(jitter=False, max_attempts=5), 2, OperationError("RATE_LIMITED", retry_after=0.1)
    )
    assert shorter.delay == 2.0  # the hint is a floor, not a shortcut past the backoff


def test_a_denied_budget_turns_a_planned_retry_into_a_dlq_stop() -> None:
    d = decide(mcp(), 0, TIMEOUT).deny_budget()
    assert (d.retry, d.delay, d.stop_reason, d.sent_to_dlq) == (
        False, 0.0, RETRY_BUDGET_EXHAUSTED, True,
    )


def test_failed_outcome_keeps_the_code_and_the_exception_and_unwrap_reraises() -> None:
    exc = OperationError("PERMISSION_DENIED", "nope")
    outcome = RetryOutcome.failed(decide(mcp(), 0, exc), exc)
    assert (outcome.success, outcome.attempts, outcome.final_error, outcome.sent_to_dlq) == (
        False, 1, "PERMISSION_DENIED", False,
    )
    assert outcome.last_exception is exc
    with pytest.raises(OperationError) as info:
        outcome.unwrap()
    assert info.value is exc
    assert RetryOutcome(True, 42, 1).unwrap() == 42


def test_decide_jitter_is_reproducible_with_a_seeded_source() -> None:
    a = decide(mcp(), 1, TIMEOUT, rng=random.Random(7).random).delay
    b = decide(mcp(), 1, TIMEOUT, rng=random.Random(7).random).delay
    assert a == b and 1.0 <= a < 1.3


def test_the_hot_path_success_outcome_is_an_ordinary_frozen_outcome() -> None:
    fast = succeeded("r", 2)
    assert fast == RetryOutcome(True, "r", 2)
    assert (fast.final_error, fast.sent_to_dlq, fast.stop_reason, fast.last_exception) == (
        None, False, None, None,
    )
    assert repr(fast) == repr(RetryOutcome(True, "r", 2))
    with pytest.raises(AttributeError):
        fast.success = False  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [("initial_delay_ms", 9e12), ("max_delay_ms", 1e13), ("max_delay_ms", 3_600_001),
     ("deadline_ms", 86_400_001)],
)
def test_delays_and_deadlines_are_bounded(field: str, value: float) -> None:
    base = {"initial_delay_ms": 1, "max_delay_ms": 10, "deadline_ms": None}
    if field == "initial_delay_ms":
        base["max_delay_ms"] = value
    base[field] = value
    with pytest.raises(ConfigError) as info:
        RetryPolicy("job", 3, **base)  # type: ignore[arg-type]
    assert info.value.field in (field, "initial_delay_ms", "max_delay_ms")
    RetryPolicy("job", 3, 3_600_000, 3_600_000, deadline_ms=86_400_000)  # the bounds pass
