"""The retry pillar's decisions, budget calls and THE retry plan (no I/O).

:func:`decide_coded` says what follows a failed attempt; :class:`BudgetOps`
builds the ``retry_budget`` script calls and decodes their replies;
:func:`retry_loop` is THE retry loop as a plan (attempt, decide, charge,
sleep, attempt again), each step a hook's (:class:`RetryHooks`);
:func:`retry_plan` is the engines' hooks on it (``Run`` the operation,
``Sleep`` the backoff, a ``retry_budget`` :class:`ScriptCall`), which the sync
and async engines of :mod:`durabilis.retry` both drive; the composed layer
drives the same loop with its own hooks (claim, lease, breaker, DLQ).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

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

__all__ = [
    "BudgetOps", "BudgetState", "RetryHooks", "Stopped", "decide_coded", "retry_loop",
    "retry_plan",
]

T = TypeVar("T")


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


# --- the retry loop and its hooks -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stopped(Generic[T]):
    """A hook's answer that ends the loop with ``value`` (the plan's result)."""

    value: T


class RetryHooks(Generic[T]):
    """What one retry loop does around the skeleton that :func:`retry_loop` owns.

    The skeleton: attempt, decide, charge the retry, sleep, attempt again. Each
    hook is a sub-plan (a generator of steps) unless said otherwise; the
    optional ones left ``None`` do nothing (``sleep``: one ``Sleep`` of the
    delay). The engines' hooks are :func:`retry_plan`'s; the composed layer's
    (claim, lease, breaker, DLQ) are built by ``durabilis.core.layer``.

    Attributes:
        attempt: ``attempt(n)``: run attempt ``n`` (from 0): ``(True, value)`` or
            ``(False, exception)``.
        decide: ``decide(n, exc)`` (a plain function): what follows failed attempt ``n``.
        on_success: ``on_success(value, n)``: the plan's result after attempt ``n`` succeeded.
        on_stop: ``on_stop(decision, exc)``: the plan's result when ``decision``
            (as charged) stops the loop; it may raise instead.
        before_first: Before attempt 0 (the engines count the call in its budget).
        before_attempt: ``before_attempt(n)``: before attempt ``n``; a :class:`Stopped`
            ends the loop (the layer: lease, breaker admission, deadline).
        after_failure: ``after_failure(decision, exc)``: the decision as charged
            (budget, the breaker's report, the deadline re-checked after those
            round trips), or a :class:`Stopped`.
        sleep: ``sleep(decision)``: the backoff before the next attempt.
    """

    __slots__ = (
        "after_failure", "attempt", "before_attempt", "before_first", "decide", "on_stop",
        "on_success", "sleep",
    )

    def __init__(  # (a plain class: built once per call, on the layer's general path)
        self,
        attempt: Callable[[int], Plan[tuple[bool, Any]]],
        decide: Callable[[int, BaseException], RetryDecision],
        on_success: Callable[[Any, int], Plan[T]],
        on_stop: Callable[[RetryDecision, BaseException], Plan[T]],
        *,
        before_first: Callable[[], Plan[None]] | None = None,
        before_attempt: Callable[[int], Plan[Stopped[T] | None]] | None = None,
        after_failure: (
            Callable[[RetryDecision, BaseException], Plan[RetryDecision | Stopped[T]]] | None
        ) = None,
        sleep: Callable[[RetryDecision], Plan[None]] | None = None,
    ) -> None:
        self.attempt, self.decide, self.on_success, self.on_stop = (
            attempt, decide, on_success, on_stop
        )
        self.before_first, self.before_attempt = before_first, before_attempt
        self.after_failure, self.sleep = after_failure, sleep


def retry_loop(hooks: RetryHooks[T]) -> Plan[T]:
    """THE retry loop, as a plan: the skeleton every retrying caller shares
    (the engines through :func:`retry_plan`, the layer through its hooks);
    every step it yields is a hook's."""
    if hooks.before_first is not None:
        yield from hooks.before_first()
    before, after, sleep = hooks.before_attempt, hooks.after_failure, hooks.sleep
    attempt = 0
    while True:
        if before is not None:
            stopped = yield from before(attempt)
            if stopped is not None:
                return stopped.value
        ok, value = yield from hooks.attempt(attempt)
        if ok:
            return (yield from hooks.on_success(value, attempt))
        decision = hooks.decide(attempt, value)
        if after is not None:
            charged = yield from after(decision, value)
            if isinstance(charged, Stopped):
                return charged.value
            decision = charged
        if not decision.retry:
            return (yield from hooks.on_stop(decision, value))
        if sleep is None:
            yield Sleep(decision.delay)
        else:
            yield from sleep(decision)
        attempt += 1


# --- the engines' retry plan --------------------------------------------------------


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
    """Run an operation under its retry policy, as a plan of steps: the
    engines' hooks on :func:`retry_loop`.

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

    def count_call() -> Plan[None]:
        assert budget is not None
        if budget_ops is None:
            raise ConfigError("budget", "a retry budget is kept in Redis: give the engine a store")
        budget_ops.check_named(operation_type)
        budget_ops.decode(operation_type, (yield budget_ops.record_call(operation_type, budget)))

    def attempt(_: int) -> Plan[tuple[bool, Any]]:
        nonlocal failed
        if failed is not None:  # the first attempt ran before the plan
            exc, failed = failed, None
            return False, exc
        reply: tuple[bool, Any] = yield attempt_step
        return reply

    def elapsed() -> float:
        return clock() - start + skipped

    def decide(n: int, exc: BaseException) -> RetryDecision:
        return decide_coded(
            policy, n, exc, classify(exc),
            elapsed=elapsed() if deadline is not None else 0.0, deadline=deadline, rng=rng,
        )

    def spend_retry(
        decision: RetryDecision, _: BaseException
    ) -> Plan[RetryDecision | Stopped[RetryOutcome[Any]]]:
        if not decision.retry:
            return decision
        assert budget_ops is not None and budget is not None
        state = budget_ops.decode(
            operation_type, (yield budget_ops.spend_retry(operation_type, budget))
        )
        if not state.allowed:
            return decision.deny_budget()
        if deadline is not None and elapsed() + decision.delay >= deadline:
            # The budget's round trip took time too: a retry is never slept
            # into the deadline (it stays charged to the budget, never made).
            return decision.deny_deadline()
        return decision

    def sleep(decision: RetryDecision) -> Plan[None]:
        nonlocal skipped
        on_retry(decision)
        if TESTING.instant:
            skipped += decision.delay
        yield Sleep(decision.delay)

    def succeeded_(value: Any, n: int) -> Plan[RetryOutcome[Any]]:
        return succeeded(value, n + 1)
        yield  # (a plan without steps)

    def stopped(decision: RetryDecision, exc: BaseException) -> Plan[RetryOutcome[Any]]:
        assert isinstance(exc, Exception)
        on_stop(decision, exc)
        return RetryOutcome.failed(decision, exc)
        yield  # (a plan without steps)

    return retry_loop(RetryHooks(
        attempt, decide, succeeded_, stopped,
        before_first=count_call if failed is None and budget is not None else None,
        after_failure=spend_retry if budget is not None and budget_ops is not None else None,
        sleep=sleep,
    ))
