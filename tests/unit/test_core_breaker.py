"""The breaker's core, tested the h11 way: scripted replies in, steps and results out.

No server and no store: each plan is stepped by hand (``answered``), so what
it sends (which script, KEYS, ARGV) and what it makes of each reply is
asserted directly.
"""

from __future__ import annotations

from typing import Any

import pytest

from durabilis._keys import KeySpace
from durabilis._scripts import ScriptCall
from durabilis.core.breaker import (
    BreakerBook,
    BreakerInfo,
    BreakerState,
    CircuitBreakerConfig,
    Permit,
    StateTransition,
)
from durabilis.core.steps import Command, answered
from durabilis.errors import CircuitOpen, CorruptData, StorageUnavailable

NOW_MS = 1_700_000_000_000


class Events:
    """A :class:`~durabilis.core.steps.Log` that keeps what it was told."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, Any]]] = []

    def _keep(self, level: str, event: str, fields: dict[str, Any]) -> None:
        self.seen.append((level, event, fields))

    def debug(self, event: str, **fields: Any) -> None:
        self._keep("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._keep("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._keep("warning", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._keep("exception", event, fields)

    def names(self) -> list[str]:
        return [event for _, event, _ in self.seen]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def book(
    *, cache: float = 1.0, clock: Clock | None = None, log: Events | None = None
) -> BreakerBook:
    return BreakerBook(
        KeySpace("unit"), [CircuitBreakerConfig("dep")], "r1", 1000, cache,
        clock=clock or Clock(), log=log,
    )


def registered(b: BreakerBook) -> BreakerBook:
    b.mark_registered("dep")  # (the index registration is its own step, tested once)
    return b


def transition(frm: bytes, to: bytes, reason: bytes, gen: int, failures: int = 0,
               requests: int = 0) -> list[Any]:
    """A transition as the scripts report it (see ``BreakerOps._transition``)."""
    return [frm, to, NOW_MS, failures, requests, 0, reason, gen, b"1700000000000-0"]


# --- the core does no I/O -----------------------------------------------------------


# --- admission -------------------------------------------------------------------------


def test_the_first_admission_registers_the_name_then_asks_cb_before_with_its_own_probe_id() -> (
    None
):
    b = book()
    steps, permit = answered(b.before_call_plan("dep"), [1, 7])
    register, before = steps
    assert isinstance(register, ScriptCall) and register.name == "cb_register"
    assert register.keys == (KeySpace("unit").breaker_names(),)
    assert register.args == ("dep",)
    assert isinstance(before, ScriptCall) and before.name == "cb_before"
    k = KeySpace("unit")
    assert before.keys == tuple(
        key.encode() for key in (k.breaker("dep"), k.breaker_probes("dep"), k.breaker_events("dep"))
    )
    probe_id = before.args[1]
    assert isinstance(probe_id, str) and len(probe_id) == 16  # a fresh id of its own
    assert permit == Permit("dep", 7)  # CLOSED: the bare generation
    # registered once: the next admission asks cb_before only
    steps, _ = answered(book(cache=0).before_call_plan("dep"), [1, 7])
    assert len(steps) == 2
    assert b.registration_call("dep") is None


def test_a_closed_admission_is_cached_and_the_next_call_yields_no_step() -> None:
    clock = Clock()
    b = registered(book(clock=clock))
    _, first = answered(b.before_call_plan("dep"), [7])
    steps, again = answered(b.before_call_plan("dep"), [])
    assert steps == [] and again is first
    clock.now += 1.0  # cached_admission_seconds later: Redis is asked again
    steps, _ = answered(b.before_call_plan("dep"), [7])
    assert [s.name for s in steps] == ["cb_before"]


def test_an_open_breaker_refuses_with_retry_after_and_ends_the_cache() -> None:
    b = registered(book())
    answered(b.before_call_plan("dep"), [7])
    assert b.cached("dep") is not None
    b.forget("dep")
    with pytest.raises(CircuitOpen) as refused:
        answered(b.before_call_plan("dep"), [[b"open", 8, 1500]])
    assert refused.value.retry_after == 1.5
    assert b.cached("dep") is None


def test_a_half_open_admission_is_a_probe_fires_its_transition_and_is_never_cached() -> None:
    b = registered(book())
    fired: list[StateTransition] = []
    b.on_transition(fired.append)
    reply = [b"ok", 9, b"p1", 0, 0, transition(b"O", b"H", b"reset_timeout", 9)]
    _, permit = answered(b.before_call_plan("dep"), [reply])
    assert permit == Permit("dep", 9, "p1") and permit.is_probe
    (t,) = fired
    assert (t.from_state, t.to_state, t.reason, t.generation) == (
        BreakerState.OPEN, BreakerState.HALF_OPEN, "reset_timeout", 9,
    )
    assert t.replica_id == "r1" and t.reset_timeout_seconds == 30
    assert b.cached("dep") is None


def test_a_rearmed_probe_is_logged() -> None:
    log = Events()
    b = registered(book(log=log))
    _, permit = answered(b.before_call_plan("dep"), [[b"ok", 9, b"p1", 0, 1]])
    assert permit.rearmed
    assert log.names() == ["durability_circuit_probes_rearmed"]


def test_an_admission_interrupted_in_flight_frees_the_probe_slot_it_may_have_taken() -> None:
    b = registered(book())
    plan = b.before_call_plan("dep")
    before = next(plan)
    release = plan.throw(KeyboardInterrupt())
    assert isinstance(release, ScriptCall) and release.name == "cb_after"
    assert release.args[1] == f"|{before.args[1]}|r|-1|0"  # that very probe id
    with pytest.raises(KeyboardInterrupt):
        plan.send([b"released"])


def test_a_release_that_fails_after_an_interruption_still_re_raises_the_interruption() -> None:
    plan = registered(book()).before_call_plan("dep")
    next(plan)
    plan.throw(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        plan.throw(StorageUnavailable("down"))


def test_a_storage_error_during_admission_propagates_without_a_release() -> None:
    plan = registered(book()).before_call_plan("dep")
    next(plan)
    with pytest.raises(StorageUnavailable):
        plan.throw(StorageUnavailable("down"))


def test_foreign_data_at_the_breaker_key_is_corrupt_data() -> None:
    with pytest.raises(CorruptData):
        answered(registered(book()).before_call_plan("dep"), [[b"corrupt", 1, b"WRONGTYPE"]])


# --- reports ---------------------------------------------------------------------------


def test_a_counted_success_confirms_the_closed_generation_in_the_cache() -> None:
    b = registered(book())
    steps, counted = answered(b.after_call_plan("dep", True, Permit("dep", 3), 5.0), [1])
    (report,) = steps
    assert report.name == "cb_after"
    assert report.args[1] == "3||s|5.000|1"  # the first report asks for a TTL check
    assert counted is True
    assert b.cached("dep") == Permit("dep", 3)


def test_a_failure_that_trips_the_breaker_fires_closed_to_open_and_ends_the_cache() -> None:
    b = registered(book())
    answered(b.before_call_plan("dep"), [3])
    fired: list[StateTransition] = []
    b.on_transition(fired.append)
    trip = transition(b"C", b"O", b"failure_rate", 4, failures=6, requests=10)
    _, counted = answered(
        b.after_call_plan("dep", False, Permit("dep", 3), None), [[b"counted", 0, 0, trip]]
    )
    assert counted is True
    (t,) = fired
    assert (t.from_state, t.to_state, t.failure_rate, t.request_count) == (
        BreakerState.CLOSED, BreakerState.OPEN, 0.6, 10,
    )
    assert b.cached("dep") is None


def test_a_stale_report_does_not_count() -> None:
    b = registered(book())
    _, counted = answered(b.after_call_plan("dep", True, Permit("dep", 1), None), [[b"stale"]])
    assert counted is False


def test_a_probe_success_that_closes_the_breaker_fires_half_open_to_closed() -> None:
    b = registered(book())
    fired: list[StateTransition] = []
    b.on_transition(fired.append)
    close = transition(b"H", b"C", b"probes_succeeded", 10, requests=2)
    steps, counted = answered(
        b.after_call_plan("dep", True, Permit("dep", 9, "p1"), 12.0),
        [[b"counted", 0, 0, close]],
    )
    assert steps[0].args[1].startswith("9|p1|s|12.000|")  # a probe: never the plain path
    assert counted is True
    assert [(t.from_state, t.to_state) for t in fired] == [
        (BreakerState.HALF_OPEN, BreakerState.CLOSED)
    ]


def test_a_probe_not_credited_for_being_too_slow_is_logged_with_the_setting_to_raise() -> None:
    log = Events()
    b = registered(book(log=log))
    _, counted = answered(
        b.after_call_plan("dep", True, Permit("dep", 9, "p1"), 31_000.0), [[b"ignored"]]
    )
    assert counted is False
    assert log.names() == ["durability_circuit_probe_too_slow"]


def test_a_report_without_a_permit_ends_the_cache() -> None:
    b = registered(book())
    answered(b.before_call_plan("dep"), [3])
    answered(b.after_call_plan("dep", True, None, None), [1])
    assert b.cached("dep") is None


def test_finishing_a_guarded_call_logs_a_report_that_fails_and_never_raises_it() -> None:
    log = Events()
    b = registered(book(log=log))
    answered(b.before_call_plan("dep"), [3])
    plan = b.finish_plan("dep", Permit("dep", 3), ValueError, 4.0)
    report = next(plan)
    assert report.args[1].split("|")[2] == "f"  # an Exception is a failure
    with pytest.raises(StopIteration):
        plan.throw(StorageUnavailable("down"))
    assert log.names() == ["durability_breaker_report_failed"]
    assert b.cached("dep") is None


def test_finishing_an_interrupted_call_releases_the_slot_without_a_result() -> None:
    steps, _ = answered(
        registered(book()).finish_plan("dep", Permit("dep", 9, "p1"), KeyboardInterrupt, 1.0),
        [[b"released"]],
    )
    assert steps[0].args[1] == "9|p1|r|1.000|1"


def test_release_frees_the_permits_probe_slot() -> None:
    steps, freed = answered(
        registered(book()).release_plan("dep", Permit("dep", 9, "p1")), [[b"released"]]
    )
    assert steps[0].args[1].startswith("9|p1|r|")
    assert freed is True


# --- operator actions and reads ----------------------------------------------------------


def test_force_open_fires_the_transition_it_made_and_forgets_the_cache() -> None:
    b = registered(book())
    answered(b.before_call_plan("dep"), [3])
    fired: list[StateTransition] = []
    b.on_transition(fired.append)
    steps, _ = answered(
        b.force_plan("dep", "open"), [[b"ok", 0, 0, transition(b"C", b"O", b"forced", 4)]]
    )
    assert steps[0].name == "cb_force" and steps[0].args[0] == "open"
    assert [t.reason for t in fired] == ["forced"]
    assert b.cached("dep") is None


def test_state_info_decodes_an_open_breaker_and_says_when_a_call_is_admitted() -> None:
    reply = [b"info", b"O", 4, NOW_MS - 10_000, 0, 0, 0, NOW_MS, 10, 6, 0, 2]
    steps, info = answered(registered(book()).state_info_plan("dep"), [reply])
    assert steps[0].name == "cb_read"
    assert isinstance(info, BreakerInfo)
    assert (info.state, info.call_allowed, info.retry_after) == (BreakerState.OPEN, False, 20.0)
    assert (info.failure_rate, info.failure_reporters) == (0.6, 2)
    _, state = answered(registered(book()).state_plan("dep"), [reply])
    assert state is BreakerState.OPEN


def test_transitions_and_stored_names_are_plain_read_commands_naming_their_key() -> None:
    b = registered(book())
    steps, events = answered(b.transitions_plan("dep", 5), [[]])
    (read,) = steps
    assert isinstance(read, Command)
    assert read.args == ("XREVRANGE", read.key, "+", "-", "COUNT", 5)
    assert read.key == KeySpace("unit").breaker_events("dep")
    assert events == []
    steps, names = answered(b.stored_names_plan(), [[b"dep", b"other"]])
    assert steps == [Command(("SMEMBERS", KeySpace("unit").breaker_names()), steps[0].key)]
    assert names == {"dep", "other"}


def test_all_states_reads_every_breaker_in_one_batch() -> None:
    b = registered(book())
    names, calls = b.read_calls()
    assert names == ["dep"] and [c.name for c in calls] == ["cb_read"]
    reply = [b"info", b"C", 1, 0, 0, 0, 0, NOW_MS, 0, 0, 0, 0]
    assert b.decode_states(names, [reply]) == {"dep": BreakerState.CLOSED}
