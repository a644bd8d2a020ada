"""The composed layer through Redis Cluster faults: the slot of its BREAKER moves or fails over.

Every ``layer.execute`` asks the breaker before and reports to it after each
attempt, so the breaker's slot is the hottest of the load (three worker
processes, two sync layers and one async, racing for every operation; see
``tests/faults/test_layer_faults.py`` for what is checked afterwards).
"""

from __future__ import annotations

import time

import pytest

from durabilis._keys import KeySpace
from tests.faults.test_layer_faults import assert_layer_held, layer_ops, note_layer
from tests.support.cluster import LocalCluster
from tests.support.slots import slot_of
from tests.support.workload import LAYER_BREAKER, run_layer_ops, run_load

pytestmark = pytest.mark.serial

RECOVERY_S = 3.0


def breaker_slot(namespace: str) -> int:
    """The slot of every key of the layer's breaker (one hash tag: its name)."""
    return slot_of(KeySpace(namespace).breaker(LAYER_BREAKER))


def test_resharding_the_breakers_slot_mid_layer_load_is_a_bounded_burst_with_nothing_doubled(
    cluster: LocalCluster, namespace: str
) -> None:
    slot = breaker_slot(namespace)
    source = cluster.primary_of_slot(slot)
    target = next(p for p in cluster.topology()["primaries"] if p != source)

    def reshard() -> None:
        # Half-migrated for a second (ASK for the keys already moved), then MOVED.
        cluster.migrate_slot(slot, target, while_migrating=lambda: time.sleep(1.0))

    res = run_load(cluster.url, namespace, layer_ops("reshard", 400), reshard,
                   worker=run_layer_ops, hot="reshard-hot", socket_timeout=1.0, lease_s=6.0,
                   work_s=0.002, deadline_s=40)
    assert cluster.primary_of_slot(slot) == target
    assert res.executed_during_fault > 0, res.summary()
    res.assert_bounded_burst(RECOVERY_S)
    problems = assert_layer_held(cluster.url, namespace, res)
    note_layer(f"layer: reshard the breaker's slot {slot} (ASK, MOVED)", "cluster", res,
               problems)


def test_replica_failover_of_the_breakers_primary_mid_layer_load_is_a_bounded_burst(
    cluster: LocalCluster, namespace: str
) -> None:
    slot = breaker_slot(namespace)
    old_primary = cluster.primary_of_slot(slot)
    replica = cluster.replica_of(old_primary)

    res = run_load(cluster.url, namespace, layer_ops("failover", 400),
                   lambda: cluster.failover(replica), worker=run_layer_ops, hot="failover-hot",
                   socket_timeout=1.0, lease_s=6.0, work_s=0.002, deadline_s=40)
    assert cluster.primary_of_slot(slot) == replica
    res.assert_bounded_burst(RECOVERY_S)
    problems = assert_layer_held(cluster.url, namespace, res)
    note_layer("layer: CLUSTER FAILOVER of the breaker's primary", "cluster", res, problems)
