"""The circuit breaker's book (configs, cached admission, callbacks) and its plans (no I/O).

:class:`BreakerBook` is everything a registry knows without asking Redis; its
``*_plan`` methods are the registry's operations as plans (generators of
steps, :mod:`durabilis.core.steps`), which the sync registry runs with
``drive`` and the async one with ``adrive``. The composed layer pipelines the
builders of :class:`~durabilis.core.breaker.ops.BreakerOps` with other pillars'
scripts and hands the replies to :meth:`BreakerBook.admit` /
:meth:`BreakerBook.reported`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext, suppress
from typing import Any

from durabilis._scripts import ScriptCall
from durabilis.core.breaker.ops import BreakerOps, outcome_code
from durabilis.core.breaker.types import (
    DEFAULT_BREAKER_CONFIGS,
    MAX_COUNT,
    BreakerInfo,
    BreakerState,
    CircuitBreakerConfig,
    Permit,
    StateTransition,
    TransitionCallback,
    default_replica_id,
    valid_text,
)
from durabilis.core.steps import Command, Log, Plan, SilentLog
from durabilis.errors import CircuitOpen, ConfigError, DurabilisError

DEFAULT_CACHED_ADMISSION_SECONDS = 1.0
"""How long a CLOSED breaker's admission, confirmed by Redis, is reused without
asking (``cached_admission_seconds``; 0 asks Redis before every call)."""
MAX_CACHED_ADMISSION_SECONDS = 60.0
SCAN_ROUNDS = 10
"""Most ``SSCAN`` round trips one bounded :meth:`BreakerBook.stored_names_plan` makes."""


class BreakerBook:
    """What both registries share: configs, callbacks, the admission cache and
    the plans of every operation. No I/O here.

    Args:
        keys: The namespace's key space.
        configs: The breakers; the seed's three when ``None``.
        replica_id: This process in reports; ``host:pid:random`` when ``None``.
        events_maxlen: Approximate cap of each breaker's events stream.
        cached_admission_seconds: See ``CircuitBreakerRegistry``.
        lock: Guards the admission cache (threads confirm and end it at once);
            the shells hand in a ``threading.Lock``.
        clock: Monotonic seconds.
        log: Where transitions and warnings are logged.

    Raises:
        ConfigError: An invalid config, replica id, cap or cache time.
    """

    def __init__(
        self,
        keys: Any,
        configs: Iterable[CircuitBreakerConfig] | None,
        replica_id: str | None,
        events_maxlen: int,
        cached_admission_seconds: float = DEFAULT_CACHED_ADMISSION_SECONDS,
        *,
        lock: AbstractContextManager[Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: Log | None = None,
    ) -> None:
        if replica_id is not None and (not isinstance(replica_id, str) or not replica_id):
            raise ConfigError("replica_id", "must be a non-empty string")
        if replica_id is not None:
            valid_text("replica_id", replica_id)
        if not isinstance(events_maxlen, int) or isinstance(events_maxlen, bool) or not (
            1 <= events_maxlen <= MAX_COUNT
        ):
            raise ConfigError(
                "events_maxlen", f"must be an integer in [1, 1e9], got {events_maxlen!r}"
            )
        self.replica_id = replica_id or default_replica_id()
        self._clock = clock
        self._log: Log = log if log is not None else SilentLog()
        self._ops = BreakerOps(keys, self.replica_id, events_maxlen, clock)
        for config in DEFAULT_BREAKER_CONFIGS if configs is None else configs:
            self._ops.upsert(config)
        self._callbacks: list[TransitionCallback] = []
        self._registered: set[str] = set()
        if (
            isinstance(cached_admission_seconds, bool)
            or not isinstance(cached_admission_seconds, (int, float))
            or not 0 <= cached_admission_seconds <= MAX_CACHED_ADMISSION_SECONDS
        ):
            raise ConfigError(
                "cached_admission_seconds",
                f"must be a number of seconds in [0, {MAX_CACHED_ADMISSION_SECONDS}], "
                f"got {cached_admission_seconds!r}",
            )
        self._cache_s = float(cached_admission_seconds)
        # name -> (a CLOSED permit, when Redis last confirmed it: monotonic)
        self._closed: dict[str, tuple[Permit, float]] = {}
        self._cache_lock: AbstractContextManager[Any] = lock if lock is not None else nullcontext()
        # name -> the newest generation this process knows to be over: a
        # confirmation of it arriving late (another caller's reply) is no news.
        self._over: dict[str, int] = {}

    def clear_cache(self, lock: AbstractContextManager[Any] | None = None) -> None:
        """Forget every confirmation (a forked child confirms the breakers itself);
        ``lock``: a fresh lock (the parent's may have been held at fork)."""
        if lock is not None:
            self._cache_lock = lock
        self._closed = {}
        self._over = {}

    # -- cached admission: a CLOSED breaker admits without a round trip

    def cached(self, name: str) -> Permit | None:
        """The CLOSED permit Redis confirmed less than ``cached_admission_seconds`` ago."""
        hit = self._closed.get(name)
        if hit is not None and self._clock() - hit[1] < self._cache_s:
            return hit[0]
        return None

    def seen(self, permit: Permit, counted: bool, transition: StateTransition | None) -> None:
        """What an admission or a report says about the breaker's CLOSED epoch.

        Generations change on every transition out of CLOSED, and a report is
        counted only in its permit's generation: a counted report of a
        non-probe permit, with no transition, means the breaker is still
        CLOSED in that generation. Anything else ends the cache.
        """
        if not self._cache_s:
            return
        name, gen = permit.dependency, permit.generation
        with self._cache_lock:
            if counted and transition is None and permit.probe_id is None:
                if gen > self._over.get(name, -1):
                    self._closed[name] = (permit, self._clock())
            else:
                self._over[name] = max(gen, self._over.get(name, -1))
                self._closed.pop(name, None)

    def forget(self, name: str) -> None:
        """End the cached admission of ``name`` (its state is not known any more)."""
        with self._cache_lock:
            self._closed.pop(name, None)

    def admission_call(self, name: str) -> ScriptCall:
        """The admission of a call the cache did not answer, with a probe id of
        its own: one whose reply never came (interrupted) frees the probe slot
        it may have taken (:meth:`interrupted_admission`), instead of holding
        the fleet's slot until ``probe_timeout_seconds``."""
        before = self._ops.entry(name).before  # (the id is ours: valid, not checked)
        return ScriptCall(before.name, before.keys, (before.args[0], os.urandom(8).hex()))

    def interrupted_admission(self, name: str, call: ScriptCall) -> ScriptCall:
        """The release of a probe slot ``call`` may have taken (its reply lost
        to a cancellation or ``KeyboardInterrupt``); a no-op otherwise."""
        self.forget(name)
        return self._ops.release_probe(name, str(call.args[1]))

    def admit(self, name: str, reply: Any) -> Permit:
        """Decode a ``cb_before`` reply; note what it says for the cache; fire.

        Raises:
            CircuitOpen: Rejected. CorruptData: Foreign data at a breaker key.
        """
        try:
            permit, transition = self._ops.decode_before(name, reply)
        except CircuitOpen:
            self.forget(name)
            raise
        self.seen(permit, transition is None and not permit.rearmed, transition)
        if transition is not None or permit.rearmed:
            self._admitted(permit, transition)
        return permit

    def reported(
        self, name: str, permit: Permit | None, reply: Any, took_ms: float | None = None
    ) -> bool:
        """Decode a ``cb_after`` reply; note what it says for the cache; fire.

        ``took_ms``: how long the call took; a probe not credited because it
        took ``probe_timeout_seconds`` or more is logged (see :meth:`_too_slow`).
        """
        counted, transition = self._ops.decode_after(name, reply)
        if not counted and took_ms is not None and permit is not None and permit.is_probe:
            self._too_slow(name, took_ms)
        if permit is not None:
            self.seen(permit, counted, transition)
        else:
            # Without a permit a report tells no generation (in HALF_OPEN it
            # counts too): it never confirms the cache, and it ends it.
            self.forget(name)
        if transition is not None:
            self.fire_transition(transition)
        return counted

    def _too_slow(self, name: str, took_ms: float) -> None:
        """A probe's answer came ``probe_timeout_seconds`` or more after its
        admission: presumed abandoned, it is never credited. If the dependency's
        calls always take that long, no probe ever is and the breaker never
        closes again: say so, with the setting to raise."""
        try:
            timeout = self._ops.entry(name).config.probe_timeout_seconds
        except DurabilisError:  # (never raised into a record step that already landed)
            return
        if took_ms >= timeout * 1000.0:
            self._log.warning(
                "durability_circuit_probe_too_slow", dependency=name,
                duration_ms=round(took_ms), probe_timeout_seconds=timeout,
                hint="the probe's answer is not credited: probe_timeout_seconds must "
                     "exceed the dependency's longest call, or the breaker cannot close",
            )

    @property
    def ops(self) -> BreakerOps:
        """The pure call builders / reply decoders (for pipelining with other pillars)."""
        return self._ops

    def upsert_config(self, config: CircuitBreakerConfig) -> None:
        """Add or replace a breaker's config; it applies from this process's next call.

        The config travels with every script call, so there is nothing to
        publish: each process uses the configs of its own registry.

        Raises:
            ConfigError: Invalid config.
        """
        self._ops.upsert(config)

    def get_config(self, name: str) -> CircuitBreakerConfig:
        """The config in force for ``name``. Raises ``DependencyNotFound``."""
        return self._ops.entry(name).config

    def names(self) -> list[str]:
        """Names of every configured breaker."""
        return self._ops.names()


    def on_transition(self, callback: TransitionCallback) -> TransitionCallback:
        """Register a callback fired once per transition, in the process that made it.

        A raising callback is logged (``durability_transition_callback_failed``)
        and never raised into the caller. Returns ``callback`` (usable as a decorator).
        """
        self._callbacks.append(callback)
        return callback

    def fire_transition(self, transition: StateTransition) -> None:
        """Log a transition and run the callbacks (never raises)."""
        t = transition
        fields = {
            "dependency": t.dependency,
            "from_state": t.from_state.value,
            "to_state": t.to_state.value,
            "reason": t.reason,
            "failure_rate": t.failure_rate,
            "request_count": t.request_count,
            "reset_timeout_seconds": t.reset_timeout_seconds,
            "generation": t.generation,
            "replica_id": t.replica_id,
        }
        if t.to_state is BreakerState.OPEN:
            self._log.warning("durability_circuit_opened", **fields)
        elif t.to_state is BreakerState.CLOSED:
            self._log.info("durability_circuit_recovered", **fields)
        else:
            self._log.info("durability_circuit_half_open", **fields)
        for callback in list(self._callbacks):
            try:
                callback(t)
            except Exception:
                self._log.exception(
                    "durability_transition_callback_failed",
                    dependency=t.dependency,
                    callback=getattr(callback, "__qualname__", repr(callback)),
                )

    def registration_call(self, name: str) -> ScriptCall | None:
        """The call adding ``name`` to the namespace's index of breakers, the first
        time this process uses it (else ``None``); run it, then :meth:`mark_registered`.

        The index has its own slot, so it cannot share a script with the breaker.
        """
        return None if name in self._registered else self._ops.register(name)

    def mark_registered(self, name: str) -> None:
        """Record that ``name`` is in the namespace's index (see :meth:`registration_call`)."""
        self._registered.add(name)

    def _admitted(self, permit: Permit, transition: StateTransition | None) -> None:
        if transition is not None:
            self.fire_transition(transition)
        if permit.rearmed:
            self._log.warning(
                "durability_circuit_probes_rearmed",
                dependency=permit.dependency,
                generation=permit.generation,
                replica_id=self.replica_id,
            )

    def _report_failed(self, name: str, exc: DurabilisError) -> None:
        # The call itself already ran: raising here would hide its outcome
        # (and invite a retry of a side effect that happened).
        self._log.warning(
            "durability_breaker_report_failed",
            dependency=name,
            error=f"{type(exc).__name__}: {exc}",
        )

    # -- plans: each public operation, sync and async alike

    def before_call_plan(self, name: str) -> Plan[Permit]:
        """Ask to call ``name``'s dependency: a cached CLOSED admission, or one
        ``cb_before`` step (after registering the name, the first time).

        Raises:
            CircuitOpen: Rejected. DependencyNotFound: No config (before any step).
        """
        self._ops.entry(name)  # DependencyNotFound before any I/O
        registration = self.registration_call(name)
        if registration is not None:
            yield registration
            self.mark_registered(name)
        if (cached := self.cached(name)) is not None:
            return cached
        call = self.admission_call(name)
        try:
            reply = yield call
        except Exception:
            raise  # (a lost reply: a probe slot taken is re-armed after probe_timeout_seconds)
        except BaseException:  # interrupted: the admission may have landed
            with suppress(Exception):  # best effort: the slot re-arms anyway
                yield self.interrupted_admission(name, call)
            raise
        return self.admit(name, reply)

    def after_call_plan(
        self, name: str, success: bool, permit: Permit | None, duration_ms: float | None
    ) -> Plan[bool]:
        """Report an admitted call's outcome; returns whether it counted."""
        call = self._ops.after_call(name, success, permit, duration_ms)
        return self.reported(name, permit, (yield call), duration_ms)

    def release_plan(self, name: str, permit: Permit) -> Plan[bool]:
        """Give ``permit``'s probe slot back without a result; returns whether one was freed."""
        return self._ops.decode_after(name, (yield self._ops.release(name, permit)))[0]

    def finish_plan(
        self, name: str, permit: Permit, exc_type: type[BaseException] | None, took_ms: float
    ) -> Plan[None]:
        """Report how a guarded call ended (:func:`outcome_code`); a report that
        fails is logged, never raised (the call's own outcome is the caller's)."""
        call = self._ops.report(name, outcome_code(exc_type), permit, took_ms)
        try:
            self.reported(name, permit, (yield call), took_ms)
        except DurabilisError as exc:
            self.forget(name)
            self._report_failed(name, exc)

    def state_info_plan(self, name: str) -> Plan[BreakerInfo]:
        """The stored state plus what a call would get now (one step)."""
        return self._ops.decode_read(name, (yield self._ops.read(name)))

    def state_plan(self, name: str) -> Plan[BreakerState]:
        """The stored state (an OPEN breaker past its reset timeout is still OPEN)."""
        return (yield from self.state_info_plan(name)).state

    def force_plan(self, name: str, mode: str) -> Plan[None]:
        """Force ``name`` ``"open"`` or ``"close"``; fires the transition it made."""
        self.forget(name)
        transition = self._ops.decode_force(name, (yield self._ops.force(name, mode)))
        if transition is not None:
            self.fire_transition(transition)

    def transitions_plan(self, name: str, limit: int) -> Plan[list[StateTransition]]:
        """The newest ``limit`` transitions of ``name``, oldest first."""
        self._ops.entry(name)
        args = self._ops.events_command(name, limit)
        return self._ops.decode_events(name, (yield Command(args, str(args[1]))))

    def stored_names_plan(self, limit: int | None = None) -> Plan[set[str]]:
        """Every breaker name any process of this namespace has used; with
        ``limit``, at most that many (``SSCAN``: bounded work per round trip,
        at most :data:`SCAN_ROUNDS` round trips; which ones is the set's order)."""
        key = self._ops.keys.breaker_names()
        if limit is None:
            return self._ops.decode_names((yield Command(("SMEMBERS", key), key)))
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ConfigError("limit", f"must be an integer >= 1 or None, got {limit!r}")
        out: set[str] = set()
        cursor: Any = 0
        for _ in range(SCAN_ROUNDS):
            reply = yield Command(("SSCAN", key, cursor, "COUNT", min(limit, 1000)), key)
            cursor, members = reply[0], reply[1]
            out |= self._ops.decode_names(members)
            if int(cursor) == 0 or len(out) >= limit:
                break
        return set(sorted(out)[:limit])

    def is_stored_plan(self, name: str) -> Plan[bool]:
        """Whether any process of this namespace has used ``name`` (one ``SISMEMBER``)."""
        key = self._ops.keys.breaker_names()
        return bool((yield Command(("SISMEMBER", key, name), key)))

    def read_calls(self) -> tuple[list[str], list[ScriptCall]]:
        """The configured names and their ``cb_read`` calls (``all_states``: one pipeline)."""
        names = self._ops.names()
        return names, [self._ops.read(n) for n in names]

    def decode_states(self, names: list[str], replies: list[Any]) -> dict[str, BreakerState]:
        """``all_states`` from the replies of :meth:`read_calls`."""
        return {
            n: self._ops.decode_read(n, r).state for n, r in zip(names, replies, strict=True)
        }
