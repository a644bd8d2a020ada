"""The benchmark suite (``python -m benchmarks``) still runs, in its tiny smoke mode.

Speed is never asserted here (benchmarks/README.md has the figures): this test
only keeps the harness from rotting, checking that every section of the results
is there, well formed, and that each bench-only peer installed was measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]


def _figure(f: Any) -> None:
    assert f["min"] <= f["median"] <= f["max"], f
    assert f["min"] > 0 and len(f["runs"]) >= 1, f


def _check_http(http: Any, table: str) -> None:
    """The middleware against the bare app, measured in the same rounds."""
    for kind in ("redis PING (asyncio, 1 connection)", "bare app (ASGI, in-process)",
                 "guarded app, new key", "guarded app, completed duplicate"):
        _figure(http[kind])
    assert http["overhead"]["new key / bare app (requests/s)"] > 0
    assert "HTTP: DurableIdempotencyMiddleware" in table


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


#: What the ``bench`` extra brings for the peers (CI installs it in a venv of its own,
#: .venv-bench, and runs this test there with ``DURABILIS_BENCH_PEERS=required``).
PEERS = ("aws_lambda_powertools", "boto3", "pybreaker", "tenacity", "stamina", "matplotlib",
         "starlette")


def _peers_required() -> None:
    """In CI every peer is measured: none may be "skipped" for want of its install."""
    if os.environ.get("DURABILIS_BENCH_PEERS") == "required":
        assert _installed(*PEERS), f"not installed: {[m for m in PEERS if not _installed(m)]}"


def _check_lean(lean: dict[str, Any], table: str) -> None:
    """The lean durable call: the client's Python per call with canned replies
    (replayed, so the same round trips as for real) and the commands per call."""
    for name in ("canned", "canned_breaker"):
        assert lean[name]["us_per_call"] > 0 and lean[name]["round_trips"] == 2.0, name
    assert lean["commands"]["scripts"] == 2.0 and lean["commands_breaker"]["scripts"] == 2.0
    assert lean["commands_breaker"]["commands"] >= lean["commands"]["commands"] > 2
    assert "Python per call, canned replies" in table


@pytest.mark.slow
def test_the_suite_runs_in_smoke_mode_and_writes_every_section(tmp_path: Path) -> None:
    _peers_required()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    table = (tmp_path / "results.txt").read_text()
    assert "Targets (ratios measured in this run)" in proc.stdout and table.strip()

    meta = results["meta"]
    assert meta["mode"] == "smoke" and meta["machine"]["redis_server"]
    single, procs = results["single"], results["processes"]
    for kind in (
        "redis PING", "redis EVALSHA (return 1)", "durable call (sync)",
        "durable call's 2 scripts, no layer (sync)", "durable call + checkpoint (sync)",
        "durable call (async, 1 in flight)",
        "durable call (async, 16 in flight)", "durable call, completed duplicate (sync)",
        "idempotency claim+record", "idempotency duplicate (completed key)",
        "breaker admit+report", "checkpoint save", "checkpoint restore", "DLQ enqueue",
        "DLQ replay",
    ):
        _figure(single[kind])
        assert single[kind]["client_cpu_us"] > 0, kind
    for kind in ("redis PING", "durable call (sync)", "durable call (async)",
                 "durable call's 2 scripts, no layer (sync)",
                 "contention: same keys (sync)", "idempotency claim+record"):
        assert set(procs[kind]) == {"1", "2"}, kind
        for f in procs[kind].values():
            _figure(f)
    # Two processes walking the same keys: one wins each, the other is answered.
    mix = procs["contention: same keys (sync)"]["2"]["outcomes"]
    assert mix["new"] < 1.0 and set(mix) <= {"new", "duplicate", "in_progress"}

    costs = results["cost"]["per_operation"]
    assert costs["redis PING"]["round_trips"] == 1.0
    assert costs["durable call (new key)"]["round_trips"] == 2.0  # the layer's promise
    assert costs["durable call (new key)"]["commands"] > costs["redis PING"]["commands"]
    for kind in ("idempotency record", "durable call record", "breaker", "checkpoint",
                 "DLQ record"):
        assert results["cost"]["memory"][kind]["bytes"] > 0, kind

    _check_http(results["http"], table)
    _check_lean(results["lean"], table)

    targets = {t["name"]: t for t in results["targets"]}
    assert len(targets) == 7
    # A target at a process count the mode does not run is "not measured".
    measured = results["meta"]["settings"]["processes"]
    unmeasured = {name for name in targets if "4 process" in name and 4 not in measured}
    assert all(targets[name]["met"] is None for name in unmeasured)
    durable = next(t for t in targets.values() if "PING" in t["name"])
    assert durable["ratio"] > 0 and isinstance(durable["met"], bool)

    # The fleet-scale table: every row from this run's own figures, or "not measured"
    # where the smoke run has no such process count.
    fleet = {t["name"]: t for t in results["fleet_targets"]}
    assert len(fleet) == 10
    assert "Fleet-scale targets" in table
    commands = fleet["Redis commands per durable call (new key)"]
    assert commands["ratio"] == costs["durable call (new key)"]["commands"]
    assert commands["met"] == (commands["ratio"] <= 10)
    memory = fleet["durable-call record, MEMORY USAGE (bytes)"]
    assert memory["ratio"] == results["cost"]["memory"]["durable call record"]["bytes"]
    cpu = fleet["Redis server CPU per durable call / per PING"]
    assert cpu["ratio"] == pytest.approx(
        costs["durable call (new key)"]["server_cpu_us"] / costs["redis PING"]["server_cpu_us"],
        abs=1e-3,
    )
    eight = next(t for name, t in fleet.items() if "8 processes" in name)
    assert (eight["met"] is None) == (8 not in measured)

    # The 1-process floor: the durable call's own scripts with no layer, same rounds.
    floors = results["floors"]
    raw, durable_rate = single["durable call's 2 scripts, no layer (sync)"], single[
        "durable call (sync)"]
    assert floors["durable call / its 2 scripts with no layer"] == pytest.approx(
        durable_rate["median"] / raw["median"], abs=1e-3)
    assert floors["the durable call's 2 scripts, no layer / (PING/s / 2)"] == pytest.approx(
        raw["median"] / (single["redis PING"]["median"] / 2), abs=1e-3)
    assert "The floor of the durable call" in table
    raw_cost = costs["durable call's 2 scripts, no layer"]
    assert raw_cost["round_trips"] == 2.0 and raw_cost["scripts"] == 2.0
    assert floors["server CPU per call / PING's: 2 x EVALSHA of 'return 1'"] == pytest.approx(
        2 * costs["redis EVALSHA (return 1)"]["server_cpu_us"]
        / costs["redis PING"]["server_cpu_us"], abs=1e-3)

    # Each peer is measured when its bench-only extra is installed, else says why not.
    powertools = single["powertools idempotency (Redis)"]
    if _installed("aws_lambda_powertools", "boto3"):
        _figure(powertools)
        assert all(isinstance(t["met"], bool) for t in targets.values()
                   if "powertools" in t["name"] and t["name"] not in unmeasured)
    else:
        assert "skipped" in powertools
    if _installed("pybreaker"):
        for f in results["breaker"]["processes"]["1"].values():
            _figure(f)
        assert results["breaker"]["ratios"]["1"]["durabilis/pybreaker"] > 0
    else:
        assert "skipped" in results["breaker"]
    if _installed("tenacity", "stamina"):
        assert results["retry"]["ratios"]["durabilis execute / tenacity Retrying"] > 0
    else:
        assert "skipped" in results["retry"]
    if _installed("matplotlib"):
        assert (tmp_path / "throughput.png").stat().st_size > 10_000


def test_the_async_cpu_benchmark_runs_and_reports_its_figures() -> None:
    """``python -m benchmarks.bench_async`` (not part of the suite: the A/B tool of
    the async row) runs on its own server and gives each figure it names."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_async", "--in-flight", "4", "--rounds", "2",
         "--seconds", "0.2", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["in_flight"] == 4 and len(out["client_cpu_us_rounds"]) == 2
    assert out["client_cpu_us"] > 0 and out["calls_per_s"] > 0 and out["ping_per_s"] > 0
    assert out["ratio_to_ping"] > 0
