"""The composed layer through the faults of one Redis server (and SCRIPT FLUSH anywhere).

The load (``tests/support/workload.py``, ``worker=run_layer_ops``): three worker
processes (two sync layers, one async) race for every operation through
``layer.execute`` — idempotency claim, breaker, fleet-wide retry budget, a
checkpoint per success — while one operation in ~15 always fails and is
parked in the DLQ by the worker that owns it. One fault is injected mid-load.
Shown: callers only get ``StorageUnavailable`` (bounded in time); service comes
back by itself; no operation is lost (each has its completed record and its
checkpoint, or its DLQ record); none is doubled (a re-run happens only after
an outcome that Redis failed to store, under the same key: counted apart).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from durabilis.testing import RedisServer
from tests.support import figures
from tests.support.workload import (
    DOUBLE_KINDS,
    FAILS,
    LOSS_KINDS,
    LoadResult,
    layer_load_problems,
    run_layer_ops,
    run_load,
)

pytestmark = [pytest.mark.topologies("cluster"), pytest.mark.serial]

SOCKET_TIMEOUT = 0.5
SLACK = 0.75  # a loaded 2-core machine on top of the socket timeout (not a speed target)


def layer_ops(tag: str, n: int = 240, fail_every: int = 15) -> list[str]:
    return [f"{tag}-{i}{FAILS if i % fail_every == 7 else ''}" for i in range(n)]


def assert_layer_held(
    url: str, namespace: str, res: LoadResult, effects_url: str | None = None
) -> dict[str, list[str]]:
    """Every promise of the layer held through the fault (see the module docstring)."""
    assert res.spanned_the_fault, "the load ended before the fault did: " + res.summary()
    assert res.parked, "no operation was parked: the DLQ was not exercised"
    problems = layer_load_problems(url, namespace, res, effects_url)
    assert {k: v for k, v in problems.items() if v} == {}, res.summary()
    return problems


def note_layer(fault: str, backend: str, res: LoadResult, problems: dict[str, list[str]]) -> None:
    spans = res.unavailable
    figures.record(
        "layer", fault, backend, ops=len(res.ops),
        lost=sum(len(problems[k]) for k in LOSS_KINDS),
        doubled=sum(len(problems[k]) for k in DOUBLE_KINDS),
        unavailable=len(spans),
        longest_unavailable_s=max((e - s for s, e in spans), default=0.0),
        ran_during_fault=res.executed_during_fault, reruns=res.reruns,
    )


@pytest.mark.standalone_only  # its own server; the session one only counts side effects
def test_layer_under_a_2s_sigstop_fails_closed_in_time_then_recovers_with_nothing_lost_or_doubled(
    private_redis: RedisServer, namespace: str, redis_url: str
) -> None:
    def pause() -> None:
        private_redis.signal(signal.SIGSTOP)
        try:
            time.sleep(2.0)
        finally:
            private_redis.signal(signal.SIGCONT)

    res = run_load(private_redis.url, namespace, layer_ops("paused"), pause,
                   worker=run_layer_ops, effects_url=redis_url, hot="paused-hot",
                   socket_timeout=SOCKET_TIMEOUT, lease_s=4.0, work_s=0.003, deadline_s=25)
    spans = res.unavailable
    # The pause hit work in progress. As for the kill below, callers may see no
    # StorageUnavailable at all: a worker inside its (shielded) record step sends
    # it again until Redis answers (one CI run had every caller there).
    assert res.spanned_the_fault, "the load ended before the pause did: " + res.summary()
    longest = max((e - s for s, e in spans), default=0.0)
    assert longest <= SOCKET_TIMEOUT + SLACK, res.summary()  # no hang
    _, resumed = res.fault_window
    last = max((s for s, _ in spans), default=resumed)
    assert last <= resumed + SLACK, res.summary()  # then service is back
    problems = assert_layer_held(private_redis.url, namespace, res, redis_url)
    note_layer("layer: SIGSTOP 2 s", "standalone", res, problems)


@pytest.mark.standalone_only
def test_layer_through_redis_killed_and_restarted_loses_no_record_checkpoint_or_dlq_record(
    private_redis: RedisServer, namespace: str, redis_url: str
) -> None:
    def kill_and_restart() -> None:
        private_redis.stop(kill=True)  # SIGKILL: no shutdown save, only the AOF (fsync always)
        time.sleep(0.5)
        private_redis.start()

    res = run_load(private_redis.url, namespace, layer_ops("killed"), kill_and_restart,
                   worker=run_layer_ops, effects_url=redis_url, hot="killed-hot",
                   socket_timeout=SOCKET_TIMEOUT, lease_s=4.0, work_s=0.003, deadline_s=25)
    # The kill hit work in progress. Callers may see no StorageUnavailable at
    # all: a worker inside its (shielded) record step sends it again until
    # Redis is back, which is the promise; a new claim during the kill fails closed.
    assert res.spanned_the_fault, "the load ended before the kill did: " + res.summary()
    longest = max((e - s for s, e in res.unavailable), default=0.0)
    assert longest <= SOCKET_TIMEOUT + SLACK, res.summary()  # no hang
    # Every result, checkpoint and DLQ id a caller was given before the kill is
    # still there after the restart (layer_outcomes checks each pillar).
    assert res.completed and res.parked
    problems = assert_layer_held(private_redis.url, namespace, res, redis_url)
    note_layer("layer: SIGKILL + restart (AOF fsync always)", "standalone", res, problems)


def test_script_flush_in_a_loop_under_layer_load_is_transparent(
    redis_url: str, namespace: str, raw: Any, backend: str
) -> None:
    flushes = 0

    def flush_loop() -> None:
        nonlocal flushes
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            raw.script_flush()  # every primary on Cluster
            flushes += 1
            time.sleep(0.002)

    res = run_load(redis_url, namespace, layer_ops("flushed", 600), flush_loop,
                   worker=run_layer_ops, fault_after_s=0.1, hot="flushed-hot",
                   socket_timeout=2.0, lease_s=10.0, work_s=0.003, deadline_s=30)
    assert flushes > 50
    assert res.executed_during_fault > 50, res.summary()
    # Transparent: the fused scripts (standalone) and the single ones are
    # reloaded on NOSCRIPT, which means "did not run": zero errors.
    assert res.unavailable == [], res.summary()
    problems = assert_layer_held(redis_url, namespace, res)
    assert res.reruns == 0, res.summary()
    note_layer(f"layer: SCRIPT FLUSH x{flushes} in 2 s", backend, res, problems)
