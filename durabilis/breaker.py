"""Circuit breaker shared by the whole fleet: one failing route closes for everyone.

Each dependency has one breaker whose state lives in Redis, so every replica
process sees the same CLOSED / OPEN / HALF_OPEN state, the same sliding window
of results (a sorted set) and the same probe slots. ``before_call`` and
``after_call`` are ONE Lua script each (one round trip each), with the
breaker's config sent along as arguments, so :meth:`upsert_config` applies at
the very next call.

Beyond the seed: permits carry their state generation and probe id (late or
stale reports never pollute the current window nor credit a newer probe), a
time-based window option, a slow-call rule, ``min_distinct_reporters`` (one
replica with a broken network cannot open the breaker for everyone), and an
events stream per breaker recording every transition.

The pure part (types, script calls, decoders, the registry's book and plans)
is :mod:`durabilis.core.breaker`; the classes here are its I/O shells: each
method builds a plan, drives it (``drive`` / ``adrive``) and returns what the
plan decoded.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from time import monotonic, perf_counter
from typing import Any, Generic, ParamSpec, TypeVar

from durabilis._fork import reset_in_child
from durabilis._log import get_logger
from durabilis._steps import adrive, drive
from durabilis._store import AsyncStore, Store

# (the old private names stay importable from here: tests and benchmarks use them)
from durabilis.core.breaker.ops import BreakerEntry as _Entry  # noqa: F401
from durabilis.core.breaker.ops import BreakerOps as _BreakerOps  # noqa: F401
from durabilis.core.breaker.ops import admission, outcome_code  # noqa: F401
from durabilis.core.breaker.ops import check_probe_id as _check_probe_id  # noqa: F401
from durabilis.core.breaker.plans import DEFAULT_CACHED_ADMISSION_SECONDS, BreakerBook
from durabilis.core.breaker.types import *  # noqa: F403  (the types, re-exported)
from durabilis.core.breaker.types import (
    BreakerInfo,
    BreakerState,
    CircuitBreakerConfig,
    Permit,
    StateTransition,
)
from durabilis.core.breaker.types import __all__ as _TYPES

__all__ = [  # noqa: PLE0604
    *_TYPES,
    "AsyncBreakerGuard",
    "AsyncCircuitBreakerRegistry",
    "BreakerGuard",
    "CircuitBreakerRegistry",
]

_log = get_logger()

P = ParamSpec("P")
R = TypeVar("R")


def _clock() -> float:
    # Looked up at each call, so a test may replace this module's ``monotonic``.
    return monotonic()


S = TypeVar("S", Store, AsyncStore)


class _RegistryCore(BreakerBook, Generic[S]):
    """What both twins share beyond the core's book: the store, a real lock
    (reset in a forked child), the clock and the logger. No I/O here."""

    def __init__(
        self,
        store: S,
        configs: Iterable[CircuitBreakerConfig] | None = None,
        *,
        replica_id: str | None = None,
        events_maxlen: int = 1000,
        cached_admission_seconds: float = DEFAULT_CACHED_ADMISSION_SECONDS,
    ) -> None:
        super().__init__(
            store.keys, configs, replica_id, events_maxlen, cached_admission_seconds,
            lock=threading.Lock(), clock=_clock, log=_log,
        )
        self.store: S = store
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """A forked child confirms the breakers itself (a fresh lock too: another
        thread of the parent may have held it at fork)."""
        self.clear_cache(threading.Lock())


class CircuitBreakerRegistry(_RegistryCore[Store]):
    """Every dependency's breaker, shared through Redis by every process.

    Args:
        store: From :func:`durabilis.connect`.
        configs: The breakers; the seed's three defaults when omitted (``()`` for none).
        replica_id: Identifies this process in reports (``min_distinct_reporters``)
            and in the events stream; ``host:pid:random`` by default.
        events_maxlen: Approximate cap of each breaker's events stream.
        cached_admission_seconds: A CLOSED breaker that Redis confirmed (an
            admission, or a report counted in the same CLOSED generation) less
            than this long ago admits the next call without a round trip. After
            another replica trips it, this process admits at most one call per
            caller in flight (each one's report finds the new generation), and
            none once this long has passed without a report. HALF_OPEN probes
            always ask Redis. 0: ask before every call.

    Raises:
        ConfigError: An invalid config, replica id, cap or cache time.
    """

    def before_call(self, name: str) -> Permit:
        """Ask to call ``name``'s dependency (one round trip).

        Returns:
            The :class:`Permit` to pass to :meth:`after_call`.

        Raises:
            CircuitOpen: Rejected; ``retry_after`` says for how long at most.
            DependencyNotFound: No config for ``name`` (before any I/O).
            StorageUnavailable: Redis down. CorruptData: Foreign data at a breaker key.
        """
        return drive(self.before_call_plan(name), self.store)

    def after_call(
        self,
        name: str,
        success: bool,
        permit: Permit | None = None,
        duration_ms: float | None = None,
    ) -> bool:
        """Report the outcome of an admitted call (one round trip).

        Args:
            name: The dependency.
            success: Whether the call succeeded.
            permit: From :meth:`before_call`. Without it (the seed's API) a
                CLOSED report enters the window and a HALF_OPEN one credits the
                oldest probe in flight.
            duration_ms: How long the call took, for the slow-call rule.

        Returns:
            ``True`` if the report counted; ``False`` if it was ignored (a stray
            with no live probe, or a permit from an earlier generation).

        Raises:
            DependencyNotFound, StorageUnavailable, CorruptData.
        """
        return drive(self.after_call_plan(name, success, permit, duration_ms), self.store)

    def release(self, name: str, permit: Permit) -> bool:
        """Give a probe slot back without a result (the call was cancelled).

        Returns:
            ``True`` if a live probe slot was freed.
        """
        return drive(self.release_plan(name, permit), self.store)

    def call(self, name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` through ``name``'s breaker.

        An ``Exception`` counts as a failure and is re-raised; a call slower
        than ``slow_call_duration_ms`` is slow. A report that cannot reach Redis
        is logged (``durability_breaker_report_failed``), not raised: the
        call's own outcome is what the caller gets.

        Raises:
            CircuitOpen: Rejected; ``fn`` did not run.
        """
        with self.guard(name):
            return fn(*args, **kwargs)

    def _finish(
        self, name: str, permit: Permit, exc_type: type[BaseException] | None, start: float
    ) -> None:
        took_ms = (perf_counter() - start) * 1000.0
        drive(self.finish_plan(name, permit, exc_type, took_ms), self.store)

    def guard(self, name: str) -> BreakerGuard:
        """``with registry.guard(name):`` or ``@registry.guard(name)``.

        Raises (on entry): CircuitOpen, DependencyNotFound.
        """
        self._ops.entry(name)
        return BreakerGuard(self, name)

    def state(self, name: str) -> BreakerState:
        """The stored state (an OPEN breaker past its reset timeout is still OPEN)."""
        return drive(self.state_plan(name), self.store)

    def state_info(self, name: str) -> BreakerInfo:
        """The stored state plus what a call would get now (one round trip)."""
        return drive(self.state_info_plan(name), self.store)

    def all_states(self) -> dict[str, BreakerState]:
        """The state of every configured breaker (one round trip)."""
        names, calls = self.read_calls()
        return self.decode_states(names, self.store.run_many(calls) if calls else [])

    def force_open(self, name: str) -> None:
        """Open the breaker now (reset timer restarted, probes in flight dropped)."""
        drive(self.force_plan(name, "open"), self.store)

    def force_close(self, name: str) -> None:
        """Close the breaker and reset everything (window, probes, reporters)."""
        drive(self.force_plan(name, "close"), self.store)

    def transitions(self, name: str, limit: int = 100) -> list[StateTransition]:
        """The newest ``limit`` transitions of ``name`` from its events stream, oldest first.

        Every replica's transitions are there (``replica_id`` says whose).
        """
        return drive(self.transitions_plan(name, limit), self.store)

    def stored_names(self, limit: int | None = None) -> set[str]:
        """Every breaker name any process of this namespace has used (with
        ``limit``: at most that many, read with a bounded ``SSCAN``)."""
        return drive(self.stored_names_plan(limit), self.store)

    def is_stored(self, name: str) -> bool:
        """Whether any process of this namespace has used ``name``."""
        return drive(self.is_stored_plan(name), self.store)


class AsyncCircuitBreakerRegistry(_RegistryCore[AsyncStore]):
    """The asyncio twin of :class:`CircuitBreakerRegistry` (same methods, awaited).

    ``upsert_config``, ``get_config``, ``names`` and ``on_transition`` are plain
    methods (no I/O); callbacks are plain functions.
    """

    async def before_call(self, name: str) -> Permit:
        """See :meth:`CircuitBreakerRegistry.before_call`."""
        return await adrive(self.before_call_plan(name), self.store)

    async def after_call(
        self, name: str, success: bool, permit: Permit | None = None,
        duration_ms: float | None = None,
    ) -> bool:
        """See :meth:`CircuitBreakerRegistry.after_call`."""
        return await adrive(self.after_call_plan(name, success, permit, duration_ms), self.store)

    async def release(self, name: str, permit: Permit) -> bool:
        """See :meth:`CircuitBreakerRegistry.release`."""
        return await adrive(self.release_plan(name, permit), self.store)

    async def call(
        self,
        name: str,
        fn: Callable[P, Awaitable[R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """See :meth:`CircuitBreakerRegistry.call` (``fn`` returns an awaitable).

        A cancelled call (``CancelledError``) frees its probe slot without a result.
        """
        async with self.guard(name):
            return await fn(*args, **kwargs)

    async def _finish(
        self, name: str, permit: Permit, exc_type: type[BaseException] | None, start: float
    ) -> None:
        took_ms = (perf_counter() - start) * 1000.0
        await adrive(self.finish_plan(name, permit, exc_type, took_ms), self.store)

    def guard(self, name: str) -> AsyncBreakerGuard:
        """``async with registry.guard(name):`` or ``@registry.guard(name)`` on ``async def``."""
        self._ops.entry(name)
        return AsyncBreakerGuard(self, name)

    async def state(self, name: str) -> BreakerState:
        """See :meth:`CircuitBreakerRegistry.state`."""
        return await adrive(self.state_plan(name), self.store)

    async def state_info(self, name: str) -> BreakerInfo:
        """See :meth:`CircuitBreakerRegistry.state_info`."""
        return await adrive(self.state_info_plan(name), self.store)

    async def all_states(self) -> dict[str, BreakerState]:
        """See :meth:`CircuitBreakerRegistry.all_states`."""
        names, calls = self.read_calls()
        return self.decode_states(names, await self.store.run_many(calls) if calls else [])

    async def force_open(self, name: str) -> None:
        """See :meth:`CircuitBreakerRegistry.force_open`."""
        await adrive(self.force_plan(name, "open"), self.store)

    async def force_close(self, name: str) -> None:
        """See :meth:`CircuitBreakerRegistry.force_close`."""
        await adrive(self.force_plan(name, "close"), self.store)

    async def transitions(self, name: str, limit: int = 100) -> list[StateTransition]:
        """See :meth:`CircuitBreakerRegistry.transitions`."""
        return await adrive(self.transitions_plan(name, limit), self.store)

    async def stored_names(self, limit: int | None = None) -> set[str]:
        """See :meth:`CircuitBreakerRegistry.stored_names`."""
        return await adrive(self.stored_names_plan(limit), self.store)

    async def is_stored(self, name: str) -> bool:
        """See :meth:`CircuitBreakerRegistry.is_stored`."""
        return await adrive(self.is_stored_plan(name), self.store)


# --- guards: context managers that are decorators too -------------------------


@dataclass(slots=True)
class BreakerGuard:
    """``with registry.guard(name):`` runs the block through the breaker.

    Entering asks for a permit (``CircuitOpen`` if rejected, the block does not
    run); leaving reports success, failure (an ``Exception``) or, for a
    cancelled/interrupted block, frees the probe slot. Report failures are
    logged, not raised. One guard object serves one ``with`` at a time; as a
    decorator (``@registry.guard(name)``) it is reusable and thread-safe.
    """

    registry: CircuitBreakerRegistry
    name: str
    permit: Permit | None = field(default=None, init=False)
    _start: float = field(default=0.0, init=False, repr=False)

    def __enter__(self) -> Permit:
        self.permit = self.registry.before_call(self.name)
        self._start = perf_counter()
        return self.permit

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        permit, self.permit = self.permit, None
        if permit is not None:
            self.registry._finish(self.name, permit, exc_type, self._start)

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        registry, name = self.registry, self.name

        @functools.wraps(fn)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            return registry.call(name, fn, *args, **kwargs)

        return guarded


@dataclass(slots=True)
class AsyncBreakerGuard:
    """``async with registry.guard(name):`` or ``@registry.guard(name)`` (see BreakerGuard)."""

    registry: AsyncCircuitBreakerRegistry
    name: str
    permit: Permit | None = field(default=None, init=False)
    _start: float = field(default=0.0, init=False, repr=False)

    async def __aenter__(self) -> Permit:
        self.permit = await self.registry.before_call(self.name)
        self._start = perf_counter()
        return self.permit

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        permit, self.permit = self.permit, None
        if permit is not None:
            await self.registry._finish(self.name, permit, exc_type, self._start)

    def __call__(
        self, fn: Callable[P, Awaitable[R]]
    ) -> Callable[P, Coroutine[Any, Any, R]]:
        registry, name = self.registry, self.name

        @functools.wraps(fn)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            return await registry.call(name, fn, *args, **kwargs)

        return guarded
