"""A wave waits one socket timeout for a node that hangs, not one per call.

The sync Cluster store writes a wave's calls to their nodes, then reads the
replies one after another. Each read used to wait the whole socket timeout, so
N calls on a primary that does not answer held the wave for N timeouts, and
with it the keep-alive's renewals of the claims on healthy nodes: their leases
ran out, and a live operation was taken over and run twice (found by a review:
3 claims on a paused node, lease 6 s, renewals every 2 s). Now the wave has one
deadline. The pause is shorter than the other tests' socket timeouts (the
session cluster is shared).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import durabilis
from durabilis import aio
from durabilis._scripts import ScriptCall
from durabilis.errors import StorageUnavailable
from tests.support.cluster import LocalCluster
from tests.support.interrupts import (
    INTERRUPT_AFTER,
    PAUSE_MS,
    Interrupted,
    claim,
    interrupted_after,
    state,
)

pytestmark = pytest.mark.serial

TIMEOUT = 0.5  # the store's socket timeout here


def keys_on(
    store: durabilis.Store | aio.Store, raw: Any, port: int, n: int, other: bool = False
) -> list[str]:
    """``n`` idempotency keys whose record is on primary ``port`` (or, ``other``, not)."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        on = raw.get_node_from_key(store.keys.idem(f"k{i}")).port == port
        if on != other:
            out.append(f"k{i}")
        i += 1
    return out


def wave_on(cluster: LocalCluster, namespace: str, primary: int, n: int) -> tuple[
    Any, durabilis.Store, int, list[ScriptCall]
]:
    """A raw client, a store (socket timeout TIMEOUT), the port of the ``primary``-th
    primary, and ``n`` calls on it plus one on another, sent once (connected,
    scripts loaded)."""
    raw = cluster.client()
    store = durabilis.connect(cluster.url, namespace=namespace, socket_timeout=TIMEOUT)
    hung = sorted(cluster.topology()["primaries"])[primary]
    keys = [*keys_on(store, raw, hung, n), *keys_on(store, raw, hung, 1, other=True)]
    calls = [ScriptCall("idem_check", [store.keys.idem(k)], []) for k in keys]
    assert len(store.run_many(calls)) == n + 1
    return raw, store, hung, calls


def test_a_wave_waits_one_socket_timeout_for_a_node_that_hangs_not_one_per_call(
    cluster: LocalCluster, namespace: str
) -> None:
    raw, store, hung, calls = wave_on(cluster, namespace, 0, 4)
    try:
        with cluster.node(hung) as node:
            node.execute_command("CLIENT", "PAUSE", 2500, "WRITE")
        began = time.monotonic()
        with pytest.raises(StorageUnavailable) as failed:
            store.run_many(calls)
        took = time.monotonic() - began
        # One read's timeout; the node's other calls fail at once (4 timeouts before).
        assert took < TIMEOUT + 0.8, f"the wave took {took:.2f} s"
        partial = failed.value.partial
        assert partial is not None and partial.status == "????c"  # (the healthy node's reply)
    finally:
        with cluster.node(hung) as node:
            node.execute_command("CLIENT", "UNPAUSE")
        store.close()
        raw.close()


def test_waves_after_a_node_hangs_fail_its_calls_at_once_fresh_connections_too(
    cluster: LocalCluster, namespace: str
) -> None:
    """Found by the review of the first deadline: the next wave had to connect
    again to the node that hung (its connections dropped), each connect waiting
    a socket timeout, and every later read waited a floor; 20 calls there took
    20 of each. Now a node that fails in a wave (connecting, writing, reading)
    has its other calls in that wave fail at once."""
    raw, store, hung, calls = wave_on(cluster, namespace, 1, 20)
    try:
        with cluster.node(hung) as node:
            node.execute_command("CLIENT", "PAUSE", 2500, "ALL")  # (new connections too)
        for wave in (1, 2):
            began = time.monotonic()
            with pytest.raises(StorageUnavailable) as failed:
                store.run_many(calls)
            took = time.monotonic() - began
            # At most: a read's timeout, or a connect's and the usual path's once.
            assert took < 3 * TIMEOUT + 0.3, f"wave {wave} took {took:.2f} s"
            partial = failed.value.partial
            assert partial is not None and partial.status == "?" * 20 + "c"
    finally:
        with cluster.node(hung) as node:
            node.execute_command("CLIENT", "UNPAUSE")
        store.close()
        raw.close()


