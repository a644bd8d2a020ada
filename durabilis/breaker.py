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
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from time import monotonic, perf_counter
from typing import Any, ParamSpec, TypeVar

from durabilis import _codec
from durabilis._fork import reset_in_child
from durabilis._keys import KeySpace
from durabilis._limits import check_limits
from durabilis._log import get_logger
from durabilis._scripts import Arg, ScriptCall
from durabilis._store import AsyncStore, Store
from durabilis.errors import (
    CircuitOpen,
    ConfigError,
    CorruptData,
    DependencyNotFound,
    DurabilisError,
)

__all__ = [
    "DEFAULT_BREAKER_CONFIGS",
    "AsyncBreakerGuard",
    "AsyncCircuitBreakerRegistry",
    "BreakerGuard",
    "BreakerInfo",
    "BreakerState",
    "CircuitBreakerConfig",
    "CircuitBreakerRegistry",
    "Permit",
    "StateTransition",
    "TransitionCallback",
    "default_breaker_configs",
    "default_replica_id",
]

_log = get_logger()

P = ParamSpec("P")
R = TypeVar("R")


class BreakerState(str, Enum):
    """The three states of a breaker (the value is the readable name)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


_STATE_CODES: dict[Any, BreakerState] = {}
for _code, _state in (("C", BreakerState.CLOSED), ("O", BreakerState.OPEN),
                      ("H", BreakerState.HALF_OPEN)):
    _STATE_CODES[_code] = _state
    _STATE_CODES[_code.encode()] = _state
_STATE_NAMES = {s.value: s for s in BreakerState}


# --- configuration ------------------------------------------------------------


def _number(name: str, value: Any, *, integer: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and integer:
        ok = isinstance(value, int)
    if not ok or not math.isfinite(value):
        kind = "an integer" if integer else "a finite number"
        raise ConfigError(name, f"must be {kind}, got {value!r}")
    return float(value)


def _at_least_one(name: str, value: Any, *, integer: bool = False) -> None:
    if _number(name, value, integer=integer) < 1:
        raise ConfigError(name, f"must be >= 1, got {value!r}")


# A registry's own counts (events_maxlen); a config's maxima are in durabilis._limits.
_MAX_COUNT = 10**9


def _valid_text(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: Redis cannot store it
        raise ConfigError(name, "must be valid Unicode (no lone surrogates)") from None


def _rate(name: str, value: Any) -> None:
    x = _number(name, value)
    if not 0 < x <= 1:
        raise ConfigError(name, f"must be in (0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class CircuitBreakerConfig:
    """Settings of one dependency's breaker (validated on construction).

    Attributes:
        name: The dependency's name (``"memory_service"``).
        failure_rate_threshold: Trips when the failure rate is strictly above
            this, in (0, 1].
        min_request_count: Results needed in the window before a rate exists.
        reset_timeout_seconds: How long OPEN rejects before a probe is let through.
        probe_success_required: Probe successes that close a HALF_OPEN breaker;
            also the most probes in flight at once, fleet-wide.
        window_size: The window holds the newest ``window_size`` results.
        probe_timeout_seconds: A probe admitted this long ago is presumed
            abandoned: once the newest probe in flight is this old, the next
            ``before_call`` frees every slot (re-arm), and a probe's report
            arriving this late is not credited.
        window_seconds: Time-based window: results older than this leave the
            window too (``window_size`` still bounds how many are kept; set it
            high for a purely time-based window). ``None``: count-based only.
        slow_call_duration_ms: Calls slower than this are slow (needs
            ``slow_call_rate_threshold``).
        slow_call_rate_threshold: Trips when the slow-call rate is strictly above
            this; a slow probe counts as a failed probe. ``None``: rule off.
        min_distinct_reporters: The breaker trips only when at least this many
            distinct replicas reported a failure (or slow call) still in the window.
        idle_ttl_seconds: The breaker's Redis keys expire after this long
            without a report or transition (a dependency no longer called leaves
            nothing behind).
    """

    name: str
    failure_rate_threshold: float = 0.5
    min_request_count: int = 10
    reset_timeout_seconds: float = 30
    probe_success_required: int = 2
    window_size: int = 20
    probe_timeout_seconds: float = 30
    window_seconds: float | None = None
    slow_call_duration_ms: float | None = None
    slow_call_rate_threshold: float | None = None
    min_distinct_reporters: int = 1
    idle_ttl_seconds: float = 7 * 86400

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field, in the seed's order first.

        Raises:
            ConfigError: Naming the first invalid field.
        """
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("name", "must be a non-empty string")
        _valid_text("name", self.name)
        _rate("failure_rate_threshold", self.failure_rate_threshold)
        _at_least_one("min_request_count", self.min_request_count, integer=True)
        _at_least_one("reset_timeout_seconds", self.reset_timeout_seconds)
        _at_least_one("probe_success_required", self.probe_success_required, integer=True)
        _at_least_one("window_size", self.window_size, integer=True)
        _at_least_one("probe_timeout_seconds", self.probe_timeout_seconds)
        if self.min_request_count > self.window_size:
            raise ConfigError(
                "min_request_count",
                f"is {self.min_request_count}, larger than window_size={self.window_size}: "
                "the window could never hold enough results to trip",
            )
        window = self.window_seconds
        if window is not None and _number("window_seconds", window) < 0.001:
            raise ConfigError("window_seconds", f"must be >= 0.001 or None, got {window!r}")
        if (self.slow_call_duration_ms is None) != (self.slow_call_rate_threshold is None):
            raise ConfigError(
                "slow_call_rate_threshold",
                "slow_call_duration_ms and slow_call_rate_threshold are set together or not at all",
            )
        if self.slow_call_duration_ms is not None:
            if _number("slow_call_duration_ms", self.slow_call_duration_ms) < 0:
                raise ConfigError("slow_call_duration_ms", "must be >= 0")
            _rate("slow_call_rate_threshold", self.slow_call_rate_threshold)
        _at_least_one("min_distinct_reporters", self.min_distinct_reporters, integer=True)
        # Every count and duration has a hard maximum (durabilis._limits): an
        # open breaker refuses for at most a day, whoever published its config.
        check_limits(self)
        longest = max(
            self.reset_timeout_seconds, self.probe_timeout_seconds, self.window_seconds or 0
        )
        if _number("idle_ttl_seconds", self.idle_ttl_seconds) < longest:
            raise ConfigError(
                "idle_ttl_seconds",
                f"must be >= the longest timeout or window ({longest:g} s), "
                f"got {self.idle_ttl_seconds!r}",
            )


