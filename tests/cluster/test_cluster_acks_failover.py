"""The lost acknowledgement on Redis Cluster, with each acknowledgement level.

A cluster of the module's own (3 primaries + 3 replicas, each keeping an AOF),
never the session's: the test kills nodes. The fault, as on Sentinel
(tests/sentinel/test_sentinel_failover.py, which shares the load of
tests/support/failover.py): one primary's replica is SIGKILLed while the load
goes on, so that primary acknowledges writes its replica never gets; then the
primary is SIGKILLed, the replica comes back from its own AOF and takes the
slots over (``CLUSTER FAILOVER FORCE``: the primary is gone), and the old
primary is started again (it rejoins as a replica, its extra writes dropped).
Then every operation is delivered again and its runs counted.

- ``acks="primary"``: what completed on that primary after its replica died
  is gone, so it runs again (the documented risk);
- ``acks="replicas:1"``: nothing acknowledged was lost: no operation runs
  twice; every DLQ record and checkpoint acknowledged is there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.support.cluster import ClusterNotReady, LocalCluster
from tests.support.failover import (
    deliver_again,
    kind_of,
    missing_acknowledged,
    record,
    through_a_failover,
)

pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    nodes = LocalCluster(Path(tmp_path_factory.mktemp("acks-cluster")), appendonly=True)
    nodes.start(timeout=90)
    try:
        yield nodes
    finally:
        nodes.stop()


def _promote(cluster: LocalCluster, replica: int, timeout: float = 40) -> None:
    """``CLUSTER FAILOVER FORCE`` on ``replica`` until it serves as a primary: asked
    again while it is still joining, and ``TAKEOVER`` (no vote) once a FORCE went
    unanswered for 8 s (primaries vote for one shard's failover once per two node
    timeouts: a repetition soon after another on the same shard gets no vote)."""
    deadline = time.monotonic() + timeout
    asked_at: float | None = None
    mode = "FORCE"
    while time.monotonic() < deadline:
        try:
            with cluster.node(replica) as c:
                if c.info("replication").get("role") == "master":
                    return
                if asked_at is None or time.monotonic() - asked_at > 8:
                    mode = "FORCE" if asked_at is None else "TAKEOVER"
                    c.execute_command("CLUSTER", "FAILOVER", mode)
                    asked_at = time.monotonic()
        except redis.RedisError:
            asked_at = None  # loading its AOF, or not yet a known replica: ask again
        time.sleep(0.1)
    raise ClusterNotReady(f"replica {replica} was not promoted within {timeout}s ({mode})")


def _lose_the_tail(cluster: LocalCluster) -> Callable[[], None]:
    cluster.wait_healthy(60)
    primary = min(cluster.topology()["primaries"])
    replica = cluster.replica_of(primary)
    cluster.kill(replica)  # the primary goes on acknowledging writes its replica lacks
    time.sleep(0.5)
    cluster.kill(primary)
    cluster.restart(replica)  # back from its AOF: what it had applied
    _promote(cluster, replica)
    # The old primary back, as the new one's replica (what an operator does; until
    # then acks="replicas:1" refuses every write to those slots, as it should)
    cluster.restart(primary)
    return lambda: cluster.wait_healthy(60)


def test_with_acks_primary_a_failover_can_run_operations_twice(
    own_cluster: LocalCluster, namespace: str
) -> None:
    load, layer, store = through_a_failover(
        own_cluster.url, namespace, "primary", lambda: _lose_the_tail(own_cluster))
    try:
        missing_dlq, missing_ckpt = missing_acknowledged(layer, load)
        assert deliver_again(layer, load) == 0
        doubled = sum(1 for runs in load.runs.values() if runs > 1)
        record("cluster", "replica lags", "primary", load, doubled, missing_dlq + missing_ckpt)
        assert doubled > 0  # what completed after the replica died was on the primary only
    finally:
        layer.close()
        store.close()


@pytest.mark.parametrize("repetition", range(2))
def test_with_acks_replicas_1_nothing_acknowledged_is_lost(
    own_cluster: LocalCluster, namespace: str, repetition: int
) -> None:
    load, layer, store = through_a_failover(
        own_cluster.url, namespace, "replicas:1", lambda: _lose_the_tail(own_cluster))
    try:
        missing_dlq, missing_ckpt = missing_acknowledged(layer, load)
        assert deliver_again(layer, load) == 0
        doubled = sorted(key for key, runs in load.runs.items() if runs > 1)
        record("cluster", "replica lags", "replicas:1", load, len(doubled),
               missing_dlq + missing_ckpt)
        assert doubled == []
        assert (missing_dlq, missing_ckpt) == (0, 0)
        assert load.parked and load.saved
        assert set(load.runs) == {key for key in load.attempted if kind_of(key) != "fails"}
    finally:
        layer.close()
        store.close()