def test_an_interrupted_wave_waits_for_the_call_it_was_reading(
    cluster: LocalCluster, namespace: str, raw: Any
) -> None:
    """Found by the fifth review: Ctrl-C while a wave read one call's reply
    dropped that connection unread (the calls not read yet were waited for):
    the plan's release of the claim could overtake it (held by nobody for a
    lease). Now that read is finished first, within the wave's time
    (tests/integration/test_interrupted_read.py: the standalone send)."""
    store = durabilis.connect(cluster.url, namespace=namespace, socket_timeout=5)
    try:
        paused = sorted(cluster.topology()["primaries"])[0]
        # A key on the paused primary, one elsewhere.
        [on], [other] = keys_on(store, raw, paused, 1), keys_on(store, raw, paused, 1, other=True)
        store.run_many([claim(store, f"{on}-warm"), claim(store, f"{other}-warm")])
        with cluster.node(paused) as node:
            node.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        # The paused primary's call is read first: the interruption lands in its read.
        with interrupted_after(INTERRUPT_AFTER), pytest.raises(Interrupted):
            store.run_many([claim(store, on), claim(store, other)])
        assert state(raw, store, on) == b"p"  # (before: still queued on the node)
        assert state(raw, store, other) == b"p"
    finally:
        with cluster.node(paused) as node:
            node.execute_command("CLIENT", "UNPAUSE")
        store.close()


def test_an_interrupted_step_waits_for_its_one_call_on_cluster(
    cluster: LocalCluster, namespace: str, raw: Any
) -> None:
    """The sync twin of the test below: a wave of one call (a claim step's
    waves are) was read by redis-py's own routing, which dropped its
    connection at the interruption: the plan's release could overtake the
    claim (held by nobody for a lease). Now it is written and read as a
    wave's calls are, and waited for."""
    store = durabilis.connect(cluster.url, namespace=namespace, socket_timeout=5)
    try:
        paused = sorted(cluster.topology()["primaries"])[0]
        [name] = keys_on(store, raw, paused, 1)
        store.run_step([claim(store, f"{name}-warm")])
        with cluster.node(paused) as node:
            node.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        with interrupted_after(INTERRUPT_AFTER), pytest.raises(Interrupted):
            store.run_step([claim(store, name)])
        assert state(raw, store, name) == b"p"  # (before: still queued on the node)
    finally:
        with cluster.node(paused) as node:
            node.execute_command("CLIENT", "UNPAUSE")
        store.close()


def test_a_cancelled_async_step_waits_for_its_one_call_on_cluster(
    cluster: LocalCluster, namespace: str, raw: Any
) -> None:
    """The asyncio twin: a wave of several calls already waited for them when its
    caller was cancelled, but a wave of one call (a claim step's waves are) was
    read in the caller's task, and redis-py dropped its connection at the
    cancellation: the plan's release could overtake the claim. Now it waits."""
    paused = sorted(cluster.topology()["primaries"])[0]

    async def scenario() -> None:
        store = aio.connect(cluster.url, namespace=namespace, socket_timeout=5)
        try:
            [name] = keys_on(store, raw, paused, 1)
            await store.run_step([claim(store, f"{name}-warm")])
            with cluster.node(paused) as node:
                node.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
            step = asyncio.ensure_future(store.run_step([claim(store, name)]))
            await asyncio.sleep(INTERRUPT_AFTER)
            step.cancel()
            with pytest.raises(asyncio.CancelledError):
                await step
            assert state(raw, store, name) == b"p"  # (before: still queued on the node)
        finally:
            with cluster.node(paused) as node:
                node.execute_command("CLIENT", "UNPAUSE")
            await store.close()

    asyncio.run(scenario())
