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

  The collector keeps what it read for ``cache_seconds`` (default 10 s):
  scrapes meanwhile cost Redis nothing.

Metric names start with ``durabilis_``; labels are bounded (operation types,
breaker names, statuses, event names), never ids or keys. Operation types are
bounded explicitly: the types named in ``operation_types=`` (and, for the
collector, those the layer's config names) each get their label; of the
others, the first ``max_operation_types`` (default 50) seen get theirs, and
every later one is counted under ``operation_type="other"``. So a scrape
never holds more than ``len(operation_types) + max_operation_types + 1``
operation-type values per metric (plus ``""`` for events that carry none),
however many types the fleet runs.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from durabilis._log import add_tap, remove_tap
from durabilis.breaker import BreakerState
from durabilis.config import ConfigSync
from durabilis.dlq import DlqStatus
from durabilis.errors import ConfigError, DurabilisError

__all__ = ["OTHER_OPERATION_TYPE", "DurabilisCollector", "DurabilisMetrics"]

OTHER_OPERATION_TYPE = "other"
"""The ``operation_type`` label of every type beyond the bound."""

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


class _OperationLabels:
    """Which operation types get a label of their own (thread-safe).

    The ``known`` types always do, and the first ``limit`` others asked for
    (they keep it); every later type maps to :data:`OTHER_OPERATION_TYPE`.
    ``""`` (an event without an operation type) stays ``""``.
    """

    def __init__(self, known: Iterable[str], limit: int) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ConfigError("max_operation_types", f"must be an integer >= 0, got {limit!r}")
        if isinstance(known, str):
            raise ConfigError("operation_types", "must be a collection of names, not one str")
        self.known = frozenset(str(k) for k in known) | {""}
        self.limit = limit
        self.seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, operation_type: str) -> str:
        if operation_type in self.known or operation_type in self.seen:
            return operation_type
        with self._lock:
            if operation_type not in self.seen and len(self.seen) < self.limit:
                self.seen.add(operation_type)
        return operation_type if operation_type in self.seen else OTHER_OPERATION_TYPE