DEFAULT_BREAKER_CONFIGS: tuple[CircuitBreakerConfig, ...] = (
    CircuitBreakerConfig("memory_service", 0.5, 10, 30, 2, 20, 30),
    CircuitBreakerConfig("external_mcp_client", 0.3, 5, 60, 1, 20, 30),
    CircuitBreakerConfig("wiki_service", 0.4, 8, 45, 2, 20, 30),
)
"""The seed's three breakers (threshold, min requests, reset s, probes, window, probe timeout s)."""


def default_breaker_configs() -> list[CircuitBreakerConfig]:
    """The seed's breakers: ``memory_service``, ``external_mcp_client``, ``wiki_service``."""
    return list(DEFAULT_BREAKER_CONFIGS)


def default_replica_id() -> str:
    """``host:pid:random``: identifies this process in reports and the events stream."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


# --- results ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Permit:
    """Admission to call a dependency, returned by ``before_call``.

    Pass it back to ``after_call``: a report is counted only in the state
    generation that admitted it, and a probe's report only while its own probe
    slot is live (never credited to a newer probe after a re-arm).

    Attributes:
        dependency: The breaker's name.
        generation: The breaker's state generation at admission.
        probe_id: Set when the call is a HALF_OPEN probe: a random token
            (the registry's ``before_call``), or the id the caller chose
            (``ops.before_call(name, probe_id)``).
        rearmed: Admitting this probe freed every probe slot first: the newest
            probe in flight was ``probe_timeout_seconds`` old (abandoned).
    """

    dependency: str
    generation: int
    probe_id: str | None = None
    rearmed: bool = False

    @property
    def is_probe(self) -> bool:
        """The call is a HALF_OPEN probe."""
        return self.probe_id is not None


@dataclass(frozen=True, slots=True)
class StateTransition:
    """One state change of a breaker, as fired to callbacks and kept in the events stream.

    Attributes:
        dependency: The breaker's name.
        from_state: State before.
        to_state: State after.
        at: When (Redis server clock, UTC).
        failure_rate: The window's failure rate when it tripped (CLOSED -> OPEN,
            on the failure or slow-call rate), else ``None``.
        request_count: Results in the window (CLOSED -> OPEN), probe results in
            this HALF_OPEN round (HALF_OPEN -> *), window results otherwise.
        reset_timeout_seconds: The reset timeout in force.
        replica_id: The process whose call made the transition.
        reason: ``failure_rate``, ``slow_call_rate``, ``reset_timeout``,
            ``probe_failed``, ``probes_succeeded`` or ``forced``.
        generation: The state generation the transition started.
        failure_count: Failures counted with ``request_count``.
        slow_call_count: Slow calls counted with ``request_count``.
        event_id: The entry id in the breaker's events stream.
    """

    dependency: str
    from_state: BreakerState
    to_state: BreakerState
    at: datetime
    failure_rate: float | None
    request_count: int
    reset_timeout_seconds: float
    replica_id: str
    reason: str
    generation: int
    failure_count: int = 0
    slow_call_count: int = 0
    event_id: str | None = None


TransitionCallback = Callable[[StateTransition], object]
"""A callback for ``on_transition``: called once per transition, by the process that made it."""


@dataclass(frozen=True, slots=True)
class BreakerInfo:
    """What ``state_info`` reports: the stored truth plus what a call would get now.

    Attributes:
        dependency: The breaker's name.
        state: The stored state (an OPEN breaker past its reset timeout is still OPEN).
        generation: The state generation.
        call_allowed: A ``before_call`` now would be admitted.
        probe_allowed: That admission would be a probe (OPEN past its reset
            timeout, or HALF_OPEN with a free or re-armable slot).
        probes_in_flight: Probe slots taken.
        probe_successes: Probe successes in this HALF_OPEN round.
        request_count: Results in the window.
        failure_count: Failures in the window.
        slow_call_count: Slow calls in the window.
        failure_rate: ``failure_count / request_count``; ``None`` below ``min_request_count``.
        slow_call_rate: ``slow_call_count / request_count``; ``None`` likewise.
        failure_reporters: Distinct replicas with a failure or slow call in the window.
        opened_at: When it last opened (UTC), ``None`` if never.
        retry_after: Seconds until a call would be admitted (0 when allowed now).
        checked_at: The server time of this reading (UTC).
    """

    dependency: str
    state: BreakerState
    generation: int
    call_allowed: bool
    probe_allowed: bool
    probes_in_flight: int
    probe_successes: int
    request_count: int
    failure_count: int
    slow_call_count: int
    failure_rate: float | None
    slow_call_rate: float | None
    failure_reporters: int
    opened_at: datetime | None
    retry_after: float
    checked_at: datetime


# --- pure operations: build calls, decode replies (no I/O) --------------------

# Which of an entry's five keys each script gets as KEYS[1..] (to name the
# key holding foreign data when a script reports {"corrupt", index, ...}).
_SCRIPT_KEYS = {"cb_before": (0, 2, 3), "cb_read": (0, 1, 2, 4)}
_RATE_REASONS = ("failure_rate", "slow_call_rate")
# Reply tags, as bytes (default clients) or str (decode_responses=True).
_OK = frozenset((b"ok", "ok"))
_OPEN = frozenset((b"open", "open"))
_COUNTED = frozenset((b"counted", "counted"))
_RELEASED = frozenset((b"released", "released"))
_NOT_COUNTED = frozenset((b"ignored", "ignored", b"stale", "stale")) | _RELEASED


@dataclass(frozen=True, slots=True)
class _Entry:
    """Everything prebuilt for one breaker, so the hot path only looks it up."""

    config: CircuitBreakerConfig
    keys: tuple[str, str, str, str, str]  # state, window, probes, events, reporters
    before: ScriptCall
    read: ScriptCall
    after_keys: tuple[bytes, ...]
    after_config: bytes
    force_args: tuple[Arg, ...]
    plain_window: bool  # count-based: a plain success may take the script's hot path
    slow_ms: float | None


_CHECK_EVERY = 1.0  # seconds between TTL checks requested by one process, per breaker
DEFAULT_CACHED_ADMISSION_SECONDS = 1.0
"""How long a CLOSED breaker's admission, confirmed by Redis, is reused without
asking (``cached_admission_seconds``; 0 asks Redis before every call)."""
_MAX_CACHED_ADMISSION_SECONDS = 60.0


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else bytes(value).decode("utf-8")


def outcome_code(exc_type: type[BaseException] | None) -> str:
    """How a wrapped call's end is reported.

    Returns:
        ``"s"`` (success) when no exception, ``"f"`` (failure) for an
        ``Exception``, ``"r"`` (release the probe slot, no result) for other
        ``BaseException``s: a cancelled or interrupted call says nothing about
        the dependency.
    """
    if exc_type is None:
        return "s"
    return "f" if issubclass(exc_type, Exception) else "r"


class _BreakerOps:
    """Builds each script call and decodes its reply; shared by both twins.

    The composed layer pipelines :meth:`before_call` / :meth:`after_call` with
    other pillars' scripts and decodes with :meth:`decode_before` /
    :meth:`decode_after`; the transition they return must be passed to the
    registry's :meth:`~CircuitBreakerRegistry.fire_transition`.
    """

    __slots__ = ("_checked", "_entries", "_permits", "events_maxlen", "keys", "replica_id")

    def __init__(self, keys: KeySpace, replica_id: str, events_maxlen: int) -> None:
        self.keys = keys
        self.replica_id = replica_id
        self.events_maxlen = events_maxlen
        self._entries: dict[str, _Entry] = {}
        self._checked: dict[str, float] = {}  # name -> monotonic time of the last TTL check
        self._permits: dict[str, Permit] = {}  # name -> the CLOSED permit of the last generation

    # -- configs

    def upsert(self, config: CircuitBreakerConfig) -> None:
        if not isinstance(config, CircuitBreakerConfig):
            raise TypeError(f"expected a CircuitBreakerConfig, got {type(config).__name__}")
        config.validate()
        k = self.keys
        name = config.name
        keys = (
            k.breaker(name),
            k.breaker_window(name),
            k.breaker_probes(name),
            k.breaker_events(name),
            k.breaker_reporters(name),
        )
        reset_ms = _ms(config.reset_timeout_seconds)
        ttl_ms = _ms(config.idle_ttl_seconds)
        window_ms = _ms(config.window_seconds) if config.window_seconds is not None else 0
        slow_ms = -1.0 if config.slow_call_duration_ms is None else config.slow_call_duration_ms
        # The hot scripts get their config as ONE pre-encoded argument: redis-py
        # encodes every argument on every call, and these never change.
        before_config = "|".join(
            str(x)
            for x in (
                reset_ms,
                config.probe_success_required,
                _ms(config.probe_timeout_seconds),
                ttl_ms,
                self.events_maxlen,
                self.replica_id,
            )
        ).encode()
        after_config = "|".join(
            str(x)
            for x in (
                config.window_size,
                window_ms,
                repr(float(slow_ms)),
                ttl_ms,
                repr(float(config.failure_rate_threshold)),
                config.min_request_count,
                repr(float(config.slow_call_rate_threshold or 1.0)),
                config.min_distinct_reporters,
                config.probe_success_required,
                reset_ms,
                self.events_maxlen,
                _ms(config.probe_timeout_seconds),
                self.replica_id,  # last: it may contain "|"
            )
        ).encode()
        bkeys = tuple(key.encode() for key in keys)
        self._entries[name] = _Entry(
            config=config,
            keys=keys,
            before=ScriptCall("cb_before", (bkeys[0], bkeys[2], bkeys[3]), (before_config,)),
            read=ScriptCall(
                "cb_read", (keys[0], keys[1], keys[2], keys[4]), (config.window_size, window_ms)
            ),
            after_keys=bkeys,
            after_config=after_config,
            force_args=(reset_ms, ttl_ms, self.events_maxlen, self.replica_id),
            plain_window=window_ms == 0,
            slow_ms=config.slow_call_duration_ms,
        )

    def entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise DependencyNotFound(str(name)) from None

    def names(self) -> list[str]:
        return list(self._entries)

    # -- admission

    def before_call(self, name: str, probe_id: str | None = None) -> ScriptCall:
        """The ``cb_before`` call for ``name``.

        Args:
            name: The dependency.
            probe_id: If the call is admitted as a HALF_OPEN probe, its id (the
                permit's ``probe_id``) instead of a counter value, so the
                caller can free the slot with :meth:`release_probe` even when
                the reply was lost. Choose it unique (a random token); a probe
                id already in flight is admitted again on its own slot.

        Raises:
            DependencyNotFound: No config for ``name``.
            ValueError: ``probe_id`` is not a non-empty str of at most 64
                characters without ``"|"``.
        """
        before = self.entry(name).before
        if probe_id is None:
            return before  # prebuilt: the hot path only looks it up
        _check_probe_id(probe_id)
        return ScriptCall(before.name, before.keys, (before.args[0], probe_id))

    def decode_before(self, name: str, reply: Any) -> tuple[Permit, StateTransition | None]:
        """The permit, and the transition this admission made (fire it), if any.

        Raises:
            CircuitOpen: Rejected (``retry_after`` in seconds).
            CorruptData: Foreign data at one of the breaker's keys.
        """
        if type(reply) is int:  # the CLOSED hot path: the bare generation
            permit = self._permits.get(name)
            if permit is None or permit.generation != reply:
                # Permits are immutable: one per (breaker, generation) serves every call.
                permit = self._permits[name] = Permit(name, reply)
            return permit, None
        try:
            tag = reply[0]
            if tag in _OK:
                probe = reply[2]
                permit = Permit(name, int(reply[1]), _text(probe) if probe else None,
                                reply[4] == 1)
                if len(reply) > 5:
                    return permit, self._transition(name, reply[5])
                return permit, None
            if tag in _OPEN:
                raise CircuitOpen(name, max(0, int(reply[2])) / 1000.0)
        except (TypeError, IndexError, ValueError, AttributeError) as exc:
            raise CorruptData(self.entry(name).keys[0], f"unexpected reply {reply!r}") from exc
        raise self._corrupt(name, reply, "cb_before")

    # -- reports

    def after_call(
        self,
        name: str,
        success: bool,
        permit: Permit | None = None,
        duration_ms: float | None = None,
    ) -> ScriptCall:
        """The ``cb_after`` call reporting a result. Raises ``DependencyNotFound``."""
        return self._report(name, "s" if success else "f", permit, duration_ms)

    def release(self, name: str, permit: Permit) -> ScriptCall:
        """The ``cb_after`` call freeing ``permit``'s probe slot without a result."""
        return self._report(name, "r", permit, None)

    def release_probe(self, name: str, probe_id: str) -> ScriptCall:
        """The ``cb_after`` call freeing the probe slot ``probe_id`` without a result.

        Needs no permit (nor its generation): for a probe id chosen with
        :meth:`before_call` whose reply may have been lost. In HALF_OPEN it
        frees that slot if it is in flight (decoded as counted: ``True``);
        otherwise it is ignored (``False``).

        Raises:
            DependencyNotFound: No config for ``name``.
            ValueError: ``probe_id`` is not a non-empty str of at most 64
                characters without ``"|"``.
        """
        e = self.entry(name)
        _check_probe_id(probe_id)
        return ScriptCall("cb_after", e.after_keys, (e.after_config, f"|{probe_id}|r|-1|0"))

    def report(
        self, name: str, outcome: str, permit: Permit | None, duration_ms: float | None
    ) -> ScriptCall:
        """The ``cb_after`` call for an outcome code from :func:`outcome_code`."""
        return self._report(name, outcome, permit, duration_ms)

    def _report(
        self, name: str, outcome: str, permit: Permit | None, duration_ms: float | None
    ) -> ScriptCall:
        e = self.entry(name)
        if permit is not None and permit.dependency != name:
            raise ValueError(f"the permit was issued for {permit.dependency!r}, not {name!r}")
        # The script's hot path reads no clock; about once a second per breaker
        # this process asks it to check whether the keys' TTLs are due.
        now = monotonic()
        check = now - self._checked.get(name, -_CHECK_EVERY) >= _CHECK_EVERY
        if check:
            self._checked[name] = now
        gen = "" if permit is None else permit.generation
        if (
            outcome == "s"
            and not check
            and e.plain_window
            and (permit is None or permit.probe_id is None)
            and (e.slow_ms is None or duration_ms is None or duration_ms <= e.slow_ms)
        ):
            report = f"+{e.config.window_size}|{gen}"
        else:
            probe = "" if permit is None else permit.probe_id or ""
            dur = "-1" if duration_ms is None else f"{max(0.0, duration_ms):.3f}"
            report = f"{gen}|{probe}|{outcome}|{dur}|{1 if check else 0}"
        return ScriptCall("cb_after", e.after_keys, (e.after_config, report))

    def decode_after(self, name: str, reply: Any) -> tuple[bool, StateTransition | None]:
        """Whether the report counted (``False``: stray or stale, ignored), and the
        transition it made, if any (fire it).

        Raises:
            CorruptData: Foreign data at one of the breaker's keys.
        """
        if reply == 1:  # the CLOSED hot path: counted, no transition
            return True, None
        try:
            tag = reply[0]
            if tag in _COUNTED:
                if len(reply) > 3:
                    return True, self._transition(name, reply[3])
                return True, None
            if tag in _NOT_COUNTED:
                return tag in _RELEASED, None
        except (TypeError, IndexError, ValueError, AttributeError) as exc:
            raise CorruptData(self.entry(name).keys[0], f"unexpected reply {reply!r}") from exc
        raise self._corrupt(name, reply, "cb_after")

    # -- operator actions and reads

    def force(self, name: str, mode: str) -> ScriptCall:
        e = self.entry(name)
        return ScriptCall("cb_force", e.keys, (mode, *e.force_args))

    def decode_force(self, name: str, reply: Any) -> StateTransition | None:
        try:
            if _text(reply[0]) == "ok":
                return self._transition(name, reply[3]) if len(reply) > 3 else None
        except (TypeError, IndexError, ValueError, AttributeError) as exc:
            raise CorruptData(self.entry(name).keys[0], f"unexpected reply {reply!r}") from exc
        raise self._corrupt(name, reply, "cb_force")

    def read(self, name: str) -> ScriptCall:
        return self.entry(name).read

    def decode_read(self, name: str, reply: Any) -> BreakerInfo:
        e = self.entry(name)
        cfg = e.config
        try:
            if _text(reply[0]) != "info":
                raise self._corrupt(name, reply, "cb_read")
            st = _STATE_CODES[_text(reply[1])]
            g, oa, pn, ps, inflight, now, n, f, s, distinct = (int(x) for x in reply[2:12])
        except (TypeError, IndexError, ValueError, AttributeError, KeyError) as exc:
            raise CorruptData(e.keys[0], f"unexpected reply {reply!r}") from exc
        allowed, probe, wait_ms = admission(
            st,
            now_ms=now,
            opened_at_ms=oa,
            newest_probe_ms=pn,
            probes_in_flight=inflight,
            config=cfg,
        )
        has_rate = n >= cfg.min_request_count and n > 0
        return BreakerInfo(
            dependency=name,
            state=st,
            generation=g,
            call_allowed=allowed,
            probe_allowed=probe,
            probes_in_flight=inflight,
            probe_successes=ps if st is BreakerState.HALF_OPEN else 0,
            request_count=n,
            failure_count=f,
            slow_call_count=s,
            failure_rate=f / n if has_rate else None,
            slow_call_rate=s / n if has_rate else None,
            failure_reporters=distinct,
            opened_at=_codec.as_datetime(oa, key=e.keys[0], field="oa") if oa else None,
            retry_after=wait_ms / 1000.0,
            checked_at=_codec.as_datetime(now, key=e.keys[0], field="now"),
        )

    def register(self, name: str) -> ScriptCall:
        """The ``cb_register`` call adding ``name`` to the namespace's index."""
        return ScriptCall("cb_register", (self.keys.breaker_names(),), (name,))

    def decode_names(self, reply: Any) -> set[str]:
        """The members of the namespace's index of breakers (``SMEMBERS``)."""
        key = self.keys.breaker_names()
        return {_codec.as_text(n, key=key, field="member") for n in reply or ()}

    def events_command(self, name: str, limit: int) -> tuple[Any, ...]:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        return ("XREVRANGE", self.keys.breaker_events(name), "+", "-", "COUNT", limit)

    def decode_events(self, name: str, reply: Any) -> list[StateTransition]:
        key = self.keys.breaker_events(name)
        out = []
        try:
            for event_id, fields in reversed(list(reply or [])):
                f = {_text(k): _text(v) for k, v in fields.items()}
                rate = f.get("failure_rate") or None
                out.append(
                    StateTransition(
                        dependency=name,
                        from_state=_STATE_NAMES[f["from"]],
                        to_state=_STATE_NAMES[f["to"]],
                        at=_codec.as_datetime(f["time"], key=key, field="time"),
                        failure_rate=float(rate) if rate else None,
                        request_count=int(f["requests"]),
                        reset_timeout_seconds=int(f["reset_timeout_ms"]) / 1000.0,
                        replica_id=f["replica"],
                        reason=f["reason"],
                        generation=int(f["generation"]),
                        failure_count=int(f["failures"]),
                        slow_call_count=int(f["slow"]),
                        event_id=_text(event_id),
                    )
                )
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise CorruptData(key, f"not a breaker events stream entry ({exc!r})") from exc
        return out

    # -- helpers

    def _transition(self, name: str, t: Sequence[Any]) -> StateTransition:
        failures, requests, slow = int(t[3]), int(t[4]), int(t[5])
        reason = _text(t[6])
        rate = failures / requests if reason in _RATE_REASONS and requests else None
        entry = self._entries.get(name)
        return StateTransition(
            dependency=name,
            from_state=_STATE_CODES[t[0]],
            to_state=_STATE_CODES[t[1]],
            at=_codec.ms_to_datetime(int(t[2])),
            failure_rate=rate,
            request_count=requests,
            reset_timeout_seconds=entry.config.reset_timeout_seconds if entry else 0.0,
            replica_id=self.replica_id,
            reason=reason,
            generation=int(t[7]),
            failure_count=failures,
            slow_call_count=slow,
            event_id=_text(t[8]),
        )

    def _corrupt(self, name: str, reply: Any, script: str) -> CorruptData:
        keys = self.entry(name).keys
        try:
            if _text(reply[0]) == "corrupt":
                own = _SCRIPT_KEYS.get(script, (0, 1, 2, 3, 4))
                return CorruptData(keys[own[int(reply[1]) - 1]], _text(reply[2]))
        except (TypeError, IndexError, ValueError, AttributeError):
            pass
        return CorruptData(keys[0], f"unexpected reply from {script}: {reply!r}")


_MAX_PROBE_ID = 64


def _check_probe_id(probe_id: Any) -> None:
    """Check a caller-chosen probe id (see :meth:`_BreakerOps.before_call`).

    Raises:
        ValueError: Not a non-empty ``str`` of at most 64 characters without
            ``"|"`` (the scripts' field separator), or not valid Unicode.
    """
    if not isinstance(probe_id, str) or not probe_id:
        raise ValueError(f"a probe id must be a non-empty string, got {probe_id!r}")
    if len(probe_id) > _MAX_PROBE_ID:
        raise ValueError(f"a probe id must be at most {_MAX_PROBE_ID} characters, "
                         f"got {len(probe_id)}")
    if "|" in probe_id:
        raise ValueError(f"a probe id must not contain '|', got {probe_id!r}")
    try:
        probe_id.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: Redis cannot store it
        raise ValueError("a probe id must be valid Unicode (no lone surrogates)") from None


def admission(
    state: BreakerState,
    *,
    now_ms: int,
    opened_at_ms: int,
    newest_probe_ms: int,
    probes_in_flight: int,
    config: CircuitBreakerConfig,
) -> tuple[bool, bool, int]:
    """What ``before_call`` would do now (the rule ``cb_before.lua`` applies).

    Returns:
        ``(admitted, as_probe, wait_ms)``: ``wait_ms`` is 0 when admitted, else
        the time until a call is sure to be admitted (the reset timeout's end;
        in HALF_OPEN with every slot taken, the re-arm of the slots). In
        HALF_OPEN, probes in flight whose newest is ``probe_timeout_seconds``
        old are re-armed first, so a free slot then always remains.
    """
    if state is BreakerState.CLOSED:
        return True, False, 0
    # A time stored "in the future" means the server clock stepped back: the
    # script restarts that timeout from now (as if the time were now).
    if state is BreakerState.OPEN:
        left = min(opened_at_ms, now_ms) + _ms(config.reset_timeout_seconds) - now_ms
        return (True, True, 0) if left <= 0 else (False, False, left)
    if probes_in_flight < config.probe_success_required:
        return True, True, 0
    left = min(newest_probe_ms, now_ms) + _ms(config.probe_timeout_seconds) - now_ms
    return (True, True, 0) if left <= 0 else (False, False, left)


# --- the twins: thin I/O shells -----------------------------------------------


class _RegistryCore:
    """What both twins share: configs, callbacks, the pure ops. No I/O here."""

    def __init__(
        self,
        keys: KeySpace,
        configs: Iterable[CircuitBreakerConfig] | None,
        replica_id: str | None,
        events_maxlen: int,
        cached_admission_seconds: float = DEFAULT_CACHED_ADMISSION_SECONDS,
    ) -> None:
        if replica_id is not None and (not isinstance(replica_id, str) or not replica_id):
            raise ConfigError("replica_id", "must be a non-empty string")
        if replica_id is not None:
            _valid_text("replica_id", replica_id)
        if not isinstance(events_maxlen, int) or isinstance(events_maxlen, bool) or not (
            1 <= events_maxlen <= _MAX_COUNT
        ):
            raise ConfigError(
                "events_maxlen", f"must be an integer in [1, 1e9], got {events_maxlen!r}"
            )
        self.replica_id = replica_id or default_replica_id()
        self._ops = _BreakerOps(keys, self.replica_id, events_maxlen)
        for config in DEFAULT_BREAKER_CONFIGS if configs is None else configs:
            self._ops.upsert(config)
        self._callbacks: list[TransitionCallback] = []
        self._registered: set[str] = set()
        if (
            isinstance(cached_admission_seconds, bool)
            or not isinstance(cached_admission_seconds, (int, float))
            or not 0 <= cached_admission_seconds <= _MAX_CACHED_ADMISSION_SECONDS
        ):
            raise ConfigError(
                "cached_admission_seconds",
                f"must be a number of seconds in [0, {_MAX_CACHED_ADMISSION_SECONDS}], "
                f"got {cached_admission_seconds!r}",
            )
        self._cache_s = float(cached_admission_seconds)
        # name -> (a CLOSED permit, when Redis last confirmed it: monotonic)
        self._closed: dict[str, tuple[Permit, float]] = {}
        self._cache_lock = threading.Lock()  # threads confirm and end the cache at once
        # name -> the newest generation this process knows to be over: a
        # confirmation of it arriving late (another caller's reply) is no news.
        self._over: dict[str, int] = {}
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """A forked child confirms the breakers itself (a fresh lock too: another
        thread of the parent may have held it at fork)."""
        self._cache_lock = threading.Lock()
        self._closed = {}
        self._over = {}

    # -- cached admission: a CLOSED breaker admits without a round trip

    def _cached(self, name: str) -> Permit | None:
        """The CLOSED permit Redis confirmed less than ``cached_admission_seconds`` ago."""
        hit = self._closed.get(name)
        if hit is not None and monotonic() - hit[1] < self._cache_s:
            return hit[0]
        return None

    def _seen(self, permit: Permit, counted: bool, transition: StateTransition | None) -> None:
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
                    self._closed[name] = (permit, monotonic())
            else:
                self._over[name] = max(gen, self._over.get(name, -1))
                self._closed.pop(name, None)

    def _forget(self, name: str) -> None:
        with self._cache_lock:
            self._closed.pop(name, None)

    def _admission(self, name: str) -> ScriptCall:
        """The admission of a call the cache did not answer, with a probe id of
        its own: one whose reply never came (interrupted) frees the probe slot
        it may have taken (:meth:`_interrupted_admission`), instead of holding
        the fleet's slot until ``probe_timeout_seconds``."""
        before = self._ops.entry(name).before  # (the id is ours: valid, not checked)
        return ScriptCall(before.name, before.keys, (before.args[0], os.urandom(8).hex()))

    def _interrupted_admission(self, name: str, call: ScriptCall) -> ScriptCall:
        """The release of a probe slot ``call`` may have taken (its reply lost
        to a cancellation or ``KeyboardInterrupt``); a no-op otherwise."""
        self._forget(name)
        return self._ops.release_probe(name, str(call.args[1]))

    def _admit(self, name: str, reply: Any) -> Permit:
        """Decode a ``cb_before`` reply; note what it says for the cache; fire."""
        try:
            permit, transition = self._ops.decode_before(name, reply)
        except CircuitOpen:
            self._forget(name)
            raise
        self._seen(permit, transition is None and not permit.rearmed, transition)
        if transition is not None or permit.rearmed:
            self._admitted(permit, transition)
        return permit

    def _reported(
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
            self._seen(permit, counted, transition)
        else:
            # Without a permit a report tells no generation (in HALF_OPEN it
            # counts too): it never confirms the cache, and it ends it.
            self._forget(name)
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
            _log.warning(
                "durability_circuit_probe_too_slow", dependency=name,
                duration_ms=round(took_ms), probe_timeout_seconds=timeout,
                hint="the probe's answer is not credited: probe_timeout_seconds must "
                     "exceed the dependency's longest call, or the breaker cannot close",
            )

    @property
    def ops(self) -> _BreakerOps:
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
            _log.warning("durability_circuit_opened", **fields)
        elif t.to_state is BreakerState.CLOSED:
            _log.info("durability_circuit_recovered", **fields)
        else:
            _log.info("durability_circuit_half_open", **fields)
        for callback in list(self._callbacks):
            try:
                callback(t)
            except Exception:
                _log.exception(
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
            _log.warning(
                "durability_circuit_probes_rearmed",
                dependency=permit.dependency,
                generation=permit.generation,
                replica_id=self.replica_id,
            )

    def _report_failed(self, name: str, exc: DurabilisError) -> None:
        # The call itself already ran: raising here would hide its outcome
        # (and invite a retry of a side effect that happened).
        _log.warning(
            "durability_breaker_report_failed",
            dependency=name,
            error=f"{type(exc).__name__}: {exc}",
        )


class CircuitBreakerRegistry(_RegistryCore):
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

    def __init__(
        self,
        store: Store,
        configs: Iterable[CircuitBreakerConfig] | None = None,
        *,
        replica_id: str | None = None,
        events_maxlen: int = 1000,
        cached_admission_seconds: float = DEFAULT_CACHED_ADMISSION_SECONDS,
    ) -> None:
        super().__init__(
            store.keys, configs, replica_id, events_maxlen, cached_admission_seconds
        )
        self.store = store

    def before_call(self, name: str) -> Permit:
        """Ask to call ``name``'s dependency (one round trip).

        Returns:
            The :class:`Permit` to pass to :meth:`after_call`.

        Raises:
            CircuitOpen: Rejected; ``retry_after`` says for how long at most.
            DependencyNotFound: No config for ``name`` (before any I/O).
            StorageUnavailable: Redis down. CorruptData: Foreign data at a breaker key.
        """
        self._ops.entry(name)  # DependencyNotFound before any I/O
        registration = self.registration_call(name)
        if registration is not None:
            self.store.run(registration)
            self.mark_registered(name)
        if (cached := self._cached(name)) is not None:
            return cached
        call = self._admission(name)
        try:
            reply = self.store.run(call)
        except Exception:
            raise  # (a lost reply: a probe slot taken is re-armed after probe_timeout_seconds)
        except BaseException:  # interrupted: the admission may have landed
            with contextlib.suppress(Exception):
                self.store.run(self._interrupted_admission(name, call))
            raise
        return self._admit(name, reply)

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
        call = self._ops.after_call(name, success, permit, duration_ms)
        return self._reported(name, permit, self.store.run(call), duration_ms)

    def release(self, name: str, permit: Permit) -> bool:
        """Give a probe slot back without a result (the call was cancelled).

        Returns:
            ``True`` if a live probe slot was freed.
        """
        return self._ops.decode_after(name, self.store.run(self._ops.release(name, permit)))[0]

    def call(self, name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` through ``name``'s breaker.

        An ``Exception`` counts as a failure and is re-raised; a call slower
        than ``slow_call_duration_ms`` is slow. A report that cannot reach Redis
        is logged (``durability_breaker_report_failed``), not raised: the
        call's own outcome is what the caller gets.

        Raises:
            CircuitOpen: Rejected; ``fn`` did not run.
        """
        permit = self.before_call(name)
        start = perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._finish(name, permit, type(exc), start)
            raise
        self._finish(name, permit, None, start)
        return result

    def _finish(
        self, name: str, permit: Permit, exc_type: type[BaseException] | None, start: float
    ) -> None:
        took_ms = (perf_counter() - start) * 1000.0
        call = self._ops.report(name, outcome_code(exc_type), permit, took_ms)
        try:
            self._reported(name, permit, self.store.run(call), took_ms)
        except DurabilisError as exc:
            self._forget(name)
            self._report_failed(name, exc)

    def guard(self, name: str) -> BreakerGuard:
        """``with registry.guard(name):`` or ``@registry.guard(name)``.

        Raises (on entry): CircuitOpen, DependencyNotFound.
        """
        self._ops.entry(name)
        return BreakerGuard(self, name)

    def state(self, name: str) -> BreakerState:
        """The stored state (an OPEN breaker past its reset timeout is still OPEN)."""
        return self.state_info(name).state

    def state_info(self, name: str) -> BreakerInfo:
        """The stored state plus what a call would get now (one round trip)."""
        return self._ops.decode_read(name, self.store.run(self._ops.read(name)))

    def all_states(self) -> dict[str, BreakerState]:
        """The state of every configured breaker (one round trip)."""
        names = self._ops.names()
        if not names:
            return {}
        replies = self.store.run_many([self._ops.read(n) for n in names])
        return {n: self._ops.decode_read(n, r).state for n, r in zip(names, replies, strict=True)}

    def force_open(self, name: str) -> None:
        """Open the breaker now (reset timer restarted, probes in flight dropped)."""
        self._forget(name)
        transition = self._ops.decode_force(name, self.store.run(self._ops.force(name, "open")))
        if transition is not None:
            self.fire_transition(transition)

    def force_close(self, name: str) -> None:
        """Close the breaker and reset everything (window, probes, reporters)."""
        self._forget(name)
        transition = self._ops.decode_force(name, self.store.run(self._ops.force(name, "close")))
        if transition is not None:
            self.fire_transition(transition)

    def transitions(self, name: str, limit: int = 100) -> list[StateTransition]:
        """The newest ``limit`` transitions of ``name`` from its events stream, oldest first.

        Every replica's transitions are there (``replica_id`` says whose).
        """
        self._ops.entry(name)
        reply = self.store.command(*self._ops.events_command(name, limit))
        return self._ops.decode_events(name, reply)

    def stored_names(self) -> set[str]:
        """Every breaker name any process of this namespace has used."""
        reply = self.store.command("SMEMBERS", self.store.keys.breaker_names())
        return self._ops.decode_names(reply)


class AsyncCircuitBreakerRegistry(_RegistryCore):
    """The asyncio twin of :class:`CircuitBreakerRegistry` (same methods, awaited).

    ``upsert_config``, ``get_config``, ``names`` and ``on_transition`` are plain
    methods (no I/O); callbacks are plain functions.
    """

    def __init__(
        self,
        store: AsyncStore,
        configs: Iterable[CircuitBreakerConfig] | None = None,
        *,
        replica_id: str | None = None,
        events_maxlen: int = 1000,
        cached_admission_seconds: float = DEFAULT_CACHED_ADMISSION_SECONDS,
    ) -> None:
        super().__init__(
            store.keys, configs, replica_id, events_maxlen, cached_admission_seconds
        )
        self.store = store

    async def before_call(self, name: str) -> Permit:
        """See :meth:`CircuitBreakerRegistry.before_call`."""
        self._ops.entry(name)  # DependencyNotFound before any I/O
        registration = self.registration_call(name)
        if registration is not None:
            await self.store.run(registration)
            self.mark_registered(name)
        if (cached := self._cached(name)) is not None:
            return cached
        call = self._admission(name)
        try:
            reply = await self.store.run(call)
        except Exception:
            raise  # (see CircuitBreakerRegistry.before_call)
        except BaseException:  # cancelled: the admission may have landed
            with contextlib.suppress(Exception):
                await self.store.run(self._interrupted_admission(name, call))
            raise
        return self._admit(name, reply)

    async def after_call(
        self,
        name: str,
        success: bool,
        permit: Permit | None = None,
        duration_ms: float | None = None,
    ) -> bool:
        """See :meth:`CircuitBreakerRegistry.after_call`."""
        call = self._ops.after_call(name, success, permit, duration_ms)
        return self._reported(name, permit, await self.store.run(call), duration_ms)

    async def release(self, name: str, permit: Permit) -> bool:
        """See :meth:`CircuitBreakerRegistry.release`."""
        reply = await self.store.run(self._ops.release(name, permit))
        return self._ops.decode_after(name, reply)[0]

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
        permit = await self.before_call(name)
        start = perf_counter()
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            await self._finish(name, permit, type(exc), start)
            raise
        await self._finish(name, permit, None, start)
        return result

    async def _finish(
        self, name: str, permit: Permit, exc_type: type[BaseException] | None, start: float
    ) -> None:
        took_ms = (perf_counter() - start) * 1000.0
        call = self._ops.report(name, outcome_code(exc_type), permit, took_ms)
        try:
            self._reported(name, permit, await self.store.run(call), took_ms)
        except DurabilisError as exc:
            self._forget(name)
            self._report_failed(name, exc)

    def guard(self, name: str) -> AsyncBreakerGuard:
        """``async with registry.guard(name):`` or ``@registry.guard(name)`` on ``async def``."""
        self._ops.entry(name)
        return AsyncBreakerGuard(self, name)

    async def state(self, name: str) -> BreakerState:
        """See :meth:`CircuitBreakerRegistry.state`."""
        return (await self.state_info(name)).state

    async def state_info(self, name: str) -> BreakerInfo:
        """See :meth:`CircuitBreakerRegistry.state_info`."""
        return self._ops.decode_read(name, await self.store.run(self._ops.read(name)))

    async def all_states(self) -> dict[str, BreakerState]:
        """See :meth:`CircuitBreakerRegistry.all_states`."""
        names = self._ops.names()
        if not names:
            return {}
        replies = await self.store.run_many([self._ops.read(n) for n in names])
        return {n: self._ops.decode_read(n, r).state for n, r in zip(names, replies, strict=True)}

    async def force_open(self, name: str) -> None:
        """See :meth:`CircuitBreakerRegistry.force_open`."""
        self._forget(name)
        reply = await self.store.run(self._ops.force(name, "open"))
        transition = self._ops.decode_force(name, reply)
        if transition is not None:
            self.fire_transition(transition)

    async def force_close(self, name: str) -> None:
        """See :meth:`CircuitBreakerRegistry.force_close`."""
        self._forget(name)
        reply = await self.store.run(self._ops.force(name, "close"))
        transition = self._ops.decode_force(name, reply)
        if transition is not None:
            self.fire_transition(transition)

    async def transitions(self, name: str, limit: int = 100) -> list[StateTransition]:
        """See :meth:`CircuitBreakerRegistry.transitions`."""
        self._ops.entry(name)
        reply = await self.store.command(*self._ops.events_command(name, limit))
        return self._ops.decode_events(name, reply)

    async def stored_names(self) -> set[str]:
        """See :meth:`CircuitBreakerRegistry.stored_names`."""
        reply = await self.store.command("SMEMBERS", self.store.keys.breaker_names())
        return self._ops.decode_names(reply)


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
