"""The circuit breaker's types: configs and the values it hands out (no I/O)."""

from __future__ import annotations

import math
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from durabilis._limits import check_limits
from durabilis.errors import ConfigError

__all__ = [  # what durabilis.core.breaker and durabilis.breaker re-export (one star import)
    "DEFAULT_BREAKER_CONFIGS",
    "BreakerInfo",
    "BreakerState",
    "CircuitBreakerConfig",
    "Permit",
    "StateTransition",
    "TransitionCallback",
    "default_breaker_configs",
    "default_replica_id",
]


class BreakerState(str, Enum):
    """The three states of a breaker (the value is the readable name)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


STATE_CODES: dict[Any, BreakerState] = {}
for _code, _state in (("C", BreakerState.CLOSED), ("O", BreakerState.OPEN),
                      ("H", BreakerState.HALF_OPEN)):
    STATE_CODES[_code] = _state
    STATE_CODES[_code.encode()] = _state
STATE_NAMES = {s.value: s for s in BreakerState}


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
MAX_COUNT = 10**9


def valid_text(name: str, value: str) -> None:
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
        valid_text("name", self.name)
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

