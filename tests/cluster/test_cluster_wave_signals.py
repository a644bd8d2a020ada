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

import durabilis
from durabilis._store._wave import ClusterWaves
from durabilis.layer import DurabilityLayer, OperationContext
from tests.integration._layer_support import fast_config


class Interrupted(BaseException):
    """What the test's handler raises (as KeyboardInterrupt would)."""


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

        def handler(signum: int, frame: Any) -> None:
            raise Interrupted

        runs: list[str] = []

        def fn(ctx: OperationContext) -> str:
            runs.append(ctx.idempotency_key)
            return "done"

        monkeypatch.setattr(ClusterWaves, "_send_to_node", send_then_signal)
        previous = signal.signal(signal.SIGUSR1, handler)
        try:
            with pytest.raises(Interrupted):
                layer.execute("a", "op", {"n": 1}, fn)
        finally:
            signal.signal(signal.SIGUSR1, previous)
        assert not armed[0], "the signal was never raised in a wave"
        assert runs == []
        assert _in_use(store) == 0, "a connection of the wave was never given back"
        assert layer.execute("a", "op", {"n": 1}, fn) == "done"
        assert layer.execute("a", "op", {"n": 1}, fn) == "done"
        assert len(runs) == 1
        layer.close()
