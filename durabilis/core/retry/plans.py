"""The retry pillar's decisions, budget calls and THE retry plan (no I/O).

:func:`decide_coded` says what follows a failed attempt; :class:`BudgetOps`
builds the ``retry_budget`` script calls and decodes their replies;
:func:`retry_plan` is the retry loop as a plan of steps (``Run`` the
operation, ``Sleep`` the backoff, a ``retry_budget`` :class:`ScriptCall`)
that the sync and async engines of :mod:`durabilis.retry` both drive.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durabilis import _codec
from durabilis._scripts import ScriptCall
from durabilis.core.retry.types import (
    DEADLINE_EXCEEDED,
    EXHAUSTED,
    NON_RETRYABLE,
    TESTING,
    NotRetried,
    RetryBudget,
    RetryDecision,
    RetryOutcome,
    RetryPolicy,
    backoff_delay,
    retry_after_of,
    succeeded,
)
from durabilis.core.steps import Plan, Run, Sleep
from durabilis.errors import ConfigError, CorruptData

if TYPE_CHECKING:
    from durabilis._keys import KeySpace

__all__ = ["BudgetOps", "BudgetState", "decide_coded", "retry_plan"]


# --- decisions ------------------------------------------------------------------------


def decide_coded(
    policy: RetryPolicy | None,
    attempt: int,
    exc: BaseException,
    code: str,
    *,
    elapsed: float = 0.0,
    deadline: float | None = None,
    rng: Callable[[], float] = random.random,
) -> RetryDecision:
    """Decide what follows failed attempt ``attempt`` (:mod:`durabilis.core.retry` lists the rules).

    The delay is the backoff, raised to the error's ``retry_after`` hint when
    that is longer, the hint capped at ``max_delay_ms``.

    Args:
        policy: The operation type's policy (``None``: no policy, one attempt).
        attempt: The 0-based number of the attempt that failed.
        exc: The exception it raised.
        code: Its classification code (``durabilis.retry.error_code``: the
            process-wide class table lives with the shells).
        elapsed: Seconds since the call started (first attempt), sleeps included.
        deadline: Seconds after the call's start when no attempt may start any
            more; ``None``: none (callers pass the policy's, which always has one).
        rng: Jitter source returning floats in ``[0, 1)``.

    Returns:
        A :class:`RetryDecision`. Budgets are not asked here (that is I/O).
    """
    if isinstance(exc, NotRetried):
        return RetryDecision(False, 0.0, attempt, 1, code, NON_RETRYABLE)
    if policy is None:
        return RetryDecision(False, 0.0, attempt, 1, code, EXHAUSTED)
    max_attempts = policy.max_attempts
    cap = TESTING.max_attempts
    if cap is not None and cap < max_attempts:
        max_attempts = cap
    if not policy.is_retryable(code):
        return RetryDecision(False, 0.0, attempt, max_attempts, code, NON_RETRYABLE)
    hint = retry_after_of(exc)
    if attempt + 1 >= max_attempts:
        return RetryDecision(False, 0.0, attempt, max_attempts, code, EXHAUSTED, hint)
    delay = backoff_delay(policy, attempt, rng)
    if hint is not None:
        delay = max(delay, min(hint, policy.max_delay_ms / 1000.0))
    if deadline is not None and elapsed + delay >= deadline:
        return RetryDecision(False, 0.0, attempt, max_attempts, code, DEADLINE_EXCEEDED, hint)
    return RetryDecision(True, delay, attempt, max_attempts, code, None, hint)


# --- the budget: pure build/decode of its one script ---------------------------------


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget script's answer.

    Attributes:
        allowed: The call was recorded / the retry was granted.
        calls: Calls in the window (after this step).
        retries: Retries in the window (after this step).
    """

    allowed: bool
    calls: int
    retries: int


class BudgetOps:
    """Builds ``retry_budget`` calls and decodes their replies (no I/O).

    Args:
        keys: The store's key space (``store.keys``): names the budget's key.
    """

    __slots__ = ("keys",)

    def __init__(self, keys: KeySpace) -> None:
        self.keys = keys

    def _call(self, mode: str, operation_type: str, budget: RetryBudget) -> ScriptCall:
        # The script applies this setting AND every other one used on the
        # operation type within its window (the strictest binds: docs/retry.md).
        return ScriptCall(
            "retry_budget",
            [self.keys.retry_budget(operation_type)],
            [
                mode,
                max(10, round(budget.window_seconds * 1000)),
                round(budget.ratio * 1_000_000),
                budget.min_retries,
            ],
        )

    def record_call(self, operation_type: str, budget: RetryBudget) -> ScriptCall:
        """Count one call (an operation started) in the window."""
        return self._call("call", operation_type, budget)

    def spend_retry(self, operation_type: str, budget: RetryBudget) -> ScriptCall:
        """Ask for one retry: granted and counted only if the budget allows it."""
        return self._call("retry", operation_type, budget)

    def decode(self, operation_type: str, reply: Any) -> BudgetState:
        """Decode either call's reply.

        Raises:
            CorruptData: Foreign data at the budget key.
        """
        rkey = self.keys.retry_budget(operation_type)
        try:
            tag = _codec.as_text(reply[0], key=rkey, field="reply")
        except (TypeError, IndexError, KeyError) as exc:
            raise CorruptData(rkey, f"unexpected script reply {reply!r}") from exc
        if tag in ("ok", "denied") and len(reply) == 3:
            return BudgetState(
                tag == "ok",
                _codec.as_int(reply[1], key=rkey, field="calls"),
                _codec.as_int(reply[2], key=rkey, field="retries"),
            )
        detail = reply[1] if tag == "corrupt" and len(reply) > 1 else reply
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise CorruptData(rkey, str(detail))

    @staticmethod
    def check_named(operation_type: str) -> None:
        """The operation type can name its budget's key (a ``"*"`` policy's
        budget meets types no policy validated).

        Raises:
            ConfigError: ``operation_type`` is not valid Unicode.
        """
        try:
            operation_type.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(
                "operation_type", "must be valid Unicode (no lone surrogates): it names "
                "the retry budget's key"
            ) from None


# --- the retry plan ------------------------------------------------------------------------


def _quiet(*_: Any) -> None:
    return None


def retry_plan(
    operation_type: str,
    policy: RetryPolicy | None,
    attempt_step: Run,
    *,
    classify: Callable[[BaseException], str],
    clock: Callable[[], float],
    start: float,
    deadline: float | None,
    rng: Callable[[], float] = random.random,
    budget_ops: BudgetOps | None = None,
    on_retry: Callable[[RetryDecision], object] = _quiet,
    on_stop: Callable[[RetryDecision, Exception], object] = _quiet,
    failed: Exception | None = None,
) -> Plan[RetryOutcome[Any]]:
    """Run an operation under its retry policy, as a plan of steps.

    Steps and the replies the plan expects:

    - ``attempt_step`` (a :class:`Run`): ``(True, value)`` or ``(False, exception)``;
    - ``Sleep(delay)``: ``None`` (under ``TESTING.instant`` the driver does not
      sleep and the plan counts the delay as elapsed, so deadlines decide as
      in real time);
    - with a budgeted policy, a ``retry_budget`` :class:`ScriptCall` before the
      first attempt (the call counted) and before each retry (granted or
      refused): its reply.

    Args:
        operation_type: Names the budget's key.
        policy: The operation type's policy (``None``: one attempt).
        attempt_step: The operation, as the step the driver runs.
        classify: Exception -> code (``durabilis.retry.error_code``).
        clock: Monotonic seconds; read only when there is a ``deadline``.
        start: ``clock()`` when the call started (before its budget's round trip).
        deadline: Seconds after ``start`` when no attempt may start; ``None``: none.
        rng: Jitter source in ``[0, 1)``.
        budget_ops: Builds the budget's calls; needed when the policy has a budget.
        on_retry: Told each retry made, before its sleep (the shells log it).
        on_stop: Told the decision that stopped the loop and the last exception.
        failed: The first attempt already ran and raised this (a driver's
            straight-line first attempt, when no budget call precedes it): the
            plan takes over at that failure, as if its ``Run`` had replied it.

    Returns:
        The :class:`RetryOutcome`; failures are reported in it, not raised.

    Raises:
        ConfigError: A budgeted policy and an operation type that cannot name
            its key (before anything is sent or run).
        CorruptData: Foreign data at the budget's key.
    """
    budget = None if policy is None else policy.budget
    skipped = 0.0  # delays not slept (TESTING.instant) still count as elapsed
    attempt = 0
    if failed is not None:
        value: Any = failed
    else:
        if budget is not None:
            if budget_ops is None:
                raise ConfigError(
                    "budget", "a retry budget is kept in Redis: give the engine a store"
                )
            budget_ops.check_named(operation_type)
            budget_ops.decode(
                operation_type, (yield budget_ops.record_call(operation_type, budget))
            )
        ok, value = yield attempt_step
        if ok:
            return succeeded(value, 1)
    while True:
        elapsed = clock() - start + skipped if deadline is not None else 0.0
        decision = decide_coded(
            policy, attempt, value, classify(value), elapsed=elapsed, deadline=deadline, rng=rng
        )
        if decision.retry and budget_ops is not None and budget is not None:
            state = budget_ops.decode(
                operation_type, (yield budget_ops.spend_retry(operation_type, budget))
            )
            if not state.allowed:
                decision = decision.deny_budget()
            elif deadline is not None and (
                clock() - start + skipped + decision.delay >= deadline
            ):
                # The budget's round trip took time too: a retry is never slept
                # into the deadline (it stays charged to the budget, never made).
                decision = decision.deny_deadline()
        if not decision.retry:
            on_stop(decision, value)
            return RetryOutcome.failed(decision, value)
        on_retry(decision)
        if TESTING.instant:
            skipped += decision.delay
        yield Sleep(decision.delay)
        attempt += 1
        ok, value = yield attempt_step
        if ok:
            return succeeded(value, attempt + 1)
