"""Checkpoint guarantees across real processes: crash and resume, racing writers, the cap."""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections import Counter

import pytest
import redis

import durabilis
from durabilis.checkpoint import CheckpointConfig, CheckpointManager
from tests.integration import _checkpoint_workers as workers

pytestmark = pytest.mark.serial

SPAWN = multiprocessing.get_context("spawn")


def _join_all(procs: list[multiprocessing.process.BaseProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join(5)
    assert not alive, "a worker did not finish in time"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


def test_sigkill_in_phase_3_resumes_at_phase_3_and_phases_1_2_ran_once(
    store: durabilis.Store, raw: redis.Redis, redis_url: str, namespace: str
) -> None:
    task = "five-phase-task"
    crashing = SPAWN.Process(
        target=workers.run_five_phases, args=(redis_url, namespace, task, 3)
    )
    crashing.start()
    try:
        deadline = time.monotonic() + 15
        while raw.get(workers.in_phase_marker(namespace)) is None:
            assert time.monotonic() < deadline, "the worker never reached phase 3"
            assert crashing.is_alive(), "the worker died before phase 3"
            time.sleep(0.02)
        crashing.kill()  # SIGKILL: no cleanup, no except/finally in the worker
        crashing.join(10)
    finally:
        if crashing.is_alive():
            crashing.kill()
    assert crashing.exitcode == -signal.SIGKILL

    manager = CheckpointManager(store)
    assert manager.restore(task, "agent-1").phase == "phase-2"  # the resume point

    resumed = SPAWN.Process(target=workers.run_five_phases, args=(redis_url, namespace, task, 0))
    resumed.start()
    _join_all([resumed], timeout=20)

    counts = {k.decode(): int(v) for k, v in raw.hgetall(workers.side_effects(namespace)).items()}
    assert counts == {"phase-1": 1, "phase-2": 1, "phase-3": 2, "phase-4": 1, "phase-5": 1}
    assert raw.lrange(workers.outcomes(namespace), 0, -1) == [b"finished"]
    history = manager.history(task, "agent-1")
    assert [h.phase for h in history] == [f"phase-{n}" for n in (5, 4, 3, 2, 1)]
    assert [h.state["value"] for h in history] == [50, 40, 30, 20, 10]


def test_two_processes_racing_on_one_expected_id_one_wins_and_no_update_is_lost(
    store: durabilis.Store, raw: redis.Redis, redis_url: str, namespace: str
) -> None:
    rounds = 20
    manager = CheckpointManager(store)
    manager.save("shared", "agent", "counter", {"n": 0, "by": "setup"})
    barrier = SPAWN.Barrier(2)
    procs = [
        SPAWN.Process(
            target=workers.race_expected,
            args=(redis_url, namespace, "shared", name, barrier, rounds),
        )
        for name in ("left", "right")
    ]
    for p in procs:
        p.start()
    _join_all(procs, timeout=20)

    results = [r.decode().split(":") for r in raw.lrange(workers.outcomes(namespace), 0, -1)]
    per_round: dict[str, Counter[str]] = {}
    for rnd, _name, outcome in results:
        per_round.setdefault(rnd, Counter())[outcome] += 1
    assert len(per_round) == rounds
    for rnd, tally in per_round.items():
        assert tally == Counter({"won": 1, "conflict": 1}), (rnd, tally)

    final = manager.restore("shared", "agent")
    assert final.state["n"] == 2 * rounds  # every increment landed
    history = manager.history("shared", "agent")
    assert [h.state["n"] for h in history] == list(range(2 * rounds, -1, -1))  # one line, no fork


def test_four_concurrent_writers_never_leave_more_than_max_checkpoints_live(
    store: durabilis.Store, raw: redis.Redis, redis_url: str, namespace: str
) -> None:
    cap, writers, saves = 20, 4, 150
    barrier = SPAWN.Barrier(writers + 1)
    procs = [
        SPAWN.Process(
            target=workers.cap_writer,
            args=(redis_url, namespace, w, cap, saves, barrier),
        )
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    # An atomic snapshot of the record keys (KEYS inside one EVAL, test-only).
    # KEYS[1] only routes the script to the node of the {ckpt} slot on Cluster.
    snapshot = raw.register_script("return #redis.call('KEYS', ARGV[1])")
    slot_key = [f"{namespace}:ckpt:{{ckpt}}:live"]
    records = f"{namespace}:ckpt:{{ckpt}}:rec:*"
    barrier.wait(timeout=15)
    peak_records = 0
    while any(p.is_alive() for p in procs):
        peak_records = max(peak_records, int(snapshot(keys=slot_key, args=[records])))
        time.sleep(0.002)
    _join_all(procs, timeout=20)

    peaks = [int(r.decode().split(":")[1]) for r in raw.lrange(workers.outcomes(namespace), 0, -1)]
    assert len(peaks) == writers
    assert max(peaks) <= cap
    assert 0 < peak_records <= cap
    manager = CheckpointManager(store, CheckpointConfig(max_checkpoints=cap))
    assert manager.count() == cap
    assert int(snapshot(keys=slot_key, args=[records])) == cap
    # the survivors are exactly the newest `cap` saves of all writers
    sequences = sorted(int(raw.hget(k, "q")) for k in raw.scan_iter(match=records))
    total = writers * saves
    assert sequences == list(range(total - cap + 1, total + 1))
    # and no index of an evicted task was left behind
    assert len(list(raw.scan_iter(match=f"{namespace}:ckpt:{{ckpt}}:task:*"))) == cap

