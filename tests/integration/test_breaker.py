"""The circuit breaker against a real Redis: seed behaviours, fixes and extensions."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

import durabilis
from durabilis.breaker import (
    AsyncCircuitBreakerRegistry,
    BreakerState,
    CircuitBreakerConfig,
    CircuitBreakerRegistry,
    Permit,
    StateTransition,
)
from durabilis.idempotency import IdempotencyConfig, IdempotencyKey, _IdemOps
from durabilis.testing import offset_server_clock
from tests.support.logs import own_logs

pytestmark = pytest.mark.topologies("cluster")

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN
RESET = 1.0  # seconds: every timeout in these tests is the shortest the config allows


def cfg(name: str = "dep", **overrides: Any) -> CircuitBreakerConfig:
    fields: dict[str, Any] = {
        "failure_rate_threshold": 0.5,
        "min_request_count": 4,
        "window_size": 4,
        "reset_timeout_seconds": RESET,
        "probe_success_required": 2,
        "probe_timeout_seconds": RESET,
    }
    fields.update(overrides)
    return CircuitBreakerConfig(name, **fields)


def make(store: durabilis.Store, *configs: CircuitBreakerConfig, replica: str = "r1") -> (
    CircuitBreakerRegistry
):
    return CircuitBreakerRegistry(store, list(configs) or [cfg()], replica_id=replica)


def report(registry: CircuitBreakerRegistry, results: str, name: str = "dep") -> None:
    """One admitted call per letter: S succeeds, F fails."""
    for letter in results:
        permit = registry.before_call(name)
        registry.after_call(name, letter == "S", permit)


def trip(registry: CircuitBreakerRegistry, name: str = "dep") -> None:
    report(registry, "FFFF", name)
    assert registry.state(name) is OPEN


def wait_reset() -> None:
    time.sleep(RESET + 0.05)


def stepped_clock(store: durabilis.Store) -> str:
    """The key whose value (microseconds) offsets the server clock the
    breaker's scripts read (standalone only)."""
    clock = f"{store.namespace}:clock"
    offset_server_clock(store, clock)
    return clock


def half_open(registry: CircuitBreakerRegistry, name: str = "dep") -> Permit:
    trip(registry, name)
    wait_reset()
    return registry.before_call(name)


# --- Must show 1: the seed's behaviours ---------------------------------------


def test_trips_only_when_the_failure_rate_is_strictly_above_the_threshold(
    store: durabilis.Store,
) -> None:
    registry = make(store)
    seen: list[StateTransition] = []
    registry.on_transition(seen.append)
    report(registry, "SSFF")  # 2 of 4 = 0.5: equal does not trip
    assert registry.state("dep") is CLOSED
    assert registry.state_info("dep").failure_rate == 0.5
    report(registry, "F")  # window S F F F = 0.75
    assert registry.state("dep") is OPEN
    assert len(seen) == 1
    t = seen[0]
    assert (t.from_state, t.to_state, t.reason) == (CLOSED, OPEN, "failure_rate")
    assert (t.failure_rate, t.request_count, t.failure_count) == (0.75, 4, 3)
    assert t.reset_timeout_seconds == RESET
    assert t.replica_id == "r1"


def test_stays_closed_below_min_request_count_whatever_the_rate(store: durabilis.Store) -> None:
    registry = make(store, cfg(min_request_count=4, window_size=10))
    report(registry, "FFF")
    info = registry.state_info("dep")
    assert info.state is CLOSED
    assert (info.request_count, info.failure_count, info.failure_rate) == (3, 3, None)
    report(registry, "F")
    assert registry.state("dep") is OPEN


def test_open_rejects_with_retry_after_until_the_reset_timeout(store: durabilis.Store) -> None:
    registry = make(store)
    trip(registry)
    with pytest.raises(durabilis.CircuitOpen) as raised:
        registry.before_call("dep")
    assert raised.value.dependency == "dep"
    assert 0 < raised.value.retry_after <= RESET


def test_an_open_breaker_past_its_reset_timeout_is_still_open_but_admits_a_probe(
    store: durabilis.Store,
) -> None:
    registry = make(store)
    trip(registry)
    info = registry.state_info("dep")
    assert (info.state, info.call_allowed, info.probe_allowed) == (OPEN, False, False)
    assert info.opened_at is not None and info.retry_after > 0
    wait_reset()
    assert registry.state("dep") is OPEN  # the stored truth: nothing turned it yet
    info = registry.state_info("dep")
    assert (info.call_allowed, info.probe_allowed, info.retry_after) == (True, True, 0.0)
    seen: list[StateTransition] = []
    registry.on_transition(seen.append)
    permit = registry.before_call("dep")  # the first caller is the first probe
    assert permit.is_probe
    assert registry.state("dep") is HALF_OPEN
    assert [(t.from_state, t.to_state, t.reason) for t in seen] == [
        (OPEN, HALF_OPEN, "reset_timeout")
    ]


def test_half_open_admits_at_most_probe_success_required_probes(store: durabilis.Store) -> None:
    registry = make(store, cfg(probe_success_required=2))
    first = half_open(registry)
    second = registry.before_call("dep")
    assert first.is_probe and second.is_probe and first.probe_id != second.probe_id
    with pytest.raises(durabilis.CircuitOpen) as raised:
        registry.before_call("dep")
    assert 0 < raised.value.retry_after <= RESET
    info = registry.state_info("dep")
    assert (info.state, info.probes_in_flight, info.call_allowed) == (HALF_OPEN, 2, False)


