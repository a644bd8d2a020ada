"""The operator's day at fleet scale: one DLQ record per operation across
replicas, replays that wait for a live sibling instead of failing it, and a
replay pass that burns nothing against an open breaker."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import durabilis
from durabilis import OperationError
from durabilis.cli import EXIT_DEFERRED, EXIT_OK, main
from durabilis.config import load_config
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext
from durabilis.testing import instant_retries
from tests.integration._cli_handlers import LOG_ENV
from tests.integration._cli_support import fleet_toml
from tests.integration._dlq_fleet_workers import fleet_config, park_one_key

pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]


def test_four_processes_parking_one_key_make_one_record(
    redis_url: str, namespace: str, store: durabilis.Store, raw: Any
) -> None:
    layer = DurabilityLayer(store, fleet_config())
    layer.breakers.force_open("svc")
    ctx = multiprocessing.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=park_one_key, args=(redis_url, namespace, 5, ready, go, out))
             for _ in range(4)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    go.set()  # the four deliver at once
    ids = [i for _ in procs for i in out.get(timeout=60)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert len(ids) == 20 and len(set(ids)) == 1  # every delivery names the same record
    assert layer.dlq.pending_count() == 1 and layer.dlq.stats().total == 1
    record = layer.dlq.get(ids[0])
    assert record is not None and record.parkings == 20
    assert record.last_parked_at is not None and record.last_parked_at >= record.failed_at
    totals = layer.stats()  # operations, as the DLQ counts them; and every parking
    assert totals.parked == 1 and totals.parkings == 20
    # The log stream tells the story in order: parked once, then parked again 19 times.
    changes = [f[b"change"] for _, f in raw.xrange(layer.dlq._ops.log_key)]
    assert changes == [b"parked"] + [b"parked_again"] * 19
    layer.close()


def test_a_record_replayed_after_its_operation_fails_again_gets_a_new_record(
    store: durabilis.Store,
) -> None:
    layer = DurabilityLayer(store, fleet_config())

    def down(ctx: OperationContext) -> Any:
        raise OperationError("NETWORK_TIMEOUT", "down")

    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as first:
        layer.execute("agent-1", "job", {"page": 1}, down)
    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as again:
        layer.execute("agent-1", "job", {"page": 1}, down)
    assert again.value.dlq_id == first.value.dlq_id  # pending: the same record
    assert layer.dlq.mark_replayed(str(first.value.dlq_id))  # an operator dealt with it
    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as later:
        layer.execute("agent-1", "job", {"page": 1}, down)
    assert later.value.dlq_id != first.value.dlq_id  # a new failure, a new record
    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as once_more:
        layer.execute("agent-1", "job", {"page": 1}, down)
    assert once_more.value.dlq_id == later.value.dlq_id  # found through the by-key index
    record = layer.dlq.get(str(later.value.dlq_id))
    assert record is not None and record.parkings == 2
    layer.close()


def test_two_operators_replaying_200_records_with_a_live_sibling_fail_none(
    redis_url: str, namespace: str, store: durabilis.Store, tmp_path: Path
) -> None:
    layer = DurabilityLayer(store, DurabilityConfig())

    def down(ctx: OperationContext) -> Any:
        raise TimeoutError("upstream timed out")

    with instant_retries():
        for i in range(200):
            with pytest.raises(durabilis.RetryExhausted):
                layer.execute("agent-1", "ledger_post", {"n": i}, down)
    assert layer.dlq.pending_count() == 200

    # A live delivery of record 0's operation is in flight while the operators replay.
    started = threading.Event()

    def slow(ctx: OperationContext) -> str:
        started.set()
        time.sleep(2.0)
        return "done by the live delivery"

    sibling = threading.Thread(
        target=lambda: layer.execute("agent-1", "ledger_post", {"n": 0}, slow)
    )
    sibling.start()
    assert started.wait(10)
    log = tmp_path / "handler.log"
    env = {**os.environ, LOG_ENV: str(log)}
    env.pop("DURABILIS_CONFIG", None)
    cmd = [sys.executable, "-m", "durabilis", "dlq", "replay", "--all", "--json", "--quiet",
           "--handler", "tests.integration._cli_handlers:record",
           "--url", redis_url, "--namespace", namespace]
    operators = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in operators]
    sibling.join(timeout=30)
    for p, (_, err) in zip(operators, outputs, strict=True):
        assert p.returncode == EXIT_OK, err
    summaries = [json.loads(out) for out, _ in outputs]
    assert sum(s["replayed"] for s in summaries) == 200
    assert sum(s["failed"] + s["lost"] + s["deferred"] for s in summaries) == 0
    assert layer.dlq.pending_count() == 0
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    keys = [c["idempotency_key"] for c in calls]
    assert len(keys) == len(set(keys)) == 199  # record 0 was done by its live delivery
    layer.close()


def test_a_replay_pass_into_an_open_breaker_burns_nothing_and_says_so(
    redis_url: str, namespace: str, store: durabilis.Store, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    toml = tmp_path / "fleet.toml"
    toml.write_text(fleet_toml(lease=5, breaker="""
failure_rate_threshold = 0.99
min_request_count = 1000
window_size = 1000
reset_timeout_seconds = 60
"""), encoding="utf-8")
    layer = DurabilityLayer(store, load_config(toml, environ={}))

    def down(ctx: OperationContext) -> Any:
        raise OperationError("NETWORK_TIMEOUT", "ledger down")

    with instant_retries():
        ids = []
        for i in range(30):
            with pytest.raises(durabilis.RetryExhausted) as info:
                layer.execute("agent-1", "job", {"n": i}, down)
            ids.append(str(info.value.dlq_id))
    layer.breakers.force_open("svc")
    log = tmp_path / "handler.log"
    os.environ[LOG_ENV] = str(log)
    try:
        capsys.readouterr()
        code = main(["dlq", "replay", "--all", "--handler",
                     "tests.integration._cli_handlers:record", "--url", redis_url,
                     "--namespace", namespace, "--config", str(toml)])
        out = capsys.readouterr().out
        assert code == EXIT_DEFERRED
        assert out.splitlines()[0] == "replayed 0, failed 0, skipped 0, claim lost 0, deferred 30"
        assert "paused: breaker open for svc" in out
        assert not log.exists()  # no handler ran
        for dlq_id in ids:
            record = layer.dlq.get(dlq_id)
            assert record is not None and record.status is durabilis.dlq.DlqStatus.PENDING
            assert record.replay_attempts == 0 and record.claimed_by is None
            assert record.last_error == "NETWORK_TIMEOUT: ledger down"  # not "CircuitOpen"
        layer.breakers.force_close("svc")
        code = main(["dlq", "replay", "--all", "--quiet", "--handler",
                     "tests.integration._cli_handlers:record", "--url", redis_url,
                     "--namespace", namespace, "--config", str(toml)])
        assert code == EXIT_OK
        assert layer.dlq.pending_count() == 0
        assert len(log.read_text().splitlines()) == 30
    finally:
        os.environ.pop(LOG_ENV, None)
        layer.close()
