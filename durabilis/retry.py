"""Retry: redelivery attempts with exponential backoff, jitter and a fleet-wide budget.

The retry loop is ONE plan of steps in the I/O-free core
(:func:`durabilis.core.retry.retry_plan`: ``Run`` the operation, ``Sleep``
the backoff, the budget's script call); :class:`RetryEngine` and
:class:`AsyncRetryEngine` drive it (the same lines, with and without
``await``), classifying errors with :func:`error_code`
(:mod:`durabilis._retry_core`). Their drivers are their own, not
``durabilis._steps.drive``: the engines run ``fn`` on the caller's thread or
loop, sleep with the injected ``sleep`` and refuse a ``fn`` of the wrong kind,
and need none of the layer driver's signal gate, lease book or shielding. The
loop needs no Redis: only a policy with a :class:`RetryBudget` makes I/O, one
script call per decision:

- one ``retry_budget`` call ("call" mode) before the first attempt;
- one per planned retry ("retry" mode), which grants or refuses it.

Events (logger ``"durabilis"``, docs/production.md), none on success:
``durability_retry_attempt`` (a retry is scheduled) and
``durability_retry_exhausted`` / ``durability_retry_non_retryable`` (the loop stops),
emitted by :mod:`durabilis._retry_events`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import random
import sys
import time
import types
import warnings
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar, cast

from durabilis._cancel import cancels as _cancels
from durabilis._cancel import resurface as _resurface
from durabilis._limits import MAX_RETRY_DEADLINE_MS
from durabilis._retry_core import (
    DEADLINE_EXCEEDED,
    EXHAUSTED,
    NON_RETRYABLE,
    RETRY_BUDGET_EXHAUSTED,
    TESTING,
    RetryBudget,
    RetryDecision,
    RetryOutcome,
    RetryPolicy,
    StopReason,
    backoff_delay,
    decide,
    error_code,
    register_error_code,
    retry_after_of,
)
from durabilis._retry_events import (  # (re-exported: the layer imports them from here)
    emit_retry_attempt as emit_retry_attempt,  # noqa: PLC0414
)
from durabilis._retry_events import (
    emit_retry_stop as emit_retry_stop,  # noqa: PLC0414
)
from durabilis._store import AsyncStore, Store
from durabilis.core.retry import BudgetOps, BudgetState, retry_plan, succeeded
from durabilis.core.retry.defaults import default_policies, gateway_policies
from durabilis.core.steps import Plan, Run, Sleep
from durabilis.errors import ConfigError
from durabilis.events import error_text

__all__ = [
    "DEADLINE_EXCEEDED",
    "EXHAUSTED",
    "NON_RETRYABLE",
    "RETRY_BUDGET_EXHAUSTED",
    "AsyncRetryEngine",
    "BudgetState",
    "RetryBudget",
    "RetryDecision",
    "RetryEngine",
    "RetryOutcome",
    "RetryPolicy",
    "StopReason",
    "backoff_delay",
    "decide",
    "default_policies",
    "error_code",
    "gateway_policies",
    "register_error_code",
    "retry",
    "retry_after_of",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
_E = TypeVar("_E", bound="_EngineBase")


# --- the shipped policies (default_policies, gateway_policies) and the budget's calls ------
# live in the core (durabilis.core.retry): imported above, re-exported here.


# --- the engines -------------------------------------------------------------------------


def _deadline(deadline_seconds: float | None) -> None:
    if deadline_seconds is not None and (
        isinstance(deadline_seconds, bool)
        or not isinstance(deadline_seconds, (int, float))
        or not 0 < deadline_seconds <= MAX_RETRY_DEADLINE_MS / 1000
    ):
        raise ConfigError(
            "deadline_seconds",
            f"must be a positive number of seconds, at most {MAX_RETRY_DEADLINE_MS // 1000} "
            f"(one day), or None, got {deadline_seconds!r}",
        )


class _EngineBase:
    """What both twins share: the policy table, validation and the budget ops."""

    @classmethod
    def empty(cls: type[_E], store: Store | AsyncStore | None = None, **options: Any) -> _E:
        """An engine with no policies (every operation type gets one attempt)."""
        return cls(store, policies=(), **options)

    def __init__(
        self,
        store: Store | AsyncStore | None,
        policies: Iterable[RetryPolicy] | None,
        clock: Callable[[], float] | None,
        rng: Callable[[], float] | None,
    ) -> None:
        self.store = store
        self._ops = None if store is None else BudgetOps(store.keys)
        self._clock = clock or time.monotonic
        self._rng = rng or random.random
        self._policies: dict[str, RetryPolicy] = {}
        for policy in default_policies() if policies is None else policies:
            self.upsert_policy(policy)

    def upsert_policy(self, policy: RetryPolicy) -> None:
        """Add or replace the policy of ``policy.operation_type`` (hot reload).

        Raises:
            ConfigError: An invalid policy, or one with a budget on an engine
                without a store.
        """
        if not isinstance(policy, RetryPolicy):
            raise ConfigError("policy", f"must be a RetryPolicy, got {policy!r}")
        policy.validate()
        if policy.budget is not None and self.store is None:
            raise ConfigError(
                "budget",
                f"the policy of {policy.operation_type!r} has a retry budget, which is kept "
                "in Redis: give the engine a store",
            )
        self._policies[policy.operation_type] = policy

    def get_policy(self, operation_type: str) -> RetryPolicy | None:
        """The policy of ``operation_type``: its own, else ``"*"``, else ``None``."""
        policy = self._policies.get(operation_type)
        return policy if policy is not None else self._policies.get("*")

    @property
    def policies(self) -> dict[str, RetryPolicy]:
        """A copy of the policy table, by operation type."""
        return dict(self._policies)

    @staticmethod
    def _check(operation_type: str, fn: object, deadline_seconds: float | None) -> None:
        if not isinstance(operation_type, str) or not operation_type:
            raise ConfigError(
                "operation_type", f"must be a non-empty string, got {operation_type!r}"
            )
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        _deadline(deadline_seconds)

    def _begin(
        self, operation_type: str, deadline: float | None
    ) -> tuple[RetryPolicy | None, float | None, float]:
        """The call's policy, deadline and start (before its budget's round trip:
        the deadline counts from the call)."""
        policy = self._policies.get(operation_type) or self._policies.get("*")
        if policy is not None and deadline is None:
            deadline = policy.deadline_seconds
        return policy, deadline, self._clock() if deadline is not None else 0.0

    def _plan(
        self,
        operation_type: str,
        policy: RetryPolicy | None,
        call: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]],
        *,
        start: float,
        deadline: float | None,
        failed: Exception | None,
    ) -> Plan[RetryOutcome[Any]]:
        """THE retry plan (:func:`durabilis.core.retry.retry_plan`) of one call;
        ``failed``: its first attempt already ran and raised this."""
        return retry_plan(
            operation_type,
            policy,
            Run(_apply, call),
            classify=error_code,
            clock=self._clock,
            start=start,
            deadline=deadline,
            rng=self._rng,
            budget_ops=self._ops,
            on_retry=functools.partial(emit_retry_attempt, operation_type),
            on_stop=functools.partial(_stopped, operation_type),
            failed=failed,
        )


def _lean(policy: RetryPolicy | None) -> bool:
    """Whether a call's first attempt may run before any step (no budget:
    nothing to ask Redis first); the engines run it straight-line."""
    return policy is None or policy.budget is None


def _stopped(operation_type: str, decision: RetryDecision, exc: Exception) -> None:
    emit_retry_stop(operation_type, decision, last_error=error_text(exc))


def _apply(call: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]) -> Any:
    fn, args, kwargs = call
    return fn(*args, **kwargs)


def _attempt(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[bool, Any]:
    """One attempt of a sync ``fn``: ``(True, result)`` or ``(False, exception)``."""
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # the failure is the plan's to judge
        return False, exc
    if inspect.iscoroutine(result):
        result.close()  # never started: nothing of it ran
        raise TypeError(
            "fn returned a coroutine, which RetryEngine does not await: "
            "use AsyncRetryEngine for a coroutine function"
        )
    return True, result


async def _aattempt(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[bool, Any]:
    """One attempt of an async ``fn``: ``(True, result)`` or ``(False, exception)``.

    A cancellation of the caller's task that ``fn`` turned into a result or an
    error (a client mapping it to its own error; redis-py's ``wait_for`` loses
    one on Python 3.11) is raised here, as if it came just after ``fn``: the
    caller asked to stop, so no other attempt is made (``asyncio.timeout`` then
    fires as it should).
    """
    before = _cancels()
    try:
        pending = fn(*args, **kwargs)
        awaitable = inspect.isawaitable(pending)
        result = (await pending) if awaitable else pending
    except Exception as exc:  # the failure is the plan's to judge
        if _cancels() > before:
            raise asyncio.CancelledError from exc
        return False, exc
    _resurface(before)
    if not awaitable:
        # fn ran (a plain function): its effect happened once; never again.
        raise TypeError(
            f"fn returned {type(result).__name__}, not an awaitable: "
            "AsyncRetryEngine awaits what fn returns; use RetryEngine for a plain function"
        )
    return True, result


class RetryEngine(_EngineBase):
    """Runs operations under per-operation-type retry policies (synchronous).

    Args:
        store: Needed only by policies with a :class:`RetryBudget`.
        policies: The policy table; the seed's five when omitted
            (:meth:`empty` for none).
        sleep: How to wait (``time.sleep``); tests inject their own.
        clock: Monotonic seconds for deadlines (``time.monotonic``).
        rng: Jitter source in ``[0, 1)`` (``random.random``).

    Raises:
        ConfigError: An invalid policy, or a budget without a store.
        TypeError: An :class:`~durabilis.aio.Store` (use :class:`AsyncRetryEngine`).
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        policies: Iterable[RetryPolicy] | None = None,
        sleep: Callable[[float], object] | None = None,
        clock: Callable[[], float] | None = None,
        rng: Callable[[], float] | None = None,
    ) -> None:
        if isinstance(store, AsyncStore):
            raise TypeError(
                "RetryEngine needs a sync Store; use AsyncRetryEngine with an AsyncStore"
            )
        super().__init__(store, policies, clock, rng)
        self.store: Store | None = store
        self._sleep = sleep or time.sleep

    def execute(
        self,
        operation_type: str,
        fn: Callable[[], T],
        *,
        deadline_seconds: float | None = None,
    ) -> RetryOutcome[T]:
        """Run ``fn()`` under the policy of ``operation_type``.

        Args:
            operation_type: Selects the policy (exact, then ``"*"``; none: one attempt).
            fn: The operation, called with no arguments.
            deadline_seconds: Total time for this call, overriding the policy's
                ``deadline_ms``; a retry whose delay would reach it is not made.

        Returns:
            A :class:`RetryOutcome`; failures are reported in it, not raised.

        Raises:
            ConfigError: A bad ``operation_type`` (one that cannot name a ``"*"``
                policy's budget key too) or ``deadline_seconds`` (before ``fn`` runs).
            TypeError: ``fn`` is not callable, or returned a coroutine (an async
                ``fn``: use :class:`AsyncRetryEngine`; the coroutine is closed
                unstarted, never retried).
            StorageUnavailable: Only with a budget: its Redis is unreachable.
            CorruptData: Only with a budget: foreign data at its key.
        """
        if deadline_seconds is not None or type(operation_type) is not str or not (
            operation_type and callable(fn)
        ):
            self._check(operation_type, fn, deadline_seconds)  # raises on bad input
        return self._run(operation_type, fn, (), {}, deadline_seconds)

    def _run(
        self,
        operation_type: str,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        deadline: float | None,
    ) -> RetryOutcome[T]:
        policy, deadline, start = self._begin(operation_type, deadline)
        failed = None
        if _lean(policy):
            # The lean path: no I/O comes first, so the first attempt runs
            # straight-line; the plan takes over at its failure.
            ok, value = _attempt(fn, args, kwargs)
            if ok:
                return succeeded(value, 1)
            failed = value
        return self._drive(self._plan(
            operation_type, policy, (fn, args, kwargs),
            start=start, deadline=deadline, failed=failed,
        ))

    def _drive(self, plan: Plan[RetryOutcome[T]]) -> RetryOutcome[T]:
        """Runs ``plan``'s steps (:meth:`AsyncRetryEngine._adrive` awaits them)."""
        reply: Any = None
        try:
            while True:
                step = plan.send(reply)
                if type(step) is Run:
                    reply = _attempt(*step.arg)
                elif type(step) is Sleep:
                    if not TESTING.instant:
                        self._sleep(step.seconds)
                    reply = None
                else:  # the budget's ScriptCall (upsert_policy ensured a store)
                    assert self.store is not None
                    reply = self.store.run(step)
        except StopIteration as stop:
            outcome: RetryOutcome[T] = stop.value
            return outcome


