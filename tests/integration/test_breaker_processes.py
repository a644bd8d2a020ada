"""Cross-process guarantees of the breaker, with real processes sharing one Redis."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest

import durabilis
from durabilis.breaker import BreakerState, CircuitBreakerConfig, CircuitBreakerRegistry
from tests.integration._breaker_workers import (
    _fake_key,
    fake_dependency_books,
    fleet_member,
    reporter,
)
from tests.support.backends import raw_client

pytestmark = pytest.mark.serial

FLEET = 8


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_eight_processes_open_it_cap_probes_fleet_wide_and_all_see_recovery(
    redis_url: str, namespace: str
) -> None:
    config = CircuitBreakerConfig(
        "flaky_dependency",
        failure_rate_threshold=0.5,
        min_request_count=5,
        reset_timeout_seconds=1,
        probe_success_required=2,
        window_size=10,
        # Longer than any probe (0.1 s): no re-arm may let a third probe in.
        probe_timeout_seconds=10,
    )
    books = raw_client(redis_url)
    store = durabilis.connect(redis_url, namespace=namespace)
    registry = CircuitBreakerRegistry(store, [config], replica_id="observer")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=fleet_member, args=(redis_url, namespace, config, i, out))
        for i in range(FLEET)
    ]
    try:
        books.set(_fake_key(namespace, "mode"), "fail")
        for p in procs:
            p.start()
        _wait_for(
            lambda: int(books.get(_fake_key(namespace, "ready")) or 0) == FLEET, 60, "workers"
        )
        # The dependency fails 100 %: the fleet opens the breaker.
        _wait_for(lambda: registry.state(config.name) is not BreakerState.CLOSED, 10, "trip")
        # Several OPEN -> HALF_OPEN -> (probe fails) -> OPEN rounds.
        _wait_for(
            lambda: fake_dependency_books(redis_url, namespace)["calls"] >= 3, 10, "probes"
        )
        time.sleep(1.5)
        recovered_at = time.time()
        books.set(_fake_key(namespace, "mode"), "ok")
        _wait_for(lambda: registry.state(config.name) is BreakerState.CLOSED, 10, "recovery")
        # Each worker sees CLOSED (it loops every <= 0.12 s; when is asserted below).
        _wait_for(
            lambda: books.scard(_fake_key(namespace, "closed_seen")) == FLEET, 30, "all CLOSED"
        )
    finally:
        books.set(_fake_key(namespace, "stop"), 1)
        results = [out.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(timeout=30)
    fake = fake_dependency_books(redis_url, namespace)
    books.close()

    assert all(p.exitcode == 0 for p in procs)
    assert [errors for _, _, errors in results] == [[]] * FLEET
    # Probes really ran, several rounds of them, yet never more than the cap at once.
    assert fake["calls"] >= 3
    assert 1 <= fake["max"] <= config.probe_success_required
    assert fake["now"] == 0
    # Every process saw CLOSED within reset_timeout + 1 s of the recovery.
    seen = sorted(at - recovered_at for _, at, _ in results if at is not None)
    assert len(seen) == FLEET, seen
    assert seen[-1] <= config.reset_timeout_seconds + 1, seen
    # The fleet's transitions are in the stream: opened, probed, reopened, recovered.
    kinds = [(t.from_state, t.to_state) for t in registry.transitions(config.name)]
    assert kinds[0] == (BreakerState.CLOSED, BreakerState.OPEN)
    assert (BreakerState.HALF_OPEN, BreakerState.OPEN) in kinds
    assert kinds[-1] == (BreakerState.HALF_OPEN, BreakerState.CLOSED)
    store.close()  # (read above: a closed cluster client forgets its nodes)


def _min_reporters_configs() -> list[CircuitBreakerConfig]:
    base: dict[str, Any] = {
        "failure_rate_threshold": 0.2,
        "min_request_count": 6,
        "window_size": 12,
        "reset_timeout_seconds": 30,
    }
    return [
        CircuitBreakerConfig("one_failing_of_three", min_distinct_reporters=2, **base),
        CircuitBreakerConfig("two_failing_of_three", min_distinct_reporters=2, **base),
        # Control: without the rule the first scenario does open it.
        CircuitBreakerConfig("one_failing_rule_off", min_distinct_reporters=1, **base),
    ]


def test_min_distinct_reporters_one_failing_process_cannot_open_it_two_can(
    redis_url: str, namespace: str
) -> None:
    one, two, control = _min_reporters_configs()
    # Per process: (config, fails?) for each scenario, run by all three together.
    roles = {
        0: [(one, True), (two, True), (control, True)],
        1: [(one, False), (two, True), (control, False)],
        2: [(one, False), (two, False), (control, False)],
    }
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(roles))
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=reporter, args=(redis_url, namespace, roles[i], 40, barrier, i, out)
        )
        for i in roles
    ]
    for p in procs:
        p.start()
    rejected = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert all(p.exitcode == 0 for p in procs)

    store = durabilis.connect(redis_url, namespace=namespace)
    try:
        registry = CircuitBreakerRegistry(store, [one, two, control])
        states = registry.all_states()
        opened_by = {
            name: {t.replica_id for t in registry.transitions(name)}
            for name in (one.name, two.name, control.name)
        }
    finally:
        store.close()
    # One replica failing 100 % (a third of the window's results) never opens it.
    assert states[one.name] is BreakerState.CLOSED
    assert opened_by[one.name] == set()
    assert [rejected[i][0] for i in roles] == [0, 0, 0]
    # Two failing replicas do; so does one when the rule is off (the control).
    assert states[two.name] is BreakerState.OPEN
    assert states[control.name] is BreakerState.OPEN
    assert sum(rejected[i][1] for i in roles) > 0
    assert len(opened_by[two.name]) == 1