def test_probe_success_required_successes_close_it_with_an_empty_window(
    store: durabilis.Store,
) -> None:
    registry = make(store)
    seen: list[StateTransition] = []
    first = half_open(registry)
    second = registry.before_call("dep")
    registry.on_transition(seen.append)
    assert registry.after_call("dep", True, first)
    assert registry.state("dep") is HALF_OPEN
    assert registry.state_info("dep").probe_successes == 1
    assert registry.after_call("dep", True, second)
    info = registry.state_info("dep")
    assert (info.state, info.request_count, info.probes_in_flight) == (CLOSED, 0, 0)
    assert [(t.from_state, t.to_state, t.reason) for t in seen] == [
        (HALF_OPEN, CLOSED, "probes_succeeded")
    ]
    assert not registry.before_call("dep").is_probe


def test_a_probe_failure_reopens_and_restarts_the_reset_timer(store: durabilis.Store) -> None:
    registry = make(store)
    first = half_open(registry)
    second = registry.before_call("dep")
    opened_before = registry.state_info("dep").opened_at
    assert registry.after_call("dep", False, first)
    info = registry.state_info("dep")
    assert info.state is OPEN
    assert opened_before is not None and info.opened_at is not None
    assert info.opened_at > opened_before
    assert info.retry_after > RESET - 0.3  # the timer restarted
    # The other probe of that round reports late: it counts for nothing.
    assert not registry.after_call("dep", True, second)
    assert registry.state("dep") is OPEN


def test_stray_reports_with_no_probe_in_flight_are_ignored(store: durabilis.Store) -> None:
    registry = make(store)
    first = half_open(registry)
    registry.after_call("dep", True, first)  # one success, no probe in flight now
    assert not registry.after_call("dep", True)
    assert not registry.after_call("dep", False)
    info = registry.state_info("dep")
    assert (info.state, info.probe_successes, info.probes_in_flight) == (HALF_OPEN, 1, 0)
    registry.force_open("dep")
    opened_at = registry.state_info("dep").opened_at
    assert not registry.after_call("dep", False)
    assert not registry.after_call("dep", True)
    info = registry.state_info("dep")
    assert (info.state, info.opened_at) == (OPEN, opened_at)


def test_a_stuck_probe_is_rearmed_after_probe_timeout_and_its_late_report_is_not_credited(
    store: durabilis.Store,
) -> None:
    registry = make(store, cfg(probe_success_required=1))
    stuck = half_open(registry)
    with pytest.raises(durabilis.CircuitOpen) as raised:
        registry.before_call("dep")
    assert 0 < raised.value.retry_after <= RESET
    time.sleep(RESET + 0.05)
    fresh = registry.before_call("dep")
    assert fresh.is_probe and fresh.rearmed and fresh.probe_id != stuck.probe_id
    # The abandoned probe finally answers: it must not close the breaker for the new one.
    assert not registry.after_call("dep", True, stuck)
    info = registry.state_info("dep")
    assert (info.state, info.probes_in_flight, info.probe_successes) == (HALF_OPEN, 1, 0)
    assert registry.after_call("dep", True, fresh)
    assert registry.state("dep") is CLOSED


def test_upsert_config_applies_at_the_next_report(store: durabilis.Store) -> None:
    registry = make(store, cfg(failure_rate_threshold=0.9))
    report(registry, "SFFF")
    assert registry.state("dep") is CLOSED
    registry.upsert_config(cfg(failure_rate_threshold=0.5))
    report(registry, "F")  # F F F F under the new threshold
    assert registry.state("dep") is OPEN
    registry.upsert_config(cfg(failure_rate_threshold=0.5, reset_timeout_seconds=30))
    with pytest.raises(durabilis.CircuitOpen):
        registry.before_call("dep")


def test_a_success_report_re_evaluates_the_rate_with_the_current_config(
    store: durabilis.Store,
) -> None:
    registry = make(store, cfg(failure_rate_threshold=0.9, window_size=5))
    report(registry, "FFFS")  # 0.75, under 0.9
    registry.upsert_config(cfg(failure_rate_threshold=0.5, window_size=5))
    report(registry, "S")  # F F F S S = 0.6 > 0.5: a success trips it
    assert registry.state("dep") is OPEN


def test_dependencies_are_independent(store: durabilis.Store) -> None:
    registry = make(store, cfg("a"), cfg("b"))
    trip(registry, "a")
    assert registry.state("b") is CLOSED
    report(registry, "SS", "b")
    assert registry.state_info("b").request_count == 2
    assert registry.all_states() == {"a": OPEN, "b": CLOSED}


def test_force_open_and_force_close_reset_everything(store: durabilis.Store) -> None:
    registry = make(store)
    seen: list[StateTransition] = []
    registry.on_transition(seen.append)
    report(registry, "SF")
    before = registry.before_call("dep")
    registry.force_open("dep")
    with pytest.raises(durabilis.CircuitOpen):
        registry.before_call("dep")
    registry.force_close("dep")
    info = registry.state_info("dep")
    assert (info.state, info.request_count, info.probes_in_flight) == (CLOSED, 0, 0)
    assert not registry.after_call("dep", False, before)  # from before the reset
    assert registry.state_info("dep").request_count == 0
    assert [(t.from_state, t.to_state, t.reason) for t in seen] == [
        (CLOSED, OPEN, "forced"),
        (OPEN, CLOSED, "forced"),
    ]


def test_force_close_of_a_half_open_breaker_drops_its_probes(store: durabilis.Store) -> None:
    registry = make(store)
    probe = half_open(registry)
    registry.force_close("dep")
    assert not registry.after_call("dep", False, probe)
    report(registry, "S")
    info = registry.state_info("dep")
    assert (info.state, info.request_count, info.failure_count) == (CLOSED, 1, 0)


