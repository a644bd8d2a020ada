"""The happy path of a durable call costs two round trips to Redis (standalone).

On Redis Cluster the scripts of one step run one after another (their keys
live in different slots; docs/layer.md, "Round trips"): the test asserts the
documented cluster figures there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis.connection

import durabilis
from durabilis.layer import DurabilityLayer
from tests.integration._layer_support import Counter, fast_config

# Round trips per call: standalone (scripts of a step fused) / Cluster (one per script).
# Cluster (docs/layer.md): claim, admit, index before fn; record, report, index after
# (+ the checkpoint); a duplicate: index, claim (refused: the step stops there), then
# count it; a retry: report, count it, admit again.
EXPECTED = {
    "standalone": {"happy": 2, "checkpoint": 2, "duplicate": 2, "one_retry": 4},
    "cluster": {"happy": 6, "checkpoint": 7, "duplicate": 3, "one_retry": 9},
}


class Sends:
    """Every write of a request (a command or a whole pipeline) to a socket, any client."""

    count = 0


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Sends]]:
    # Patched on the class: a cluster client builds one pool per node itself
    # (it takes no ``connection_class``), every one of them on this class.
    original = redis.connection.Connection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        Sends.count += 1
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counting)
    yield Sends


def round_trips(sends: type[Sends], layer: DurabilityLayer, payload: str, op: Counter,
                **kw: Any) -> int:
    before = sends.count
    layer.execute("a1", "job", payload, op, **kw)
    return sends.count - before


def test_happy_path_is_two_round_trips(
    redis_url: str, namespace: str, backend: str, sends: type[Sends]
) -> None:
    want = EXPECTED[backend]
    store = durabilis.connect(redis_url, namespace=namespace)
    try:
        layer = DurabilityLayer(store, fast_config())
        rt = lambda *a, **kw: round_trips(sends, layer, *a, **kw)  # noqa: E731
        rt("warm-up", Counter())  # loads the scripts (SCRIPT LOAD on NOSCRIPT)
        rt("warm-up", Counter())
        rt("warm-up-2", Counter(), task_id="t", phase="p")
        rt("warm-up-3", Counter(["NETWORK_TIMEOUT"]))
        seen = {
            "happy": rt("op-1", Counter()),  # claim+admit, record+report
            "checkpoint": rt("op-2", Counter(), task_id="t", phase="p2"),
            "duplicate": rt("op-1", Counter()),  # a duplicate: claim, then count it
            # A retry adds: the failure report, the next admission.
            "one_retry": rt("op-3", Counter(["NETWORK_TIMEOUT"])),
        }
        assert seen == want
    finally:
        store.close()
