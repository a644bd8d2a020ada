"""The circuit breaker's script calls and reply decoders (no I/O).

:class:`BreakerOps` builds each script call (which script, KEYS, ARGV) and
decodes its reply; :func:`admission` is the rule ``cb_before.lua`` applies,
for reads that say what a call would get.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durabilis import _codec
from durabilis._scripts import Arg, ScriptCall
from durabilis.core.breaker.types import (
    STATE_CODES,
    STATE_NAMES,
    BreakerInfo,
    BreakerState,
    CircuitBreakerConfig,
    Permit,
    StateTransition,
)
from durabilis.errors import CircuitOpen, CorruptData, DependencyNotFound

if TYPE_CHECKING:
    from durabilis._keys import KeySpace

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
class BreakerEntry:
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


def ms(seconds: float) -> int:
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


class BreakerOps:
    """Builds each script call and decodes its reply; shared by both twins.

    The composed layer pipelines :meth:`before_call` / :meth:`after_call` with
    other pillars' scripts and decodes with :meth:`decode_before` /
    :meth:`decode_after`; the transition they return must be passed to the
    registry's :meth:`~CircuitBreakerRegistry.fire_transition`.
    """

    __slots__ = (
        "_checked", "_clock", "_entries", "_permits", "events_maxlen", "keys", "replica_id",
    )

    def __init__(
        self,
        keys: KeySpace,
        replica_id: str,
        events_maxlen: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: monotonic seconds (when to ask the script for a TTL check)."""
        self._clock = clock
        self.keys = keys
        self.replica_id = replica_id
        self.events_maxlen = events_maxlen
        self._entries: dict[str, BreakerEntry] = {}
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
        reset_ms = ms(config.reset_timeout_seconds)
        ttl_ms = ms(config.idle_ttl_seconds)
        window_ms = ms(config.window_seconds) if config.window_seconds is not None else 0
        slow_ms = -1.0 if config.slow_call_duration_ms is None else config.slow_call_duration_ms
        # The hot scripts get their config as ONE pre-encoded argument: redis-py
        # encodes every argument on every call, and these never change.
        before_config = "|".join(
            str(x)
            for x in (
                reset_ms,
                config.probe_success_required,
                ms(config.probe_timeout_seconds),
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
                ms(config.probe_timeout_seconds),
                self.replica_id,  # last: it may contain "|"
            )
        ).encode()
        bkeys = tuple(key.encode() for key in keys)
        self._entries[name] = BreakerEntry(
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

    def entry(self, name: str) -> BreakerEntry:
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
        check_probe_id(probe_id)
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
        self, name: str, success: bool, permit: Permit | None = None,
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
        check_probe_id(probe_id)
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
        now = self._clock()
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
            st = STATE_CODES[_text(reply[1])]
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
                        from_state=STATE_NAMES[f["from"]],
                        to_state=STATE_NAMES[f["to"]],
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
            from_state=STATE_CODES[t[0]],
            to_state=STATE_CODES[t[1]],
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


def check_probe_id(probe_id: Any) -> None:
    """Check a caller-chosen probe id (see :meth:`BreakerOps.before_call`).

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
        left = min(opened_at_ms, now_ms) + ms(config.reset_timeout_seconds) - now_ms
        return (True, True, 0) if left <= 0 else (False, False, left)
    if probes_in_flight < config.probe_success_required:
        return True, True, 0
    left = min(newest_probe_ms, now_ms) + ms(config.probe_timeout_seconds) - now_ms
    return (True, True, 0) if left <= 0 else (False, False, left)

