"""A signal handler that raises between two steps of a Cluster wave's own
bookkeeping leaves no connection behind (the fourth review of 2026-12-05,
finding 3).

The sync Cluster store writes each call of a wave to its node, keeps the
connection until its reply is read, then gives it back. A handler raising
just after a call was written and before its connection was noted (a real
``SIGUSR1``, raised there) lost that connection: never given back, its reply
never read. Now the handlers wait while the wave does its bookkeeping and run
during its writes and reads, where the connection is in hand."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import redis

import durabilis
from durabilis._signal_gate import GATE
from durabilis._steps import Command, drive
from durabilis._store._held import HeldPool
from durabilis._store._wave import ClusterWaves
from durabilis.layer import DurabilityLayer, OperationContext
from tests.integration._layer_support import fast_config
from tests.support.interrupts import Interrupted, raising_handler, signal_as_it_starts


def _in_use(store: durabilis.Store) -> int:
    return sum(
        len(node.redis_connection.connection_pool._in_use_connections)
        for node in store.client.get_nodes()
        if node.redis_connection is not None
    )


def test_a_handler_raising_just_after_a_wave_wrote_a_call_leaves_no_connection_out(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with durabilis.connect(redis_url, namespace=namespace) as store:
        layer = DurabilityLayer(store, fast_config(dependencies={}))
        assert layer.execute("a", "op", {"n": 0}, lambda ctx: "warm") == "warm"
        assert _in_use(store) == 0
        armed = [True]
        send_to_node = ClusterWaves._send_to_node

        def send_then_signal(self: ClusterWaves, *args: Any) -> Any:
            written = send_to_node(self, *args)
            if armed[0] and type(written) is tuple:
                armed[0] = False
                signal.raise_signal(signal.SIGUSR1)  # its handler runs here
            return written

        runs: list[str] = []

        def fn(ctx: OperationContext) -> str:
            runs.append(ctx.idempotency_key)
            return "done"

        monkeypatch.setattr(ClusterWaves, "_send_to_node", send_then_signal)
        with raising_handler(), pytest.raises(Interrupted):
            layer.execute("a", "op", {"n": 1}, fn)
        assert not armed[0], "the signal was never raised in a wave"
        assert runs == []
        assert _in_use(store) == 0, "a connection of the wave was never given back"
        assert layer.execute("a", "op", {"n": 1}, fn) == "done"
        assert layer.execute("a", "op", {"n": 1}, fn) == "done"
        assert len(runs) == 1
        layer.close()


def test_a_handler_raising_inside_a_node_pool_on_redis_py_s_own_path_leaks_nothing(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call the wave hands to redis-py's own routing (here: NOSCRIPT after a
    ``SCRIPT FLUSH``) takes a connection from the node's pool, with the
    handlers let through. The signal lands inside that pool's
    ``get_connection``, after it marked the connection in use: the call is
    interrupted, and no connection stays in use (the node pools hold the
    handlers back for their bookkeeping; redis-py's plain pool kept it in use
    for good, and with ``max_connections`` every later call failed)."""
    with durabilis.connect(redis_url, namespace=namespace) as store:
        layer = DurabilityLayer(store, fast_config(dependencies={}))
        assert layer.execute("a", "op", {"n": 0}, lambda ctx: "warm") == "warm"
        for node in store.client.get_primaries():
            store.client.get_redis_connection(node).script_flush()
        armed = [True]
        inside = [False]
        caught = durabilis.Store._caught
        record = redis.connection.record_connection_count

        def caught_here(self: durabilis.Store, call: Any) -> Any:
            inside[0] = True
            try:
                return caught(self, call)
            finally:
                inside[0] = False

        def record_then_signal(*args: Any, **kwargs: Any) -> Any:
            if armed[0] and inside[0]:
                armed[0] = False
                signal.raise_signal(signal.SIGUSR1)  # the connection is marked in use
            return record(*args, **kwargs)

        monkeypatch.setattr(durabilis.Store, "_caught", caught_here)
        monkeypatch.setattr(redis.connection, "record_connection_count", record_then_signal)
        with raising_handler(), pytest.raises(Interrupted):
            layer.execute("a", "op", {"n": 1}, lambda ctx: "never")
        assert not armed[0], "the signal was never raised in a node's pool"
        assert _in_use(store) == 0, "a node pool's connection stayed in use"
        assert layer.execute("a", "op", {"n": 1}, lambda ctx: "ran") == "ran"
        layer.close()


def test_a_handler_runs_while_a_wave_connects_to_a_node(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wave holds the handlers for its bookkeeping, but a node's new
    connection waits on the network (a paused or unreachable node: up to the
    connect timeout): the signal that lands while it connects interrupts it
    there, not after (held, a Ctrl-C waited out each node's connect)."""
    with durabilis.connect(redis_url, namespace=namespace) as store:
        layer = DurabilityLayer(store, fast_config(dependencies={}))
        assert layer.execute("a", "op", {"n": 0}, lambda ctx: "warm") == "warm"
        store.client.disconnect_connection_pools()  # (the next wave connects anew)
        armed = [True]
        went_on: list[str] = []
        connect = redis.connection.AbstractConnection.connect

        def connect_with_signal(conn: Any) -> None:
            if armed[0]:
                armed[0] = False
                signal.raise_signal(signal.SIGUSR1)  # a Ctrl-C while it connects
                went_on.append("the connect went on")
            connect(conn)

        monkeypatch.setattr(redis.connection.AbstractConnection, "connect", connect_with_signal)
        with raising_handler(), pytest.raises(Interrupted):
            layer.execute("a", "op", {"n": 1}, lambda ctx: "never")
        assert not armed[0], "no connection was made"
        assert went_on == [], "the handler waited for the connect to end"
        assert _in_use(store) == 0
        assert layer.execute("a", "op", {"n": 1}, lambda ctx: "ran") == "ran"
        layer.close()


def test_a_handler_raising_as_a_node_pool_gets_a_connection_back_loses_none(
    store: durabilis.Store,
) -> None:
    """A plain command step goes through redis-py's own routing, which gives
    the node's connection back in its ``finally``. The signal lands at the
    very entry of the pool's ``release``, before any of its code runs: the
    connection is lent with the handlers held, so it goes back, and the
    handler runs just after (the fourth review of 2026-12-06, F1)."""

    def plan() -> Any:
        reply = yield Command(("GET", "{lent}:x"))
        return reply

    assert drive(plan(), store) is None
    with raising_handler(), pytest.raises(Interrupted), \
            signal_as_it_starts(HeldPool.release.__code__) as armed:
        drive(plan(), store)
    assert not armed[0], "the signal was never raised at release"
    assert _in_use(store) == 0, "a connection is out of its node's pool"
    assert not GATE.closed and not GATE.holding and not GATE.lent
    assert drive(plan(), store) is None
