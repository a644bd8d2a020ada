"""Worker processes for the cross-process breaker tests (spawned, importable).

The fake dependency keeps its own books in Redis (plain keys under the test's
namespace, outside durabilis's key space): how many probe calls are running
right now across every process, and the most ever seen at once.
"""

from __future__ import annotations

import time
from typing import Any

import durabilis
from durabilis.breaker import BreakerState, CircuitBreakerConfig, CircuitBreakerRegistry
from tests.support.backends import raw_client

# Count one more probe call running and keep the maximum, in one atomic step.
_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
redis.call('INCR', KEYS[3])
return n
"""


def _fake_key(namespace: str, part: str) -> str:
    # One hash tag: the books script touches three of them at once (Cluster).
    return f"fake-dependency:{{{namespace}}}:{part}"


def fake_dependency_books(url: str, namespace: str) -> dict[str, int]:
    """The fake dependency's counters: probes running now, the most at once, probe calls."""
    client = raw_client(url)
    try:
        keys = [_fake_key(namespace, p) for p in ("probes_now", "probes_max", "probe_calls")]
        now, most, calls = client.mget(keys)
        return {"now": int(now or 0), "max": int(most or 0), "calls": int(calls or 0)}
    finally:
        client.close()


def fleet_member(
    url: str, namespace: str, config: CircuitBreakerConfig, me: int, out: Any
) -> None:
    """Call the dependency through the breaker until told to stop.

    The dependency takes 0.1 s per call and fails while ``<ns>:mode`` is not
    ``ok``. Reports to ``out``: ``(me, closed_seen_at, errors)`` where
    ``closed_seen_at`` is the first wall-clock time this process saw CLOSED
    after the dependency recovered (``None`` if never); ``me`` joins the set
    ``<ns>:closed_seen`` then.
    """
    store = durabilis.connect(url, namespace=namespace)
    registry = CircuitBreakerRegistry(store, [config], replica_id=f"worker-{me}")
    books = raw_client(url)
    enter = books.register_script(_ENTER)
    probes_now = _fake_key(namespace, "probes_now")
    probes_max = _fake_key(namespace, "probes_max")
    probe_calls = _fake_key(namespace, "probe_calls")
    mode_key = _fake_key(namespace, "mode")
    stop_key = _fake_key(namespace, "stop")
    books.incr(_fake_key(namespace, "ready"))
    closed_seen_at: float | None = None
    errors: list[str] = []
    try:
        while not books.exists(stop_key):
            recovered = books.get(mode_key) == b"ok"
            if (
                recovered
                and closed_seen_at is None
                and registry.state(config.name) is BreakerState.CLOSED
            ):
                closed_seen_at = time.time()
                books.sadd(_fake_key(namespace, "closed_seen"), me)  # for the test to wait on
            try:
                permit = registry.before_call(config.name)
            except durabilis.CircuitOpen:
                time.sleep(0.02)
                continue
            if permit.is_probe:
                enter(keys=[probes_now, probes_max, probe_calls])
            try:
                time.sleep(0.1)  # the dependency at work
                ok = books.get(mode_key) == b"ok"
            finally:
                if permit.is_probe:
                    books.decr(probes_now)
            registry.after_call(config.name, ok, permit)
            if recovered and closed_seen_at is None and not permit.is_probe:
                closed_seen_at = time.time()  # admitted as a CLOSED call: it saw CLOSED
                books.sadd(_fake_key(namespace, "closed_seen"), me)
    except Exception as exc:  # reported to the test, which fails on any
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        books.close()
        store.close()
        out.put((me, closed_seen_at, errors))


def reporter(
    url: str,
    namespace: str,
    scenarios: list[tuple[CircuitBreakerConfig, bool]],
    calls: int,
    barrier: Any,
    me: int,
    out: Any,
) -> None:
    """For each scenario in turn (all processes together): ``calls`` calls that
    fail when this process's role says so. Reports ``(me, [rejected per scenario])``.
    """
    store = durabilis.connect(url, namespace=namespace)
    configs = [config for config, _ in scenarios]
    registry = CircuitBreakerRegistry(store, configs, replica_id=f"reporter-{me}")
    rejected = []
    try:
        for config, failing in scenarios:
            barrier.wait(timeout=60)
            n = 0
            for _ in range(calls):
                try:
                    permit = registry.before_call(config.name)
                except durabilis.CircuitOpen:
                    n += 1
                else:
                    registry.after_call(config.name, not failing, permit)
                time.sleep(0.005)
            rejected.append(n)
    finally:
        store.close()
        out.put((me, rejected))


def cached_caller(
    url: str, namespace: str, cache_s: float, ready: Any, stop: Any, out: Any,
    refused: Any = None, tripped: Any = None,
) -> None:
    """Call the dependency through the breaker, one call after another, until told
    to stop; report for each call whether ``tripped`` (an event the caller sets once
    another process has tripped the breaker) was set when it started, and whether
    it was admitted. ``refused`` (a shared ``multiprocessing.Value``) counts the
    refusals as they come. (No wall clock across processes: one that steps, or a
    test process descheduled between the trip and its reading, cannot mislead.)"""
    store = durabilis.connect(url, namespace=namespace)
    registry = CircuitBreakerRegistry(
        store, (CircuitBreakerConfig("svc", 0.5, 100, 60, 1, 200, 30),),
        cached_admission_seconds=cache_s,
    )
    calls: list[tuple[bool, bool]] = []
    try:
        while not stop.is_set():
            started = tripped is not None and tripped.is_set()
            try:
                registry.call("svc", time.sleep, 0.001)
                calls.append((started, True))
            except durabilis.CircuitOpen:
                calls.append((started, False))
                if refused is not None:
                    with refused.get_lock():
                        refused.value += 1
            if len(calls) == 20:
                ready.set()  # warm: the breaker is CLOSED and cached here
    finally:
        out.put(calls)
        store.close()
