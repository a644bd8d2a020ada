"""Prometheus metrics for durabilis (the ``prometheus`` extra: ``prometheus-client``).

Two complementary sources:

- :class:`DurabilisMetrics`: **this process's** counters, fed by durabilis's
  events (a tap on its event logger, or ``metrics.processor`` in a structlog
  chain), so nothing in the hot path calls Prometheus directly::

      metrics = DurabilisMetrics()              # registers on the default registry
      metrics.install()                         # counts every event, logged or not
      # or: structlog.configure(processors=[metrics.processor, *your_processors])

- :class:`DurabilisCollector`: **fleet-wide** gauges and counters read from
  Redis at scrape time (DLQ records by status, breaker states, live
  checkpoints, operations in flight, the layer's totals, the fleet config
  version)::

      REGISTRY.register(DurabilisCollector(layer))

Metric names start with ``durabilis_``; labels are bounded (operation types,
breaker names, statuses, event names), never ids or keys.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from durabilis._log import add_tap, remove_tap
from durabilis.breaker import BreakerState
from durabilis.config import ConfigSync
from durabilis.dlq import DlqStatus
from durabilis.errors import DurabilisError

__all__ = ["DurabilisCollector", "DurabilisMetrics"]

_BREAKER_VALUE = {BreakerState.CLOSED: 0.0, BreakerState.HALF_OPEN: 1.0, BreakerState.OPEN: 2.0}

_STOP_EVENTS = ("durability_retry_exhausted", "durability_retry_non_retryable")
_DLQ_REPLAY_EVENTS = {
    "durability_dlq_replayed": "replayed",
    "durability_dlq_replay_failed": "failed",
    "durability_dlq_replay_claim_lost": "claim_lost",
}


def _label(event: MutableMapping[str, Any], name: str) -> str:
    value = event.get(name)
    return "" if value is None else str(value)


class DurabilisMetrics:
    """This process's counters, fed by durabilis's structlog events.

    Counters (``_total``): ``durabilis_events`` (event, level), ``durabilis_retry_attempts``
    (operation_type), ``durabilis_retry_stops`` (operation_type, reason),
    ``durabilis_circuit_transitions`` (dependency, to_state),
    ``durabilis_checkpoint_saves``, ``durabilis_dlq_enqueued`` (operation_type),
    ``durabilis_dlq_replays`` (operation_type, outcome), ``durabilis_dlq_abandoned``,
    ``durabilis_orphans_recovered`` (operation_type), ``durabilis_config_reloads``.

    Args:
        registry: Where to register (the default registry when omitted).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = REGISTRY if registry is None else registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=reg)

        self.events = counter(
            "durabilis_events", "durabilis structlog events, by name and level", ("event", "level")
        )
        self.retry_attempts = counter(
            "durabilis_retry_attempts", "Retries scheduled after a failed attempt",
            ("operation_type",),
        )
        self.retry_stops = counter(
            "durabilis_retry_stops", "Retry loops that stopped without success",
            ("operation_type", "reason"),
        )
        self.circuit_transitions = counter(
            "durabilis_circuit_transitions", "Breaker transitions made by this process",
            ("dependency", "to_state"),
        )
        self.checkpoint_saves = counter(
            "durabilis_checkpoint_saves", "Checkpoints saved (save, fork, rewind)"
        )
        self.dlq_enqueued = counter(
            "durabilis_dlq_enqueued", "Operations parked in the DLQ by this process",
            ("operation_type",),
        )
        self.dlq_replays = counter(
            "durabilis_dlq_replays", "DLQ replays run by this process, by outcome",
            ("operation_type", "outcome"),
        )
        self.dlq_abandoned = counter("durabilis_dlq_abandoned", "DLQ records abandoned")
        self.orphans_recovered = counter(
            "durabilis_orphans_recovered", "Operations of dead workers moved to the DLQ",
            ("operation_type",),
        )
        self.config_reloads = counter(
            "durabilis_config_reloads", "Fleet config changes applied by this process"
        )

    def processor(
        self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        """A structlog processor: counts durabilis events, passes every event on unchanged."""
        name = event_dict.get("event")
        if isinstance(name, str) and name.startswith("durability_"):
            self.observe(name, method_name, event_dict)
        return event_dict

    def observe(self, name: str, level: str, event: MutableMapping[str, Any]) -> None:
        """Count one event (what :meth:`processor` does for each durabilis event)."""
        self.events.labels(name, level).inc()
        op = _label(event, "operation_type")
        if name == "durability_retry_attempt":
            self.retry_attempts.labels(op).inc()
        elif name in _STOP_EVENTS:
            self.retry_stops.labels(op, _label(event, "reason")).inc()
        elif name.startswith("durability_circuit_") and "to_state" in event:
            self.circuit_transitions.labels(
                _label(event, "dependency"), _label(event, "to_state")
            ).inc()
        elif name == "durability_checkpoint_saved":
            self.checkpoint_saves.inc()
        elif name == "durability_dlq_enqueued":
            self.dlq_enqueued.labels(op).inc()
        elif name in _DLQ_REPLAY_EVENTS:
            self.dlq_replays.labels(op, _DLQ_REPLAY_EVENTS[name]).inc()
        elif name == "durability_dlq_abandoned":
            self.dlq_abandoned.inc()
        elif name == "durability_orphan_recovered":
            self.orphans_recovered.labels(op).inc()
        elif name == "durability_config_reloaded":
            self.config_reloads.inc()

    def install(self) -> None:
        """Count every durabilis event from now on, whatever is logged.

        Installs a tap on durabilis's event logger: it sees every event, also
        the INFO ones the ``"durabilis"`` logger's level keeps out of the logs,
        and nothing in the logging or structlog configuration is changed. (Use
        either this or :meth:`processor` in a structlog chain, not both.)
        """
        add_tap(self._tap)

    def uninstall(self) -> None:
        """Stop counting (undoes :meth:`install`)."""
        remove_tap(self._tap)

    def _tap(self, name: str, level: str, fields: dict[str, Any]) -> None:
        if name.startswith("durability_"):
            self.observe(name, level, fields)


class DurabilisCollector(Collector):
    """Fleet-wide state read from Redis at each scrape.

    Gauges: ``durabilis_up`` (1 when Redis answered), ``durabilis_dlq_records``
    (status, operation_type), ``durabilis_dlq_oldest_pending_age_seconds``,
    ``durabilis_breaker_state`` (dependency; 0 closed, 1 half open, 2 open),
    ``durabilis_breaker_failure_rate`` (dependency), ``durabilis_checkpoints_current``,
    ``durabilis_operations_in_flight``, ``durabilis_config_version``.
    Counter: ``durabilis_operations_total`` (outcome: the layer's fleet-wide totals).

    A scrape costs about six round trips. When Redis does not answer,
    ``durabilis_up`` is 0 and nothing else is reported (never a failed scrape).

    Args:
        layer: A :class:`~durabilis.DurabilityLayer` (its breakers are the ones reported).
    """

    def __init__(self, layer: Any) -> None:
        self.layer = layer

    def describe(self) -> list[Any]:
        return []  # collected lazily: no Redis round trip at registration

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("durabilis_up", "1 when the durabilis Redis answered this scrape")
        try:
            families = list(self._families())
        except DurabilisError:
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families

    def _families(self) -> Iterator[Any]:
        layer = self.layer
        stats = layer.dlq.stats()
        records = GaugeMetricFamily(
            "durabilis_dlq_records", "Live DLQ records", labels=["status", "operation_type"]
        )
        for op_type, by_status in sorted(stats.by_operation_type.items()):
            for status in DlqStatus:
                records.add_metric([status.value, op_type], float(by_status.get(status, 0)))
        yield records
        age = GaugeMetricFamily(
            "durabilis_dlq_oldest_pending_age_seconds", "Age of the oldest pending DLQ record"
        )
        age.add_metric([], float(stats.oldest_pending_age_seconds or 0.0))
        yield age

        state = GaugeMetricFamily(
            "durabilis_breaker_state", "Breaker state: 0 closed, 1 half open, 2 open",
            labels=["dependency"],
        )
        rate = GaugeMetricFamily(
            "durabilis_breaker_failure_rate", "Failure rate of the breaker's window",
            labels=["dependency"],
        )
        for name in sorted(layer.breakers.names()):
            info = layer.breakers.state_info(name)
            state.add_metric([name], _BREAKER_VALUE[info.state])
            rate.add_metric([name], float(info.failure_rate or 0.0))
        yield state
        yield rate

        current = GaugeMetricFamily(
            "durabilis_checkpoints_current", "Live current checkpoints in the namespace"
        )
        current.add_metric([], float(layer.checkpoints.count()))
        yield current

        totals = layer.stats()
        flight = GaugeMetricFamily(
            "durabilis_operations_in_flight", "Operations holding a claim (fleet-wide)"
        )
        flight.add_metric([], float(totals.in_flight))
        yield flight
        ops = CounterMetricFamily(
            "durabilis_operations", "The layer's fleet-wide totals", labels=["outcome"]
        )
        for outcome in ("started", "succeeded", "duplicates", "retries", "parked",
                        "non_retryable", "recovered"):
            ops.add_metric([outcome], float(getattr(totals, outcome)))
        yield ops

        version = GaugeMetricFamily(
            "durabilis_config_version", "Version of the fleet config in Redis"
        )
        version.add_metric([], float(ConfigSync(layer.store).fleet_config().version))
        yield version