def test_callbacks_fire_once_in_the_process_that_made_the_transition(
    store: durabilis.Store, redis_url: str, namespace: str
) -> None:
    here = make(store, replica="here")
    other_store = durabilis.connect(redis_url, namespace=namespace)
    try:
        there = make(other_store, replica="there")
        fired_here: list[StateTransition] = []
        fired_there: list[StateTransition] = []
        here.on_transition(fired_here.append)
        there.on_transition(fired_there.append)
        report(here, "FF")
        report(there, "FF")  # this report trips it
        assert [t.replica_id for t in fired_there] == ["there"]
        assert fired_here == []
        # ...and every replica can read it from the breaker's events stream.
        (event,) = here.transitions("dep")
        assert (event.from_state, event.to_state, event.replica_id) == (CLOSED, OPEN, "there")
        assert (event.failure_rate, event.request_count) == (1.0, 4)
        assert event.event_id == fired_there[0].event_id
        assert event.at == fired_there[0].at
    finally:
        other_store.close()


def test_a_raising_callback_is_logged_never_raised_and_others_still_run(
    store: durabilis.Store,
) -> None:
    registry = make(store)
    seen: list[StateTransition] = []

    def broken(t: StateTransition) -> None:
        raise RuntimeError("callback bug")

    registry.on_transition(broken)
    registry.on_transition(seen.append)
    with own_logs() as logs:
        trip(registry)  # no exception reaches the caller
    assert len(seen) == 1
    failures = [e for e in logs if e["event"] == "durability_transition_callback_failed"]
    assert len(failures) == 1 and failures[0]["dependency"] == "dep"


def test_structlog_events_for_opened_and_recovered(store: durabilis.Store) -> None:
    registry = make(store, cfg(probe_success_required=1))
    with own_logs() as logs:
        probe = half_open(registry)
        registry.after_call("dep", True, probe)
    events = {e["event"]: e for e in logs}
    opened = events["durability_circuit_opened"]
    assert (opened["dependency"], opened["failure_rate"], opened["request_count"]) == (
        "dep",
        1.0,
        4,
    )
    assert opened["log_level"] == "warning"
    assert events["durability_circuit_recovered"]["dependency"] == "dep"
    assert events["durability_circuit_half_open"]["reason"] == "reset_timeout"


# --- fixes of the seed ----------------------------------------------------------


def test_reports_from_an_earlier_generation_never_enter_the_window(
    store: durabilis.Store,
) -> None:
    registry = make(store, cfg(probe_success_required=1))
    old = [registry.before_call("dep") for _ in range(3)]  # admitted while CLOSED
    probe = half_open(registry)
    registry.after_call("dep", True, probe)  # closed again: a new generation
    assert all(not registry.after_call("dep", False, p) for p in old)
    info = registry.state_info("dep")
    assert (info.state, info.request_count, info.failure_count) == (CLOSED, 0, 0)
    assert info.generation == old[0].generation + 3


def test_a_permit_of_another_dependency_is_refused_before_any_io(store: durabilis.Store) -> None:
    registry = make(store, cfg("a"), cfg("b"))
    permit = registry.before_call("a")
    with pytest.raises(ValueError, match="issued for 'a'"):
        registry.after_call("b", True, permit)


def test_unknown_dependency_raises_dependency_not_found(store: durabilis.Store) -> None:
    registry = make(store)
    for call in (
        lambda: registry.before_call("nope"),
        lambda: registry.after_call("nope", True),
        lambda: registry.state("nope"),
        lambda: registry.force_open("nope"),
        lambda: registry.guard("nope"),
    ):
        with pytest.raises(durabilis.errors.DependencyNotFound) as raised:
            call()
        assert raised.value.dependency == "nope"


# --- beyond the seed ------------------------------------------------------------


def test_time_based_window_forgets_results_older_than_window_seconds(
    store: durabilis.Store,
) -> None:
    registry = make(store, cfg(min_request_count=3, window_size=100, window_seconds=1))
    report(registry, "FF")
    time.sleep(1.1)
    assert registry.state_info("dep").request_count == 0
    report(registry, "F")  # F F F by count, but only one inside the last second
    info = registry.state_info("dep")
    assert (info.state, info.request_count) == (CLOSED, 1)
    report(registry, "FF")
    assert registry.state("dep") is OPEN


def test_slow_calls_trip_it_by_the_slow_call_rate(store: durabilis.Store) -> None:
    registry = make(
        store, cfg(slow_call_duration_ms=50, slow_call_rate_threshold=0.5, probe_success_required=1)
    )
    seen: list[StateTransition] = []
    registry.on_transition(seen.append)
    for duration in (100, 100, 10):
        permit = registry.before_call("dep")
        registry.after_call("dep", True, permit, duration_ms=duration)
    info = registry.state_info("dep")
    assert (info.state, info.slow_call_count, info.failure_count) == (CLOSED, 2, 0)
    registry.call("dep", time.sleep, 0.08)  # measured by the wrapper: slow
    assert registry.state("dep") is OPEN
    assert (seen[0].reason, seen[0].slow_call_count, seen[0].failure_rate) == (
        "slow_call_rate",
        3,
        0.0,
    )