class DurabilisMetrics:
    """This process's counters, fed by durabilis's structlog events.

    Counters (``_total``): ``durabilis_events`` (event, level), ``durabilis_retry_attempts``
    (operation_type), ``durabilis_retry_stops`` (operation_type, reason),
    ``durabilis_circuit_transitions`` (dependency, to_state),
    ``durabilis_checkpoint_saves``, ``durabilis_dlq_enqueued`` (operation_type),
    ``durabilis_dlq_replays`` (operation_type, outcome), ``durabilis_dlq_abandoned``,
    ``durabilis_dlq_expired`` (operation_type: pending records this process's
    cleanups reported expired unreplayed),
    ``durabilis_orphans_recovered`` (operation_type), ``durabilis_config_reloads``.

    Args:
        registry: Where to register (the default registry when omitted).
        operation_types: Operation types that always get their own label.
        max_operation_types: How many other types get their own label, first
            seen first; every later one is counted as ``"other"``.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        operation_types: Iterable[str] = (),
        max_operation_types: int = 50,
    ) -> None:
        self.operation_label = _OperationLabels(operation_types, max_operation_types)
        reg = REGISTRY if registry is None else registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=reg)

        self.events = counter(
            "durabilis_events", "durabilis structlog events, by name and level", ("event", "level")
        )
        self.retry_attempts = counter(
            "durabilis_retry_attempts",
            "Retries begun after a failed attempt (counted when the backoff ends)",
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
        self.dlq_expired = counter(
            "durabilis_dlq_expired", "Pending DLQ records that expired unreplayed, reported by "
            "this process's cleanups", ("operation_type",),
        )
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
        op = self.operation_label(_label(event, "operation_type"))
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
        elif name == "durability_dlq_expired":
            self.dlq_expired.labels(op).inc()
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
    """Fleet-wide state read from Redis, at most once per ``cache_seconds``.

    Gauges: ``durabilis_up`` (1 when Redis answered), ``durabilis_dlq_records``
    (status, operation_type), ``durabilis_dlq_oldest_pending_age_seconds``,
    ``durabilis_dlq_expired_awaiting_cleanup``, ``durabilis_dlq_expired_records``
    (operation_type), ``durabilis_dlq_stats_exact``
    (0 when the expired backlog exceeded ``DlqConfig.stats_scan_limit``: the DLQ
    gauges are then upper bounds, see :class:`~durabilis.dlq.DlqStats`),
    ``durabilis_breaker_state`` (dependency; 0 closed, 1 half open, 2 open),
    ``durabilis_breaker_failure_rate`` (dependency), ``durabilis_checkpoints_current``,
    ``durabilis_operations_in_flight``, ``durabilis_operations_lease_ended``,
    ``durabilis_config_version``.
    Counter: ``durabilis_operations_total`` (outcome: the layer's fleet-wide totals).

    A read costs about six round trips, each script bounded. What was read
    (or that Redis did not answer) is kept for ``cache_seconds``: the scrapes
    meanwhile, concurrent ones included, are answered from it and cost Redis
    nothing. When Redis does not answer, ``durabilis_up`` is 0 and nothing
    else is reported (never a failed scrape).

    Args:
        layer: A :class:`~durabilis.DurabilityLayer` (its breakers are the ones reported).
        operation_types: Operation types that always get their own label, besides
            those the layer's config names (retry policies, dependencies).
        max_operation_types: How many other types get their own label (first
            seen first, the ones with the most records first within one read);
            the records of every later type are reported as ``"other"``.
        cache_seconds: How long one read of Redis serves scrapes (0: every
            scrape reads Redis).
    """

    def __init__(
        self,
        layer: Any,
        *,
        operation_types: Iterable[str] = (),
        max_operation_types: int = 50,
        cache_seconds: float = 10.0,
    ) -> None:
        if (
            not isinstance(cache_seconds, (int, float))
            or isinstance(cache_seconds, bool)
            or not math.isfinite(cache_seconds)
            or cache_seconds < 0
        ):
            raise ConfigError("cache_seconds", f"must be a number >= 0, got {cache_seconds!r}")
        self.layer = layer
        self.cache_seconds = float(cache_seconds)
        self.operation_label = _OperationLabels(
            [*operation_types, *_configured_operation_types(layer)], max_operation_types
        )
        self._lock = threading.Lock()
        self._cached: list[Any] | None = None
        self._read_at = 0.0

    def describe(self) -> list[Any]:
        return []  # collected lazily: no Redis round trip at registration

    def collect(self) -> Iterator[Any]:
        with self._lock:  # one read at a time; concurrent scrapes share it
            if self._cached is None or time.monotonic() - self._read_at >= self.cache_seconds:
                self._cached = self._read()
                self._read_at = time.monotonic()
            families = self._cached
        yield from families

    def _read(self) -> list[Any]:
        up = GaugeMetricFamily("durabilis_up", "1 when the durabilis Redis answered this scrape")
        try:
            families = list(self._families())
        except DurabilisError:
            up.add_metric([], 0.0)
            return [up]
        up.add_metric([], 1.0)
        return [up, *families]

    def _families(self) -> Iterator[Any]:
        layer = self.layer
        stats = layer.dlq.stats()
        records = GaugeMetricFamily(
            "durabilis_dlq_records", "Live DLQ records", labels=["status", "operation_type"]
        )
        rows: dict[str, dict[DlqStatus, int]] = {}
        # The types with the most records first: they get the free labels.
        for op_type, by_status in sorted(
            stats.by_operation_type.items(), key=lambda item: (-sum(item[1].values()), item[0])
        ):
            row = rows.setdefault(self.operation_label(op_type), dict.fromkeys(DlqStatus, 0))
            for status in DlqStatus:
                row[status] += by_status.get(status, 0)
        for label, row in sorted(rows.items()):
            for status in DlqStatus:
                records.add_metric([status.value, label], float(row[status]))
        yield records
        yield _gauge(
            "durabilis_dlq_oldest_pending_age_seconds", "Age of the oldest pending DLQ record",
            float(stats.oldest_pending_age_seconds or 0.0),
        )
        yield _gauge(
            "durabilis_dlq_expired_awaiting_cleanup",
            "Expired DLQ records not cleaned up yet (cleanup_expired removes them)",
            float(stats.expired_awaiting_cleanup),
        )
        lapsed = GaugeMetricFamily(
            "durabilis_dlq_expired_records",
            "Pending DLQ records that expired unreplayed (DlqStats.expired)",
            labels=["operation_type"],
        )
        lapsed_rows: dict[str, int] = {}
        for op_type, n in sorted(stats.expired_by_operation_type.items()):
            label = self.operation_label(op_type)
            lapsed_rows[label] = lapsed_rows.get(label, 0) + n
        for label, n in sorted(lapsed_rows.items()):
            lapsed.add_metric([label], float(n))
        yield lapsed
        yield _gauge(
            "durabilis_dlq_stats_exact",
            "0 when the expired backlog exceeded stats_scan_limit: DLQ gauges are upper bounds",
            1.0 if stats.exact else 0.0,
        )

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

        yield _gauge(
            "durabilis_checkpoints_current", "Live current checkpoints in the namespace",
            float(layer.checkpoints.count()),
        )

        totals = layer.stats()
        yield _gauge(
            "durabilis_operations_in_flight", "Operations holding a live claim (fleet-wide)",
            float(totals.in_flight),
        )
        yield _gauge(
            "durabilis_operations_lease_ended",
            "Claims whose lease ended (dead workers), not yet recovered (fleet-wide)",
            float(totals.lease_ended),
        )
        ops = CounterMetricFamily(
            "durabilis_operations", "The layer's fleet-wide totals", labels=["outcome"]
        )
        for outcome in ("started", "succeeded", "duplicates", "retries", "parked", "parkings",
                        "non_retryable", "recovered"):
            ops.add_metric([outcome], float(getattr(totals, outcome)))
        yield ops

        yield _gauge(
            "durabilis_config_version", "Version of the fleet config in Redis",
            float(ConfigSync(layer.store).fleet_config().version),
        )


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    """A gauge of one unlabelled sample."""
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], float(value))
    return family


def _configured_operation_types(layer: Any) -> list[str]:
    """The operation types the layer's config names (``"*"`` excluded)."""
    config = getattr(layer, "config", None)
    names = [str(op) for op in getattr(config, "dependencies", None) or {}]
    for policy in getattr(config, "retry_policies", None) or ():
        names.append(str(getattr(policy, "operation_type", "*")))
    return [n for n in names if n != "*"]
