"""Redis Cluster faults under a load of idempotent operations from real processes.

The load (``tests/support/workload.py``) races three worker processes (two
sync, one async) over every operation; a "hot" key is claimed between any two
of them, and ~20 slot siblings of the hot key are spread through the list, so
keys of the faulted slot are created, claimed and recorded while it moves.
"""

from __future__ import annotations

import signal
import time

import pytest

import durabilis
from durabilis.idempotency import IdempotencyGuard
from tests.support import figures
from tests.support.cluster import LocalCluster
from tests.support.slots import crowded_slot, slot_of
from tests.support.workload import LoadResult, run_load, stored_records_disagreeing

pytestmark = pytest.mark.serial

# A fault is a burst, then normal service: errors must stop soon after it ends.
RECOVERY_S = 3.0


def hot_load(namespace: str, tag: str, fresh: int = 1200) -> tuple[str, list[str], int]:
    """``(hot key, ops, slot of the hot key)``: fresh ops with the hot key's siblings inside."""
    hot, *siblings = crowded_slot(namespace, f"{tag}-hot")
    ops = [f"{tag}-{i}" for i in range(fresh)]
    step = fresh // (len(siblings) + 1)
    for n, sib in enumerate(siblings, start=1):
        ops.insert(n * step + n - 1, sib)
    store_keys = durabilis.connect("memory://", namespace=namespace).keys
    return hot, ops, slot_of(store_keys.idem(hot))


def assert_burst_then_normal_service(
    cluster: LocalCluster, namespace: str, res: LoadResult
) -> None:
    assert res.spanned_the_fault, "the load ended before the fault did: " + res.summary()
    assert res.executed_during_fault > 0, "no operation ran during the fault: " + res.summary()
    assert res.unexpected == [], res.summary()
    assert res.unfinished == [] and res.lease_lost == [], res.summary()
    assert res.doubled == [] and res.lost == [], res.summary()
    res.assert_bounded_burst(RECOVERY_S)
    assert stored_records_disagreeing(cluster.url, namespace, res) == []


def note(fault: str, res: LoadResult) -> None:
    spans = res.unavailable
    figures.record("cluster", fault, "cluster", ops=len(res.ops), lost=len(res.lost),
                   doubled=len(res.doubled), unavailable=len(spans),
                   longest_unavailable_s=max((e - s for s, e in spans), default=0.0),
                   ran_during_fault=res.executed_during_fault)


def test_resharding_the_hot_keys_slot_mid_load_is_a_bounded_burst_with_nothing_doubled(
    cluster: LocalCluster, namespace: str
) -> None:
    hot, ops, slot = hot_load(namespace, "reshard")
    source = cluster.primary_of_slot(slot)
    target = next(p for p in cluster.topology()["primaries"] if p != source)

    def reshard() -> None:
        # Hold the slot half-migrated for a second: keys already moved answer
        # ASK, new keys are created on the target, the rest stay on the source.
        cluster.migrate_slot(slot, target, while_migrating=lambda: time.sleep(1.0))

    res = run_load(cluster.url, namespace, ops, reshard, hot=hot,
                   socket_timeout=1.0, lease_s=6.0, work_s=0.002, deadline_s=40)
    assert cluster.primary_of_slot(slot) == target  # MOVED from now on
    assert_burst_then_normal_service(cluster, namespace, res)
    note(f"reshard slot {slot} (ASK 1 s, then MOVED)", res)


def test_replica_failover_mid_load_is_a_bounded_burst_with_nothing_doubled(
    cluster: LocalCluster, namespace: str
) -> None:
    hot, ops, slot = hot_load(namespace, "failover")
    old_primary = cluster.primary_of_slot(slot)
    replica = cluster.replica_of(old_primary)

    res = run_load(cluster.url, namespace, ops, lambda: cluster.failover(replica), hot=hot,
                   socket_timeout=1.0, lease_s=6.0, work_s=0.002, deadline_s=40)
    assert cluster.primary_of_slot(slot) == replica
    assert cluster.topology()["replicas"][old_primary] == replica
    assert_burst_then_normal_service(cluster, namespace, res)
    note("CLUSTER FAILOVER of the hot key's primary", res)


def test_a_timed_out_claim_on_cluster_is_never_resent_and_lands_once_after_the_pause(
    cluster: LocalCluster, namespace: str
) -> None:
    # redis-py's cluster client would re-send a timed-out command up to 10
    # times by default; durabilis turns that off (MOVED/ASK are still followed).
    key = "sent-into-a-paused-node"
    with durabilis.connect(cluster.url, namespace=namespace, socket_timeout=0.3,
                           socket_connect_timeout=0.3) as store:
        guard = IdempotencyGuard(store)
        guard.check_and_record("warm-up")  # the claim script is loaded on every primary
        assert guard.check(key) is None  # and a connection to the key's node is open
        port = cluster.primary_of_slot(slot_of(store.keys.idem(key)))
        node = next(n for n in cluster.nodes if n.port == port)
        node.signal(signal.SIGSTOP)  # 1.5 s: well under cluster-node-timeout, no failover
        try:
            began = time.monotonic()
            with pytest.raises(durabilis.StorageUnavailable):
                guard.check_and_record(key, placeholder="the only claim")
            assert time.monotonic() - began <= 0.3 + 0.75
            time.sleep(max(0.0, 1.5 - (time.monotonic() - began)))
        finally:
            node.signal(signal.SIGCONT)
        landed = guard.check(key)
        assert landed is not None and landed.in_progress
        assert landed.original_result == "the only claim"
