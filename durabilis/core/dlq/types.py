"""The DLQ's public values: its config, a record, listings, stats and replay outcomes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, NamedTuple

from durabilis._limits import MAX_STORED_TTL_SECONDS, check_limits
from durabilis.errors import (
    ConfigError,
)

# A record's TTL (a call's ttl_seconds too): at most a year (durabilis._limits).
MAX_TTL_SECONDS = MAX_STORED_TTL_SECONDS


class DlqStatus(str, Enum):
    """Where a record is in its life: ``PENDING`` -> ``REPLAYED`` | ``ABANDONED`` (final)."""

    PENDING = "pending"
    REPLAYED = "replayed"
    ABANDONED = "abandoned"


def check_number(name: str, value: Any, *, integer: bool = False, minimum: float = 0) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and integer:
        ok = isinstance(value, int)
    if not ok or not math.isfinite(value) or value < minimum or (minimum == 0 and value <= 0):
        kind = "an integer" if integer else "a finite number"
        bound = f">= {minimum}" if minimum else "> 0"
        raise ConfigError(name, f"must be {kind} {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class DlqConfig:
    """Settings of the dead-letter queue.

    Attributes:
        default_ttl_seconds: Lifetime of a record when ``enqueue`` gives none
            (the seed's 24 h). A record is removed once its TTL has passed
            (a pending one only without ``keep_pending``); a pending record
            that expires unreplayed is reported as it goes (event
            ``durability_dlq_expired``, an ``expired`` log entry, the count
            ``DlqStats.expired``).
        max_pending: Pending records above which ``enqueue`` logs the warning
            event ``durability_dlq_max_pending_exceeded`` and ``stats()`` flags
            it. Nothing is ever dropped to make room. With ``keep_pending``
            it is also the most records kept: see there.
        keep_pending: Pending records never expire (as Sidekiq keeps its
            dead set): a record's TTL runs from the moment it is replayed or
            abandoned. Memory stays bounded by ``max_pending``: a record
            parked while ``max_pending`` records are pending is not kept (it
            gets its TTL as usual, and its enqueue logs
            ``durability_dlq_max_pending_exceeded`` with ``kept=False``), so at
            most ``max_pending`` records live forever.
        claim_ttl_seconds: How long a replay's claim holds a record; a replayer
            that dies mid-replay releases it after this long. Keep it above the
            longest replay handler: past it, another replica may replay the
            same record.
        max_payload_bytes: Largest encoded ``original_operation`` (plus
            metadata) accepted; more raises ``PayloadTooLarge``.
        max_error_bytes: Error texts longer than this (UTF-8) are truncated.
        max_name_bytes: Longest ``agent_id`` / ``operation_type`` (UTF-8).
        cleanup_batch_size: Records removed per script by ``cleanup_expired``.
        purge_per_enqueue: Expired records each ``enqueue`` removes on the way
            (0 turns it off), so the stream stays bounded without a cleanup job.
        stats_scan_limit: Expired records (awaiting cleanup) ``stats()`` reads
            at most, so one call does bounded work however large the backlog;
            beyond it the answer is marked inexact (``DlqStats.exact``).
    """

    default_ttl_seconds: float = 86400
    max_pending: int = 10_000
    claim_ttl_seconds: float = 300
    max_payload_bytes: int = 1024 * 1024
    max_error_bytes: int = 8192
    max_name_bytes: int = 256
    cleanup_batch_size: int = 500
    purge_per_enqueue: int = 2
    stats_scan_limit: int = 1000
    keep_pending: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ``ConfigError`` naming the first invalid field."""
        check_number("default_ttl_seconds", self.default_ttl_seconds)
        check_number("max_pending", self.max_pending, integer=True, minimum=1)
        check_number("claim_ttl_seconds", self.claim_ttl_seconds)
        check_number("max_payload_bytes", self.max_payload_bytes, integer=True, minimum=1)
        check_number("max_error_bytes", self.max_error_bytes, integer=True, minimum=16)
        check_number("max_name_bytes", self.max_name_bytes, integer=True, minimum=1)
        check_number("cleanup_batch_size", self.cleanup_batch_size, integer=True, minimum=1)
        check_number("stats_scan_limit", self.stats_scan_limit, integer=True, minimum=1)
        if not (isinstance(self.purge_per_enqueue, int) and not isinstance(
            self.purge_per_enqueue, bool
        )) or self.purge_per_enqueue < 0:
            raise ConfigError(
                "purge_per_enqueue", f"must be an integer >= 0, got {self.purge_per_enqueue!r}"
            )
        check_limits(self)  # every maximum: durabilis._limits
        if not isinstance(self.keep_pending, bool):
            raise ConfigError(
                "keep_pending", f"must be true or false, got {self.keep_pending!r}"
            )
        if self.default_ttl_seconds * 1000 < 1 or self.claim_ttl_seconds * 1000 < 1:
            raise ConfigError("default_ttl_seconds", "durations shorter than 1 ms are meaningless")
        for name in ("default_ttl_seconds", "claim_ttl_seconds"):
            if getattr(self, name) > MAX_TTL_SECONDS:
                raise ConfigError(name, f"must be at most {MAX_TTL_SECONDS}")
        # Lua counts: exact below 1e14
        for name in ("cleanup_batch_size", "purge_per_enqueue", "stats_scan_limit"):
            if getattr(self, name) > 1_000_000:
                raise ConfigError(name, f"must be at most 1000000, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class DlqRecord:
    """One parked operation, as read from Redis.

    Attributes:
        dlq_id: The record's id (32 hex chars, or the id the caller chose).
        original_operation: The operation as enqueued (JSON-compatible values
            come back as JSON decodes them; others through msgpack).
        agent_id: Who ran the operation.
        operation_type: Its type (``"wiki_write"``, ...).
        retry_count: Attempts made before it was parked.
        last_error: The latest error: of the last failed replay or the last
            parking, whichever came later, else ``original_error``.
        failed_at: When it was enqueued (Redis server clock, UTC).
        expires_at: When it is removed, whatever its status (9999-12-31 for a
            pending record kept by ``keep_pending``: never).
        status: :class:`DlqStatus`.
        replay_attempts: Failed replays so far.
        last_replay_at: When the last failed replay was reported.
        replayed_at: When it was marked replayed; ``replayed_by`` who did it.
        abandoned_at: When it was abandoned; ``abandoned_by`` who did it.
        claimed_by: The replayer holding (or last holding) a claim, if any;
            ``claim_expires_at`` when that claim ends.
        metadata: The ``metadata`` given to ``enqueue``.
        stream_id: The stream entry id: the enqueue order, and the cursor of
            ``list_pending`` / ``list_all`` (``after=``).
        original_error: The error that first sent it to the DLQ (the stream entry).
        parkings: How many times the operation was parked while this record was
            pending (deliveries of one idempotency key land in ONE record).
        last_parked_at: When it was last parked again (``None``: parked once).
        requeued_at: When an operator marked it for redelivery by the fleet
            (``durabilis dlq requeue``), while the mark holds (a failed replay
            ends it; a replayed record keeps it, as history); ``requeued_by`` who.
        last_replay_error: The last replay that could not run for want of
            config in the replaying process (a durabilis ``ConfigError`` or
            ``DependencyNotFound``): its text, in clear (the library's own
            text). Such a replay counts no attempt and leaves ``last_error``
            as it was; ``last_replay_error_at`` when.
    """

    dlq_id: str
    original_operation: Any
    agent_id: str
    operation_type: str
    retry_count: int
    last_error: str
    failed_at: datetime
    expires_at: datetime
    status: DlqStatus
    replay_attempts: int = 0
    last_replay_at: datetime | None = None
    replayed_at: datetime | None = None
    replayed_by: str | None = None
    abandoned_at: datetime | None = None
    abandoned_by: str | None = None
    claimed_by: str | None = None
    claim_expires_at: datetime | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    stream_id: str = ""
    original_error: str = ""
    parkings: int = 1
    last_parked_at: datetime | None = None
    requeued_at: datetime | None = None
    requeued_by: str | None = None
    last_replay_error: str | None = None
    last_replay_error_at: datetime | None = None

    @property
    def trace_context(self) -> tuple[str, str | None] | None:
        """The W3C trace context (``traceparent``, ``tracestate`` or ``None``) of
        the call that parked the operation, kept as the metadata fields of the
        same names when tracing was on (:mod:`durabilis.otel`); ``None``
        without one. A replay's span links to it."""
        meta = self.metadata or {}
        parent = meta.get("traceparent")
        return (parent, meta.get("tracestate")) if parent else None


class DlqListing(NamedTuple):
    """What ``list_all`` returns: ``records, pending_count = dlq.list_all()``."""

    records: list[DlqRecord]
    pending_count: int


class DlqScan(NamedTuple):
    """One bounded page of a listing (``DeadLetterQueue.scan``)."""

    records: list[DlqRecord]
    next_after: str | None
    """The stream id to continue after (``None``: the end was reached)."""
    examined: int
    """Index or stream entries looked at, expired records awaiting cleanup included."""


@dataclass(frozen=True, slots=True)
class DlqStats:
    """Counts of the live (not expired) records.

    One ``stats()`` call reads at most ``DlqConfig.stats_scan_limit`` of the
    expired records awaiting cleanup (Redis is never blocked in proportion to
    the backlog). When more than that have expired, ``exact`` is ``False``:
    ``total`` and ``expired_awaiting_cleanup`` stay exact, but the counts per
    status and type may still include expired records not read, so each is an
    upper bound ("at most"; never above ``total``), and the oldest pending
    record comes from a bounded search: the oldest when every record has the
    same TTL, else a live pending record that may be younger than the oldest
    (its age then a lower bound: "at least"). ``cleanup_expired()`` makes the
    answer exact again.

    Attributes:
        total: Live records (exact, also when ``exact`` is ``False``).
        by_status: Live records per status (every status present, maybe 0).
        by_operation_type: Per operation type, live records per status.
        oldest_pending_at: Enqueue time of the oldest pending record.
        oldest_pending_age_seconds: Its age by the Redis server clock.
        max_pending: The configured threshold.
        over_max_pending: More than ``max_pending`` records are pending.
        expired_awaiting_cleanup: Expired records whose entries
            ``cleanup_expired`` (or the next enqueues) will remove (exact:
            counted in O(log n), even when ``exact`` is ``False``).
        exact: ``False`` when the expired backlog exceeded ``stats_scan_limit``:
            the counts per status and type are then upper bounds (see above).
        expired: Pending records that reached their TTL unreplayed: those
            reported by a cleanup (kept in the counts hash, which lives as long
            as the DLQ's records and at least ``default_ttl_seconds`` after
            the last report) plus those awaiting it. Not part of ``total``:
            ``pending + replayed + abandoned == total`` (live records), and
            every record parked is in exactly one of the four.
        expired_by_operation_type: ``expired`` per operation type.
    """

    total: int
    by_status: dict[DlqStatus, int]
    by_operation_type: dict[str, dict[DlqStatus, int]]
    oldest_pending_at: datetime | None
    oldest_pending_age_seconds: float | None
    max_pending: int
    over_max_pending: bool
    expired_awaiting_cleanup: int
    exact: bool = True
    expired: int = 0
    expired_by_operation_type: dict[str, int] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        return self.by_status[DlqStatus.PENDING]

    def pending_for(self, operation_type: str | None) -> int:
        """Pending records of one operation type (all types when ``None``)."""
        if operation_type is None:
            return self.pending
        return self.by_operation_type.get(operation_type, {}).get(DlqStatus.PENDING, 0)


class CleanupReport(NamedTuple):
    """What one scheduled cleanup (:meth:`DeadLetterQueue.cleanup_due`) did."""

    removed: int
    """Expired records removed (pending, replayed and abandoned ones)."""
    expired: tuple[str, ...]
    """The ids of the pending ones among them: expired unreplayed, each reported."""


class ReplayOutcome(str, Enum):
    """What one replay attempt did."""

    REPLAYED = "replayed"
    """The handler succeeded and the record is now replayed."""
    FAILED = "failed"
    """The handler raised: the record stays pending, ``replay_attempts`` + 1."""
    NOT_FOUND = "not_found"
    """No live record has this id (unknown, malformed, or expired)."""
    EXPIRED = "expired"
    """(a replay pass) The record reached its TTL while pending, before the
    pass reached it: the handler did not run; the pass's cleanup reports it
    (event ``durability_dlq_expired``, log entry, ``DlqStats.expired``)."""
    NOT_PENDING = "not_pending"
    """Already replayed or abandoned: the handler did not run."""
    CLAIMED_ELSEWHERE = "claimed_elsewhere"
    """Another replayer holds a live claim on it: the handler did not run."""
    DEFERRED = "deferred"
    """Not replayed now, and no replay attempt counted: the operation is in
    progress elsewhere (``OperationInProgress``: a live delivery or another
    record of it) or its dependency's breaker is open (``CircuitOpen``; the pass
    replays no other record of that dependency), or, in a pass over one
    operation type, the record's type changed since it was listed. Also a
    handler that failed on a record parked without its payload, when the
    payload was parked into it meanwhile (the handler ran, on what it saw).
    The record stays pending, its claim released; ``error`` says which."""
    CLAIM_LOST = "claim_lost"
    """The handler ran, but the claim was lost meanwhile (it expired and was
    taken over, or an operator finished the record): nothing was recorded."""
    CONFIG_ERROR = "config_error"
    """The replaying process lacks config the record needs (a durabilis
    ``ConfigError`` or ``DependencyNotFound``, e.g. no breaker configured for
    its dependency): no attempt counted, ``last_error`` kept, the text kept in
    ``DlqRecord.last_replay_error`` (and ``error``, in clear: the library's own
    text); the claim released, a requeue mark kept (a replica with the config
    replays it)."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """The result of :meth:`DeadLetterQueue.replay`.

    Attributes:
        dlq_id: The record.
        outcome: :class:`ReplayOutcome`.
        error: The handler's error text (``FAILED``), or who holds the claim
            (``CLAIMED_ELSEWHERE``).
        replay_attempts: Failed replays so far, when known.
        status: The record's status afterwards, when known.
    """

    dlq_id: str
    outcome: ReplayOutcome
    error: str | None = None
    replay_attempts: int | None = None
    status: DlqStatus | None = None

    @property
    def replayed(self) -> bool:
        return self.outcome is ReplayOutcome.REPLAYED


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    """The result of :meth:`DeadLetterQueue.replay_pending`.

    Attributes:
        replayed: Records whose handler succeeded and that are now replayed.
        failed: Records whose handler raised (still pending).
        skipped: Records seen but not run: claimed by another replayer,
            finished or expired meanwhile.
        lost: Records whose handler ran but whose claim was lost meanwhile.
        failed_ids: The ids of the failed ones; ``lost_ids`` of the lost ones.
        deferred: Records not replayed now, no attempt counted
            (:attr:`ReplayOutcome.DEFERRED`); ``deferred_ids`` their ids.
        breakers_open: Dependencies found with an open breaker: the pass
            replayed none of their records (replay again once they close).
        expired: Records that expired unreplayed before the pass reached them
            (reported by the pass's cleanup); ``expired_ids`` their ids.
        config_errors: Records not replayed for want of config in this process
            (:attr:`ReplayOutcome.CONFIG_ERROR`; no attempt counted);
            ``config_error_ids`` their ids.
    """

    replayed: int = 0
    failed: int = 0
    skipped: int = 0
    lost: int = 0
    failed_ids: tuple[str, ...] = ()
    lost_ids: tuple[str, ...] = ()
    deferred: int = 0
    deferred_ids: tuple[str, ...] = ()
    breakers_open: tuple[str, ...] = ()
    expired: int = 0
    expired_ids: tuple[str, ...] = ()
    config_errors: int = 0
    config_error_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RequeueResult:
    """What :meth:`DeadLetterQueue.requeue` did to one record.

    Attributes:
        dlq_id: The record.
        outcome: ``"requeued"`` (marked now), ``"already"`` (marked before:
            nothing changed), ``"final"`` (replayed or abandoned: refused),
            ``"not_found"`` (unknown, malformed or expired) or ``"changed"``
            (not the record ``expected`` named: parked again since; refused).
        requeued_at: When it was marked (``requeued`` / ``already``).
        requeued_by: Who marked it (``already``: the earlier mark's).
        status: The record's status (``final``: which).
    """

    dlq_id: str
    outcome: str
    requeued_at: datetime | None = None
    requeued_by: str | None = None
    status: DlqStatus | None = None

    @property
    def marked(self) -> bool:
        """The record is marked for redelivery (now or before)."""
        return self.outcome in ("requeued", "already")