class AsyncRetryEngine(_EngineBase):
    """The asyncio twin of :class:`RetryEngine` (``execute`` is a coroutine).

    Args:
        store: An :class:`~durabilis.aio.Store`, needed only by budgeted policies.
        policies: As :class:`RetryEngine`.
        sleep: An async sleep (``asyncio.sleep``).
        clock: As :class:`RetryEngine`.
        rng: As :class:`RetryEngine`.
    """

    def __init__(
        self,
        store: AsyncStore | None = None,
        *,
        policies: Iterable[RetryPolicy] | None = None,
        sleep: Callable[[float], Awaitable[object]] | None = None,
        clock: Callable[[], float] | None = None,
        rng: Callable[[], float] | None = None,
    ) -> None:
        if isinstance(store, Store):
            raise TypeError("AsyncRetryEngine needs an AsyncStore; use RetryEngine with a Store")
        super().__init__(store, policies, clock, rng)
        self.store: AsyncStore | None = store
        self._sleep = sleep or asyncio.sleep

    async def execute(
        self,
        operation_type: str,
        fn: Callable[[], Awaitable[T]],
        *,
        deadline_seconds: float | None = None,
    ) -> RetryOutcome[T]:
        """See :meth:`RetryEngine.execute`; ``fn()`` returns an awaitable.

        Raises:
            TypeError: As :meth:`RetryEngine.execute`, and when ``fn()`` returned
                something not awaitable (a plain function: it ran once, and is
                never retried for this).
        """
        if deadline_seconds is not None or type(operation_type) is not str or not (
            operation_type and callable(fn)
        ):
            self._check(operation_type, fn, deadline_seconds)  # raises on bad input
        return await self._run(operation_type, fn, (), {}, deadline_seconds)

    async def _run(  # (RetryEngine._run, its awaits)
        self, operation_type: str, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...],
        kwargs: dict[str, Any], deadline: float | None,
    ) -> RetryOutcome[T]:
        policy, deadline, start = self._begin(operation_type, deadline)
        failed = None
        if _lean(policy):
            ok, value = await _aattempt(fn, args, kwargs)  # the lean path (see RetryEngine._run)
            if ok:
                return succeeded(value, 1)
            failed = value
        return await self._adrive(self._plan(
            operation_type, policy, (fn, args, kwargs),
            start=start, deadline=deadline, failed=failed,
        ))

    async def _adrive(self, plan: Plan[RetryOutcome[T]]) -> RetryOutcome[T]:
        """Awaits ``plan``'s steps (see :meth:`RetryEngine._drive`)."""
        reply: Any = None
        try:
            while True:
                step = plan.send(reply)
                if type(step) is Run:
                    reply = await _aattempt(*step.arg)
                elif type(step) is Sleep:
                    if not TESTING.instant:
                        await self._sleep(step.seconds)
                    reply = None
                else:  # the budget's ScriptCall (upsert_policy ensured a store)
                    assert self.store is not None
                    reply = await self.store.run(step)
        except StopIteration as stop:
            outcome: RetryOutcome[T] = stop.value
            return outcome


