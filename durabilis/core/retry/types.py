"""The retry pillar's types: policies, budgets, decisions, outcomes (no I/O).

Backoff is a pure function of the policy (:func:`backoff_delay`, the formula in
its docstring); :data:`TESTING` is the process-wide switch of
``durabilis.testing.instant_retries``.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

from durabilis._limits import (
    DEFAULT_RETRY_DEADLINE_MS,
    MAX_BUDGET_WINDOW_SECONDS,
    MAX_RETRY_DEADLINE_MS,
    MAX_RETRY_DELAY_MS,
    check_limits,
)
from durabilis.errors import ConfigError

__all__ = [  # what durabilis.core.retry re-exports (one star import)
    "DEADLINE_EXCEEDED",
    "DEFAULT_DEADLINE_MS",
    "EXHAUSTED",
    "JITTER_SHARE",
    "MAX_DEADLINE_MS",
    "MAX_DELAY_MS",
    "NETWORK_TIMEOUT",
    "NON_RETRYABLE",
    "PERMISSION_DENIED",
    "RATE_LIMITED",
    "RETRY_BUDGET_EXHAUSTED",
    "SERVICE_UNAVAILABLE",
    "TESTING",
    "NotRetried",
    "RetryBudget",
    "RetryDecision",
    "RetryOutcome",
    "RetryPolicy",
    "StopReason",
    "backoff_delay",
    "retry_after_of",
    "succeeded",
]

T = TypeVar("T")

StopReason = Literal["NON_RETRYABLE", "EXHAUSTED", "DEADLINE_EXCEEDED", "RETRY_BUDGET_EXHAUSTED"]
"""Why a retry loop stopped without success."""

NON_RETRYABLE: StopReason = "NON_RETRYABLE"
EXHAUSTED: StopReason = "EXHAUSTED"
DEADLINE_EXCEEDED: StopReason = "DEADLINE_EXCEEDED"
RETRY_BUDGET_EXHAUSTED: StopReason = "RETRY_BUDGET_EXHAUSTED"


class NotRetried(Exception):
    """Internal marker: a failure no policy retries or parks (stop at once).

    Raised by operations the library itself builds (the HTTP middleware wraps
    an application's exception in it: an HTTP handler runs once per delivery),
    so that a user's policy with an empty ``retryable_errors`` (retry every
    code) or no policy at all (park on failure) never re-runs or parks it.
    """


JITTER_SHARE = 0.3
"""Jitter adds a uniform share in ``[0, JITTER_SHARE)`` of the delay (seed: 30 %)."""

MAX_DELAY_MS = MAX_RETRY_DELAY_MS
"""Longest ``initial_delay_ms`` / ``max_delay_ms`` (one hour). A sleep is the
backoff (at most ``max_delay_ms``) plus its jitter: up to 1.3 hours."""

MAX_DEADLINE_MS = MAX_RETRY_DEADLINE_MS
"""Longest ``deadline_ms`` (one day): the longest an operation holds its claim retrying."""

DEFAULT_DEADLINE_MS = DEFAULT_RETRY_DEADLINE_MS
"""The deadline of a policy without one (``deadline_ms=None``): one hour."""


# Classification codes the library itself gives (durabilis._retry_core maps exceptions to them).
NETWORK_TIMEOUT = "NETWORK_TIMEOUT"
SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
RATE_LIMITED = "RATE_LIMITED"
PERMISSION_DENIED = "PERMISSION_DENIED"


def retry_after_of(exc: BaseException) -> float | None:
    """The ``retry_after`` hint of an exception in seconds, if it has a usable one.

    Accepts a non-negative finite number of seconds or a ``timedelta``; anything
    else (absent, negative, NaN, another type) is ignored. An integer too large
    for a float (``int`` of a 400-digit ``Retry-After`` header) is the largest
    float: the decision caps every hint at the policy's ``max_delay_ms``.
    """
    try:
        hint = getattr(exc, "retry_after", None)
    except Exception:  # a foreign property that raised: no hint
        return None
    if hint is None:
        return None
    if isinstance(hint, timedelta):
        hint = hint.total_seconds()
    if isinstance(hint, bool) or not isinstance(hint, (int, float)):
        return None
    try:
        try:
            hint = float(hint)
        except OverflowError:  # an int past the float range: "a very long time"
            hint = sys.float_info.max if hint > 0 else -1.0
    except Exception:  # a foreign number type's __float__ / __gt__ that raised: no hint
        return None
    return hint if math.isfinite(hint) and hint >= 0 else None


# --- configuration ---------------------------------------------------------------


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(name, f"must be a finite number, got {value!r}")
    return float(value)


def _codes(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(name, f"must be a list of error codes, got {value!r}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigError(name, f"error codes must be non-empty strings, got {item!r}")
    return items


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """A fleet-wide cap on retries of one operation type, kept in Redis.

    Over a sliding window of ``window_seconds``, every replica together may
    retry at most ``ratio * calls + min_retries`` times, where ``calls`` counts
    the operations started (first attempts) in the window. ``min_retries`` lets
    low traffic still retry; ``ratio`` bounds the extra load a fleet-wide
    outage can cause (0.2: at most 20 % more requests than the callers send).

    Replicas that disagree about these settings never grant more than the
    strictest in use would: the budget remembers each setting used on the
    operation type and applies every one used within its window
    (``durabilis/lua/retry_budget.lua``, docs/retry.md). A call counts for 90-100 % of
    the window, a retry for 100-110 %.

    Attributes:
        ratio: Retries allowed per call in the window (0 to 100).
        min_retries: Retries allowed per window whatever the traffic (0 to 1e6).
        window_seconds: Length of the sliding window (0.01 s to one hour).
    """

    ratio: float = 0.2
    min_retries: int = 10
    window_seconds: float = 10.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ``ConfigError`` naming the first invalid field."""
        # Upper bounds (durabilis._limits): a budget's settings bind every
        # replica of the operation type (the strictest seen applies).
        if _number("ratio", self.ratio) < 0:
            raise ConfigError("ratio", f"must be >= 0, got {self.ratio!r}")
        if isinstance(self.min_retries, bool) or not isinstance(self.min_retries, int) or (
            self.min_retries < 0
        ):
            raise ConfigError(
                "min_retries", f"must be an integer >= 0, got {self.min_retries!r}"
            )
        if _number("window_seconds", self.window_seconds) < 0.01:
            raise ConfigError(
                "window_seconds",
                f"must be at least 0.01 and at most {MAX_BUDGET_WINDOW_SECONDS} "
                f"(one hour), got {self.window_seconds!r}",
            )
        check_limits(self)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How one operation type is retried.

    Attributes:
        operation_type: The operation type this policy applies to (``"*"``: any
            type without a policy of its own).
        max_attempts: Attempts in total, the first included (1 to 100).
        initial_delay_ms: Delay after the first failed attempt (> 0).
        max_delay_ms: Cap of the exponential delay (>= ``initial_delay_ms``).
        multiplier: Growth factor per attempt (> 0).
        jitter: Add a uniform ``[0, 30 %)`` of the delay, so that replicas that
            failed together do not retry together.
        retryable_errors: Codes that are retried; empty means every code that is
            not in ``non_retryable_errors``.
        non_retryable_errors: Codes that stop at once (they win over the list above).
        retry_policy_id: Identifies this policy (version) in events; defaults to
            ``operation_type``.
        deadline_ms: Total time budget of one call, sleeps included: a retry
            whose delay would reach it is not made (the layer parks the
            operation in the DLQ). At most one day; ``None``: the default
            deadline, one hour (:data:`DEFAULT_DEADLINE_MS`): no policy retries
            for ever.
        budget: A fleet-wide :class:`RetryBudget` (needs an engine with a
            store); ``None``: retries are not budgeted and need no Redis.
    """

    operation_type: str
    max_attempts: int
    initial_delay_ms: float
    max_delay_ms: float
    multiplier: float = 2.0
    jitter: bool = True
    retryable_errors: tuple[str, ...] = ()
    non_retryable_errors: tuple[str, ...] = ()
    retry_policy_id: str | None = None
    deadline_ms: float | None = None
    budget: RetryBudget | None = None
    _retryable: frozenset[str] = field(init=False, repr=False, compare=False)
    _non_retryable: frozenset[str] = field(init=False, repr=False, compare=False)
    _deadline_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Lists are accepted for convenience; stored as tuples so the policy stays hashable.
        for name in ("retryable_errors", "non_retryable_errors"):
            value = getattr(self, name)
            if isinstance(value, Iterable) and not isinstance(value, (str, bytes, tuple)):
                object.__setattr__(self, name, tuple(value))
        if self.retry_policy_id is None and isinstance(self.operation_type, str) and (
            self.operation_type
        ):
            object.__setattr__(self, "retry_policy_id", self.operation_type)
        self.validate()
        object.__setattr__(self, "_retryable", frozenset(self.retryable_errors))
        object.__setattr__(self, "_non_retryable", frozenset(self.non_retryable_errors))
        deadline_ms = DEFAULT_DEADLINE_MS if self.deadline_ms is None else self.deadline_ms
        object.__setattr__(self, "_deadline_s", deadline_ms / 1000.0)

    def validate(self) -> None:
        """Check the policy; the seed's rules first, in the seed's order.

        Seed order: empty ``retry_policy_id``, ``max_attempts == 0``,
        ``multiplier <= 0``, ``initial_delay_ms == 0``, ``max_delay_ms <
        initial_delay_ms``. Then the fields the seed did not check.

        Raises:
            ConfigError: Naming the first invalid field.
        """
        # None only survives __post_init__ when operation_type is invalid (reported below).
        if self.retry_policy_id is not None and (
            not isinstance(self.retry_policy_id, str) or not self.retry_policy_id
        ):
            raise ConfigError("retry_policy_id", "must be a non-empty string")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or (
            self.max_attempts < 1
        ):
            raise ConfigError("max_attempts", f"must be an integer >= 1, got {self.max_attempts!r}")
        if _number("multiplier", self.multiplier) <= 0:
            raise ConfigError("multiplier", f"must be > 0, got {self.multiplier!r}")
        if _number("initial_delay_ms", self.initial_delay_ms) <= 0:
            raise ConfigError(
                "initial_delay_ms", f"must be > 0, got {self.initial_delay_ms!r}"
            )
        if _number("max_delay_ms", self.max_delay_ms) < self.initial_delay_ms:
            raise ConfigError(
                "max_delay_ms",
                f"must be >= initial_delay_ms ({self.initial_delay_ms!r}), "
                f"got {self.max_delay_ms!r}",
            )
        _check_bounds(self)
        if not isinstance(self.operation_type, str) or not self.operation_type:
            raise ConfigError("operation_type", "must be a non-empty string")
        try:
            self.operation_type.encode("utf-8")  # a budget's key is built from it
        except UnicodeEncodeError:
            raise ConfigError(
                "operation_type", "must be valid Unicode (no lone surrogates)"
            ) from None
        if self.retry_policy_id is None:
            raise ConfigError("retry_policy_id", "must be a non-empty string")
        if not isinstance(self.jitter, bool):
            raise ConfigError("jitter", f"must be a bool, got {self.jitter!r}")
        _codes("retryable_errors", self.retryable_errors)
        _codes("non_retryable_errors", self.non_retryable_errors)
        if self.deadline_ms is not None and _number("deadline_ms", self.deadline_ms) <= 0:
            raise ConfigError("deadline_ms", f"must be > 0 or None, got {self.deadline_ms!r}")

        if self.budget is not None:
            if not isinstance(self.budget, RetryBudget):
                raise ConfigError("budget", f"must be a RetryBudget or None, got {self.budget!r}")
            self.budget.validate()

    @property
    def deadline_seconds(self) -> float:
        """The deadline in force, in seconds: ``deadline_ms``, or the default
        deadline (one hour) when it is ``None`` (computed once, at construction)."""
        return self._deadline_s

    def is_retryable(self, code: str) -> bool:
        """Whether a failure with ``code`` may be retried under this policy.

        ``non_retryable_errors`` wins; an empty ``retryable_errors`` means every
        other code is retryable; otherwise only the listed codes are.
        """
        if code in self._non_retryable:
            return False
        return not self._retryable or code in self._retryable

    def delay_for_attempt(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based).

        ``min(initial_delay_ms · multiplier^attempt, max_delay_ms)``, plus with
        ``jitter`` a uniform ``[0, 30 %)`` of that. Exact without jitter;
        overflow-safe for huge attempts (the cap applies).

        Raises:
            ValueError: A negative attempt.
        """
        return backoff_delay(self, attempt)


