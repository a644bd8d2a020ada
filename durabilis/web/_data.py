"""What the console's pages read, and the actions it runs: plain sync calls of the
public API (run in Starlette's thread pool), each bounded in work per request.

Nothing here renders HTML; :mod:`durabilis.web._app` does, through templates
with autoescape on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from durabilis import _codec
from durabilis._scripts import ScriptCall
from durabilis.breaker import (
    BreakerInfo,
    CircuitBreakerConfig,
    CircuitBreakerRegistry,
    StateTransition,
)
from durabilis.checkpoint import Checkpoint
from durabilis.config import ConfigSync, FleetConfig
from durabilis.core.checkpoint.plans import CheckpointOps
from durabilis.dlq import DlqRecord, DlqStats, DlqStatus
from durabilis.errors import ConfigError, CorruptData, DependencyNotFound, InvalidKey
from durabilis.layer import DurabilityConfig, DurabilityLayer, LayerStats

PAGE_SIZES = (10, 25, 50, 100, 200)
DEFAULT_PAGE = 50
MAX_PAGE = 200
SCAN_BOUND = 1000
"""Index or stream entries one list page examines at most (expired records'
entries included; a bulk action's selection: five times as many)."""
BATCH = 100
ACTION_MAX = 500
"""Records one bulk action's confirmation selects (and shows) at most; the POST
acts on exactly those. Run it again for more."""
HISTORY_SCAN = 5000
"""Log-stream entries one record page reads at most (the stream is capped near 10,000)."""
INFLIGHT_LIMIT = 200
BREAKER_LIMIT = 500
AGENT_LIMIT = 20
CHECKPOINT_LIMIT = 200
"""Most current checkpoints of a task the checkpoint page reads and shows (a
bounded ``ckpt_find``: "more" is shown past it)."""
LINEAGE_LIMIT = 50
TRANSITION_LIMIT = 200

STATUSES = ("pending", "requeued", "replayed", "abandoned", "all")
_AGE = re.compile(r"^(\d{1,9}(?:\.\d{1,6})?)([smhd]?)$")
_AGE_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
_MAX_FILTER_CHARS = 256


class BadInput(Exception):
    """A query parameter or form field the console cannot take (answered 400)."""


def _text_param(params: Any, name: str) -> str | None:
    value = params.get(name)
    if value is None or not str(value).strip():
        return None
    value = str(value).strip()
    if len(value) > _MAX_FILTER_CHARS or "\x00" in value:
        raise BadInput(f"{name} must be at most {_MAX_FILTER_CHARS} characters, without NUL")
    return value


def parse_age(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``7d`` (a bare number: seconds) -> seconds."""
    match = _AGE.fullmatch(text.strip())
    if match is None:
        raise BadInput(f"older_than must be a number with s, m, h or d, got {text!r}")
    return float(match[1]) * _AGE_UNIT[match[2]]


def error_code(text: str | None) -> str:
    """The code (or exception type) that leads an error text: what ``reason`` matches
    (as ``durabilis dlq requeue --reason``)."""
    return (text or "").split(":", 1)[0].strip()


@dataclass(frozen=True, slots=True)
class DlqFilter:
    """The DLQ page's filter (query string), as ``durabilis dlq ls`` / ``requeue`` take it."""

    status: str = "pending"
    operation_type: str | None = None
    reason: str | None = None
    agent: str | None = None
    older_than: str | None = None

    @classmethod
    def parse(cls, params: Any) -> DlqFilter:
        status = _text_param(params, "status") or "pending"
        if status not in STATUSES:
            raise BadInput(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        older = _text_param(params, "older_than")
        if older is not None:
            parse_age(older)
        return cls(status, _text_param(params, "operation_type"), _text_param(params, "reason"),
                   _text_param(params, "agent"), older)

    def query(self) -> dict[str, str]:
        """The filter as query parameters (links, hidden form fields)."""
        out = {"status": self.status}
        for name in ("operation_type", "reason", "agent", "older_than"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @property
    def pending_only(self) -> bool:
        return self.status in ("pending", "requeued")

    def canonical(self) -> str:
        """The filter as a confirmation signs it: canonical JSON (unambiguous,
        unlike :meth:`describe`, whose ``k=v, k=v`` a value can imitate)."""
        return json.dumps(self.query(), sort_keys=True, separators=(",", ":"))

    def describe(self) -> str:
        parts = [f"status={self.status}"]
        parts += [f"{k}={v}" for k, v in self.query().items() if k != "status"]
        return ", ".join(parts)

    def matches(self, r: DlqRecord, cutoff: float | None) -> bool:
        shown = "requeued" if (r.status is DlqStatus.PENDING and r.requeued_at) else (
            r.status.value)
        if self.status != "all" and self.status not in (shown, r.status.value):
            return False
        if self.operation_type is not None and r.operation_type != self.operation_type:
            return False
        if self.agent is not None and r.agent_id != self.agent:
            return False
        if self.reason is not None and self.reason not in (
                error_code(r.original_error), error_code(r.last_error)):
            return False
        return cutoff is None or r.failed_at.timestamp() < cutoff

    def cutoff(self) -> float | None:
        return None if self.older_than is None else time.time() - parse_age(self.older_than)


@dataclass(frozen=True, slots=True)
class DlqPage:
    records: list[DlqRecord]
    next_after: str | None
    """The cursor of the next page (``None``: this was the last)."""
    bounded: bool
    """The page stopped at :data:`SCAN_BOUND` records examined before it filled."""
    stats: DlqStats


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry of the DLQ's log stream about a record."""

    entry_id: str
    at: datetime
    change: str
    by: str | None
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class Sample:
    at: datetime
    started: int
    succeeded: int
    retries: int
    parked: int
    in_flight: int
    lease_ended: int
    backlog: int


@dataclass(frozen=True, slots=True)
class BreakerRow:
    name: str
    info: BreakerInfo
    config: CircuitBreakerConfig
    configured: bool


@dataclass(frozen=True, slots=True)
class Claim:
    """An entry of the in-flight index: an idempotency key and when its lease ends."""

    key: str
    nonce: str
    lease_ends_at: datetime


@dataclass(frozen=True, slots=True)
class InFlight:
    stats: LayerStats
    live: list[Claim]
    orphans: list[Claim]
    now: datetime


@dataclass(slots=True)
class Checkpoints:
    current: list[Checkpoint]
    lineage: dict[str, list[Checkpoint]] = field(default_factory=dict)
    more: bool = False  # the task has current checkpoints not read (CHECKPOINT_LIMIT)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _ms_to_dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


class Console:
    """The reads and actions behind the pages, over one store (sync, thread-safe).

    Args:
        store: The store (its namespace is the console's).
        config: The fleet's config (breakers, policies, DLQ settings); the
            library's defaults when ``None``. What is published to the fleet
            config is applied on top (as the CLI does).
        sample_interval_seconds: Minimum time between two samples of the
            overview's history (fleet-wide).
        history_size: Samples kept (fleet-wide, one capped stream in Redis).
    """

    def __init__(
        self,
        store: Any,
        config: DurabilityConfig | None = None,
        *,
        sample_interval_seconds: float = 5.0,
        history_size: int = 720,
    ) -> None:
        if not (isinstance(history_size, int) and 2 <= history_size <= 10_000):
            raise ConfigError("history_size", f"must be an integer in 2..10000, got "
                              f"{history_size!r}")
        if not (isinstance(sample_interval_seconds, (int, float))
                and 0.001 <= sample_interval_seconds <= 86400):
            raise ConfigError("sample_interval_seconds", "must be a number in 0.001..86400, "
                              f"got {sample_interval_seconds!r}")
        self.store = store
        self.sample_interval_ms = max(1, round(sample_interval_seconds * 1000))
        self.history_size = history_size
        replica = f"web:{socket.gethostname()}:{os.getpid()}"
        self.layer = DurabilityLayer(store, config, replica_id=replica)
        self._sync = ConfigSync(self.layer, replica_id=replica)
        self._defaults = CircuitBreakerRegistry(store, (), replica_id=replica)
        self._lock = threading.Lock()
        keys = store.keys
        self._inflight_key = keys.layer("inflight")
        self._stats_key = keys.layer("stats")
        self._history_key = keys.layer("console-history")
        self._log_key = keys.dlq("log")

    @property
    def namespace(self) -> str:
        return str(self.store.keys.namespace)

    def close(self) -> None:
        self.layer.close()

    # -- overview ---------------------------------------------------------------------

    def overview(self) -> tuple[LayerStats, DlqStats, list[Sample]]:
        """The totals now, the DLQ's counts, and the shared history (one sample taken)."""
        totals = self.layer.stats()
        stats = self.layer.dlq.stats()
        call = ScriptCall(
            "console_sample", [self._inflight_key, self._stats_key, self._history_key],
            [stats.pending, self.sample_interval_ms, self.history_size,
             max(self.sample_interval_ms * self.history_size * 2, 3_600_000)],
        )
        reply = self.store.run(call)
        return totals, stats, self.decode_samples(reply)

    def decode_samples(self, reply: Any) -> list[Sample]:
        key = self._history_key
        if not isinstance(reply, (list, tuple)) or not reply:
            raise CorruptData(key, f"unexpected console_sample reply {reply!r}")
        tag = _text(reply[0])
        if tag == "corrupt":
            raise CorruptData(key, _text(reply[2]) if len(reply) > 2 else "corrupt")
        out = []
        for entry in reversed(list(reply[2] or ())):  # newest first: oldest first here
            raw = {_text(k): v for k, v in _field_pairs(entry[1])}

            def num(name: str, raw: dict[str, Any] = raw) -> int:
                return _codec.as_int(raw.get(name, 0), key=key, field=name)

            out.append(Sample(_ms_to_dt(num("t")), num("started"), num("succeeded"),
                              num("retries"), num("parked"), num("in_flight"),
                              num("lease_ended"), num("backlog")))
        return out

    # -- DLQ --------------------------------------------------------------------------

    def _walk(self, flt: DlqFilter, after: str | None, want: int, bound: int
              ) -> tuple[list[DlqRecord], str | None, bool]:
        """Records the filter lets through, in enqueue order, after ``after``:
        at most ``want``, looking at most at ``bound`` entries of the index
        walked (the pending index, or the stream for other statuses), expired
        records awaiting cleanup included. Returns the records, the cursor to
        continue from (``None``: the end was reached), and whether the bound
        stopped the walk."""
        dlq = self.layer.dlq
        cutoff = flt.cutoff()
        out: list[DlqRecord] = []
        seen = 0
        cursor = after
        while seen < bound:
            page = dlq.scan(flt.operation_type if flt.pending_only else None,
                            pending=flt.pending_only, after=cursor,
                            max_examined=min(BATCH, bound - seen))
            seen += page.examined
            for record in page.records:
                if flt.pending_only and cutoff is not None and (
                        record.failed_at.timestamp() >= cutoff):
                    # The pending index is in enqueue order: every later one is younger.
                    return out, None, False
                if flt.matches(record, cutoff):
                    out.append(record)
                    if len(out) >= want:
                        return out, record.stream_id, False
            if page.next_after is None:
                return out, None, False
            cursor = page.next_after
        return out, cursor, True

    def dlq_page(self, flt: DlqFilter, after: str | None, limit: int) -> DlqPage:
        if after is not None and not _STREAM_ID.fullmatch(after):
            raise BadInput("after must be a stream id (as the next-page link gives)")
        records, cursor, bounded = self._walk(flt, after, limit, SCAN_BOUND)
        return DlqPage(records, cursor, bounded, self.layer.dlq.stats())

    def record(self, dlq_id: str) -> DlqRecord | None:
        try:
            return self.layer.dlq.get(dlq_id)
        except InvalidKey:
            return None

    def history(self, record: DlqRecord) -> tuple[list[LogEntry], bool]:
        """The log stream's entries about ``record``, NEWEST first: read from the
        newest entry down to the time it was first parked on (the stream is
        time-ordered), at most :data:`HISTORY_SCAN` entries read, so the latest
        changes (the console's own audit entries) always show. Returns them and
        whether the read stopped at that bound before reaching the parking."""
        start = f"{max(0, int(record.failed_at.timestamp() * 1000) - 1000)}-0"
        out: list[LogEntry] = []
        read = 0
        end = "+"
        while read < HISTORY_SCAN:
            count = min(500, HISTORY_SCAN - read)
            reply = self.store.command("XREVRANGE", self._log_key, end, start, "COUNT", count)
            entries = list(reply or ())
            for entry_id, raw in entries:
                read += 1
                fields = {_text(k): _text(v) for k, v in _field_pairs(raw)}
                sid = _text(entry_id)
                end = "(" + sid
                if fields.get("dlq_id") != record.dlq_id:
                    continue
                ms = int(sid.split("-", 1)[0])
                out.append(LogEntry(sid, _ms_to_dt(ms), fields.pop("change", "?"),
                                    fields.pop("by", None) or None, fields))
            if len(entries) < count:
                return out, False
        return out, True

    def select(self, flt: DlqFilter) -> tuple[list[DlqRecord], bool]:
        """What a bulk action's confirmation shows and freezes: at most
        :data:`ACTION_MAX` records from the start, examining at most
        ``SCAN_BOUND * 5`` entries. Returns them and whether there may be more."""
        records, cursor, bounded = self._walk(flt, None, ACTION_MAX, SCAN_BOUND * 5)
        return records, bounded or cursor is not None

    def requeue(self, dlq_id: str, by: str,
                expected: Mapping[str, tuple[str, int]] | None = None) -> str:
        results = self.layer.dlq.requeue([dlq_id], by=by, expected=expected)
        return results[0].outcome if results else "not_found"

    def requeue_many(self, dlq_ids: Sequence[str], by: str,
                     expected: Mapping[str, tuple[str, int]] | None = None
                     ) -> dict[str, str]:
        results = self.layer.dlq.requeue(list(dlq_ids), by=by, expected=expected)
        return {r.dlq_id: r.outcome for r in results}

    def spend_nonce(self, nonce: str, ttl_ms: int) -> bool:
        """Spend a confirmation's nonce (``console_nonce``): ``True`` the first
        time, ``False`` ever after (within ``ttl_ms``)."""
        key = self.store.keys.layer("console-nonce", nonce)
        reply = self.store.run(ScriptCall("console_nonce", [key], [ttl_ms]))
        if not isinstance(reply, list) or _text(reply[0]) != "ok" or len(reply) != 2:
            raise CorruptData(key, _text(reply[2]) if isinstance(reply, list)
                              and len(reply) > 2 else f"unexpected reply {reply!r}")
        return int(reply[1]) == 1

    def abandon(self, dlq_id: str, by: str,
                expected: Mapping[str, tuple[str, int]] | None = None) -> str:
        abandoned = self.layer.dlq.abandon(dlq_id, by=by, expected=expected)
        return "abandoned" if abandoned else "not abandoned"

    def purge(self, dlq_ids: Sequence[str], by: str, status: str | None,
              expected: Mapping[str, tuple[str, int]] | None = None) -> dict[str, str]:
        return self.layer.dlq.purge(list(dlq_ids), by=by, status=status, expected=expected)

    # -- breakers ---------------------------------------------------------------------

    def _adopt(self, names: Iterable[str]) -> None:
        """Read the names found only in Redis through a registry of their own
        with a default config (shown as not configured: their rates and
        timeouts may differ from the fleet's), as the CLI does. Call with the
        lock held."""
        known = set(self._defaults.names())
        for name in sorted(set(names) - known):
            with contextlib.suppress(ConfigError):  # a member no durabilis process wrote
                self._defaults.upsert_config(CircuitBreakerConfig(name))

    def _registries(self) -> tuple[set[str], set[str], bool]:
        """The configured names (the config, then the fleet config applied on
        top), at most :data:`BREAKER_LIMIT` of the names found in Redis (a
        bounded ``SSCAN``: never the whole set), and whether there are more."""
        with self._lock:
            self._sync.refresh()
            configured = set(self.layer.breakers.names())
            found = self.layer.breakers.stored_names(BREAKER_LIMIT + 1)
            stored = set(sorted(found)[:BREAKER_LIMIT])
            self._adopt(stored - configured)
            stored &= configured | set(self._defaults.names())
        return configured, stored, len(found) > BREAKER_LIMIT

    def _row(self, name: str, configured: set[str]) -> BreakerRow:
        registry = self.layer.breakers if name in configured else self._defaults
        return BreakerRow(name, registry.state_info(name), registry.get_config(name),
                          name in configured)

    def breakers(self) -> tuple[list[BreakerRow], bool]:
        """At most :data:`BREAKER_LIMIT` breakers (configured ones first), and
        whether more exist than are shown."""
        configured, stored, more = self._registries()
        names = sorted(configured)[:BREAKER_LIMIT]
        names += sorted(stored - configured)[:BREAKER_LIMIT - len(names)]
        more = more or len(configured | stored) > len(names)
        return [self._row(n, configured) for n in names], more

    def breaker(self, name: str) -> tuple[BreakerRow, list[StateTransition]] | None:
        """One breaker, configured or found in Redis (one ``SISMEMBER``), or ``None``."""
        with self._lock:
            self._sync.refresh()
            configured = set(self.layer.breakers.names())
            if name not in configured:
                if not self.layer.breakers.is_stored(name):
                    return None
                self._adopt([name])
                if name not in self._defaults.names():
                    return None
        try:
            row = self._row(name, configured)
        except DependencyNotFound:
            return None
        registry = self.layer.breakers if name in configured else self._defaults
        return row, registry.transitions(name, TRANSITION_LIMIT)

    # -- checkpoints ------------------------------------------------------------------

    def checkpoints(self, task_id: str, agent: str | None) -> Checkpoints:
        manager = self.layer.checkpoints
        ops = CheckpointOps(self.store.keys, manager.config)
        find = ops.find(task_id, agent, CHECKPOINT_LIMIT)
        reply = self.store.run(find)
        entries, gets = ops.located(find, task_id, reply)
        current = ops.current(entries, self.store.run_many(gets) if gets else [])
        out = Checkpoints(current, more=ops.find_more(reply))
        agents: list[str] = []
        for cp in current:
            if cp.agent_id not in agents:
                agents.append(cp.agent_id)
        for a in agents[:AGENT_LIMIT]:
            out.lineage[a] = manager.history(task_id, a, limit=LINEAGE_LIMIT)
        return out

    # -- in flight ----------------------------------------------------------------------

    def inflight(self) -> InFlight:
        stats = self.layer.stats()
        sec, usec = self.store.command("TIME")
        now = int(_text(sec)) * 1000 + int(_text(usec)) // 1000
        live = self.store.command("ZREVRANGEBYSCORE", self._inflight_key, "+inf",
                                  f"({now}", "WITHSCORES", "LIMIT", 0, INFLIGHT_LIMIT)
        ended = self.store.command("ZRANGEBYSCORE", self._inflight_key, "-inf", now,
                                   "WITHSCORES", "LIMIT", 0, INFLIGHT_LIMIT)
        return InFlight(stats, self._claims(live), self._claims(ended), _ms_to_dt(now))

    def _claims(self, reply: Any) -> list[Claim]:
        out = []
        for item in _pairs(reply):
            member, score = item
            key, _, nonce = _text(member).rpartition("|")
            out.append(Claim(key or _text(member), nonce, _ms_to_dt(int(float(score)))))
        return out

    # -- config -----------------------------------------------------------------------

    def config(self) -> tuple[FleetConfig, DurabilityConfig]:
        return self._sync.fleet_config(), self.layer.config


def _pairs(reply: Any) -> Iterable[tuple[Any, Any]]:
    """A WITHSCORES reply (flat under RESP2, pairs under RESP3) as pairs."""
    items = list(reply or ())
    if items and isinstance(items[0], (list, tuple)):
        return [(a, b) for a, b in items]
    return list(zip(items[0::2], items[1::2], strict=False))


def _field_pairs(raw: Any) -> list[tuple[Any, Any]]:
    """A stream entry's fields: a mapping (redis-py's XRANGE reply) or a flat list
    (a script's reply)."""
    if isinstance(raw, dict):
        return list(raw.items())
    flat = list(raw or ())
    return list(zip(flat[0::2], flat[1::2], strict=False))
