"""Prometheus metrics (the ``prometheus`` extra): this process's counters fed by
the events, and the fleet-wide state read from Redis at scrape time."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry

import durabilis
from durabilis import CircuitBreakerConfig, OperationError, RetryPolicy
from durabilis.config import ConfigSync
from durabilis.layer import DurabilityConfig, DurabilityLayer
from durabilis.metrics import DurabilisCollector, DurabilisMetrics
from durabilis.testing import RedisServer, instant_retries

pytestmark = pytest.mark.topologies("cluster")

POLICY = RetryPolicy("job", 3, 1, 2, jitter=False, retryable_errors=("NETWORK_TIMEOUT",))


def config() -> DurabilityConfig:
    return DurabilityConfig(
        retry_policies=(POLICY,),
        breakers=(CircuitBreakerConfig("svc", 0.5, 3, 30, 1, 10, 30),),
        dependencies={"job": "svc"},
    )


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def down(ctx: Any) -> None:
    raise OperationError("NETWORK_TIMEOUT", "down")


def test_the_processor_counts_each_pillars_events(
    store: durabilis.Store, restore_structlog: None
) -> None:
    registry = CollectorRegistry()
    metrics = DurabilisMetrics(registry)
    structlog.configure(
        processors=[metrics.processor, structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(file=io.StringIO()),
    )
    layer = DurabilityLayer(store, config())
    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as info:
        layer.execute("a", "job", {"n": 1}, down)  # 3 failures: the breaker opens
    layer.breakers.force_close("svc")
    layer.replay(str(info.value.dlq_id), lambda ctx: "ok")
    layer.checkpoints.save("t", "a", "p", {"s": 1})
    ConfigSync(DurabilityLayer(store, config())).refresh()
    ConfigSync(store).publish_policy(RetryPolicy("job", 2, 1, 1))
    ConfigSync(layer).refresh()

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("durabilis_retry_attempts_total", operation_type="job") == 2
    assert value("durabilis_retry_stops_total", operation_type="job", reason="EXHAUSTED") == 1
    assert value("durabilis_circuit_transitions_total", dependency="svc", to_state="open") == 1
    assert value("durabilis_circuit_transitions_total", dependency="svc",
                 to_state="closed") == 1
    assert value("durabilis_dlq_enqueued_total", operation_type="job") == 1
    assert value("durabilis_dlq_replays_total", operation_type="job", outcome="replayed") == 1
    assert value("durabilis_checkpoint_saves_total") == 1
    assert value("durabilis_config_reloads_total") == 1
    assert value("durabilis_events_total", event="durability_retry_attempt",
                 level="warning") == 2
    layer.close()


def test_install_counts_every_event_even_those_the_logger_level_keeps_out(
    store: durabilis.Store, restore_structlog: None
) -> None:
    sink = io.StringIO()
    structlog.configure(
        processors=[structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(file=sink),
    )
    registry = CollectorRegistry()
    metrics = DurabilisMetrics(registry)
    metrics.install()
    metrics.install()  # idempotent: counted once
    gate = logging.getLogger("durabilis")
    level = gate.level
    try:
        durabilis.checkpoint.CheckpointManager(store).save("t", "a", "p", 1)
        assert registry.get_sample_value("durabilis_checkpoint_saves_total") == 1
        assert "durability_checkpoint_saved" in sink.getvalue()  # the chain still logs
        gate.setLevel(logging.WARNING)  # a library user's default: INFO not logged
        durabilis.checkpoint.CheckpointManager(store).save("t", "a", "p", 2)
        assert registry.get_sample_value("durabilis_checkpoint_saves_total") == 2
        assert sink.getvalue().count("durability_checkpoint_saved") == 1
    finally:
        gate.setLevel(level)
        metrics.uninstall()
    assert structlog.get_config()["processors"][0] != metrics.processor  # nothing changed


def test_the_collector_reads_the_fleet_state_at_scrape_time(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, config())
    registry = CollectorRegistry()
    registry.register(DurabilisCollector(layer, cache_seconds=0))  # every scrape reads

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("durabilis_up") == 1
    assert value("durabilis_breaker_state", dependency="svc") == 0
    with instant_retries(), pytest.raises(durabilis.RetryExhausted):
        layer.execute("a", "job", {"n": 1}, down)
    layer.checkpoints.save("t", "a", "p", {"s": 1})
    ConfigSync(store).publish_policy(POLICY)
    assert value("durabilis_dlq_records", status="pending", operation_type="job") == 1
    assert value("durabilis_dlq_records", status="replayed", operation_type="job") == 0
    assert value("durabilis_breaker_state", dependency="svc") == 2  # open
    assert value("durabilis_breaker_failure_rate", dependency="svc") == 1.0
    assert value("durabilis_checkpoints_current") == 1
    assert value("durabilis_operations_total", outcome="parked") == 1
    assert value("durabilis_operations_in_flight") == 0
    assert value("durabilis_operations_lease_ended") == 0
    assert value("durabilis_config_version") == 1
    assert value("durabilis_dlq_oldest_pending_age_seconds") is not None
    layer.close()


def test_a_scrape_while_redis_is_down_reports_up_0_instead_of_failing(tmp_path: Any) -> None:
    server = RedisServer(tmp_path / "redis").start()
    store = durabilis.connect(server.url, socket_timeout=0.3, socket_connect_timeout=0.3)
    try:
        registry = CollectorRegistry()
        registry.register(DurabilisCollector(DurabilityLayer(store, config()), cache_seconds=0))
        assert registry.get_sample_value("durabilis_up") == 1
        server.stop()
        assert registry.get_sample_value("durabilis_up") == 0
        assert registry.get_sample_value("durabilis_checkpoints_current") is None
    finally:
        store.close()
        server.stop()
