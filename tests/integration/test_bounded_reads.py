"""Reads that stay bounded on a real Redis: DLQ stats over an expired backlog, the
collector's cache, and the operation-type labels of the Prometheus metrics.

How long Redis is blocked is measured by ``benchmarks/bench_dlq_backlog.py``,
never timed here: these tests check the answers and the bounds themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

import durabilis
from durabilis.dlq import DeadLetterQueue, DlqConfig, DlqStatus
from durabilis.layer import DurabilityLayer
from durabilis.metrics import OTHER_OPERATION_TYPE, DurabilisCollector, DurabilisMetrics

pytestmark = pytest.mark.topologies("cluster")

LIMIT = 5
ROOT = Path(__file__).resolve().parents[2]


def sleep_until(raw: redis.Redis, moment: datetime) -> None:
    """Sleep until the Redis server clock has passed ``moment`` by a whole millisecond
    (Redis drops a key only once its millisecond clock is past the deadline)."""
    deadline = time.monotonic() + 10
    while True:
        secs, micros = raw.time()
        if datetime.fromtimestamp(secs + micros / 1e6, tz=UTC) > moment + timedelta(
            milliseconds=2
        ):
            return
        assert time.monotonic() < deadline
        time.sleep(0.02)


def near(at: datetime | None, failed_at: datetime) -> bool:
    """The index keeps the stream id's ms, ``failed_at`` the script's clock: 1 ms apart at most."""
    return at is not None and abs((at - failed_at).total_seconds()) < 0.01


def park(dlq: DeadLetterQueue, n: int, op: str, **kw: Any) -> list[str]:
    return [dlq.enqueue("agent-1", op, {"n": i}, 3, "NETWORK_TIMEOUT", **kw) for i in range(n)]


@pytest.mark.parametrize("expired", [LIMIT - 1, LIMIT, LIMIT + 3, LIMIT + 70])
def test_stats_read_at_most_the_scan_limit_of_the_expired_backlog_and_say_so(
    store: durabilis.Store, raw: redis.Redis, expired: int
) -> None:
    dlq = DeadLetterQueue(store, DlqConfig(stats_scan_limit=LIMIT, purge_per_enqueue=0))
    short = park(dlq, expired, "short", ttl_seconds=0.6)  # oldest first: head of the index
    dlq.mark_replayed(short[0])
    live = park(dlq, 3, "keep")
    last = dlq.get(short[-1])
    first_live = dlq.get(live[0])
    assert last is not None and first_live is not None
    sleep_until(raw, last.expires_at)

    reply = store.run(dlq._ops.stats())
    assert reply[5] == expired  # every expired record counted (ZCOUNT) ...
    assert reply[6] == min(expired, LIMIT)  # ... at most the limit of them read
    stats = dlq.stats()
    assert stats.expired_awaiting_cleanup == expired  # exact either way
    assert stats.total == 3  # exact either way
    assert stats.pending == 3 and stats.by_status[DlqStatus.REPLAYED] == 0
    assert stats.by_operation_type["keep"][DlqStatus.PENDING] == 3
    # The oldest live pending record: found by the walk (at most 64 checks) or, past
    # 64 expired ones, by the binary search; one TTL each here, so exactly.
    assert near(stats.oldest_pending_at, first_live.failed_at)
    if expired <= LIMIT:  # every expired record read: the answer is exact
        assert stats.exact is True
        assert list(stats.by_operation_type) == ["keep"]
    else:  # marked: per status and type, the counts are upper bounds ("at most")
        assert stats.exact is False
        unread = expired - LIMIT
        # "short" still counts its expired records not read, capped by the exact total.
        assert stats.pending_for("short") == min(unread, stats.total)
        for row in stats.by_operation_type.values():
            assert all(n <= stats.total for n in row.values())
    assert dlq.pending_count() == stats.pending
    assert [r.dlq_id for r in dlq.list_pending()] == live  # listings stay exact
    listing = dlq.list_all()
    assert [r.dlq_id for r in listing.records] == live
    assert listing.pending_count == stats.pending

    assert dlq.cleanup_expired() == expired
    after = dlq.stats()
    assert after.exact is True and after.expired_awaiting_cleanup == 0
    assert after.total == after.pending == 3
    assert near(after.oldest_pending_at, first_live.failed_at)


def test_the_stats_scan_limit_is_validated() -> None:
    for bad in (0, -1, 1.5, True, 2_000_000):
        with pytest.raises(durabilis.ConfigError) as err:
            DlqConfig(stats_scan_limit=bad)  # type: ignore[arg-type]
        assert err.value.field == "stats_scan_limit"


def test_the_collector_reads_redis_once_per_cache_period(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store)
    collector = DurabilisCollector(layer, cache_seconds=0.5)
    reads = 0
    read = layer.dlq.stats

    def counting() -> Any:
        nonlocal reads
        reads += 1
        return read()

    layer.dlq.stats = counting  # type: ignore[method-assign]
    registry = CollectorRegistry()
    registry.register(collector)

    def pending() -> float | None:
        return registry.get_sample_value(
            "durabilis_dlq_records", {"status": "pending", "operation_type": "job"}
        )

    park(layer.dlq, 1, "job")
    assert pending() == 1 and reads == 1
    park(layer.dlq, 1, "job")
    for _ in range(5):  # within the period: the same answer, no Redis read
        assert pending() == 1
    assert reads == 1
    time.sleep(0.6)
    assert pending() == 2 and reads == 2
    assert registry.get_sample_value("durabilis_dlq_stats_exact") == 1
    assert registry.get_sample_value("durabilis_dlq_expired_awaiting_cleanup") == 0
    with pytest.raises(durabilis.ConfigError):
        DurabilisCollector(layer, cache_seconds=-1)
    layer.close()


def test_2000_operation_types_make_at_most_the_bound_of_label_values(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    bound = 20
    registry = CollectorRegistry()
    metrics = DurabilisMetrics(registry, operation_types=["job"], max_operation_types=bound)
    layer = DurabilityLayer(store)
    dlq = DeadLetterQueue(store)
    metrics.install()
    try:
        for i in range(2000):  # 2,000 distinct types, each parked once (real events)
            dlq.enqueue("agent-1", f"type-{i:04d}", {"n": i}, 3, "NETWORK_TIMEOUT")
        dlq.enqueue("agent-1", "job", {"n": 0}, 3, "NETWORK_TIMEOUT")  # configured: own label
    finally:
        metrics.uninstall()
    registry.register(
        DurabilisCollector(layer, operation_types=["job"], max_operation_types=bound)
    )

    values: dict[str, set[str]] = {}
    samples = 0
    for family in registry.collect():
        for sample in family.samples:
            samples += 1
            if "operation_type" in sample.labels:
                values.setdefault(family.name, set()).add(sample.labels["operation_type"])
    assert set(values) == {"durabilis_dlq_enqueued", "durabilis_dlq_records"}
    for name, seen in values.items():
        assert len(seen) <= 1 + bound + 1, name  # configured + first seen + "other"
        assert {"job", OTHER_OPERATION_TYPE} <= seen, name
    assert samples < 200  # was > 6,000 series for these two metrics alone

    def value(name: str, **labels: str) -> float:
        got = registry.get_sample_value(name, labels)
        assert got is not None, (name, labels)
        return got

    # Nothing is lost: "other" holds every type beyond the bound.
    assert value("durabilis_dlq_enqueued_total", operation_type="job") == 1
    assert value("durabilis_dlq_enqueued_total", operation_type="type-0000") == 1
    assert value("durabilis_dlq_enqueued_total", operation_type=OTHER_OPERATION_TYPE) == (
        2000 - bound
    )
    pending = sum(
        value("durabilis_dlq_records", status="pending", operation_type=op)
        for op in values["durabilis_dlq_records"]
    )
    assert pending == 2001
    assert value("durabilis_dlq_records", status="pending", operation_type="job") == 1
    layer.close()


def test_the_label_bound_is_validated() -> None:
    with pytest.raises(durabilis.ConfigError):
        DurabilisMetrics(CollectorRegistry(), max_operation_types=-1)
    with pytest.raises(durabilis.ConfigError):
        DurabilisMetrics(CollectorRegistry(), operation_types="job")


@pytest.mark.slow
def test_the_backlog_benchmark_runs_on_a_tiny_backlog(tmp_path: Path) -> None:
    """Structure only (the figures come from the full run, docs/dlq.md)."""
    out = tmp_path / "backlog.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_dlq_backlog", "--expired", "300",
         "--live", "10", "--rounds", "1", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["expired"] == 300
    for name in ("idle (0.3 s)", "dlq stats", "dlq ls (pending, limit 50)",
                 "scrape (fresh collector)", "cleanup_expired (whole backlog)"):
        assert result["reads"][name]["max_ping_ms"] > 0, name
    assert "expired_awaiting_cleanup 300" in proc.stdout
