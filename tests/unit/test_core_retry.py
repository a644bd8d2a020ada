"""The retry plan, tested the h11 way: scripted outcomes and replies in, steps out.

No server and no store: :func:`~durabilis.core.steps.answered` steps the plan
by hand, so which step it asks for (``Run`` the operation, ``Sleep`` the
backoff, the budget's ``ScriptCall``) and what it makes of each reply is
asserted directly. The engines of :mod:`durabilis.retry` drive this plan.
"""

from __future__ import annotations

from typing import Any

import pytest

from durabilis._keys import KeySpace
from durabilis._retry_core import error_code
from durabilis._scripts import ScriptCall
from durabilis.core.retry import (
    DEADLINE_EXCEEDED,
    EXHAUSTED,
    NON_RETRYABLE,
    RETRY_BUDGET_EXHAUSTED,
    TESTING,
    BudgetOps,
    RetryBudget,
    RetryDecision,
    RetryHooks,
    RetryOutcome,
    RetryPolicy,
    Stopped,
    decide_coded,
    retry_loop,
    retry_plan,
)
from durabilis.core.steps import Plan, Run, Sleep, answered
from durabilis.errors import ConfigError, CorruptData

K = KeySpace("unit")
STEP = Run(lambda _: None, None)  # the plan never calls it: the test answers for it
TIMEOUT = TimeoutError("slow")  # NETWORK_TIMEOUT: retryable under POLICY
DENIED = PermissionError("no")  # PERMISSION_DENIED: not retryable


def policy(**fields: Any) -> RetryPolicy:
    base: dict[str, Any] = {
        "operation_type": "op", "max_attempts": 3, "initial_delay_ms": 100,
        "max_delay_ms": 1_000, "jitter": False,
        "retryable_errors": ("NETWORK_TIMEOUT",), "non_retryable_errors": ("PERMISSION_DENIED",),
    }
    base.update(fields)
    return RetryPolicy(**base)


