"""The waves of an unfused step (Redis Cluster; docs/layer.md, "Steps and round trips").

The calls of one wave are all sent, a wave only after the one before it
answered, and after a wave with a gated refusal or a failure no later wave is
sent; ``exc.partial`` says what each call did. On a standalone server the
same code path runs with fusing off (calls one by one); on Cluster the calls
of a wave go concurrently, each to its node (the last test shows it).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
import redis

import durabilis
from durabilis import StorageUnavailable
from durabilis._scripts import ScriptCall, unfuse
from durabilis._store import _wave
from durabilis.errors import CorruptData
from durabilis.idempotency import IdempotencyGuard
from durabilis.layer import DurabilityLayer
from tests.integration._layer_support import Counter, fast_config
from tests.support.interrupts import (
    Interrupted,
    InterruptedAgain,
    raising_handler,
    signal_as_it_starts,
    signal_in,
)

pytestmark = pytest.mark.topologies("cluster")


def claims(store: durabilis.Store, *names: str) -> list[ScriptCall]:
    ops = IdempotencyGuard(store)._ops
    return [ops.claim(ops.validate_key(name), None) for name in names]


def state(raw: Any, store: durabilis.Store, name: str) -> bytes | None:
    value = raw.hget(store.keys.idem(name), "s")
    return value if isinstance(value, bytes) else None


def refused(reply: Any) -> bool:
    return bool(reply[0] != b"new")


def test_a_failure_in_a_wave_lets_its_other_calls_run_and_sends_no_later_wave(
    store: durabilis.Store, raw: Any, namespace: str
) -> None:
    store._fuse = False  # the Cluster code path (a no-op on Cluster)
    a, c = claims(store, "wave-a", "wave-c")
    planted = f"{namespace}:x:{{layer}}:planted"  # the layer's slot: a two-key script
    raw.set(planted, "not a sorted set")
    bad = ScriptCall("layer_note", [planted, store.keys.layer("stats")], ["add", 1000, 1, "m"])
    with pytest.raises(CorruptData) as caught:
        store.run_step([bad, a, c], waves=[0, 0, 1])
    partial = caught.value.partial
    assert partial is not None and partial.status == "?cn"
    assert state(raw, store, "wave-a") == b"p"  # beside the failure: ran
    assert state(raw, store, "wave-c") is None  # the next wave: never sent


def test_a_gated_refusal_ends_the_step_after_its_wave(
    store: durabilis.Store, raw: Any
) -> None:
    store._fuse = False
    a, b, c = claims(store, "gate-a", "gate-b", "gate-c")
    store.run(a)  # a second claim of gate-a is refused
    replies = store.run_step([a, b, c], gates={0: refused}, waves=[0, 0, 1])
    assert replies.status == "rcn"
    assert state(raw, store, "gate-b") == b"p"
    assert state(raw, store, "gate-c") is None
    replies = store.run_step(claims(store, "gate-d", "gate-e"), gates={0: refused}, waves=[0, 1])
    assert replies.status == "cc"


def test_waves_must_name_every_call(store: durabilis.Store) -> None:
    store._fuse = False
    with pytest.raises(ValueError, match="waves"):
        store.run_step(claims(store, "w-1", "w-2"), waves=[0])


@pytest.mark.cluster_only
def test_on_cluster_the_calls_of_a_wave_go_at_once(
    store: durabilis.Store, raw: Any
) -> None:
    """One node stalls its writes: the other call of the wave lands meanwhile."""
    slow = "slow-0"
    node = raw.get_node_from_key(store.keys.idem(slow))
    fast = next(f"fast-{i}" for i in range(1000)
                if raw.get_node_from_key(store.keys.idem(f"fast-{i}")) != node)
    calls = claims(store, slow, fast)
    store.run_step(claims(store, "warm-1", "warm-2"), waves=[0, 0])  # scripts loaded
    raw.execute_command("CLIENT", "PAUSE", 1500, "WRITE", target_nodes=node)
    out: list[Any] = []
    began = time.monotonic()
    step = threading.Thread(target=lambda: out.append(store.run_step(calls, waves=[0, 0])))
    step.start()
    while state(raw, store, fast) is None and time.monotonic() - began < 5:
        time.sleep(0.01)
    landed = time.monotonic() - began
    step.join(10)
    assert landed < 1.0, "the second call waited for the first one's node"
    assert out and out[0].status == "cc"
    assert time.monotonic() - began >= 1.2  # the first call did wait for its node


@pytest.mark.cluster_only
def test_an_interrupt_after_a_wave_s_reply_never_gives_a_connection_back_twice(
    store: durabilis.Store,
) -> None:
    """Found by an adversarial review: KeyboardInterrupt while a redirected call was
    sent again released its connection a second time, under another thread."""
    client = store.client
    store.run_step(claims(store, "warm-1", "warm-2"), waves=[0, 0])  # scripts loaded
    [a] = claims(store, "a-key")
    node = client.get_node_from_key(a.keys[0])
    [b] = next(claims(store, f"b-{i}") for i in range(1000)
               if client.get_node_from_key(claims(store, f"b-{i}")[0].keys[0]) != node)
    pool = client.get_redis_connection(node).connection_pool
    with redis.Redis(host=node.host, port=node.port) as admin:
        admin.script_flush()  # a's EVALSHA answers NOSCRIPT: sent again the usual way
    grabbed: list[Any] = []

    def interrupted(call: ScriptCall) -> Any:
        grabbed.append(pool.get_connection())  # another thread takes a connection...
        raise KeyboardInterrupt  # ...and Ctrl-C lands

    store._caught = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        store.run_step([a, b], waves=[0, 0])
    other = grabbed[0]
    assert other in pool._in_use_connections and other not in pool._available_connections
    assert other._sock is not None  # not disconnected under its user
    assert pool.get_connection() is not other
    pool.release(other)


@pytest.mark.cluster_only
def test_an_interruption_just_after_a_wave_s_reply_was_read_does_not_wait_for_another(
    redis_url: str, namespace: str
) -> None:
    """An interruption landing just after a wave's reply was read whole (as its
    read returns): the wave waits for what is still due on that connection
    before it goes on, and nothing is: it goes on at once, not after the wave's
    deadline (a socket timeout; never, without one) waiting for a reply that
    was already read (the fourth review of 2026-12-06, N3: the Cluster twin
    of the store's F1)."""
    with durabilis.connect(redis_url, namespace=namespace, socket_timeout=30) as store:
        store.run_step(claims(store, "warm-1", "warm-2"), waves=[0, 0])  # scripts loaded
        with (
            raising_handler(Interrupted, signal.SIGUSR1),
            signal_in(_wave._kept_reply.__code__) as armed,  # (its reply read whole)
        ):
            began = time.monotonic()
            with pytest.raises(Interrupted):
                store.run_step(claims(store, "read-1"), waves=[0])
            took = time.monotonic() - began
        assert not armed[0]  # (it landed there)
        assert took < 10, took  # (not the wave's 30 s deadline)
        assert store.run_step(claims(store, "next-1", "next-2"), waves=[0, 0]).status == "cc"


@pytest.mark.cluster_only
@pytest.mark.parametrize("second_at", ["_drain_past", "_drain"])
def test_a_second_interruption_as_a_wave_s_read_is_drained_loses_no_connection(
    redis_url: str, namespace: str, raw: Any, second_at: str
) -> None:
    """A first interruption cuts a wave's read (its node paused); a second one
    lands as the drain that follows begins (before its ``try``): the
    connection goes back to its node's pool, dropped (its replies on their
    way), not left in use for good (a review of 2026-12-06, F1: one connection
    of the node lost per hit)."""
    with durabilis.connect(redis_url, namespace=namespace, socket_timeout=30) as store:
        store.run_step(claims(store, "warm-1", "warm-2"), waves=[0, 0])  # scripts loaded
        [call] = claims(store, "read-1")
        node = store.client.get_node_from_key(call.keys[0])
        pool = store.client.get_redis_connection(node).connection_pool
        timer = threading.Timer(0.15, os.kill, (os.getpid(), signal.SIGUSR1))
        with (
            raising_handler(Interrupted, signal.SIGUSR1),
            raising_handler(InterruptedAgain, signal.SIGUSR2),
            signal_as_it_starts(getattr(_wave, second_at).__code__, signal.SIGUSR2) as armed,
        ):
            raw.execute_command("CLIENT", "PAUSE", 1000, "WRITE", target_nodes=node)
            timer.start()
            try:
                with pytest.raises(InterruptedAgain):
                    store.run_step([call], waves=[0])
            finally:
                timer.join()
            assert not armed[0]  # (the second one landed as the drain began)
        assert not pool._in_use_connections, "a connection was left in use"
        assert store.run_step(claims(store, "next-1", "next-2"), waves=[0, 0]).status == "cc"


def test_a_call_that_ends_after_close_still_removes_its_index_entry_and_counts(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """Found by an adversarial review: the closed keep-alive's last tick sent only
    removals a second old, and then stopped."""
    store = durabilis.connect(redis_url, namespace=namespace)
    store._fuse = False  # the Cluster code path (a no-op on Cluster)
    layer = DurabilityLayer(store, fast_config(lease=30, renew_every_seconds=0.4))
    done = threading.Event()

    def slow(ctx: Any) -> str:
        time.sleep(0.7)
        return "ok"

    try:
        worker = threading.Thread(target=lambda: (layer.execute("a1", "job", "p", slow),
                                                  done.set()))
        worker.start()
        time.sleep(0.2)
        layer.close()  # the operation goes on; it ends after this
        worker.join(5)
        assert done.is_set()
        deadline = time.monotonic() + 5
        while raw.zcard(store.keys.layer("inflight")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert raw.zcard(store.keys.layer("inflight")) == 0
        assert raw.hget(store.keys.layer("stats"), "succeeded") == b"1"
    finally:
        store.close()


def test_a_flush_that_fails_loses_no_removal_and_counts_nothing_twice(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """Found by an adversarial review: a failed flush dropped its batch, and a batch
    sent again merged with newer removals counted its calls twice."""
    store = durabilis.connect(redis_url, namespace=namespace)
    store._fuse = False
    layer = DurabilityLayer(store, fast_config())
    real = store.run_step
    fail = {"left": 0, "applied": True}

    def flaky(calls: Any, gates: Any = None, waves: Any = None) -> Any:
        removing = any(c.name == "layer_note" and c.args[0] in ("rem", "leave") for c in calls)
        if fail["left"] and removing:
            fail["left"] -= 1
            if fail["applied"]:
                real(calls, gates, waves)  # applied, then the reply is lost
            raise StorageUnavailable("the reply was lost")
        return real(calls, gates, waves)

    store.run_step = flaky  # type: ignore[method-assign]
    try:
        layer.execute("a1", "job", "p-1", Counter())
        fail["left"] = 1  # p-2's claim step carries p-1's removal: its reply is lost
        with pytest.raises(StorageUnavailable):
            layer.execute("a1", "job", "p-2", Counter())
        layer.execute("a1", "job", "p-3", Counter())
        fail.update(left=1, applied=False)  # the next flush fails before anything ran
        with pytest.raises(StorageUnavailable):
            layer.stats()
        stats = layer.stats()  # sent again: nothing lost, nothing twice
        assert (stats.started, stats.succeeded, stats.in_flight) == (2, 2, 0)
    finally:
        store.close()


def test_a_duplicate_never_asks_the_breaker(
    store: durabilis.Store, raw: Any
) -> None:
    """It gets its stored result while the circuit is open, and never holds a probe
    slot a real call needs (Cluster: the breaker goes after the claim)."""
    store._fuse = False
    layer = DurabilityLayer(store, fast_config())
    assert layer.execute("a1", "job", "p", Counter(result="stored")) == "stored"
    layer.breakers.force_open("svc")
    time.sleep(1.05)  # past the reset timeout: the next admission is the half-open probe
    sent: list[str] = []
    real = store.run_step

    def watch(calls: Any, gates: Any = None, waves: Any = None) -> Any:
        replies = real(calls, gates, waves)
        sent.extend(part.name for c, st in zip(calls, replies.status, strict=True) if st != "n"
                    for part in unfuse(c))  # (Cluster: the claim fused with its birth entry)
        return replies

    store.run_step = watch  # type: ignore[method-assign]
    assert layer.execute("a1", "job", "p", Counter()) == "stored"
    del store.run_step
    assert "idem_claim" in sent and not {"cb_before", "cb_after"} & set(sent)
    assert raw.hlen(store.keys.breaker_probes("svc")) == 0
    assert layer.execute("a1", "job", "other", Counter(result="probe")) == "probe"


def test_on_cluster_the_layer_admits_from_the_breaker_cache_at_most_once_after_a_trip(
    redis_url: str, namespace: str
) -> None:
    """The staleness bound of cached admission (CircuitBreakerRegistry), now used by
    the layer's Cluster path: after another replica trips the breaker, one call
    passes (its report, not counted in the new generation, ends the cache)."""
    here, there = (durabilis.connect(redis_url, namespace=namespace) for _ in range(2))
    here._fuse = False
    try:
        layer = DurabilityLayer(here, fast_config())
        other = DurabilityLayer(there, fast_config())
        layer.execute("a1", "job", "p-1", Counter())  # admitted by Redis: cached
        layer.execute("a1", "job", "p-2", Counter())
        other.breakers.force_open("svc")
        assert layer.execute("a1", "job", "p-3", Counter()) == "done"  # from the cache
        with pytest.raises(durabilis.CircuitOpen):
            layer.execute("a1", "job", "p-4", Counter())
    finally:
        here.close()
        there.close()


@pytest.mark.standalone_only  # the failure is injected in Store.run: the one-by-one path
def test_a_release_that_fails_never_holds_back_the_probe_slot_s(
    store: durabilis.Store, raw: Any
) -> None:
    """Found by an adversarial helper: the compensation went one call per wave, so
    a claim release that failed kept the probe slot (every caller refused until
    the probe timeout). Now the releases go at once, the index entry after them:
    the claim whose release failed stays listed for recovery."""
    store._fuse = False
    layer = DurabilityLayer(store, fast_config())
    layer.breakers.force_open("svc")
    time.sleep(1.05)  # the next admission is the half-open probe
    real = store.run
    failed: list[str] = []

    def flaky(call: ScriptCall) -> Any:
        if call.name == "idem_release" and not failed:
            failed.append(call.name)
            raise StorageUnavailable("the claim's node is unreachable")
        return real(call)

    store.run = flaky  # type: ignore[method-assign]
    with pytest.raises(durabilis.OperationError):
        layer.execute("a1", "job", "p", Counter(["PERMISSION_DENIED"]))
    del store.run
    assert failed
    assert raw.hlen(store.keys.breaker_probes("svc")) == 0
    assert raw.zcard(store.keys.layer("inflight")) == 1  # kept: its claim is still out
    assert layer.execute("a1", "job", "other", Counter(result="probe")) == "probe"