# --- the decorator -----------------------------------------------------------------------

_default_sync: RetryEngine | None = None
_default_async: AsyncRetryEngine | None = None


def _default_engine(is_async: bool) -> RetryEngine | AsyncRetryEngine:
    global _default_sync, _default_async  # noqa: PLW0603  (lazy process-wide defaults)
    if is_async:
        if _default_async is None:
            _default_async = AsyncRetryEngine()
        return _default_async
    if _default_sync is None:
        _default_sync = RetryEngine()
    return _default_sync


def _name(fn: Callable[..., Any]) -> str:
    """What to call ``fn`` in an error: its ``__qualname__``, else (a
    ``functools.partial``, a callable object) its ``repr``."""
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else repr(fn)


def retry(
    operation_type: str,
    *,
    engine: RetryEngine | AsyncRetryEngine | None = None,
    deadline_seconds: float | None = None,
) -> Callable[[F], F]:
    """Decorate a function (sync or ``async def``) to run under a retry policy.

    The decorated function returns the result, or raises the last attempt's
    exception unchanged (so ``except`` clauses keep working); use
    ``engine.execute`` to get the full :class:`RetryOutcome` instead.

    Args:
        operation_type: Selects the policy.
        engine: A :class:`RetryEngine` for sync functions or an
            :class:`AsyncRetryEngine` for coroutine functions; default: a
            process-wide engine with the seed's policies.
        deadline_seconds: Total time per call (overrides the policy's).

    Raises:
        ConfigError: Bad ``operation_type`` or ``deadline_seconds``.
        TypeError: An engine of the wrong kind for the function.
    """
    if not isinstance(operation_type, str) or not operation_type:
        raise ConfigError("operation_type", f"must be a non-empty string, got {operation_type!r}")
    _deadline(deadline_seconds)

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            if engine is not None and not isinstance(engine, AsyncRetryEngine):
                raise TypeError(f"{_name(fn)} is async: decorate it with an AsyncRetryEngine")

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                eng = cast(AsyncRetryEngine, engine or _default_engine(True))
                outcome = await eng._run(operation_type, fn, args, kwargs, deadline_seconds)
                return outcome.unwrap()

            return cast(F, run_async)
        if engine is not None and not isinstance(engine, RetryEngine):
            raise TypeError(f"{_name(fn)} is not async: decorate it with a RetryEngine")

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            eng = cast(RetryEngine, engine or _default_engine(False))
            return eng._run(operation_type, fn, args, kwargs, deadline_seconds).unwrap()

        return cast(F, run)

    return decorate


class _CallableModule(types.ModuleType):
    """This module, callable as the decorator it shadowed in durabilis 0.1.

    0.1 exported :func:`retry` from the front door, where it hid this module
    (``durabilis.retry`` was the function). Now ``durabilis.retry`` is the
    module; ``from durabilis import retry`` then ``@retry("mcp_call")`` keeps
    working for one release, with a ``DeprecationWarning``. Remove with the
    other moved names (``durabilis._MOVED``).
    """

    def __call__(
        self,
        operation_type: str,
        *,
        engine: RetryEngine | AsyncRetryEngine | None = None,
        deadline_seconds: float | None = None,
    ) -> Callable[[F], F]:
        warnings.warn(
            "durabilis.retry is deprecated as the decorator (it is the module): use "
            "`from durabilis.retry import retry`",
            DeprecationWarning,
            stacklevel=2,
        )
        return retry(operation_type, engine=engine, deadline_seconds=deadline_seconds)


sys.modules[__name__].__class__ = _CallableModule
