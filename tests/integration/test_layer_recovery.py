"""A worker that dies mid-operation: its lease ends, recovery parks the
operation in the DLQ (WORKER_LOST), and a replay runs it with its original key."""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time

import pytest
import redis

import durabilis
from durabilis.dlq import ReplayOutcome
from durabilis.layer import DurabilityLayer
from tests.integration._layer_support import Counter, fast_config
from tests.integration._layer_workers import die_inside

pytestmark = [pytest.mark.topologies("cluster"), pytest.mark.serial]


def test_worker_killed_mid_operation_is_recovered_into_the_dlq_and_replayed(
    redis_url: str, namespace: str, raw: redis.Redis, backend: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=die_inside, args=(redis_url, namespace, started))
    proc.start()
    assert started.wait(30)
    store = durabilis.connect(redis_url, namespace=namespace)
    layer = DurabilityLayer(store, fast_config(lease=0.5))
    assert layer.recover_orphans() == []  # alive (its lease is renewed): nothing to do
    assert layer.stats().in_flight == 1
    proc.kill()
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    time.sleep(0.8)  # the lease runs out

    parked: list[list[str]] = []
    threads = [threading.Thread(target=lambda: parked.append(layer.recover_orphans()))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for batch in parked for i in batch]
    assert len(ids) == 1  # four replicas recovering at once park it once
    record = layer.dlq.get(ids[0])
    assert record is not None
    assert record.last_error == "WORKER_LOST" and record.agent_id == "a1"
    assert record.original_operation == {"to": "bob", "text": "hello"}
    key = durabilis.IdempotencyKey.new("a1", "job", {"to": "bob", "text": "hello"})
    assert record.metadata["idempotency_key"] == str(key)
    stats = layer.stats()
    assert stats.in_flight == 0
    # Standalone: the parking and its count are one step. Cluster: a recoverer
    # that loses the race may drop the index entry between the winner's release
    # and its count, and the count is lost (never the record: docs/layer.md).
    assert stats.recovered == 1 if backend == "standalone" else stats.recovered <= 1

    op = Counter(result="sent")
    assert layer.replay(ids[0], op).outcome is ReplayOutcome.REPLAYED
    assert len(op.calls) == 1 and op.calls[0].idempotency_key == str(key)
    assert layer.execute("a1", "job", {"to": "bob", "text": "hello"}, Counter()) == "sent"
    assert layer.recover_orphans() == []
    store.close()