def test_a_slow_probe_counts_as_a_failed_probe(store: durabilis.Store) -> None:
    config = cfg(slow_call_duration_ms=50, slow_call_rate_threshold=0.5, probe_success_required=1)
    registry = make(store, config)
    probe = half_open(registry)
    registry.after_call("dep", True, probe, duration_ms=80)
    assert registry.state("dep") is OPEN
    (reopened,) = [t for t in registry.transitions("dep") if t.from_state is HALF_OPEN]
    assert (reopened.reason, reopened.slow_call_count) == ("probe_failed", 1)


def test_min_distinct_reporters_needs_bad_results_from_that_many_replicas(
    store: durabilis.Store,
) -> None:
    config = cfg(min_request_count=4, window_size=8, min_distinct_reporters=2)
    alone = make(store, config, replica="broken-network")
    healthy = make(store, config, replica="healthy")
    report(alone, "FFFFFF")  # rate 1.0, but from one replica only
    assert alone.state("dep") is CLOSED
    assert alone.state_info("dep").failure_reporters == 1
    report(healthy, "F")
    assert alone.state("dep") is OPEN


def test_guard_as_context_manager_and_decorator_reports_outcomes(store: durabilis.Store) -> None:
    registry = make(store, cfg(window_size=10, min_request_count=10))
    with registry.guard("dep") as permit:
        assert permit.dependency == "dep"
    with pytest.raises(KeyError), registry.guard("dep"):
        raise KeyError("boom")

    @registry.guard("dep")
    def work(x: int) -> int:
        if x < 0:
            raise ValueError(x)
        return x * 2

    assert work(21) == 42
    with pytest.raises(ValueError):
        work(-1)
    assert registry.call("dep", lambda: "ok") == "ok"
    info = registry.state_info("dep")
    assert (info.request_count, info.failure_count) == (5, 2)


def test_an_interrupted_probe_frees_its_slot_without_a_result(store: durabilis.Store) -> None:
    class Interrupted(BaseException):
        pass

    registry = make(store, cfg(probe_success_required=1))
    trip(registry)
    wait_reset()
    with pytest.raises(Interrupted), registry.guard("dep") as permit:
        assert permit.is_probe
        raise Interrupted
    info = registry.state_info("dep")
    assert (info.state, info.probes_in_flight, info.probe_successes) == (HALF_OPEN, 0, 0)
    probe = registry.before_call("dep")  # the slot is free again at once
    assert registry.release("dep", probe)
    assert not registry.release("dep", probe)


def test_seed_api_reports_without_a_permit(store: durabilis.Store) -> None:
    registry = make(store, cfg(probe_success_required=1))
    for _ in range(4):
        registry.before_call("dep")
        registry.after_call("dep", False)  # counted in CLOSED
    assert registry.state("dep") is OPEN
    wait_reset()
    registry.before_call("dep")
    assert registry.after_call("dep", True)  # credits the probe in flight
    assert registry.state("dep") is CLOSED


