"""The core promise under SIGKILL: nothing lost, nothing doubled after its record,
never two workers at once — over 20 runs of 4 workers and 500 operations, on a
server and on Redis Cluster (5 through Sentinel, with ``--every-test-on-backend``:
the workers' deaths are no Redis fault; ``DURABILIS_CRASH_RUNS`` sets another
count)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import threading
import time

import pytest

import durabilis
from durabilis.layer import DurabilityLayer
from tests.integration._layer_workers import LEASE_SECONDS, Ledger, crash_config, crash_worker
from tests.support import figures
from tests.support.backends import raw_client

pytestmark = [pytest.mark.topologies("cluster"), pytest.mark.serial]

RUNS = 20
RUNS_ON = {"sentinel": 5}
WORKERS = 4
OPERATIONS = 500


def one_run(url: str, namespace: str, run: int, rng: random.Random) -> dict[str, int]:
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=crash_worker, args=(url, namespace, run, OPERATIONS, run * 10 + i))
        for i in range(WORKERS)
    ]
    for p in procs:
        p.start()
    raw = raw_client(url)
    prefix = f"{namespace}:ledger:{run}"
    # Kill one worker at a random moment while operations are running.
    deadline = time.monotonic() + 60
    kill_after = rng.randint(20, 300)  # operations started fleet-wide
    while time.monotonic() < deadline and sum(
        int(v) for v in raw.hvals(f"{prefix}:starts")
    ) < kill_after:
        time.sleep(0.002)
    victim = rng.choice(procs)
    os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode is not None, "a worker hung"
    assert victim.exitcode == -signal.SIGKILL

    # The dead worker's leases run out; recovery, from two replicas at once.
    time.sleep(LEASE_SECONDS + 0.3)
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, crash_config())
    other = DurabilityLayer(durabilis.connect(url, namespace=namespace), crash_config())
    recovered: list[list[str]] = []
    racer = threading.Thread(target=lambda: recovered.append(other.recover_orphans()))
    racer.start()
    recovered.append(layer.recover_orphans())
    racer.join()
    parked_ids = [i for batch in recovered for i in batch]
    assert len(parked_ids) == len(set(parked_ids))  # each orphan parked once

    ledger = Ledger(url, namespace, run, "replayer")
    for _ in range(30):  # replays fail transiently too; they stay pending until they succeed
        if layer.dlq.pending_count() == 0:
            break
        layer.replay_pending(ledger)
    assert layer.dlq.pending_count() == 0

    done = 0
    for op in range(OPERATIONS):
        key = durabilis.IdempotencyKey.new("agent", "job", {"run": run, "op": op})
        seen = layer.idempotency.check(key)
        done += seen is not None and not seen.in_progress
    effects = {int(k): int(v) for k, v in raw.hgetall(f"{prefix}:effects").items()}
    violations = {k.decode(): int(v) for k, v in raw.hgetall(f"{prefix}:violations").items()}
    result = {
        "done": done,
        "recovered": len(parked_ids),
        "with_effect": len(effects),
        "reruns_after_effect": sum(n - 1 for n in effects.values()),
        "downstream_effects": int(raw.hlen(f"{prefix}:downstream")),
        "concurrent": violations.get("concurrent", 0),
        "ran_after_record": violations.get("ran_after_record", 0),
    }
    layer.close()
    other.close()
    store.close()
    raw.close()
    return result


def test_sigkill_loop_loses_nothing_and_doubles_nothing(
    redis_url: str, namespace: str, backend: str
) -> None:
    # 20 runs on a server and on Cluster; 5 through Sentinel (the same server
    # behind a URL that names it: the loop's faults are the workers', not Redis')
    runs = int(os.environ.get("DURABILIS_CRASH_RUNS") or RUNS_ON.get(backend, RUNS))
    rng = random.Random(20261130)
    totals: dict[str, int] = {}
    for run in range(runs):
        result = one_run(redis_url, namespace, run, rng)
        assert result["done"] == OPERATIONS, result  # zero lost
        assert result["with_effect"] == OPERATIONS, result
        assert result["concurrent"] == 0, result  # never in two workers at once
        assert result["ran_after_record"] == 0, result  # never again after its record
        # The downstream that dedups on the forwarded key: one effect per operation.
        assert result["downstream_effects"] == OPERATIONS, result
        for k, v in result.items():
            totals[k] = totals.get(k, 0) + v
    figures.note(f"SIGKILL loop ({backend}): {runs} runs x {WORKERS} workers x {OPERATIONS} "
                 f"operations, one worker killed per run: {totals}")