def _check_bounds(policy: RetryPolicy) -> None:
    # Retrying holds the operation's claim (the keep-alive renews it): unbounded
    # attempts, delays or deadline would wedge the operation (re-deliveries
    # refused, nothing parked). Every maximum is in durabilis._limits.
    if policy.deadline_ms is not None:
        _number("deadline_ms", policy.deadline_ms)
    check_limits(policy)


def backoff_delay(
    policy: RetryPolicy, attempt: int, rng: Callable[[], float] = random.random
) -> float:
    """The backoff delay in seconds after failed attempt ``attempt`` (0-based).

    ``d = min(initial_delay_ms · multiplier^attempt, max_delay_ms)``; with
    jitter ``d + d · 0.3 · rng()`` (``rng()`` in ``[0, 1)``); divided by 1000.

    Raises:
        ValueError: A negative attempt.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    try:
        base = policy.initial_delay_ms * float(policy.multiplier) ** attempt
    except OverflowError:  # multiplier^attempt beyond float range: the cap applies
        base = policy.max_delay_ms
    base = min(base, policy.max_delay_ms)
    if policy.jitter:
        base += base * JITTER_SHARE * rng()
    return base / 1000.0


# --- decisions and outcomes --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """What to do after a failed attempt.

    Attributes:
        retry: Make another attempt after ``delay`` seconds.
        delay: Seconds to wait first (0.0 when stopping).
        attempt: The 0-based number of the attempt that failed.
        max_attempts: The policy's ``max_attempts`` (1 without a policy).
        error_code: The failure's classification code.
        stop_reason: Why no retry is made; ``None`` when ``retry``.
        retry_after: The error's ``retry_after`` hint in seconds, if it had one.
    """

    retry: bool
    delay: float
    attempt: int
    max_attempts: int
    error_code: str
    stop_reason: StopReason | None = None
    retry_after: float | None = None

    @property
    def attempts(self) -> int:
        """Attempts made so far (``attempt + 1``)."""
        return self.attempt + 1

    @property
    def sent_to_dlq(self) -> bool:
        """A stop that should park the operation in the DLQ: every stop but non-retryable."""
        return self.stop_reason is not None and self.stop_reason != NON_RETRYABLE

    def deny_budget(self) -> RetryDecision:
        """This planned retry, turned into a stop because the retry budget is spent."""
        return replace(self, retry=False, delay=0.0, stop_reason=RETRY_BUDGET_EXHAUSTED)

    def deny_deadline(self) -> RetryDecision:
        """This planned retry, turned into a stop because the round trips made
        after the decision (the budget's, the breaker's) took the time left."""
        return replace(self, retry=False, delay=0.0, stop_reason=DEADLINE_EXCEEDED)


@dataclass(frozen=True, slots=True)
class RetryOutcome(Generic[T]):
    """The result of running an operation under its retry policy.

    Attributes:
        success: An attempt succeeded.
        result: That attempt's return value (``None`` on failure).
        attempts: How many attempts ran.
        final_error: The error code of the last failure (``None`` on success).
        sent_to_dlq: The failure should be parked in the dead-letter queue:
            retries ran out (``EXHAUSTED``, ``DEADLINE_EXCEEDED``,
            ``RETRY_BUDGET_EXHAUSTED``). ``False`` for non-retryable errors.
        stop_reason: Why retrying stopped (``None`` on success).
        last_exception: The exception of the last failed attempt, to re-raise.
    """

    success: bool
    result: T | None
    attempts: int
    final_error: str | None = None
    sent_to_dlq: bool = False
    stop_reason: StopReason | None = None
    last_exception: BaseException | None = field(default=None, repr=False, compare=False)

    @classmethod
    def failed(cls, decision: RetryDecision, exc: BaseException) -> RetryOutcome[Any]:
        """The failure outcome of a loop stopped by ``decision`` (whose last error is ``exc``)."""
        return cls(
            False,
            None,
            decision.attempts,
            decision.error_code,
            decision.sent_to_dlq,
            decision.stop_reason,
            exc,
        )

    def unwrap(self) -> T:
        """The result on success; otherwise re-raise the last exception.

        Raises:
            BaseException: ``last_exception``, unchanged.
        """
        if self.success:
            return self.result  # type: ignore[return-value]
        if self.last_exception is None:  # only for hand-built outcomes
            raise RuntimeError(f"operation failed: {self.final_error} ({self.stop_reason})")
        raise self.last_exception


def _slot_setters() -> tuple[Callable[[object, object], None], ...]:
    slots = RetryOutcome.__dict__
    names = (
        "success", "result", "attempts", "final_error", "sent_to_dlq", "stop_reason",
        "last_exception",
    )
    return tuple(slots[name].__set__ for name in names)


_S = _slot_setters()


def succeeded(
    result: T,
    attempts: int,
    _new: Callable[[type[RetryOutcome[Any]]], RetryOutcome[Any]] = object.__new__,
    _s: tuple[Callable[[object, object], None], ...] = _S,
) -> RetryOutcome[T]:
    """``RetryOutcome(True, result, attempts)``, built for the hot path.

    A frozen dataclass's ``__init__`` goes through ``object.__setattr__`` once
    per field, which was two thirds of the engine's whole per-call overhead;
    this writes the slots directly (same object, same fields, ~2x faster).
    """
    outcome: RetryOutcome[T] = _new(RetryOutcome)
    _s[0](outcome, True)
    _s[1](outcome, result)
    _s[2](outcome, attempts)
    _s[3](outcome, None)
    _s[4](outcome, False)
    _s[5](outcome, None)
    _s[6](outcome, None)
    return outcome


# --- the testing switch (see durabilis.testing.instant_retries) -----------------------


class _Testing:
    """Process-wide switch for users' tests: no real sleeping, optionally fewer attempts.

    Loops skip the sleep when ``instant`` (but count the delay as elapsed, so
    deadlines decide exactly as they would in real time); :func:`decide` caps
    ``max_attempts`` at ``max_attempts`` when set.
    """

    __slots__ = ("instant", "max_attempts")

    def __init__(self) -> None:
        self.instant = False
        self.max_attempts: int | None = None


TESTING = _Testing()