def test_1000_replicas_reporting_into_a_20_result_window_leave_at_most_20_reporters(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    # threshold 1.0 never trips (the rate must be strictly above it): every report counts
    config = cfg(window_size=20, min_request_count=20, failure_rate_threshold=1.0,
                 min_distinct_reporters=3)
    reporters = store.keys.breaker_reporters("dep")
    largest = 0
    for i in range(1000):
        report(make(store, config, replica=f"replica-{i}"), "F" if i % 3 else "SF")
        largest = max(largest, raw.zcard(reporters))
    assert largest <= 20
    window = raw.zrange(store.keys.breaker_window("dep"), 0, -1, withscores=True)
    assert len(window) == 20
    bad_scores = {int(score) for member, score in window if not member.endswith(b"s")}
    kept = raw.zrange(reporters, 0, -1, withscores=True)
    assert {int(score) for _, score in kept} <= bad_scores  # only reporters still in the window
    assert len(kept) == len(bad_scores)
    assert registry_info(store, config).failure_reporters == len(kept)
    assert 0 < raw.pttl(reporters) <= 7 * 86400 * 1000


def registry_info(store: durabilis.Store, config: CircuitBreakerConfig) -> Any:
    return make(store, config, replica="reader").state_info("dep")


def test_reporters_leave_when_their_failures_leave_the_window(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    config = cfg(window_size=6, min_request_count=6, failure_rate_threshold=1.0)
    for name in ("a", "b", "c"):
        report(make(store, config, replica=name), "F")
    reporters = store.keys.breaker_reporters("dep")
    assert raw.zcard(reporters) == 3
    healthy = make(store, config, replica="healthy")
    report(healthy, "SSSS")  # a's failure leaves the window (6 results kept)
    assert sorted(raw.zrange(reporters, 0, -1)) == [b"b", b"c"]
    report(healthy, "SS")
    assert raw.zcard(reporters) == 0
    assert registry_info(store, config).failure_reporters == 0


def test_a_reporters_set_grown_before_the_trim_shrinks_by_at_most_window_size_plus_one(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    config = cfg(window_size=20, min_request_count=20, failure_rate_threshold=1.0)
    registry = make(store, config, replica="now")
    report(registry, "S")
    reporters = store.keys.breaker_reporters("dep")
    raw.zadd(reporters, {f"old-{i}": i for i in range(500)})  # an earlier version's leftovers
    report(registry, "F")
    assert raw.zcard(reporters) == 500 - 21 + 1
    report(registry, "F" * 30)
    assert raw.zcard(reporters) == 1
    assert registry.state_info("dep").failure_reporters == 1


def test_a_long_healthy_run_keeps_an_exact_window(store: durabilis.Store, raw: redis.Redis) -> None:
    registry = make(store, cfg(window_size=5, min_request_count=5, failure_rate_threshold=0.5))
    report(registry, "S" * 30)
    report(registry, "FF")
    info = registry.state_info("dep")
    assert (info.request_count, info.failure_count, info.state) == (5, 2, CLOSED)
    report(registry, "SSS")  # both failures still in the last five
    assert registry.state_info("dep").failure_count == 2
    report(registry, "SS")
    assert registry.state_info("dep").failure_count == 0
    assert raw.zcard(store.keys.breaker_window("dep")) == 5


# --- storage: keys, TTLs, foreign data -----------------------------------------


def test_every_breaker_key_has_a_ttl_and_the_layout_is_readable(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    registry = make(store)
    half_open(registry)
    keys = store.keys
    state, window = keys.breaker("dep"), keys.breaker_window("dep")
    probes, events = keys.breaker_probes("dep"), keys.breaker_events("dep")
    reporters = keys.breaker_reporters("dep")
    assert state == f"{store.namespace}:cb:{{dep}}"
    assert [raw.type(k) for k in (state, window, probes, events, reporters)] == [
        b"hash",
        b"zset",
        b"hash",
        b"stream",
        b"zset",
    ]
    for key in (state, window, probes, events, reporters):
        assert 0 < raw.pttl(key) <= 7 * 86400 * 1000, key
    assert raw.hget(state, "st") == b"H"
    assert registry.stored_names() == {"dep"}


@pytest.mark.parametrize(
    ("plant", "which"),
    [
        (lambda raw, k: raw.set(k.breaker("dep"), "x"), "breaker"),
        (lambda raw, k: raw.hset(k.breaker("dep"), mapping={"st": "Z", "g": 1}), "breaker"),
        (lambda raw, k: raw.hset(k.breaker("dep"), mapping={"st": "C", "g": "x"}), "breaker"),
    ],
)
def test_foreign_state_is_a_typed_error_naming_the_key(
    store: durabilis.Store, raw: redis.Redis, plant: Any, which: str
) -> None:
    registry = make(store)
    plant(raw, store.keys)
    key = getattr(store.keys, which)("dep")
    for call in (
        lambda: registry.before_call("dep"),
        lambda: registry.after_call("dep", True),
        lambda: registry.state_info("dep"),
        lambda: registry.force_close("dep"),
    ):
        with pytest.raises(durabilis.errors.CorruptData) as raised:
            call()
        assert raised.value.key == key


def test_a_foreign_window_or_events_key_is_named_in_the_error(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    registry = make(store)
    raw.set(store.keys.breaker_window("dep"), "not a zset")
    with pytest.raises(durabilis.errors.CorruptData) as raised:
        report(registry, "F")
    assert raised.value.key == store.keys.breaker_window("dep")
    raw.delete(store.keys.breaker_window("dep"))
    raw.set(store.keys.breaker_events("dep"), "not a stream")
    report(registry, "FFF")
    with pytest.raises(durabilis.errors.CorruptData) as raised:
        report(registry, "F")  # this one would trip: the transition needs the stream
    assert raised.value.key == store.keys.breaker_events("dep")
    assert registry.state("dep") is CLOSED


def test_default_registry_has_the_seed_breakers(store: durabilis.Store) -> None:
    registry = CircuitBreakerRegistry(store)
    assert sorted(registry.names()) == ["external_mcp_client", "memory_service", "wiki_service"]
    assert registry.all_states() == dict.fromkeys(registry.names(), CLOSED)
    assert CircuitBreakerRegistry(store, ()).all_states() == {}


# --- the async twin ---------------------------------------------------------------


def test_async_twin_trips_probes_and_recovers(redis_url: str, namespace: str) -> None:
    async def scenario() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            registry = AsyncCircuitBreakerRegistry(
                store, [cfg(probe_success_required=1)], replica_id="async"
            )
            seen: list[StateTransition] = []
            registry.on_transition(seen.append)

            async def failing() -> None:
                raise ConnectionError("down")

            for _ in range(4):
                with pytest.raises(ConnectionError):
                    await registry.call("dep", failing)
            assert await registry.state("dep") is OPEN
            with pytest.raises(durabilis.CircuitOpen):
                async with registry.guard("dep"):
                    pass
            await asyncio.sleep(RESET + 0.05)

            @registry.guard("dep")
            async def healthy(x: int) -> int:
                return x + 1

            assert await healthy(1) == 2  # the probe, which closes it
            info = await registry.state_info("dep")
            assert (info.state, info.request_count) == (CLOSED, 0)
            assert [(t.from_state, t.to_state) for t in seen] == [
                (CLOSED, OPEN),
                (OPEN, HALF_OPEN),
                (HALF_OPEN, CLOSED),
            ]
            assert len(await registry.transitions("dep")) == 3
            permit = await registry.before_call("dep")
            assert await registry.after_call("dep", True, permit)
            await registry.force_open("dep")
            assert await registry.all_states() == {"dep": OPEN}
            await registry.force_close("dep")
            assert await registry.stored_names() == {"dep"}
        finally:
            await store.close()

    asyncio.run(scenario())


def test_async_cancelled_probe_frees_its_slot(redis_url: str, namespace: str) -> None:
    async def scenario() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            registry = AsyncCircuitBreakerRegistry(store, [cfg(probe_success_required=1)])
            await registry.force_open("dep")
            await asyncio.sleep(RESET + 0.05)
            task = asyncio.ensure_future(registry.call("dep", asyncio.sleep, 10))
            await asyncio.sleep(0.2)
            assert (await registry.state_info("dep")).probes_in_flight == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            info = await registry.state_info("dep")
            assert (info.state, info.probes_in_flight) == (HALF_OPEN, 0)
        finally:
            await store.close()

    asyncio.run(scenario())


def _interrupt_after_the_admission_lands(store: Any, interruption: type[BaseException]) -> None:
    """The store's next ``cb_before`` runs in Redis, then its caller is
    interrupted before the reply arrives (a cancellation or Ctrl-C that lands
    while the reply is in flight)."""
    real = store.run

    def run(call: Any) -> Any:
        reply = real(call)
        if call.name == "cb_before":
            store.run = real
            if asyncio.iscoroutine(reply):
                async def landed_then_interrupted() -> Any:
                    await reply
                    raise interruption
                return landed_then_interrupted()
            raise interruption
        return reply

    store.run = run


def test_a_probe_admission_interrupted_in_flight_frees_the_slot_it_took(
    store: durabilis.Store,
) -> None:
    registry = make(store, cfg(probe_success_required=1, probe_timeout_seconds=30))
    registry.force_open("dep")
    wait_reset()
    _interrupt_after_the_admission_lands(store, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        registry.call("dep", lambda: "never runs")
    info = registry.state_info("dep")
    assert (info.state, info.probes_in_flight) == (HALF_OPEN, 0)  # not held for 30 s
    assert registry.call("dep", lambda: "probe") == "probe"
    assert registry.state("dep") is CLOSED


def test_async_a_probe_admission_cancelled_in_flight_frees_the_slot_it_took(
    redis_url: str, namespace: str
) -> None:
    async def scenario() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            registry = AsyncCircuitBreakerRegistry(
                store, [cfg(probe_success_required=1, probe_timeout_seconds=30)])
            await registry.force_open("dep")
            await asyncio.sleep(RESET + 0.05)
            _interrupt_after_the_admission_lands(store, asyncio.CancelledError)
            with pytest.raises(asyncio.CancelledError):
                await registry.call("dep", asyncio.sleep, 0)
            info = await registry.state_info("dep")
            assert (info.state, info.probes_in_flight) == (HALF_OPEN, 0)
            await registry.call("dep", asyncio.sleep, 0)
            assert await registry.state("dep") is CLOSED
        finally:
            await store.close()

    asyncio.run(scenario())


# --- probe re-arm, abandoned probes, caller-chosen probe ids ---------------------


def test_a_stale_probe_is_rearmed_even_with_a_free_slot_and_its_late_report_is_not_credited(
    store: durabilis.Store,
) -> None:
    # Regression: with two slots and one stuck probe, the next caller after
    # probe_timeout took the free slot without a re-arm, and the stuck probe's
    # late success was then credited toward closing.
    registry = make(store, cfg(probe_success_required=2))
    stuck = half_open(registry)
    time.sleep(RESET + 0.05)  # the newest (only) probe is now probe_timeout old
    with own_logs() as logs:
        fresh = registry.before_call("dep")
    assert fresh.is_probe and fresh.rearmed and fresh.probe_id != stuck.probe_id
    assert [e["event"] for e in logs] == ["durability_circuit_probes_rearmed"]
    assert registry.state_info("dep").probes_in_flight == 1  # the stuck slot is gone
    assert not registry.after_call("dep", True, stuck)  # a stray now: not credited
    info = registry.state_info("dep")
    assert (info.state, info.probes_in_flight, info.probe_successes) == (HALF_OPEN, 1, 0)
    assert registry.after_call("dep", True, fresh)
    assert registry.state_info("dep").probe_successes == 1  # one of two: still HALF_OPEN
    assert registry.state("dep") is HALF_OPEN


def test_a_report_of_a_probe_admitted_probe_timeout_ago_is_not_credited_before_any_rearm(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    registry = make(store, cfg(probe_success_required=2))
    first = half_open(registry)
    second = registry.before_call("dep")
    seen: list[StateTransition] = []
    registry.on_transition(seen.append)
    time.sleep(RESET + 0.05)
    # Nobody called before_call since: both slots are still taken.
    assert registry.state_info("dep").probes_in_flight == 2
    assert not registry.after_call("dep", True, first)  # not a success of this round
    assert not registry.after_call("dep", False, second)  # nor a failure: no reopening
    assert not registry.after_call("dep", True)  # seed API: no live probe to credit
    info = registry.state_info("dep")
    assert (info.state, info.probes_in_flight, info.probe_successes) == (HALF_OPEN, 0, 0)
    assert raw.exists(store.keys.breaker_probes("dep")) == 0  # each slot freed
    assert seen == []
    fresh = registry.before_call("dep")  # a free slot: no re-arm needed
    assert fresh.is_probe and not fresh.rearmed


def test_a_probe_slower_than_probe_timeout_is_not_credited_and_says_which_setting_to_raise(
    store: durabilis.Store,
) -> None:
    """A dependency whose calls take probe_timeout_seconds or more can never
    close its breaker (each probe is presumed abandoned): the late answer is
    logged with the setting to raise, so an operator can tell it from a stray."""
    registry = make(store, cfg(probe_success_required=1))
    trip(registry)
    wait_reset()
    with own_logs() as logs:
        assert registry.call("dep", lambda: time.sleep(RESET + 0.05) or "ok") == "ok"
    assert registry.state("dep") is HALF_OPEN  # not credited: still half-open
    slow = [e for e in logs if e["event"] == "durability_circuit_probe_too_slow"]
    assert len(slow) == 1 and slow[0]["dependency"] == "dep"
    assert slow[0]["probe_timeout_seconds"] == RESET and slow[0]["duration_ms"] >= 1000
    with own_logs() as logs:  # a probe within the timeout: credited, nothing logged
        assert registry.call("dep", lambda: "ok") == "ok"
    assert registry.state("dep") is CLOSED
    assert [e for e in logs if e["event"] == "durability_circuit_probe_too_slow"] == []


@pytest.mark.standalone_only  # (the clock hook needs one plain server)
def test_a_server_clock_stepping_back_holds_a_breaker_one_timeout_more_not_for_the_jump(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    """A failover to a replica whose clock is an hour behind: the breaker's
    stored times are then "in the future". Each timeout restarts from now (one
    more reset or probe timeout, not an hour of refusals), probes keep their
    slots (the cap holds) and a live probe's report is still credited."""
    clock = stepped_clock(store)
    registry = make(store, cfg(probe_success_required=1))
    trip(registry)
    raw.set(clock, -3600 * 1_000_000)  # an hour behind, at once
    with pytest.raises(durabilis.CircuitOpen) as refused:
        registry.before_call("dep")
    assert 0 < refused.value.retry_after <= RESET  # not the hour
    assert registry.state_info("dep").retry_after <= RESET
    wait_reset()
    first = registry.before_call("dep")  # OPEN -> HALF_OPEN: the first probe
    assert first.is_probe and registry.state("dep") is HALF_OPEN
    raw.set(clock, -7200 * 1_000_000)  # another hour back while it runs
    with pytest.raises(durabilis.CircuitOpen) as full:
        registry.before_call("dep")  # the cap (1) holds: the probe keeps its slot
    assert 0 < full.value.retry_after <= RESET
    assert registry.state_info("dep").probes_in_flight == 1
    assert registry.after_call("dep", True, first)  # a live probe's report counts
    assert registry.state("dep") is CLOSED


@pytest.mark.standalone_only  # (the clock hook needs one plain server)
def test_a_dead_probe_admitted_before_the_clock_stepped_back_is_rearmed_one_timeout_later(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    clock = stepped_clock(store)
    registry = make(store, cfg(probe_success_required=1))
    dead = half_open(registry)
    raw.set(clock, -3600 * 1_000_000)
    with pytest.raises(durabilis.CircuitOpen) as full:
        registry.before_call("dep")
    assert 0 < full.value.retry_after <= RESET
    wait_reset()
    fresh = registry.before_call("dep")
    assert fresh.is_probe and fresh.rearmed and fresh.probe_id != dead.probe_id
    assert registry.after_call("dep", True, fresh)
    assert registry.state("dep") is CLOSED


@pytest.mark.standalone_only  # (the clock hook needs one plain server)
def test_a_clock_step_back_sets_a_time_window_to_now_and_results_leave_it_one_window_later(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    clock = stepped_clock(store)
    registry = make(store, cfg(window_size=100, window_seconds=10, idle_ttl_seconds=3600))
    raw.set(clock, 0)
    report(registry, "FF")
    back = -3600 * 1_000_000  # an hour behind, at once
    raw.set(clock, back + 1_000_000)
    report(registry, "S")  # the step is seen: the window's results count as of now
    assert registry.state_info("dep").request_count == 3
    raw.set(clock, back + 12_000_000)  # one window (10 s) later: they leave it
    report(registry, "SSS")
    info = registry.state_info("dep")
    assert (info.state, info.request_count, info.failure_count) == (CLOSED, 3, 0)


@pytest.mark.standalone_only  # (the clock hook needs one plain server)
def test_after_a_clock_step_back_every_new_result_is_a_window_member_of_its_own(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    # Members are named by their score: a window set to now renames them, or
    # the new results (on the earlier clock) would meet the old names and
    # overwrite old results instead of joining them.
    clock = stepped_clock(store)
    registry = CircuitBreakerRegistry(store, [cfg(window_size=100_000, window_seconds=600)],
                                      replica_id="r1", cached_admission_seconds=0)
    raw.set(clock, 0)

    def busy(seconds: float) -> int:
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            report(registry, "S")
            n += 1
        return n

    reported = busy(1.2)
    raw.set(clock, -2_000_000)  # 2 s back: the next 1.2 s retrace the old results' times
    reported += busy(1.2)
    assert raw.zcard(store.keys.breaker_window("dep")) == reported
    assert registry.state_info("dep").request_count == reported


@pytest.mark.standalone_only  # (the clock hook needs one plain server)
def test_a_clock_step_back_does_not_stop_a_busy_breaker_refreshing_its_ttl(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    # The keys' idle TTL is pushed back at most every idle_ttl / 4 (field tx);
    # a tx "in the future" held that back for the whole jump, and the keys of a
    # breaker in use expired under it, its window with them.
    clock = stepped_clock(store)
    registry = make(store, cfg(idle_ttl_seconds=8))
    raw.set(clock, 0)
    report(registry, "S")
    raw.set(clock, -3600 * 1_000_000)
    report(registry, "S")
    state = store.keys.breaker("dep")
    real_ms = int(raw.time()[0]) * 1000
    first = int(raw.hget(state, "tx"))
    assert first < real_ms - 1800 * 1000  # refreshed now, on the stepped-back clock
    raw.incrby(clock, 3_000_000)  # a quarter of the TTL later
    report(registry, "S")
    assert int(raw.hget(state, "tx")) >= first + 3000


def test_a_caller_chosen_probe_id_is_the_probe_and_frees_its_slot_without_the_permit(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    registry = make(store, cfg(probe_success_required=1))
    ops = registry.ops
    probes = store.keys.breaker_probes("dep")

    def admit(probe_id: str | None) -> Permit:
        return ops.decode_before("dep", store.run(ops.before_call("dep", probe_id)))[0]

    def release(probe_id: str) -> bool:
        return ops.decode_after("dep", store.run(ops.release_probe("dep", probe_id)))[0]

    assert admit("layer-7f3a") == Permit("dep", 0)  # CLOSED: not a probe, id unused
    assert not release("layer-7f3a")  # CLOSED: nothing to free
    trip(registry)
    assert not release("layer-7f3a")  # OPEN: ignored
    wait_reset()
    probe = admit("layer-7f3a")  # the first probe, turning it HALF_OPEN
    assert (probe.probe_id, probe.is_probe, probe.rearmed) == ("layer-7f3a", True, False)
    assert set(raw.hkeys(probes)) == {b"layer-7f3a"}
    # The same id again (a resend after a lost reply): the same slot, not another.
    assert admit("layer-7f3a").probe_id == "layer-7f3a"
    assert registry.state_info("dep").probes_in_flight == 1
    with pytest.raises(durabilis.CircuitOpen):
        admit("layer-other")  # the only slot is taken
    assert not release("layer-unknown")  # an id with no slot: ignored
    assert raw.hlen(probes) == 1
    assert release("layer-7f3a")  # freed without the permit (nor its generation)
    assert raw.hlen(probes) == 0
    assert not release("layer-7f3a")  # already free: ignored
    late = ops.decode_after("dep", store.run(ops.after_call("dep", True, probe)))
    assert late == (False, None)  # its permit's report finds no live slot
    counter = registry.before_call("dep")  # the public API chooses a random id of its own
    assert counter.is_probe and counter.probe_id is not None
    assert len(counter.probe_id) == 16 and int(counter.probe_id, 16) >= 0
    assert registry.after_call("dep", True, counter)
    assert registry.state("dep") is CLOSED


def test_a_caller_chosen_probe_id_closes_the_breaker_with_its_permit(
    store: durabilis.Store,
) -> None:
    registry = make(store, cfg(probe_success_required=1))
    ops = registry.ops
    trip(registry)
    wait_reset()
    permit, transition = ops.decode_before("dep", store.run(ops.before_call("dep", "p-1")))
    assert permit.probe_id == "p-1" and transition is not None
    assert transition.to_state is HALF_OPEN
    counted, closed = ops.decode_after("dep", store.run(ops.after_call("dep", True, permit)))
    assert counted and closed is not None and closed.to_state is CLOSED


# --- in a fused step (standalone: one atomic script for the whole step) ----------


def _refused(reply: Any) -> bool:
    return isinstance(reply, list) and reply[0] in (b"open", "open")


@pytest.mark.standalone_only
def test_a_fused_step_whose_breaker_refuses_writes_nothing_from_any_body(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    registry = make(store, cfg(probe_success_required=1))
    ops = registry.ops
    idem = _IdemOps(store.keys, IdempotencyConfig())

    def step(key: str, probe_id: str | None = None) -> Any:
        claim = idem.claim(IdempotencyKey.from_raw(key), None)
        return store.run_step([claim, ops.before_call("dep", probe_id)], gates={1: _refused})

    registry.force_open("dep")
    replies = step("refused")
    assert replies.status == "nr"  # the claim passed its checks, then was never resumed
    assert raw.exists(store.keys.idem("refused")) == 0
    with pytest.raises(durabilis.CircuitOpen):
        ops.decode_before("dep", replies[1])

    wait_reset()
    replies = step("probe", "step-probe")  # OPEN -> HALF_OPEN inside the step
    assert replies.status == "cc"
    permit, transition = ops.decode_before("dep", replies[1])
    assert permit.probe_id == "step-probe" and transition is not None
    assert raw.exists(store.keys.idem("probe")) == 1
    replies = step("full", "another")  # the only probe slot is taken: refused
    assert replies.status == "nr"
    assert raw.exists(store.keys.idem("full")) == 0
    assert raw.hkeys(store.keys.breaker_probes("dep")) == [b"step-probe"]

    registry.force_close("dep")
    replies = step("closed")  # the CLOSED hot path writes nothing yet admits
    assert replies.status == "cc"
    assert ops.decode_before("dep", replies[1])[0] == Permit("dep", permit.generation + 1)
    assert raw.exists(store.keys.idem("closed")) == 1


@pytest.mark.standalone_only
def test_every_breaker_script_runs_as_a_body_of_a_fused_step(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    registry = make(store, cfg(probe_success_required=1))
    ops = registry.ops
    idem = _IdemOps(store.keys, IdempotencyConfig())
    n = iter(range(100))

    def step(call: Any) -> Any:
        claim = idem.claim(IdempotencyKey.from_raw(f"k{next(n)}"), None)
        replies = store.run_step([claim, call])
        assert replies.status[0] == "c", replies.status
        return replies

    assert step(ops.register("dep")).status == "cc"
    assert step(ops.register("dep"))[1] == 0  # already known
    assert registry.stored_names() == {"dep"}
    for _ in range(4):
        permit = ops.decode_before("dep", step(ops.before_call("dep"))[1])[0]
        replies = step(ops.after_call("dep", False, permit))
        assert replies.status == "cc"
    assert registry.state("dep") is OPEN
    assert step(ops.after_call("dep", True)).status == "cr"  # OPEN: a stray, no write
    assert ops.decode_force("dep", step(ops.force("dep", "close"))[1]) is not None
    assert registry.state("dep") is CLOSED
    assert step(ops.read("dep")).status == "cr"  # read-only
    assert raw.exists(store.keys.idem("k0")) == 1
