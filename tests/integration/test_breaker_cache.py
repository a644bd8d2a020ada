"""Cached admission: a CLOSED breaker that Redis just confirmed admits the next
call without a round trip; after another replica trips it, a process admits at
most one call per caller in flight, and none once the cache time has passed."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest

import durabilis
from durabilis.breaker import CircuitBreakerConfig, CircuitBreakerRegistry
from tests.integration._breaker_workers import cached_caller
from tests.support.waits import wait_until

CONFIG = CircuitBreakerConfig("svc", 0.5, 100, 60, 1, 200, 30)


def _admitted_after_a_trip_elsewhere(redis_url: str, namespace: str, cache_s: float) -> int:
    ctx = multiprocessing.get_context("spawn")
    ready, stop, out, refused = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Value("i", 0)
    tripped = ctx.Event()
    worker = ctx.Process(target=cached_caller,
                         args=(redis_url, namespace, cache_s, ready, stop, out, refused, tripped))
    worker.start()
    store = durabilis.connect(redis_url, namespace=namespace)
    try:
        assert ready.wait(60)
        CircuitBreakerRegistry(store, (CONFIG,)).force_open("svc")  # another replica trips it
        tripped.set()  # (calls started from now on began after the trip)
        # The worker keeps calling (hundreds of attempts in 0.3 s on an idle machine):
        # until it has been refused more than 20 times since the event, however
        # loaded the machine (counted from here: this process descheduled
        # between the trip and the event, the worker's refusals before it
        # reached 20, and it was stopped with no call seen after the trip).
        base = refused.value
        wait_until(lambda: refused.value > base + 22, timeout=60, what="20 refusals")
        stop.set()
        calls: list[tuple[bool, bool]] = out.get(timeout=60)
        worker.join(30)
    finally:
        store.close()
    after = [admitted for after_trip, admitted in calls if after_trip]
    assert len(after) > 20 and not after[-1]  # it went on calling, refused in the end
    return sum(after)


def test_after_another_process_trips_it_a_sequential_caller_gets_at_most_one_more_call(
    redis_url: str, namespace: str
) -> None:
    assert _admitted_after_a_trip_elsewhere(redis_url, namespace, 1.0) <= 1


def test_without_the_cache_no_call_is_admitted_after_the_trip(
    redis_url: str, namespace: str
) -> None:
    assert _admitted_after_a_trip_elsewhere(redis_url, namespace, 0) == 0


def test_a_closed_breaker_confirmed_by_redis_admits_without_a_round_trip(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = CircuitBreakerRegistry(store, (CONFIG,))
    sent: list[str] = []
    run = store.run
    monkeypatch.setattr(store, "run", lambda call: (sent.append(call.name), run(call))[1])
    registry.call("svc", lambda: None)  # registration, admission, report
    assert sent.count("cb_before") == 1
    for _ in range(5):
        registry.call("svc", lambda: None)
    assert sent.count("cb_before") == 1 and sent.count("cb_after") == 6  # reports: every one


def test_the_cache_ends_after_its_time_and_on_this_registry_s_own_refusal(
    store: durabilis.Store,
) -> None:
    mine = CircuitBreakerRegistry(store, (CONFIG,), cached_admission_seconds=0.2)
    other = CircuitBreakerRegistry(store, (CONFIG,))
    mine.call("svc", lambda: None)
    other.force_open("svc")
    time.sleep(0.25)  # no report for longer than the cache time: ask Redis
    with pytest.raises(durabilis.CircuitOpen):
        mine.call("svc", lambda: None)
    other.force_close("svc")
    mine.call("svc", lambda: None)  # CLOSED again, cached
    other.force_open("svc")
    mine.call("svc", lambda: None)  # within the cache time: the one call that passes
    with pytest.raises(durabilis.CircuitOpen):  # its report found the new generation
        mine.call("svc", lambda: None)


def test_a_probe_is_never_cached_and_a_bad_cache_time_is_a_config_error(
    store: durabilis.Store,
) -> None:
    config = CircuitBreakerConfig("svc", 0.5, 100, 1, 1, 200, 30)
    registry = CircuitBreakerRegistry(store, (config,))
    registry.force_open("svc")
    time.sleep(1.05)  # reset timeout over: the next call is a HALF_OPEN probe
    permit = registry.before_call("svc")
    assert permit.is_probe
    with pytest.raises(durabilis.CircuitOpen):  # one probe at a time, asked of Redis
        registry.before_call("svc")
    registry.release("svc", permit)
    for bad in (-1, float("nan"), True, "1", 61):
        with pytest.raises(durabilis.ConfigError):
            CircuitBreakerRegistry(store, (CONFIG,), cached_admission_seconds=bad)  # type: ignore[arg-type]


def test_async_registry_caches_the_same_way(redis_url: str, namespace: str) -> None:
    import asyncio

    async def main() -> tuple[int, Any]:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        sync = durabilis.connect(redis_url, namespace=namespace)
        try:
            mine = durabilis.aio.CircuitBreakerRegistry(store, (CONFIG,))
            other = CircuitBreakerRegistry(sync, (CONFIG,))

            async def noop() -> None:
                return None

            await mine.call("svc", noop)
            other.force_open("svc")
            passed = 0
            for _ in range(5):
                try:
                    await mine.call("svc", noop)
                    passed += 1
                except durabilis.CircuitOpen as exc:
                    refused = exc
            return passed, refused
        finally:
            await store.close()
            sync.close()

    passed, refused = asyncio.run(main())
    assert passed == 1 and isinstance(refused, durabilis.CircuitOpen)


def test_a_report_without_a_permit_never_confirms_the_cache_and_ends_it(
    store: durabilis.Store,
) -> None:
    """Found by an adversarial review: permitless reports (the seed's
    ``after_call(name, success)``) left the cache alive after a trip."""
    mine = CircuitBreakerRegistry(store, (CONFIG,))
    other = CircuitBreakerRegistry(store, (CONFIG,))
    mine.before_call("svc")  # cached: CLOSED, just confirmed
    other.force_open("svc")
    mine.after_call("svc", True)  # no permit: tells no generation
    with pytest.raises(durabilis.CircuitOpen):
        mine.before_call("svc")


def test_a_late_confirmation_of_a_generation_known_to_be_over_does_not_refill_the_cache(
    store: durabilis.Store,
) -> None:
    mine = CircuitBreakerRegistry(store, (CONFIG,))
    other = CircuitBreakerRegistry(store, (CONFIG,))
    early = mine.before_call("svc")
    late = mine.before_call("svc")  # two callers in flight, both from the cache
    other.force_open("svc")
    other.force_close("svc")  # a new CLOSED generation
    assert mine.after_call("svc", True, early) is False  # stale: the generation is over
    mine.seen(late, True, None)  # a reply of that generation read late, as if counted
    assert mine.before_call("svc").generation > late.generation  # asked Redis again