class Clock:
    """A hand-moved monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def plan(
    pol: RetryPolicy | None, *, clock: Clock | None = None, deadline: float | None = 60.0,
    events: list[Any] | None = None, **options: Any,
) -> Plan[RetryOutcome[Any]]:
    log = [] if events is None else events
    return retry_plan(
        "op", pol, STEP, classify=error_code, clock=clock or Clock(), start=0.0,
        deadline=deadline, rng=lambda: 0.5,
        on_retry=lambda d: log.append(("retry", d)),
        on_stop=lambda d, exc: log.append(("stop", d, exc)),
        **options,
    )


# --- the core does no I/O -----------------------------------------------------------


# --- without a budget: Run, Sleep, Run ... -------------------------------------------------


def test_a_first_attempt_that_succeeds_is_the_only_step() -> None:
    steps, outcome = answered(plan(policy()), [(True, 42)])
    assert steps == [STEP]
    assert (outcome.success, outcome.result, outcome.attempts) == (True, 42, 1)


def test_a_retryable_failure_sleeps_the_backoff_then_runs_again() -> None:
    events: list[Any] = []
    steps, outcome = answered(plan(policy(), events=events), [(False, TIMEOUT), None, (True, "ok")])
    assert steps == [STEP, Sleep(0.1), STEP]
    assert (outcome.success, outcome.result, outcome.attempts) == (True, "ok", 2)
    [(kind, decision)] = events
    assert kind == "retry" and decision.error_code == "NETWORK_TIMEOUT" and decision.attempts == 1


def test_the_backoff_grows_by_the_multiplier_and_jitter_comes_from_rng() -> None:
    replies = [(False, TIMEOUT), None, (False, TIMEOUT), None, (True, 1)]
    steps, _ = answered(plan(policy(max_attempts=5, jitter=True)), replies)
    # d = 100 ms * 2^i, plus 30 % of d times rng() = 0.5
    assert steps == [STEP, Sleep(0.115), STEP, Sleep(0.23), STEP]


def test_a_non_retryable_failure_stops_at_once_and_is_not_for_the_dlq() -> None:
    events: list[Any] = []
    steps, outcome = answered(plan(policy(), events=events), [(False, DENIED)])
    assert steps == [STEP]
    assert (outcome.success, outcome.stop_reason, outcome.sent_to_dlq) == (
        False, NON_RETRYABLE, False
    )
    assert outcome.final_error == "PERMISSION_DENIED" and outcome.last_exception is DENIED
    assert [e[0] for e in events] == ["stop"]


def test_the_last_attempt_is_never_followed_by_a_sleep_and_exhaustion_goes_to_the_dlq() -> None:
    replies = [(False, TIMEOUT), None, (False, TIMEOUT), None, (False, TIMEOUT)]
    steps, outcome = answered(plan(policy()), replies)
    assert steps == [STEP, Sleep(0.1), STEP, Sleep(0.2), STEP]
    assert (outcome.attempts, outcome.stop_reason, outcome.sent_to_dlq) == (3, EXHAUSTED, True)


def test_no_policy_means_one_attempt_and_its_failure_is_exhaustion() -> None:
    steps, outcome = answered(plan(None, deadline=None), [(False, ValueError("x"))])
    assert steps == [STEP]
    assert (outcome.attempts, outcome.stop_reason, outcome.final_error) == (
        1, EXHAUSTED, "ValueError"
    )


def test_a_retry_whose_delay_would_reach_the_deadline_is_not_made() -> None:
    clock = Clock()
    clock.now = 59.95  # the first attempt took almost the whole minute
    steps, outcome = answered(plan(policy(), clock=clock), [(False, TIMEOUT)])
    assert steps == [STEP]
    assert outcome.stop_reason == DEADLINE_EXCEEDED and outcome.sent_to_dlq


def test_delays_not_slept_under_instant_retries_still_count_against_the_deadline() -> None:
    TESTING.instant = True
    try:
        replies = [(False, TIMEOUT), None, (False, TIMEOUT)]
        steps, outcome = answered(plan(policy(), deadline=0.25), replies)
    finally:
        TESTING.instant = False
    # 0.1 s skipped + the next 0.2 s would reach 0.25 s, though the clock never moved
    assert steps == [STEP, Sleep(0.1), STEP]
    assert outcome.stop_reason == DEADLINE_EXCEEDED


def test_a_plan_given_the_first_failure_starts_with_its_decision() -> None:
    steps, outcome = answered(plan(policy(), failed=TIMEOUT), [None, (True, "x")])
    assert steps == [Sleep(0.1), STEP]
    assert (outcome.result, outcome.attempts) == ("x", 2)


# --- with a budget: its script before the first attempt and before each retry -----------


def budgeted(**fields: Any) -> RetryPolicy:
    return policy(budget=RetryBudget(ratio=0.5, min_retries=2, window_seconds=10), **fields)


def test_a_budgeted_call_is_counted_before_its_first_attempt() -> None:
    steps, outcome = answered(
        plan(budgeted(), budget_ops=BudgetOps(K)), [[b"ok", 1, 0], (True, 7)]
    )
    count, run = steps
    assert isinstance(count, ScriptCall) and count.name == "retry_budget"
    assert list(count.keys) == [K.retry_budget("op")]
    assert list(count.args) == ["call", 10_000, 500_000, 2]
    assert run == STEP and outcome.result == 7


def test_a_retry_the_budget_refuses_stops_the_loop_for_the_dlq() -> None:
    replies = [[b"ok", 1, 0], (False, TIMEOUT), [b"denied", 1, 2]]
    steps, outcome = answered(plan(budgeted(), budget_ops=BudgetOps(K)), replies)
    assert [type(s) for s in steps] == [ScriptCall, Run, ScriptCall]
    assert steps[2].args[0] == "retry"
    assert (outcome.stop_reason, outcome.sent_to_dlq, outcome.attempts) == (
        RETRY_BUDGET_EXHAUSTED, True, 1
    )


def test_a_granted_retry_is_not_made_when_the_budgets_round_trip_took_the_time_left() -> None:
    clock = Clock()
    budget_ops = BudgetOps(K)
    steps_plan = plan(budgeted(), clock=clock, deadline=1.0, budget_ops=budget_ops)
    assert isinstance(next(steps_plan), ScriptCall)
    assert steps_plan.send([b"ok", 1, 0]) == STEP
    spend = steps_plan.send((False, TIMEOUT))
    assert isinstance(spend, ScriptCall) and spend.args[0] == "retry"
    clock.now = 0.95  # the budget's reply came late: 0.95 + 0.1 >= 1.0
    with pytest.raises(StopIteration) as stop:
        steps_plan.send([b"ok", 1, 1])
    assert stop.value.value.stop_reason == DEADLINE_EXCEEDED


def test_foreign_data_at_the_budget_key_is_corrupt_data_naming_it() -> None:
    with pytest.raises(CorruptData) as raised:
        answered(plan(budgeted(), budget_ops=BudgetOps(K)), [[b"corrupt", b"WRONGTYPE"]])
    assert raised.value.key == K.retry_budget("op")


def test_a_budget_without_its_calls_builder_is_a_config_error_before_any_step() -> None:
    with pytest.raises(ConfigError):
        next(plan(budgeted()))


def test_an_operation_type_that_cannot_name_the_budget_key_is_refused_before_any_step() -> None:
    bad = retry_plan(
        "op\ud800", budgeted(operation_type="*"), STEP, classify=error_code, clock=Clock(),
        start=0.0, deadline=None, budget_ops=BudgetOps(K),
    )
    with pytest.raises(ConfigError):
        next(bad)


# --- THE loop with other hooks (the layer's shape) ------------------------------------


class _Hooks:
    """Hooks that note each call and stop where told: the loop's skeleton checked
    apart from any policy."""

    def __init__(self, *, stop_before: int | None = None, stop_after: int | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.stop_before, self.stop_after = stop_before, stop_after

    def hooks(self) -> RetryHooks[str]:
        return RetryHooks(
            self.attempt, self.decide, self.on_success, self.on_stop,
            before_attempt=self.before_attempt, after_failure=self.after_failure,
        )

    def before_attempt(self, n: int) -> Plan[Stopped[str] | None]:
        self.calls.append(("before", n))
        yield ScriptCall("before", [], [n])
        return Stopped(f"stopped before {n}") if n == self.stop_before else None

    def attempt(self, n: int) -> Plan[tuple[bool, Any]]:
        self.calls.append(("attempt", n))
        reply: tuple[bool, Any] = yield STEP
        return reply

    def decide(self, n: int, exc: BaseException) -> RetryDecision:
        self.calls.append(("decide", n, exc))
        return decide_coded(policy(), n, exc, error_code(exc), rng=lambda: 0.5)

    def after_failure(
        self, decision: RetryDecision, _: BaseException
    ) -> Plan[RetryDecision | Stopped[str]]:
        self.calls.append(("after", decision.attempt))
        yield ScriptCall("report", [], [decision.attempt])
        if decision.attempt == self.stop_after:
            return Stopped(f"stopped after {decision.attempt}")
        return decision

    def on_success(self, value: Any, n: int) -> Plan[str]:
        self.calls.append(("success", n))
        yield ScriptCall("record", [], [value])
        return f"ok {value} at {n}"

    def on_stop(self, decision: RetryDecision, exc: BaseException) -> Plan[str]:
        self.calls.append(("stop", decision.stop_reason))
        if decision.stop_reason == NON_RETRYABLE:
            raise exc
        yield ScriptCall("park", [], [])
        return f"parked {decision.stop_reason}"


def _names(steps: list[Any]) -> list[str]:
    return [type(s).__name__ if not isinstance(s, ScriptCall) else s.name for s in steps]


def test_the_loop_runs_each_hook_in_the_skeleton_s_order_and_sleeps_the_decision() -> None:
    h = _Hooks()
    steps, result = answered(
        retry_loop(h.hooks()),
        [b"", (False, TIMEOUT), b"", None, b"", (True, 7), b""],
    )
    assert result == "ok 7 at 1"
    assert _names(steps) == [
        "before", "Run", "report", "Sleep", "before", "Run", "record",
    ]
    assert steps[3] == Sleep(0.1)  # the decision's delay (no jitter)
    assert [c[0] for c in h.calls] == [
        "before", "attempt", "decide", "after", "before", "attempt", "success",
    ]


def test_a_stopped_from_before_attempt_or_after_failure_is_the_loop_s_result() -> None:
    early = _Hooks(stop_before=1)
    steps, result = answered(retry_loop(early.hooks()), [b"", (False, TIMEOUT), b"", None, b""])
    assert result == "stopped before 1"
    assert _names(steps) == ["before", "Run", "report", "Sleep", "before"]
    late = _Hooks(stop_after=0)
    steps, result = answered(retry_loop(late.hooks()), [b"", (False, TIMEOUT), b""])
    assert result == "stopped after 0"
    assert _names(steps) == ["before", "Run", "report"]  # no sleep, no on_stop


def test_on_stop_ends_the_loop_with_its_value_or_its_exception() -> None:
    h = _Hooks()
    steps, result = answered(
        retry_loop(h.hooks()),
        [b"", (False, TIMEOUT), b"", None, b"", (False, TIMEOUT), b"", None,
         b"", (False, TIMEOUT), b"", b""],
    )
    assert result == f"parked {EXHAUSTED}"
    assert _names(steps)[-2:] == ["report", "park"]
    raising = _Hooks()
    with pytest.raises(PermissionError):
        answered(retry_loop(raising.hooks()), [b"", (False, DENIED), b""])
    assert raising.calls[-1] == ("stop", NON_RETRYABLE)
