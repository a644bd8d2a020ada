"""Dead-letter queue: the returns warehouse where failed operations wait, never lost.

An operation that exhausted its retries is parked here with everything needed
to understand and re-ship it. Storage (all keys of a namespace share the hash
tag ``{dlq}``, so every script runs on Redis Cluster):

- ``<ns>:dlq:{dlq}:stream`` - a Redis Stream, the ordered append-only log of
  failures, readable with ``redis-cli XRANGE``: plain text fields ``dlq_id``,
  ``agent_id``, ``operation_type``, ``retry_count``, ``last_error``,
  ``failed_at`` / ``expires_at`` (ISO-8601 UTC), ``original_operation`` (JSON
  text; ``original_operation_msgpack`` when the value is not JSON-compatible)
  and ``meta:<name>`` for caller metadata;
- ``<ns>:dlq:{dlq}:rec:<dlq_id>`` - a hash per record with its mutable state
  (status, replay attempts, replay error, claim), with a TTL = its expiry;
- ``expiry`` / ``pending`` / ``pending-by-op`` sorted sets and a ``counts`` hash,
  the indexes behind cleanup, listing and stats.

Every state change (enqueue, claim, finish, failed replay, cleanup) is ONE Lua
script. Replays claim a record first (a lease with a fencing token), so
replicas replaying at once never run one record twice; a dead replayer's claim
expires after ``claim_ttl_seconds``.

Round trips: ``enqueue``, ``get``, ``mark_replayed``, ``abandon``, ``stats``
and ``pending_count`` are one each; ``replay`` is three (claim, handler,
finish); listings are two per page of up to 100 records; ``cleanup_expired``
is two per batch; ``cleanup_due`` one for its lease, then as ``cleanup_expired``.

Nothing leaves silently: a record that reaches its TTL while pending is
reported by the cleanup that removes it (event ``durability_dlq_expired``, an
``expired`` log entry, ``DlqStats.expired``), exactly once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import re
import secrets
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from durabilis import _codec
from durabilis._keys import KeySpace
from durabilis._limits import MAX_STORED_TTL_SECONDS, check_limits
from durabilis._log import get_logger
from durabilis._scripts import ScriptCall
from durabilis._steps import INTERRUPTS, IO, Command, Run, Sleep, adrive, drive
from durabilis._store import AsyncStore, Store
from durabilis.errors import (
    CircuitOpen,
    ConfigError,
    CorruptData,
    DependencyNotFound,
    DurabilisError,
    InvalidKey,
    InvalidPayload,
    InvalidTtl,
    OperationInProgress,
    PayloadTooLarge,
    StorageUnavailable,
)
from durabilis.events import error_text, redact_error

__all__ = [
    "AsyncDeadLetterQueue",
    "CleanupReport",
    "DeadLetterQueue",
    "DlqConfig",
    "DlqListing",
    "DlqRecord",
    "DlqStats",
    "DlqStatus",
    "ReplayOutcome",
    "ReplayResult",
    "ReplaySummary",
    "RequeueResult",
]

_log = get_logger()

_PAGE = 100
_JSON_FIELD = "original_operation"
_MSGPACK_FIELD = "original_operation_msgpack"
_META_PREFIX = "meta:"
MAX_METADATA_FIELDS = 1000
"""Most metadata fields a record may carry (each is a field of its stream entry)."""
# Caller-chosen ids end up inside index members separated by "|": keep them plain.
_ID_RE = re.compile(r"^[A-Za-z0-9_.:%\-]{1,200}$")
# A record's TTL (a call's ttl_seconds too): at most a year (durabilis._limits).
_MAX_TTL_SECONDS = MAX_STORED_TTL_SECONDS
_SID_RE = re.compile(r"^(\d{1,20})-(\d{1,20})$")


class DlqStatus(str, Enum):
    """Where a record is in its life: ``PENDING`` -> ``REPLAYED`` | ``ABANDONED`` (final)."""

    PENDING = "pending"
    REPLAYED = "replayed"
    ABANDONED = "abandoned"


def _check_number(name: str, value: Any, *, integer: bool = False, minimum: float = 0) -> None:
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
        _check_number("default_ttl_seconds", self.default_ttl_seconds)
        _check_number("max_pending", self.max_pending, integer=True, minimum=1)
        _check_number("claim_ttl_seconds", self.claim_ttl_seconds)
        _check_number("max_payload_bytes", self.max_payload_bytes, integer=True, minimum=1)
        _check_number("max_error_bytes", self.max_error_bytes, integer=True, minimum=16)
        _check_number("max_name_bytes", self.max_name_bytes, integer=True, minimum=1)
        _check_number("cleanup_batch_size", self.cleanup_batch_size, integer=True, minimum=1)
        _check_number("stats_scan_limit", self.stats_scan_limit, integer=True, minimum=1)
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
            if getattr(self, name) > _MAX_TTL_SECONDS:
                raise ConfigError(name, f"must be at most {_MAX_TTL_SECONDS}")
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


class DlqListing(NamedTuple):
    """What ``list_all`` returns: ``records, pending_count = dlq.list_all()``."""

    records: list[DlqRecord]
    pending_count: int


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
            nothing changed), ``"final"`` (replayed or abandoned: refused) or
            ``"not_found"`` (unknown, malformed or expired).
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


# --- helpers --------------------------------------------------------------------


def record_id_for(merge_key: str) -> str:
    """The id of an operation's first DLQ record, derived from its idempotency key
    (every replica parking the operation names the same record)."""
    return hashlib.sha256(f"dlq\x00{merge_key}".encode()).hexdigest()[:32]


def sort_key(stream_id: str) -> str:
    """The index form of a stream id whose byte order is the enqueue order.

    ``"1700000000000-12"`` -> ``"001700000000000-b12"``: milliseconds padded to
    15 digits, the sequence prefixed by a letter giving its digit count (so
    ``-a9`` < ``-b10``). The Lua scripts compute the same.

    Raises:
        InvalidKey: ``stream_id`` is not a stream entry id.
    """
    match = _SID_RE.match(stream_id) if isinstance(stream_id, str) else None
    if match is None:
        raise InvalidKey(str(stream_id), "not a stream entry id (<ms>-<seq>)")
    ms, seq = str(int(match[1])), str(int(match[2]))
    return f"{ms.zfill(15)}-{chr(96 + len(seq))}{seq}"


def stream_id_of(key: str) -> str:
    """The stream id a :func:`sort_key` was made of (``""`` when ``key`` is not one)."""
    ms, sep, rest = key.partition("-")
    if not sep or not ms.isdigit() or len(rest) < 2 or not rest[1:].isdigit():
        return ""
    return f"{int(ms)}-{int(rest[1:])}"


KEEP_MS = 253402300799999
"""The expiry of a pending record kept by ``DlqConfig.keep_pending``: never
(9999-12-31T23:59:59.999Z; the scripts use the same number)."""

_CLEANUP_BATCHES = 20
"""Most cleanup batches (scripts) one :meth:`DeadLetterQueue.cleanup_due` runs:
the rest waits for the next period (bounded work per period)."""

_BY_BYTES = 256
"""The longest ``replayed_by`` / ``by`` name kept on a record (bytes)."""


def _clean(text: str) -> str:
    """``text`` with lone surrogates (from badly decoded bytes) replaced by ``?``.

    Text written down for a failed operation must never make its enqueue fail.
    """
    return text.encode("utf-8", errors="replace").decode("utf-8")


def _truncate(text: str, limit: int) -> str:
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return data.decode("utf-8")
    marker = " ...[truncated]"
    return data[: limit - len(marker)].decode("utf-8", errors="ignore") + marker


def _encode_operation(value: Any, room: int | None = None) -> tuple[str, bytes]:
    """JSON text when the value survives a JSON round trip unchanged (and fits
    in ``room`` bytes), else msgpack (often smaller: bytes, floats, non-ASCII)."""
    text = _codec.json_text_or_none(value)
    if text is not None:
        try:
            same = bool(json.loads(text) == value)
        except Exception:  # a foreign __eq__ may raise anything
            same = False
        if same:
            try:
                encoded = text.encode("utf-8")
            except UnicodeEncodeError:
                encoded = None  # a lone surrogate: msgpack refuses it too, as InvalidPayload
            if encoded is not None:
                if room is None or len(encoded) <= room:
                    return _JSON_FIELD, encoded
                packed = _codec.pack(value, what="original_operation")
                if len(packed) < len(encoded):
                    return _MSGPACK_FIELD, packed
                return _JSON_FIELD, encoded
    return _MSGPACK_FIELD, _codec.pack(value, what="original_operation")


def _text(value: Any, key: str, name: str) -> str:
    return _codec.as_text(value, key=key, field=name)


def _flat_to_dict(flat: Any, key: str) -> dict[str, Any]:
    if isinstance(flat, dict):
        return {_text(k, key, "field name"): v for k, v in flat.items()}
    if not isinstance(flat, (list, tuple)) or len(flat) % 2:
        raise CorruptData(key, f"expected field/value pairs, got {type(flat).__name__}")
    return {_text(flat[i], key, "field name"): flat[i + 1] for i in range(0, len(flat), 2)}


def _tag(reply: Any, key: str) -> str:
    try:
        return _codec.as_text(reply[0], key=key, field="reply")
    except (TypeError, IndexError, KeyError) as exc:
        raise CorruptData(key, f"unexpected script reply {reply!r}") from exc


def _corrupt(reply: Any, default_key: str) -> CorruptData:
    """The ``{"corrupt", key, detail}`` reply as an error naming the key."""
    try:
        key = _codec.as_text(reply[1], key=default_key, field="key")
        detail = _codec.as_text(reply[2], key=default_key, field="detail")
    except (IndexError, TypeError, CorruptData):
        return CorruptData(default_key, f"unexpected script reply {reply!r}")
    return CorruptData(key, detail)


class _Member(NamedTuple):
    """A pending-index member: ``raw`` (the bytes to continue after) and its parts."""

    raw: bytes
    sort_key: str
    dlq_id: str


@dataclass(frozen=True, slots=True)
class _Enqueued:
    """What the enqueue script did (for the composed layer's pipelines)."""

    dlq_id: str
    created: bool
    stream_id: str
    pending: int = 0
    merged: bool = False
    made_here: bool = False  # "exists": this very parking created it (sent again)

    @property
    def new_record(self) -> bool:
        """This parking made a new pending record: an operation parked (the
        layer's ``parked`` counter), not a re-parking."""
        return self.created or self.made_here


@dataclass(frozen=True, slots=True)
class Prepared:
    """A DLQ record checked and encoded ahead of time (``_DlqOps.prepare``)."""

    agent_id: str
    operation_type: str
    payload_field: str
    payload: bytes
    metadata: tuple[str, ...]  # field, value, ... (fields already prefixed)


@dataclass(frozen=True, slots=True)
class _Claimed:
    token: str
    record: DlqRecord
    taken_over: bool
    until: float = 0.0  # (monotonic) the claim's expiry at the latest (set by the replay)
    via: bytes = b""  # (a requeue pass) the requeue-index entry it was claimed through


# --- the steps a plan asks its driver to do ---------------------------------------


_T = TypeVar("_T")
_Plan = Generator[Any, Any, _T]
Handle = Callable[[DlqRecord, str], "_Plan[BaseException | object | None]"]
"""How a replay runs a record (with the replay's claim token): a plan returning
``None`` (done), :data:`FINISHED` (done, and the record already finished in the
handler's own step) or the failure."""


class _TypeChanged(Exception):
    """A filtered replay pass claimed a record whose type changed since it was
    listed (a payload-less record filled in): deferred, not run."""

    reason = "operation_type_changed"  # (the deferral's log reason)

    def __init__(self, wanted: str, found: str) -> None:
        super().__init__(f"listed as {wanted!r}, now {found!r}: left for its own pass")


class ReplayDeclined(Exception):
    """A replay handler's answer before anything ran: the record is not this
    replayer's to replay (e.g. an HTTP request another middleware parked).
    Deferred: the claim released, no attempt counted, a requeue mark kept."""


FINISHED = object()
"""A handler's answer: it succeeded and finished the record itself, fenced by
the claim token, in the same atomic step as its outcome (the layer's replays)."""

ANSWERED = object()
"""A handler's answer: the operation had completed (its outcome is recorded),
so nothing ran; a record another finished meanwhile (a later delivery of the
operation settles it) is replayed, not a lost claim."""


CONFIG_ERROR_QUIET_SECONDS = 600.0
"""After a config error on a requeued record, this replica's requeue passes
leave the record alone this long, and the same replica's same error is not
logged again (``replay_config_error``) within it."""

_BACKOFF_MAX = 10_000  # records one replica remembers backing off, at most

_POLL = Sleep(0.0)
"""An unshielded step that does nothing: where an interruption held back during
a shielded step (a claim, the note of the last record's outcome, a plain
handler in its thread) is delivered, before a handler starts."""

_NOTE_BACKOFF = (0.05, 1.0)  # first and longest pause between tries of a claim or a note
_RESEND_SECONDS = 30.0
"""How long a replay's claim or note is sent again after a lost reply, at most
(a cancellation or a signal waits for it meanwhile)."""


def handler_plan(handler: Callable[[DlqRecord], Any]) -> Handle:
    """The replay plan of a plain handler: run it (it fails by raising)."""

    def handle(record: DlqRecord, _token: str) -> _Plan[BaseException | None]:
        ok, value = yield Run(handler, record)
        return None if ok else value

    return handle



class _Pacer:
    """Spaces handler starts ``1 / max_per_second`` apart (pure: the caller sleeps)."""

    __slots__ = ("_interval", "_next")

    def __init__(self, max_per_second: float | None) -> None:
        self._interval = 0.0 if max_per_second is None else 1.0 / max_per_second
        self._next: float | None = None

    def wait(self, now: float) -> float:
        """Seconds to wait before the next claim attempt."""
        if self._next is None:
            return 0.0
        return max(0.0, self._next - now)

    def started(self, at: float) -> None:
        """A handler started at ``at`` (monotonic seconds)."""
        if self._interval:
            self._next = at + self._interval


class _Tally:
    """Accumulates replay results into a :class:`ReplaySummary`."""

    __slots__ = ("config_ids", "deferred_ids", "expired_ids", "failed_ids", "lost_ids", "open",
                 "ran", "replayed", "skipped")

    def __init__(self) -> None:
        self.ran = self.replayed = self.skipped = 0
        self.failed_ids: list[str] = []
        self.lost_ids: list[str] = []
        self.deferred_ids: list[str] = []
        self.expired_ids: list[str] = []
        self.config_ids: list[str] = []
        self.open: dict[str, None] = {}  # dependencies with an open breaker (ordered set)

    def add(self, result: ReplayResult) -> bool:
        """Count ``result``; ``True`` when its handler ran."""
        outcome = result.outcome
        if outcome is ReplayOutcome.DEFERRED:
            self.deferred_ids.append(result.dlq_id)
            return False
        if outcome is ReplayOutcome.EXPIRED:
            self.expired_ids.append(result.dlq_id)
            return False
        if outcome is ReplayOutcome.CONFIG_ERROR:
            # Counted toward the pass's limit (it claimed and wrote), not an attempt.
            self.config_ids.append(result.dlq_id)
            self.ran += 1
            return False
        if outcome is ReplayOutcome.REPLAYED:
            self.replayed += 1
        elif outcome is ReplayOutcome.FAILED:
            self.failed_ids.append(result.dlq_id)
        elif outcome is ReplayOutcome.CLAIM_LOST:
            self.lost_ids.append(result.dlq_id)
        else:
            self.skipped += 1
            return False
        self.ran += 1
        return True

    def summary(self) -> ReplaySummary:
        return ReplaySummary(
            replayed=self.replayed,
            failed=len(self.failed_ids),
            skipped=self.skipped,
            lost=len(self.lost_ids),
            failed_ids=tuple(self.failed_ids),
            lost_ids=tuple(self.lost_ids),
            deferred=len(self.deferred_ids),
            deferred_ids=tuple(self.deferred_ids),
            breakers_open=tuple(self.open),
            expired=len(self.expired_ids),
            expired_ids=tuple(self.expired_ids),
            config_errors=len(self.config_ids),
            config_error_ids=tuple(self.config_ids),
        )


# --- pure operations: build calls, decode replies (no I/O) ------------------------


class _DlqOps:
    """Builds each script call and decodes its reply; shared by both twins."""

    __slots__ = ("_backoff", "config", "keys", "owner")

    def __init__(self, keys: KeySpace, config: DlqConfig, owner: str) -> None:
        self.keys = keys
        self.config = config
        self.owner = owner
        # Requeued records this replica met a config error on: dlq_id -> when
        # (monotonic) its requeue passes may claim it again.
        self._backoff: dict[str, float] = {}

    # keys ------------------------------------------------------------------

    @property
    def stream_key(self) -> str:
        return self.keys.dlq("stream")

    @property
    def expiry_key(self) -> str:
        return self.keys.dlq("expiry")

    @property
    def pending_key(self) -> str:
        return self.keys.dlq("pending")

    @property
    def pending_by_op_key(self) -> str:
        return self.keys.dlq("pending-by-op")

    @property
    def counts_key(self) -> str:
        return self.keys.dlq("counts")

    def record_key(self, dlq_id: str) -> str:
        return self.keys.dlq("rec", dlq_id)

    @property
    def bykey_key(self) -> str:
        """Hash: an operation's idempotency key -> the id of its current record."""
        return self.keys.dlq("bykey")

    @property
    def requeue_key(self) -> str:
        """Lex zset: the records marked for redelivery by the fleet
        (``<op>\\0<sortkey(sid)>|<dlq_id>``, as ``pending-by-op``)."""
        return self.keys.dlq("requeued")

    @property
    def lease_key(self) -> str:
        """The scheduled cleanup's lease: one replica per period (``layer_lease``)."""
        return self.keys.dlq("lease", "cleanup")

    @property
    def log_key(self) -> str:
        """Capped stream of every state change (parked, parked_again, filled_in, replay_failed,
        replayed, abandoned, expired), in order."""
        return self.keys.dlq("log")

    # validation ------------------------------------------------------------

    def name(self, what: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise InvalidKey(str(value), f"{what} must be a non-empty string")
        if "\x00" in value:
            raise InvalidKey(value, f"{what} must not contain NUL characters")
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise InvalidKey(value, f"{what} is not valid UTF-8 text") from exc
        if size > self.config.max_name_bytes:
            raise InvalidKey(
                value, f"{what} is {size} bytes, over max_name_bytes={self.config.max_name_bytes}"
            )
        return value

    @staticmethod
    def known_id(dlq_id: Any) -> bool:
        """Whether ``dlq_id`` could name a record (malformed ids are simply unknown).

        Raises:
            InvalidKey: ``dlq_id`` is not a string at all.
        """
        if not isinstance(dlq_id, str):
            raise InvalidKey(repr(dlq_id), "a dlq_id must be a string")
        return _ID_RE.match(dlq_id) is not None

    def ttl_ms(self, ttl_seconds: float | None) -> int:
        ttl = self.config.default_ttl_seconds if ttl_seconds is None else ttl_seconds
        if (
            not isinstance(ttl, (int, float))
            or isinstance(ttl, bool)
            or not math.isfinite(ttl)
            or ttl <= 0
        ):
            raise InvalidTtl(ttl)
        if ttl > _MAX_TTL_SECONDS:
            raise ConfigError("ttl_seconds", f"must be at most {_MAX_TTL_SECONDS}")
        return max(1, int(ttl * 1000))

    def hold_ms(self) -> int:
        """How long the composed layer holds a parked operation's idempotency key
        (so that a later success of the operation settles its record), in ms.

        As long as the record can live pending: ``default_ttl_seconds``; with
        ``keep_pending`` (a record that may never expire while pending), the
        longest TTL there is, ``MAX_STORED_TTL_SECONDS`` (366 days). A kept
        record older than that is no longer settled by its operation's success:
        replay or abandon it before.
        """
        if self.config.keep_pending:
            return int(_MAX_TTL_SECONDS * 1000)
        return self.ttl_ms(None)

    # enqueue ---------------------------------------------------------------

    def prepare(
        self,
        agent_id: str,
        operation_type: str,
        original_operation: Any,
        metadata: Mapping[str, str] | None = None,
        *,
        spare_bytes: int = 0,
    ) -> Prepared:
        """Check and encode what a later :meth:`enqueue_prepared` parks (no I/O).

        The composed layer prepares its DLQ record BEFORE it claims an
        operation, so a failure can always be parked (check before the effect).

        Args:
            spare_bytes: Room kept under ``max_payload_bytes`` for metadata
                added at enqueue time.

        Raises:
            InvalidKey: Empty/over-long/NUL ``agent_id`` or ``operation_type``.
            InvalidPayload: Metadata not str -> str, too many metadata fields, or
                an operation msgpack cannot encode.
            PayloadTooLarge: The encoded operation plus metadata is over
                ``max_payload_bytes``.
        """
        self.name("agent_id", agent_id)
        self.name("operation_type", operation_type)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise InvalidPayload(f"metadata must be a mapping, got {type(metadata).__name__}")
        if metadata is not None and len(metadata) > MAX_METADATA_FIELDS:
            raise InvalidPayload(
                f"metadata has {len(metadata)} fields, over the limit of {MAX_METADATA_FIELDS}"
            )
        meta: list[str] = []
        size = spare_bytes
        for key, value in (metadata or {}).items():
            if not isinstance(key, str) or not key or not isinstance(value, str):
                raise InvalidPayload(
                    f"metadata must map non-empty str to str, got {key!r}: {type(value).__name__}"
                )
            meta += [_META_PREFIX + _clean(key), _clean(value)]
            size += len(key.encode("utf-8", "replace")) + len(value.encode("utf-8", "replace"))
        payload_field, payload = _encode_operation(
            original_operation, self.config.max_payload_bytes - size
        )
        size += len(payload)
        if size > self.config.max_payload_bytes:
            raise PayloadTooLarge("original_operation", size, self.config.max_payload_bytes)
        return Prepared(agent_id, operation_type, payload_field, payload, tuple(meta))

    def enqueue_prepared(
        self,
        prepared: Prepared,
        retry_count: int,
        last_error: str,
        *,
        dlq_id: str,
        ttl_seconds: float | None = None,
        metadata: Mapping[str, str] | None = None,
        merge_key: str | None = None,
        candidate: str | None = None,
    ) -> ScriptCall:
        """The enqueue call of a prepared record (never raises for its content:
        the error text is truncated, ``metadata`` here is small and trusted).

        With ``merge_key`` (the operation's idempotency key), a parking of an
        operation whose record is pending lands in that record (one record per
        operation); ``dlq_id`` names this parking, and a new record takes the id
        ``candidate`` (by default :func:`record_id_for`) or, when that id is taken
        by an older record of the key, ``dlq_id``. A reply ``"miss"`` (the key's
        record is another) is sent again with :meth:`enqueue_again`.
        """
        meta = list(prepared.metadata)
        for key, value in (metadata or {}).items():
            meta += [_META_PREFIX + _clean(key), _clean(value)]
        mkey = merge_key or ""
        cand = (candidate or record_id_for(mkey)) if mkey else dlq_id
        return ScriptCall(
            "dlq_enqueue",
            [
                self.stream_key,
                self.expiry_key,
                self.pending_key,
                self.pending_by_op_key,
                self.counts_key,
                self.record_key(dlq_id),
                self.bykey_key,
                self.record_key(cand),
                self.log_key,
                self.requeue_key,
            ],
            [
                dlq_id,
                self.ttl_ms(ttl_seconds),
                self.config.purge_per_enqueue,
                prepared.agent_id,
                prepared.operation_type,
                str(max(0, int(retry_count))),
                _truncate(_clean(last_error), self.config.max_error_bytes),
                prepared.payload_field,
                prepared.payload,
                mkey,
                cand,
                self.config.max_pending if self.config.keep_pending else 0,
                *meta,
            ],
        )

    def enqueue_again(self, call: ScriptCall, reply: Any) -> ScriptCall | None:
        """After a ``"miss"`` reply: the same enqueue, naming the record the key's
        entry names; ``None`` for any other reply."""
        if _tag(reply, str(call.keys[5])) != "miss":
            return None
        cand = _text(reply[1], self.bykey_key, "dlq_id")
        keys = list(call.keys)
        keys[7] = self.record_key(cand)
        args = list(call.args)
        args[10] = cand
        return ScriptCall(call.name, keys, args)

    def enqueue(  # noqa: PLR0917  (the seed's signature)
        self,
        agent_id: str,
        operation_type: str,
        original_operation: Any,
        retry_count: int,
        last_error: str | None,
        ttl_seconds: float | None = None,
        *,
        metadata: Mapping[str, str] | None = None,
        dlq_id: str | None = None,
    ) -> ScriptCall:
        """The enqueue call; every input is checked here, before any I/O.

        Raises:
            InvalidKey: Empty/over-long/NUL ``agent_id`` or ``operation_type``,
                or a malformed caller-chosen ``dlq_id``.
            InvalidPayload: ``retry_count`` not an int >= 0, ``last_error`` not
                text, metadata not str -> str (or more than
                ``MAX_METADATA_FIELDS`` fields), or an operation msgpack cannot encode.
            PayloadTooLarge: The encoded operation plus metadata is over
                ``max_payload_bytes``.
            InvalidTtl: ``ttl_seconds`` <= 0.
        """
        prepared = self.prepare(agent_id, operation_type, original_operation, metadata)
        if not isinstance(retry_count, int) or isinstance(retry_count, bool) or retry_count < 0:
            raise InvalidPayload(f"retry_count must be an integer >= 0, got {retry_count!r}")
        if last_error is None:
            last_error = ""
        if not isinstance(last_error, str):
            raise InvalidPayload(f"last_error must be a string, got {type(last_error).__name__}")
        if dlq_id is None:
            dlq_id = uuid.uuid4().hex
        elif not isinstance(dlq_id, str) or not _ID_RE.match(dlq_id):
            raise InvalidKey(str(dlq_id), "a dlq_id must be 1-200 chars of [A-Za-z0-9_.:%-]")
        self.ttl_ms(ttl_seconds)
        return self.enqueue_prepared(
            prepared, retry_count, last_error, dlq_id=dlq_id, ttl_seconds=ttl_seconds
        )

    def decode_enqueue(self, call: ScriptCall, reply: Any) -> _Enqueued:
        """Decode the enqueue reply (logs the events); a ``"miss"`` is not decoded
        here (see :meth:`enqueue_again`)."""
        parking = str(call.args[0])
        key = str(call.keys[5])
        tag = _tag(reply, key)
        if tag == "exists":
            sid = _text(reply[1], key, "sid")
            dlq_id = _text(reply[2], key, "dlq_id") if len(reply) > 2 else parking
            made = len(reply) > 3 and _codec.as_int(reply[3], key=key, field="made") == 1
            _log.info("durability_dlq_enqueue_existing", dlq_id=dlq_id, stream_id=sid)
            return _Enqueued(dlq_id, created=False, stream_id=sid, made_here=made)
        if tag == "merged":
            sid = _text(reply[1], key, "sid")
            dlq_id = _text(reply[2], key, "dlq_id")
            parkings = _codec.as_int(reply[3], key=key, field="pk")
            _log.info(
                "durability_dlq_parked_again", dlq_id=dlq_id, operation_type=str(call.args[4]),
                agent_id=str(call.args[3]), parkings=parkings,
            )
            return _Enqueued(dlq_id, created=False, stream_id=sid, merged=True)
        if tag != "ok":
            raise _corrupt(reply, key)
        sid = _text(reply[1], key, "sid")
        pending = _codec.as_int(reply[4], key=key, field="pending")
        dlq_id = _text(reply[5], key, "dlq_id")
        kept = len(reply) > 6 and _codec.as_int(reply[6], key=key, field="kept") == 1
        if len(reply) > 7:
            self.report_expired(reply[7], key)
        operation_type = str(call.args[4])
        _log.info(
            "durability_dlq_enqueued",
            dlq_id=dlq_id,
            agent_id=str(call.args[3]),
            operation_type=operation_type,
            retry_count=int(str(call.args[5])),
        )
        keeping = self.config.keep_pending
        if pending > self.config.max_pending or (keeping and not kept):
            # Nothing is dropped (peers drop the oldest); the operator is told.
            # With keep_pending, a record over max_pending is not kept: it
            # expires (reported) after its TTL, so memory stays bounded.
            _log.warning(
                "durability_dlq_max_pending_exceeded",
                dlq_id=dlq_id,
                operation_type=operation_type,
                pending=pending,
                max_pending=self.config.max_pending,
                **({"kept": kept} if keeping else {}),
            )
        return _Enqueued(dlq_id, created=True, stream_id=sid, pending=pending)

    def report_expired(self, flat: Any, key: str) -> list[tuple[str, str, str]]:
        """Log ``durability_dlq_expired`` for each pending record a script reported
        expired (flat dlq_id, operation type, idempotency key, agent_id); returns
        (dlq_id, operation type, idempotency key) per record."""
        items = list(flat or ())
        if len(items) % 4:
            raise CorruptData(key, f"unexpected expired-record list {items!r}"[:300])
        out = []
        for i in range(0, len(items), 4):
            dlq_id, op, ik, agent = (_text(v, key, "expired") for v in items[i:i + 4])
            _log.warning(
                "durability_dlq_expired", dlq_id=dlq_id, operation_type=op,
                idempotency_key=ik or None, agent_id=agent or None,
            )
            out.append((dlq_id, op, ik))
        return out

    # reads -----------------------------------------------------------------

    def get(self, dlq_ids: Sequence[str], *, with_stream: bool = True) -> ScriptCall:
        return ScriptCall(
            "dlq_get",
            [self.stream_key, *(self.record_key(i) for i in dlq_ids)],
            ["1" if with_stream else "0"],
        )

    def decode_get(
        self,
        dlq_ids: Sequence[str],
        reply: Any,
        entries: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[DlqRecord | None]:
        """One record (or ``None``) per id; ``entries`` are the stream fields
        when the call was built ``with_stream=False``."""
        if not isinstance(reply, list) or len(reply) != len(dlq_ids):
            raise CorruptData(self.stream_key, f"unexpected script reply {reply!r}")
        out: list[DlqRecord | None] = []
        for i, (dlq_id, item) in enumerate(zip(dlq_ids, reply, strict=True)):
            key = self.record_key(dlq_id)
            tag = _tag(item, key)
            if tag == "none":
                out.append(None)
            elif tag == "ok":
                stream = entries[i] if entries is not None else _flat_to_dict(item[2], key)
                out.append(self.record(dlq_id, _flat_to_dict(item[1], key), stream))
            else:
                raise _corrupt(item, key)
        return out

    def record(
        self, dlq_id: str, h: Mapping[str, Any], s: Mapping[str, Any]
    ) -> DlqRecord:
        """Build a record from its hash ``h`` and stream entry ``s``.

        Raises:
            CorruptData: A missing or garbled field (names the key holding it).
        """
        hkey, skey = self.record_key(dlq_id), self.stream_key

        def req(src: Mapping[str, Any], name: str, key: str) -> Any:
            if name not in src:
                raise CorruptData(key, f"field {name!r} is missing (record {dlq_id})")
            return src[name]

        def opt_ms(name: str) -> datetime | None:
            raw = h.get(name)
            return None if raw is None else _codec.as_datetime(raw, key=hkey, field=name)

        def opt_text(name: str) -> str | None:
            raw = h.get(name)
            return None if raw is None else _text(raw, hkey, name)

        status_text = _text(req(h, "st", hkey), hkey, "st")
        try:
            status = DlqStatus(status_text)
        except ValueError as exc:
            raise CorruptData(hkey, f"unknown status {status_text!r}") from exc
        stream_dlq_id = _text(req(s, "dlq_id", skey), skey, "dlq_id")
        if stream_dlq_id != dlq_id:
            raise CorruptData(skey, f"entry of record {dlq_id} names record {stream_dlq_id}")
        if _JSON_FIELD in s:
            raw_op = _text(s[_JSON_FIELD], skey, _JSON_FIELD)
            try:
                operation = json.loads(raw_op)
            except ValueError as exc:
                raise CorruptData(skey, f"{_JSON_FIELD} of {dlq_id} is not JSON") from exc
        elif _MSGPACK_FIELD in s:
            operation = _codec.unpack(bytes(s[_MSGPACK_FIELD]), key=skey)
        else:
            raise CorruptData(skey, f"entry of record {dlq_id} holds no original_operation")
        original_error = _text(req(s, "last_error", skey), skey, "last_error")
        replay_error = opt_text("le")
        return DlqRecord(
            dlq_id=dlq_id,
            original_operation=operation,
            agent_id=_text(req(s, "agent_id", skey), skey, "agent_id"),
            operation_type=_text(req(s, "operation_type", skey), skey, "operation_type"),
            retry_count=_codec.as_int(req(s, "retry_count", skey), key=skey, field="retry_count"),
            last_error=original_error if replay_error is None else replay_error,
            failed_at=_codec.as_datetime(req(h, "ts", hkey), key=hkey, field="ts"),
            expires_at=_codec.as_datetime(req(h, "exp", hkey), key=hkey, field="exp"),
            status=status,
            replay_attempts=_codec.as_int(h.get("ra", 0), key=hkey, field="ra"),
            last_replay_at=opt_ms("lat"),
            replayed_at=opt_ms("rat"),
            replayed_by=opt_text("rby"),
            abandoned_at=opt_ms("aat"),
            abandoned_by=opt_text("aby"),
            claimed_by=opt_text("co"),
            claim_expires_at=opt_ms("ce"),
            metadata={
                k[len(_META_PREFIX) :]: _text(v, skey, k)
                for k, v in s.items()
                if k.startswith(_META_PREFIX)
            },
            stream_id=_text(req(h, "sid", hkey), hkey, "sid"),
            original_error=original_error,
            parkings=_codec.as_int(h.get("pk", 1), key=hkey, field="pk"),
            last_parked_at=opt_ms("pat"),
            requeued_at=opt_ms("rq"),
            requeued_by=(opt_text("rqb") or None) if "rq" in h else None,
            last_replay_error=opt_text("lre"),
            last_replay_error_at=opt_ms("lrat"),
        )

    def pending_range(self, operation_type: str | None, after: bytes | None) -> Command:
        """One page of the pending index (lex order = enqueue order).

        ``after`` is exclusive: a raw member, or ``sort_key(sid) + b"|\\xff"``.
        """
        if operation_type is None:
            low = b"-" if after is None else b"(" + after
            return Command(
                ("ZRANGEBYLEX", self.pending_key, low, b"+", "LIMIT", 0, _PAGE), self.pending_key
            )
        prefix = operation_type.encode("utf-8") + b"\x00"
        low = b"[" + prefix if after is None else b"(" + prefix + after
        high = b"(" + operation_type.encode("utf-8") + b"\x01"
        return Command(
            ("ZRANGEBYLEX", self.pending_by_op_key, low, high, "LIMIT", 0, _PAGE),
            self.pending_by_op_key,
        )

    def decode_members(self, operation_type: str | None, reply: Any) -> list[_Member]:
        key = self.pending_key if operation_type is None else self.pending_by_op_key
        skip = 0 if operation_type is None else len(operation_type.encode("utf-8")) + 1
        out: list[_Member] = []
        for item in reply or ():
            raw = bytes(item[skip:]) if isinstance(item, bytes) else str(item)[skip:].encode()
            sk, sep, dlq_id = raw.partition(b"|")
            if not sep or not dlq_id:
                raise CorruptData(key, f"index member {raw!r} is not <sort key>|<dlq_id>")
            out.append(_Member(raw, _text(sk, key, "member"), _text(dlq_id, key, "member")))
        return out

    def stream_range(self, after: str | None) -> Command:
        low = "-" if after is None else "(" + after
        return Command(("XRANGE", self.stream_key, low, "+", "COUNT", _PAGE), self.stream_key)

    def decode_entries(self, reply: Any) -> list[tuple[str, dict[str, Any]]]:
        key = self.stream_key
        out = []
        for item in reply or ():
            try:
                sid, fields = item[0], item[1]
            except (TypeError, IndexError, KeyError) as exc:
                raise CorruptData(key, f"unexpected XRANGE item {item!r}") from exc
            out.append((_text(sid, key, "id"), _flat_to_dict(fields, key)))
        return out

    def cursor(self, after: str | DlqRecord | None) -> bytes | None:
        """The exclusive pending-index bound after a stream id (or a record)."""
        if after is None:
            return None
        sid = after.stream_id if isinstance(after, DlqRecord) else after
        return sort_key(sid).encode() + b"|\xff"

    # replay ----------------------------------------------------------------

    def claim(
        self, dlq_id: str, nonce: str = "", stream_id: str = "", *, requeued: bool = False
    ) -> ScriptCall:
        """The claim of a record; with ``nonce`` (hex), the same call sent again
        after a lost reply gets back the claim its earlier try made; with
        ``stream_id`` (a pass's, from the pending index), a record that expired
        awaiting cleanup is told apart (``"expired"``) from an unknown one. With
        ``requeued`` (a requeue pass, ``stream_id`` its index entry's), only a
        record that carries the requeue mark for that stream id is claimed (else
        ``"unmarked"``: the entry is left over)."""
        args: list[Any] = [
            self.owner, max(1, int(self.config.claim_ttl_seconds * 1000)), nonce, stream_id,
            dlq_id, *(("rq",) if requeued else ()),
        ]
        return ScriptCall(
            "dlq_claim",
            [self.stream_key, self.record_key(dlq_id), self.expiry_key, self.requeue_key], args,
        )

    def decode_claim(self, dlq_id: str, reply: Any) -> _Claimed | ReplayResult:
        key = self.record_key(dlq_id)
        tag = _tag(reply, key)
        if tag == "ok":
            token = _text(reply[1], key, "token")
            record = self.record(
                dlq_id, _flat_to_dict(reply[3], key), _flat_to_dict(reply[4], key)
            )
            return _Claimed(token, record, taken_over=bool(int(reply[2])))
        if tag == "none":
            return ReplayResult(dlq_id, ReplayOutcome.NOT_FOUND)
        if tag == "expired":
            return ReplayResult(dlq_id, ReplayOutcome.EXPIRED)
        if tag == "unmarked":  # a requeue-index entry the record does not carry the mark of
            return ReplayResult(dlq_id, ReplayOutcome.NOT_FOUND,
                                error="not marked for redelivery (a stale requeue entry)")
        if tag == "final":
            return ReplayResult(
                dlq_id, ReplayOutcome.NOT_PENDING, status=self._status(reply[1], key)
            )
        if tag == "busy":
            return ReplayResult(
                dlq_id,
                ReplayOutcome.CLAIMED_ELSEWHERE,
                error=f"claimed by {_text(reply[1], key, 'owner')}",
                status=DlqStatus.PENDING,
            )
        raise _corrupt(reply, key)

    @staticmethod
    def _status(raw: Any, key: str) -> DlqStatus:
        text = _text(raw, key, "st")
        try:
            return DlqStatus(text)
        except ValueError as exc:
            raise CorruptData(key, f"unknown status {text!r}") from exc

    def finish(
        self, dlq_id: str, target: DlqStatus, token: str = "", by: str | None = None,
        merge_key: str | None = None,
    ) -> ScriptCall:
        """The finish call of a record; with ``merge_key``, only if it is that
        key's current record (else a ``"miss"`` reply names the current one,
        see :meth:`settle_miss`, or ``"none"`` when the key has none)."""
        if target is DlqStatus.PENDING:
            raise ValueError("a record can only be finished as replayed or abandoned")
        if by is not None and not isinstance(by, str):
            raise ConfigError("by", f"must be a string or None, got {type(by).__name__}")
        return ScriptCall(
            "dlq_finish",
            [
                self.expiry_key,
                self.pending_key,
                self.pending_by_op_key,
                self.counts_key,
                self.record_key(dlq_id),
                self.bykey_key,
                self.log_key,
                self.requeue_key,
            ],
            [dlq_id, target.value, token, _truncate(_clean(by or ""), _BY_BYTES), merge_key or ""],
        )

    def settle_miss(self, reply: Any) -> str | None:
        """The id a ``"miss"`` reply of :meth:`finish` names, else ``None``."""
        if _tag(reply, self.bykey_key) != "miss":
            return None
        return _text(reply[1], self.bykey_key, "dlq_id")

    def decode_finish(self, dlq_id: str, target: DlqStatus, reply: Any) -> bool:
        """``True`` when the record moved to ``target`` (logs the event)."""
        key = self.record_key(dlq_id)
        tag = _tag(reply, key)
        if tag == "ok":
            event = (
                "durability_dlq_replayed"
                if target is DlqStatus.REPLAYED
                else "durability_dlq_abandoned"
            )
            _log.info(event, dlq_id=dlq_id)
            return True
        if tag in ("none", "final", "lost", "miss"):
            return False
        if tag == "busy":  # (abandon) a running replay holds it: its outcome lands first
            _log.info("durability_dlq_abandon_refused_busy", dlq_id=dlq_id,
                      held_by=_text(reply[1], key, "owner"))
            return False
        raise _corrupt(reply, key)

    def defer(self, dlq_id: str, token: str, error: BaseException) -> ScriptCall:
        """Release the claim of a replay that did not run, counting nothing."""
        text = _truncate(error_text(error), self.config.max_error_bytes)
        return ScriptCall("dlq_fail", [self.record_key(dlq_id), self.log_key],
                          [token, text, dlq_id, "defer"])

    def fail(
        self, dlq_id: str, token: str, error: BaseException, *, payloadless: str = "",
        via: bytes = b"",
    ) -> ScriptCall:
        """Note a failed replay. ``payloadless``: the stream id of the record the
        replay claimed without its payload; if a parking filled it in since, the
        failure is stale and only the claim is released (reply ``filled``).
        ``via``: the requeue-index entry a requeue pass claimed it through (it
        goes with the record's mark, whatever stream id it names)."""
        text = _truncate(error_text(error), self.config.max_error_bytes)
        args: list[Any] = [token, text, dlq_id]
        if payloadless or via:
            args += ["np" if payloadless else "", payloadless]
        if via:
            args += ["", "", via]  # (ARGV[6], ARGV[7]: "config" mode's)
        return ScriptCall("dlq_fail", [self.record_key(dlq_id), self.log_key, self.requeue_key],
                          args)

    def config_failed(self, dlq_id: str, token: str, error: BaseException) -> ScriptCall:
        """Note a replay that could not run for want of config here: the claim
        released, nothing counted, the text kept apart (``last_replay_error``)."""
        text = _truncate(error_text(error), self.config.max_error_bytes)
        return ScriptCall("dlq_fail", [self.record_key(dlq_id), self.log_key],
                          [token, text, dlq_id, "config", "", self.owner,
                           int(CONFIG_ERROR_QUIET_SECONDS * 1000)])

    def replay_steps(
        self, dlq_id: str, handle: Handle, open_breakers: dict[str, None] | None = None,
        operation_type: str | None = None, stream_id: str = "", *, via: bytes = b"",
    ) -> _Plan[ReplayResult]:
        """Claim, run the handler, then finish (fenced) or report the failure.

        A handler refused before it could replay (``OperationInProgress``,
        ``CircuitOpen``) defers the record: claim released, nothing counted. With
        ``open_breakers`` (a pass's), a record whose dependency is in it is
        deferred without running, and a ``CircuitOpen`` adds its dependency.
        With ``operation_type`` (a filtered pass's), a record of another type
        (a payload-less record filled in since it was listed) is deferred too.
        """
        if not self.known_id(dlq_id):
            return ReplayResult(dlq_id, ReplayOutcome.NOT_FOUND)
        yield _POLL  # an interruption held back (a pass's last record) stops here
        claim = self.claim(dlq_id, secrets.token_hex(8), stream_id, requeued=bool(via))
        until = time.monotonic() + self.config.claim_ttl_seconds
        claimed = self.decode_claim(dlq_id, (yield from self._sent(claim, dlq_id, until))[0])
        if isinstance(claimed, ReplayResult):
            return claimed
        claimed = dataclasses.replace(claimed, until=until, via=via)
        record = claimed.record
        key = self.record_key(dlq_id)
        error = yield from self._handled(claimed, handle, open_breakers, operation_type)
        if error is FINISHED:
            return self._replayed(record, claimed)
        if isinstance(error, (OperationInProgress, CircuitOpen, _TypeChanged, ReplayDeclined)):
            if isinstance(error, CircuitOpen) and open_breakers is not None:
                open_breakers[error.dependency] = None
            reply, _ = yield from self._noted(self.defer(dlq_id, claimed.token, error), claimed)
            if _tag(reply, key) not in ("ok", "none", "final", "lost"):
                raise _corrupt(reply, key)
            _log.info(
                "durability_dlq_replay_deferred", dlq_id=dlq_id,
                operation_type=record.operation_type,
                reason=_TypeChanged.reason if isinstance(error, _TypeChanged)
                else type(error).__name__,
            )
            return ReplayResult(
                dlq_id, ReplayOutcome.DEFERRED, error=error_text(error),
                replay_attempts=record.replay_attempts, status=DlqStatus.PENDING,
            )
        if isinstance(error, (ConfigError, DependencyNotFound)):
            return (yield from self._replay_unconfigured(record, claimed, error))
        if isinstance(error, BaseException):
            return (yield from self._replay_failed(record, claimed, error))
        reply, unsure = yield from self._noted(
            self.finish(dlq_id, DlqStatus.REPLAYED, claimed.token, self.owner), claimed)
        tag = _tag(reply, key)
        # Replayed by another (the operation's later delivery settled it) when
        # nothing ran, or by an earlier try of this very note whose reply was lost.
        if tag == "ok" or ((error is ANSWERED or unsure) and tag == "final"
                           and _text(reply[1], key, "st") == DlqStatus.REPLAYED.value):
            return self._replayed(record, claimed)
        if tag not in ("none", "final", "lost"):
            raise _corrupt(reply, key)
        return self._lost(record)

    def _replay_unconfigured(
        self, record: DlqRecord, claimed: _Claimed, error: BaseException
    ) -> _Plan[ReplayResult]:
        """The replaying process lacks config the record needs (a durabilis
        ``ConfigError`` / ``DependencyNotFound``: the library's own text, shown
        in clear): the claim released, no attempt counted, ``last_error`` kept."""
        dlq_id, key = record.dlq_id, self.record_key(record.dlq_id)
        call = self.config_failed(dlq_id, claimed.token, error)
        reply, _ = yield from self._noted(call, claimed)
        tag = _tag(reply, key)
        if tag not in ("ok", "none", "final", "lost"):
            raise _corrupt(reply, key)
        _log.warning(
            "durability_dlq_replay_config_error", dlq_id=dlq_id,
            operation_type=record.operation_type, replayer=self.owner,
            error=str(call.args[1]),
        )
        return ReplayResult(
            dlq_id, ReplayOutcome.CONFIG_ERROR, error=str(call.args[1]),
            replay_attempts=record.replay_attempts, status=DlqStatus.PENDING,
        )

    def _replay_failed(
        self, record: DlqRecord, claimed: _Claimed, error: BaseException
    ) -> _Plan[ReplayResult]:
        """The handler raised: the record stays pending, one more attempt noted."""
        dlq_id, key = record.dlq_id, self.record_key(record.dlq_id)
        payloadless = (record.metadata or {}).get("payload_error") and record.stream_id
        call = self.fail(dlq_id, claimed.token, error, payloadless=payloadless or "",
                         via=claimed.via)
        reply, unsure = yield from self._noted(call, claimed)
        tag = _tag(reply, key)
        if tag == "filled":  # its payload was parked meanwhile: replayable now
            text = str(call.args[1]) + " (the payload was parked meanwhile: replay it again)"
            _log.warning("durability_dlq_replay_deferred", dlq_id=dlq_id,
                         operation_type=record.operation_type, reason="filled_in",
                         error=redact_error(text))
            return ReplayResult(
                dlq_id, ReplayOutcome.DEFERRED,
                error=text,
                replay_attempts=_codec.as_int(reply[1], key=key, field="ra"),
                status=DlqStatus.PENDING,
            )
        if tag == "ok" or (unsure and tag == "lost"):
            # ("lost" after a try whose reply was lost: that try may have
            # noted it and released the claim; the handler failed either way.)
            attempts = _codec.as_int(reply[1], key=key, field="ra") if tag == "ok" else None
            _log.warning(
                "durability_dlq_replay_failed",
                dlq_id=dlq_id,
                operation_type=record.operation_type,
                replay_attempts=attempts,
                error=redact_error(str(call.args[1])),
            )
            return ReplayResult(
                dlq_id,
                ReplayOutcome.FAILED,
                error=str(call.args[1]),
                replay_attempts=attempts,
                status=DlqStatus.PENDING,
            )
        if tag not in ("none", "final", "lost"):
            raise _corrupt(reply, key)
        return self._lost(record, error=error_text(error))

    def _handled(
        self, claimed: _Claimed, handle: Handle, open_breakers: dict[str, None] | None,
        operation_type: str | None,
    ) -> _Plan[BaseException | object | None]:
        """What the handler answered, or the refusal that kept it from running."""
        record = claimed.record
        dependency = (record.metadata or {}).get("dependency")
        if operation_type is not None and record.operation_type != operation_type:
            return _TypeChanged(operation_type, record.operation_type)
        if open_breakers is not None and dependency is not None and dependency in open_breakers:
            return CircuitOpen(dependency, 0.0)
        try:
            yield _POLL  # one held back during the claim: the handler does not start
            return (yield from handle(record, claimed.token))
        except INTERRUPTS as exc:
            yield from self._interrupted(record, claimed, exc)
            raise

    def _noted(self, call: ScriptCall, claimed: _Claimed) -> _Plan[tuple[Any, bool]]:
        """Send a note of the replay's outcome (see :meth:`_sent`): a note lost
        to a blip, or to a sweep that cancelled its step's task, would leave a
        handler that ran to run again once the claim expired."""
        return (yield from self._sent(call, claimed.record.dlq_id, claimed.until))

    def _sent(self, call: ScriptCall, dlq_id: str, until: float) -> _Plan[tuple[Any, bool]]:
        """Send a step of a replay (shielded) until it lands, with backoff, for
        ``_RESEND_SECONDS`` at most and while the claim lasts (``until``,
        monotonic: after it the step would be refused anyway). The claim and
        the notes can be sent again: a claim's nonce gets its own earlier try
        back, a note is fenced by the claim's token. Returns the reply and
        whether an earlier try may have landed."""
        unsure = False
        delay = _NOTE_BACKOFF[0]
        stop: float | None = None
        while True:
            try:
                return (yield IO([call], shield=True))[0], unsure
            except StorageUnavailable as exc:  # (a script's own error is not sent again)
                now = time.monotonic()
                stop = min(until, now + _RESEND_SECONDS) if stop is None else stop
                if now + delay >= stop:
                    raise
                unsure = True
                _log.warning("durability_dlq_step_retry", dlq_id=dlq_id, script=call.name,
                             error=f"{type(exc).__name__}: {exc}",
                             delay_seconds=round(delay, 3))
                yield Sleep(delay * (0.5 + random.random() / 2), shield=True)
                delay = min(delay * 2, _NOTE_BACKOFF[1])

    def _interrupted(
        self, record: DlqRecord, claimed: _Claimed, interruption: BaseException
    ) -> _Plan[None]:
        """A cancellation (``KeyboardInterrupt``, ``SystemExit``) while the
        handler ran: the claim is released, nothing counted (the handler did not
        finish: as a refusal, not a failure), so the record can be replayed at
        once instead of after ``claim_ttl_seconds``. If the release cannot be
        sent, the claim expires as after a crash."""
        key = self.record_key(record.dlq_id)
        released: bool | None = None  # unknown: its reply was lost
        try:
            # Shielded (a cancellation waits for it), sent once.
            call = self.defer(record.dlq_id, claimed.token, interruption)
            reply = (yield IO([call], shield=True))[0]
            released = _tag(reply, key) == "ok"
        except DurabilisError:
            pass
        _log.warning(
            "durability_dlq_replay_interrupted", dlq_id=record.dlq_id,
            operation_type=record.operation_type, interruption=type(interruption).__name__,
            claim_released=released,
        )

    def _replayed(self, record: DlqRecord, claimed: _Claimed) -> ReplayResult:
        _log.info(
            "durability_dlq_replayed",
            dlq_id=record.dlq_id,
            operation_type=record.operation_type,
            agent_id=record.agent_id,
            replayed_by=self.owner,
            replay_attempts=record.replay_attempts,
            claim_taken_over=claimed.taken_over,
        )
        return ReplayResult(
            record.dlq_id,
            ReplayOutcome.REPLAYED,
            replay_attempts=record.replay_attempts,
            status=DlqStatus.REPLAYED,
        )

    def _lost(self, record: DlqRecord, error: str | None = None) -> ReplayResult:
        # The claim expired and another replayer took the record over (or an
        # operator finished it): our handler's effect is not recorded here.
        _log.warning(
            "durability_dlq_replay_claim_lost",
            dlq_id=record.dlq_id,
            operation_type=record.operation_type,
            replayer=self.owner,
            claim_ttl_seconds=self.config.claim_ttl_seconds,
        )
        return ReplayResult(record.dlq_id, ReplayOutcome.CLAIM_LOST, error=error)

    def replay_pending_steps(
        self,
        operation_type: str | None,
        limit: int | None,
        max_per_second: float | None,
        handle: Handle,
        on_result: Callable[[ReplayResult], object] | None = None,
        *,
        requeued_only: bool = False,
    ) -> _Plan[ReplaySummary]:
        """Walk the pending index once, oldest first, replaying each record
        (``on_result`` is called with each record's result: progress). With
        ``requeued_only``, the requeue index instead: only the records marked
        for redelivery (:meth:`requeue`)."""
        if operation_type is not None:
            self.name("operation_type", operation_type)
        self._check_pass(limit, max_per_second)
        tally = _Tally()
        yield from self._pass_steps(operation_type, limit, handle, pacer=_Pacer(max_per_second),
                                    tally=tally, on_result=on_result, requeued=requeued_only)
        if tally.expired_ids:  # met expired records: they are reported now, not skipped
            yield from self.cleanup_steps()
        return tally.summary()

    def replay_requeued_steps(
        self,
        handles: Mapping[str, Handle],
        limit: int | None,
        max_per_second: float | None,
        on_result: Callable[[ReplayResult], object] | None = None,
    ) -> _Plan[ReplaySummary]:
        """One pass over the records marked for redelivery whose operation type
        has a handler in ``handles`` (operation type -> handle), oldest first
        per type; records of other types are not touched (a replica that has
        their handler replays them). ``limit`` and pacing span the pass."""
        if not isinstance(handles, Mapping):
            raise ConfigError("handlers", "must map operation types to handlers")
        for op in handles:
            self.name("operation_type", op)
        self._check_pass(limit, max_per_second)
        tally = _Tally()
        pacer = _Pacer(max_per_second)
        for op in sorted(handles):
            if limit is not None and tally.ran >= limit:
                break
            yield from self._pass_steps(op, limit, handles[op], pacer=pacer, tally=tally,
                                        on_result=on_result, requeued=True)
        if tally.expired_ids:
            yield from self.cleanup_steps()
        return tally.summary()

    def _check_pass(self, limit: int | None, max_per_second: float | None) -> None:
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 0
        ):
            raise ConfigError("limit", f"must be an integer >= 0 or None, got {limit!r}")
        if max_per_second is not None:
            _check_number("max_per_second", max_per_second)

    def _pass_steps(
        self,
        operation_type: str | None,
        limit: int | None,
        handle: Handle,
        *,
        pacer: _Pacer,
        tally: _Tally,
        on_result: Callable[[ReplayResult], object] | None,
        requeued: bool,
    ) -> _Plan[None]:
        after: bytes | None = None
        while limit is None or tally.ran < limit:
            if requeued:
                page = self.decode_requeued((yield self.requeue_range(operation_type, after)))
            else:
                page = self.decode_members(
                    operation_type, (yield self.pending_range(operation_type, after))
                )
            stale: list[_Member] = []
            # (a requeued record met with a config error here lately: left to the others)
            todo = [m for m in page if not self._backed_off(m.dlq_id)] if requeued else page
            for member in todo:
                if limit is not None and tally.ran >= limit:
                    break
                wait = pacer.wait(time.monotonic())
                if wait > 0:
                    yield Sleep(wait)
                started = time.monotonic()
                result = yield from self.replay_steps(member.dlq_id, handle, tally.open,
                                                      operation_type,
                                                      stream_id_of(member.sort_key),
                                                      via=member.raw if requeued else b"")
                if result.outcome is ReplayOutcome.EXPIRED:
                    _log.warning("durability_dlq_replay_expired", dlq_id=member.dlq_id,
                                 outcome=result.outcome.value)
                if requeued:
                    self._requeued_result(member, result, stale)
                if tally.add(result):
                    pacer.started(started)
                if on_result is not None:
                    on_result(result)
            if stale:  # marks of records gone or finished meanwhile (e.g. expired)
                yield self.prune(stale)
            if len(page) < _PAGE:
                break
            after = page[-1].raw

    def _requeued_result(
        self, member: _Member, result: ReplayResult, stale: list[_Member]
    ) -> None:
        """A requeue pass's bookkeeping: a mark of a record gone or finished is
        pruned; a record met with a config error is backed off here."""
        if result.outcome in (
            ReplayOutcome.NOT_FOUND, ReplayOutcome.EXPIRED, ReplayOutcome.NOT_PENDING
        ):
            stale.append(member)
        elif result.outcome is ReplayOutcome.CONFIG_ERROR:
            self._back_off(member.dlq_id)

    def _backed_off(self, dlq_id: str) -> bool:
        until = self._backoff.get(dlq_id)
        if until is None:
            return False
        if until > time.monotonic():
            return True
        del self._backoff[dlq_id]
        return False

    def _back_off(self, dlq_id: str) -> None:
        """Skip ``dlq_id`` in this replica's requeue passes for a while (bounded)."""
        now = time.monotonic()
        if len(self._backoff) >= _BACKOFF_MAX:
            self._backoff = {k: v for k, v in self._backoff.items() if v > now}
            while len(self._backoff) >= _BACKOFF_MAX:  # the soonest-ending go first
                del self._backoff[min(self._backoff, key=self._backoff.__getitem__)]
        self._backoff[dlq_id] = now + CONFIG_ERROR_QUIET_SECONDS

    # requeue (redelivery by the fleet) -----------------------------------------

    def requeue(self, dlq_ids: Sequence[str], by: str | None) -> ScriptCall:
        """Mark up to a batch of records for redelivery (``dlq_requeue`` "mark")."""
        if by is not None and not isinstance(by, str):
            raise ConfigError("by", f"must be a string or None, got {type(by).__name__}")
        return ScriptCall(
            "dlq_requeue",
            [self.requeue_key, self.log_key, *(self.record_key(i) for i in dlq_ids)],
            ["mark", _truncate(_clean(by or ""), _BY_BYTES), *dlq_ids],
        )

    def decode_requeue(self, dlq_ids: Sequence[str], reply: Any) -> list[RequeueResult]:
        key = self.requeue_key
        if _tag(reply, key) != "ok" or len(reply) != len(dlq_ids) + 1:
            raise _corrupt(reply, key)
        out = []
        for dlq_id, item in zip(dlq_ids, reply[1:], strict=True):
            tag = _tag(item, key)
            if tag == "ok":
                at = _codec.as_datetime(item[1], key=key, field="rq")
                out.append(RequeueResult(dlq_id, "requeued", at, None, DlqStatus.PENDING))
            elif tag == "already":
                at = _codec.as_datetime(item[1], key=key, field="rq")
                out.append(RequeueResult(dlq_id, "already", at, _text(item[2], key, "rqb")
                                         or None, DlqStatus.PENDING))
            elif tag == "final":
                out.append(RequeueResult(dlq_id, "final", status=self._status(item[1], key)))
            elif tag == "none":
                out.append(RequeueResult(dlq_id, "not_found"))
            else:
                raise _corrupt(item, key)
        return out

    def requeue_steps(self, dlq_ids: Sequence[str], by: str | None) -> _Plan[list[RequeueResult]]:
        """Mark records for redelivery, a bounded batch (one script) at a time;
        unknown and malformed ids are ``not_found`` without a call."""
        ids = list(dlq_ids)
        known = [i for i in ids if self.known_id(i)]
        found: dict[str, RequeueResult] = {}
        for start in range(0, len(known), _PAGE):
            batch = known[start:start + _PAGE]
            call = self.requeue(batch, by)
            for r in self.decode_requeue(batch, (yield call)):
                found[r.dlq_id] = r
                if r.outcome == "requeued":
                    _log.info("durability_dlq_requeued", dlq_id=r.dlq_id, by=by)
        return [found.get(i) or RequeueResult(i, "not_found") for i in ids]

    def requeue_range(self, operation_type: str | None, after: bytes | None) -> Command:
        """One page of the requeue index (``after``: a whole member, exclusive)."""
        key = self.requeue_key
        if operation_type is None:
            low = b"-" if after is None else b"(" + after
            high = b"+"
        else:
            prefix = operation_type.encode("utf-8") + b"\x00"
            low = b"[" + prefix if after is None else b"(" + after
            high = b"(" + operation_type.encode("utf-8") + b"\x01"
        return Command(("ZRANGEBYLEX", key, low, high, "LIMIT", 0, _PAGE), key)

    def decode_requeued(self, reply: Any) -> list[_Member]:
        """Requeue-index members (``raw`` is the whole member: the cursor)."""
        key = self.requeue_key
        out: list[_Member] = []
        for item in reply or ():
            raw = bytes(item) if isinstance(item, bytes) else str(item).encode()
            _, zero, rest = raw.partition(b"\x00")
            sk, sep, dlq_id = rest.partition(b"|")
            if not zero or not sep or not dlq_id:
                raise CorruptData(key, f"index member {raw!r} is not <op>\\0<sort key>|<dlq_id>")
            out.append(_Member(raw, _text(sk, key, "member"), _text(dlq_id, key, "member")))
        return out

    def prune(self, members: Sequence[_Member]) -> ScriptCall:
        """Drop requeue marks whose record is gone, finished or another."""
        return ScriptCall(
            "dlq_requeue",
            [self.requeue_key, self.log_key,
             *(self.record_key(m.dlq_id if self.known_id(m.dlq_id) else "_") for m in members)],
            ["prune", "", *(m.raw for m in members)],
        )

    def list_requeued_steps(
        self, operation_type: str | None, limit: int | None
    ) -> _Plan[list[DlqRecord]]:
        """The records marked for redelivery (pending), by type then age."""
        if operation_type is not None:
            self.name("operation_type", operation_type)
        self._limit(limit)
        out: list[DlqRecord] = []
        after: bytes | None = None
        while limit is None or len(out) < limit:
            page = self.decode_requeued((yield self.requeue_range(operation_type, after)))
            if not page:
                break
            ids = [m.dlq_id for m in page if self.known_id(m.dlq_id)]
            for record in self.decode_get(ids, (yield self.get(ids))) if ids else ():
                if (record is not None and record.status is DlqStatus.PENDING
                        and record.requeued_at is not None):
                    out.append(record)
                    if limit is not None and len(out) >= limit:
                        break
            if len(page) < _PAGE:
                break
            after = page[-1].raw
        return out

    # operators' bulk actions -----------------------------------------------------

    def purge(self, dlq_ids: Sequence[str], by: str | None, status: str | None) -> ScriptCall:
        """Remove up to a batch of records for good (``dlq_purge``)."""
        if by is not None and not isinstance(by, str):
            raise ConfigError("by", f"must be a string or None, got {type(by).__name__}")
        if status not in (None, "pending", "requeued", "replayed", "abandoned"):
            raise ConfigError("status", f"must be pending, requeued, replayed, abandoned or "
                              f"None, got {status!r}")
        return ScriptCall(
            "dlq_purge",
            [self.stream_key, self.expiry_key, self.pending_key, self.pending_by_op_key,
             self.counts_key, self.bykey_key, self.log_key, self.requeue_key,
             *(self.record_key(i) for i in dlq_ids)],
            [_truncate(_clean(by or ""), _BY_BYTES), status or "", *dlq_ids],
        )

    def purge_steps(
        self, dlq_ids: Sequence[str], by: str | None, status: str | None
    ) -> _Plan[dict[str, str]]:
        """Purge records a bounded batch (one script) at a time: dlq_id ->
        ``"purged"``, ``"not_found"``, ``"busy"`` (a replay holds it) or
        ``"other:<status>"`` (kept: not in ``status``)."""
        ids = list(dlq_ids)
        known = [i for i in ids if self.known_id(i)]
        self.purge([], by, status)  # checks the arguments before any I/O
        out: dict[str, str] = {i: "not_found" for i in ids}
        key = self.stream_key
        for start in range(0, len(known), _PAGE):
            batch = known[start:start + _PAGE]
            reply = yield self.purge(batch, by, status)
            if _tag(reply, key) != "ok" or len(reply) != len(batch) + 1:
                raise _corrupt(reply, key)
            for dlq_id, item in zip(batch, reply[1:], strict=True):
                tag = _tag(item, key)
                if tag == "ok":
                    out[dlq_id] = "purged"
                    _log.info("durability_dlq_purged", dlq_id=dlq_id, by=by)
                elif tag == "other":
                    out[dlq_id] = "other:" + _text(item[1], key, "status")
                elif tag in ("busy", "none"):
                    out[dlq_id] = "busy" if tag == "busy" else "not_found"
                else:
                    raise _corrupt(item, key)
        return out

    def abandon_steps(self, dlq_ids: Sequence[str], by: str | None) -> _Plan[dict[str, bool]]:
        """Abandon records, one ``dlq_finish`` script each (bounded work per
        call): dlq_id -> abandoned now (``False``: unknown, expired or final)."""
        ids = list(dlq_ids)
        self.finish("_", DlqStatus.ABANDONED, by=by)  # checks ``by`` before any I/O
        out = dict.fromkeys(ids, False)
        for dlq_id in ids:
            if self.known_id(dlq_id):
                call = self.finish(dlq_id, DlqStatus.ABANDONED, by=by)
                out[dlq_id] = self.decode_finish(dlq_id, DlqStatus.ABANDONED, (yield call))
        return out

    # listings --------------------------------------------------------------

    def _limit(self, limit: int | None) -> None:
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 0
        ):
            raise ConfigError("limit", f"must be an integer >= 0 or None, got {limit!r}")

    def list_pending_steps(
        self,
        operation_type: str | None,
        limit: int | None,
        after: str | DlqRecord | None,
    ) -> _Plan[list[DlqRecord]]:
        if operation_type is not None:
            self.name("operation_type", operation_type)
        self._limit(limit)
        bound = self.cursor(after)
        out: list[DlqRecord] = []
        while limit is None or len(out) < limit:
            page = self.decode_members(
                operation_type, (yield self.pending_range(operation_type, bound))
            )
            if not page:
                break
            ids = [m.dlq_id for m in page]
            for record in self.decode_get(ids, (yield self.get(ids))):
                # Expired (None) and just-finished records are not pending.
                if record is not None and record.status is DlqStatus.PENDING:
                    out.append(record)
                    if limit is not None and len(out) >= limit:
                        break
            if len(page) < _PAGE:
                break
            bound = page[-1].raw
        return out

    def list_all_steps(
        self,
        operation_type: str | None,
        limit: int | None,
        after: str | DlqRecord | None,
    ) -> _Plan[DlqListing]:
        if operation_type is not None:
            self.name("operation_type", operation_type)
        self._limit(limit)
        cursor = after.stream_id if isinstance(after, DlqRecord) else after
        if cursor is not None:
            sort_key(cursor)  # validates before any I/O
        out: list[DlqRecord] = []
        while limit is None or len(out) < limit:
            entries = self.decode_entries((yield self.stream_range(cursor)))
            if not entries:
                break
            wanted = [
                (sid, fields)
                for sid, fields in entries
                if operation_type is None
                or fields.get("operation_type") in (operation_type, operation_type.encode())
            ]
            ids = [
                _text(fields.get("dlq_id", b""), self.stream_key, "dlq_id") for _, fields in wanted
            ]
            if any(not self.known_id(i) for i in ids):
                raise CorruptData(self.stream_key, "an entry has no valid dlq_id field")
            if ids:
                reply = yield self.get(ids, with_stream=False)
                for record in self.decode_get(ids, reply, [f for _, f in wanted]):
                    if record is not None:
                        out.append(record)
                        if limit is not None and len(out) >= limit:
                            break
            if len(entries) < _PAGE:
                break
            cursor = entries[-1][0]
        stats = self.decode_stats((yield self.stats()))
        return DlqListing(out, stats.pending_for(operation_type))

    # stats -----------------------------------------------------------------

    def stats(self) -> ScriptCall:
        return ScriptCall(
            "dlq_stats",
            [self.expiry_key, self.pending_key, self.counts_key, self.stream_key],
            [self.config.stats_scan_limit],
        )

    def decode_stats(self, reply: Any) -> DlqStats:
        key = self.counts_key
        tag = _tag(reply, key)
        if tag != "ok":
            raise _corrupt(reply, key)
        now_ms = _codec.as_int(reply[1], key=key, field="now")
        table: dict[str, dict[DlqStatus, int]] = {}
        gone: dict[str, int] = {}  # pending records expired: reported, and awaiting it

        def add(flat: Any, sign: int) -> int:
            total = 0
            for field_name, n in _flat_to_dict(flat, key).items():
                status_text, sep, op = field_name.partition("|")
                if status_text == "expired" and sep and sign > 0:
                    gone[op] = gone.get(op, 0) + _codec.as_int(n, key=key, field=field_name)
                    continue
                if status_text == DlqStatus.PENDING.value and sign < 0:
                    gone[op] = gone.get(op, 0) + _codec.as_int(n, key=key, field=field_name)
                try:
                    status = DlqStatus(status_text)
                except ValueError as exc:
                    raise CorruptData(key, f"unknown count field {field_name!r}") from exc
                if not sep:
                    raise CorruptData(key, f"unknown count field {field_name!r}")
                value = _codec.as_int(n, key=key, field=field_name)
                row = table.setdefault(op, {s: 0 for s in DlqStatus})
                row[status] += sign * value
                total += value
            return total

        counted = add(reply[2], 1)
        backlog = add(reply[3], -1)
        # The expired records in all (ZCOUNT) and how many were read (bounded).
        expired = _codec.as_int(reply[5], key=key, field="expired") if len(reply) > 5 else backlog
        read = _codec.as_int(reply[6], key=key, field="read") if len(reply) > 6 else backlog
        expired = max(expired, backlog)
        exact = expired <= read
        # Not exact: the counts still hold expired records not read (upper bounds),
        # but the live total is exact (every record is counted once) and caps them.
        live = max(0, counted - expired)
        cap = math.inf if exact else live
        by_op = {
            op: {s: int(min(max(0, n), cap)) for s, n in row.items()}
            for op, row in sorted(table.items())
            if any(n > 0 for n in row.values())
        }
        by_status = {
            s: int(min(sum(row[s] for row in by_op.values()), cap)) for s in DlqStatus
        }
        oldest_raw = _text(reply[4], self.pending_key, "member")
        oldest_at: datetime | None = None
        age: float | None = None
        if oldest_raw:
            stamp = oldest_raw.partition("|")[0].split("-", 1)[0]
            ms = _codec.as_int(stamp, key=self.pending_key, field="member")
            oldest_at = _codec.as_datetime(ms, key=self.pending_key, field="member")
            age = max(0.0, (now_ms - ms) / 1000.0)
        pending = by_status[DlqStatus.PENDING]
        return DlqStats(
            total=sum(by_status.values()) if exact else live,
            by_status=by_status,
            by_operation_type=by_op,
            oldest_pending_at=oldest_at,
            oldest_pending_age_seconds=age,
            max_pending=self.config.max_pending,
            over_max_pending=pending > self.config.max_pending,
            expired_awaiting_cleanup=expired,
            exact=exact,
            expired=sum(gone.values()),
            expired_by_operation_type={op: n for op, n in sorted(gone.items()) if n > 0},
        )

    # cleanup ---------------------------------------------------------------

    def expired(self) -> ScriptCall:
        return ScriptCall("dlq_expired", [self.expiry_key], [self.config.cleanup_batch_size])

    def cleanup(self, members: Sequence[bytes]) -> ScriptCall:
        keys = [
            self.stream_key,
            self.expiry_key,
            self.pending_key,
            self.pending_by_op_key,
            self.counts_key,
            self.bykey_key,
            self.log_key,
            self.requeue_key,
        ]
        for member in members:
            parts = member.split(b"|", 2)
            dlq_id = parts[1].decode("utf-8", "replace") if len(parts) == 3 else ""
            # A malformed member gets a placeholder key the script never touches.
            keys.append(self.record_key(dlq_id if self.known_id(dlq_id) else "_"))
        keep_ms = self.ttl_ms(None)
        return ScriptCall("dlq_cleanup", keys, [keep_ms, *members])

    def cleanup_steps(self, max_batches: int | None = None) -> _Plan[int]:
        """Remove expired records, one bounded batch (one script) at a time (at
        most ``max_batches``); each pending one is reported as it goes."""
        removed, _ = yield from self.cleanup_report_steps(max_batches)
        return removed

    def cleanup_report_steps(
        self, max_batches: int | None = None
    ) -> _Plan[tuple[int, list[tuple[str, str, str]]]]:
        """:meth:`cleanup_steps`, also returning the pending records reported
        expired (dlq_id, operation type, idempotency key)."""
        total = 0
        reported: list[tuple[str, str, str]] = []
        batches = 0
        while max_batches is None or batches < max_batches:
            batches += 1
            reply = yield self.expired()
            if _tag(reply, self.expiry_key) != "ok":
                raise _corrupt(reply, self.expiry_key)
            members = [bytes(m) if not isinstance(m, str) else m.encode() for m in reply[1:]]
            if not members:
                break
            result = yield self.cleanup(members)
            if _tag(result, self.stream_key) != "ok":
                raise _corrupt(result, self.stream_key)
            removed = _codec.as_int(result[1], key=self.expiry_key, field="removed")
            if len(result) > 2:
                reported += self.report_expired(result[2], self.log_key)
            total += removed
            if len(members) < self.config.cleanup_batch_size or removed == 0:
                break
        if total:
            _log.info("durability_dlq_cleaned", removed=total, expired=len(reported))
        return total, reported

    def lease(self, every_seconds: float, holder: str | None) -> ScriptCall:
        """Take this period's cleanup lease (``layer_lease``; reply 1 when taken)."""
        _check_number("every_seconds", every_seconds)
        if every_seconds > _MAX_TTL_SECONDS:
            raise ConfigError("every_seconds", f"must be at most {_MAX_TTL_SECONDS}")
        if holder is not None and not isinstance(holder, str):
            raise ConfigError("holder", f"must be a string or None, got {type(holder).__name__}")
        ms = max(1, int(every_seconds * 1000))
        who = _truncate(_clean(holder or self.owner), _BY_BYTES)
        return ScriptCall("layer_lease", [self.lease_key], [who, ms])

    def cleanup_due_steps(
        self, every_seconds: float, holder: str | None
    ) -> _Plan[CleanupReport | None]:
        """The scheduled cleanup: ``None`` when another replica holds this
        period's lease, else what it removed and reported (bounded)."""
        call = self.lease(every_seconds, holder)
        if not int((yield call) or 0):
            return None
        removed, reported = yield from self.cleanup_report_steps(_CLEANUP_BATCHES)
        return CleanupReport(removed, tuple(dlq_id for dlq_id, _, _ in reported))


def _default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


# --- the twins: thin I/O shells -------------------------------------------------------


class DeadLetterQueue:
    """The dead-letter queue shared by every process using the store.

    Args:
        store: From :func:`durabilis.connect`.
        config: Settings; the seed's defaults when omitted.
        replayer_id: Who this instance is when it replays (claims and
            ``replayed_by``); ``host:pid:random`` when omitted.
    """

    def __init__(
        self,
        store: Store,
        config: DlqConfig | None = None,
        *,
        replayer_id: str | None = None,
    ) -> None:
        self.store = store
        self.config = config or DlqConfig()
        self.replayer_id = replayer_id or _default_owner()
        self._ops = _DlqOps(store.keys, self.config, self.replayer_id)

    def enqueue(  # noqa: PLR0917  (the seed's signature)
        self,
        agent_id: str,
        operation_type: str,
        original_operation: Any,
        retry_count: int,
        last_error: str | None,
        ttl_seconds: float | None = None,
        *,
        metadata: Mapping[str, str] | None = None,
        dlq_id: str | None = None,
    ) -> str:
        """Park a failed operation; it is never dropped to make room.

        Args:
            agent_id: Who ran it.
            operation_type: Its type (listing filter, stats).
            original_operation: The operation itself (JSON text in the stream
                when JSON-compatible, msgpack otherwise).
            retry_count: Attempts made.
            last_error: The error that exhausted them (truncated past
                ``max_error_bytes``).
            ttl_seconds: Lifetime; ``config.default_ttl_seconds`` when omitted.
            metadata: Extra readable text fields (e.g. the idempotency key),
                stored in the stream entry as ``meta:<name>``.
            dlq_id: Choose the id yourself to make the enqueue idempotent: while
                a record with this id lives, enqueue returns it unchanged.

        Returns:
            The ``dlq_id``.

        Raises:
            InvalidKey, InvalidPayload, PayloadTooLarge, InvalidTtl: Bad input
                (before any I/O). CorruptData: Foreign data at a DLQ key.
            StorageUnavailable: Redis down.
        """
        call = self._ops.enqueue(
            agent_id,
            operation_type,
            original_operation,
            retry_count,
            last_error,
            ttl_seconds,
            metadata=metadata,
            dlq_id=dlq_id,
        )
        return self._ops.decode_enqueue(call, self.store.run(call)).dlq_id

    def get(self, dlq_id: str) -> DlqRecord | None:
        """The live record with this id, or ``None`` (unknown, malformed or expired)."""
        if not self._ops.known_id(dlq_id):
            return None
        return self._ops.decode_get([dlq_id], self.store.run(self._ops.get([dlq_id])))[0]

    def list_pending(
        self,
        operation_type: str | None = None,
        *,
        limit: int | None = None,
        after: str | DlqRecord | None = None,
    ) -> list[DlqRecord]:
        """Pending records, oldest first.

        Args:
            operation_type: Only this type.
            limit: At most this many (all when ``None``).
            after: Continue after this record (or its ``stream_id``): pass the
                last record of the previous page.
        """
        return drive(self._ops.list_pending_steps(operation_type, limit, after), self.store)

    def list_all(
        self,
        operation_type: str | None = None,
        *,
        limit: int | None = None,
        after: str | DlqRecord | None = None,
    ) -> DlqListing:
        """Every live record in enqueue order, and how many are pending.

        Returns:
            ``(records, pending_count)``; ``pending_count`` counts every pending
            record (of ``operation_type`` when given), not only this page.
        """
        return drive(self._ops.list_all_steps(operation_type, limit, after), self.store)

    def pending_count(self, operation_type: str | None = None) -> int:
        """How many live records are pending (of ``operation_type`` when given)."""
        if operation_type is not None:
            self._ops.name("operation_type", operation_type)
        return self.stats().pending_for(operation_type)

    def stats(self) -> DlqStats:
        """Counts by status and operation type, oldest pending age, over-capacity flag."""
        return self._ops.decode_stats(self.store.run(self._ops.stats()))

    def mark_replayed(self, dlq_id: str, *, replayed_by: str | None = None) -> bool:
        """Mark a pending record replayed (by hand).

        Returns:
            ``True`` if it was pending; ``False`` for an unknown/expired id or a
            record already replayed or abandoned (nothing changes).

        Raises:
            ConfigError: ``replayed_by`` is not a string (nothing sent). Text is
                kept cleaned of lone surrogates, and cut at 256 bytes.
        """
        if not self._ops.known_id(dlq_id):
            return False
        call = self._ops.finish(dlq_id, DlqStatus.REPLAYED, by=replayed_by)
        return self._ops.decode_finish(dlq_id, DlqStatus.REPLAYED, self.store.run(call))

    def abandon(self, dlq_id: str, *, by: str | None = None) -> bool:
        """Give up on a pending record (final). Same returns as :meth:`mark_replayed`;
        a record a running replay holds (live claim) is not abandoned (``False``,
        as :meth:`purge` answers ``"busy"``): try again once that replay ends."""
        if not self._ops.known_id(dlq_id):
            return False
        call = self._ops.finish(dlq_id, DlqStatus.ABANDONED, by=by)
        return self._ops.decode_finish(dlq_id, DlqStatus.ABANDONED, self.store.run(call))

    def replay(self, dlq_id: str, handler: Callable[[DlqRecord], object]) -> ReplayResult:
        """Claim the record, run ``handler(record)``, and record the outcome.

        The claim is atomic: of any number of replicas replaying at once,
        exactly one runs the handler. On success the record becomes replayed
        (only if this replayer still holds the claim); if the handler raises,
        the record stays pending with ``replay_attempts`` + 1 and the error.
        An interruption (``KeyboardInterrupt``, ``SystemExit``; a cancellation
        in the async twin) while the handler runs releases the claim, counting
        nothing, and propagates; once the handler returned, its outcome is
        noted first. Another ``BaseException`` propagates and the claim
        expires after ``claim_ttl_seconds``, as when the process dies.
        """
        return drive(self._ops.replay_steps(dlq_id, handler_plan(handler)), self.store)

    def replay_pending(
        self,
        handler: Callable[[DlqRecord], object],
        operation_type: str | None = None,
        limit: int | None = None,
        max_per_second: float | None = None,
        *,
        requeued_only: bool = False,
    ) -> ReplaySummary:
        """Replay pending records oldest first, each as :meth:`replay` does.

        Args:
            handler: Called with each claimed :class:`DlqRecord`.
            operation_type: Only this type.
            limit: Run the handler at most this many times.
            max_per_second: Start at most this many handlers per second.
            requeued_only: Only the records marked for redelivery (:meth:`requeue`).
        """
        plan = self._ops.replay_pending_steps(
            operation_type, limit, max_per_second, handler_plan(handler),
            requeued_only=requeued_only,
        )
        return drive(plan, self.store)

    def cleanup_expired(self) -> int:
        """Remove expired records from every structure; returns how many.

        Each pending record among them (it expired unreplayed) is reported:
        event ``durability_dlq_expired``, an ``expired`` log entry, the count
        :attr:`DlqStats.expired`.
        """
        return drive(self._ops.cleanup_steps(), self.store)

    def cleanup_due(
        self, every_seconds: float, *, holder: str | None = None
    ) -> CleanupReport | None:
        """The scheduled cleanup, one replica per period: run it every
        ``every_seconds`` on every replica (``OrphanRecovery`` does).

        The first replica to ask in a period takes the lease
        ``<ns>:dlq:{dlq}:lease:cleanup`` (a Lua script; it expires with the
        period) and cleans up at most 20 batches of ``cleanup_batch_size``;
        the others skip. Each expired record is reported once, whoever cleans.

        Returns:
            The records removed and the ids of the pending ones among them
            (reported expired), or ``None`` when another replica has the lease.

        Raises:
            ConfigError: ``every_seconds`` is not a number > 0 (at most ten
                years) or ``holder`` not a string (nothing sent).
        """
        return drive(self._ops.cleanup_due_steps(every_seconds, holder), self.store)

    def requeue(self, dlq_ids: Sequence[str], *, by: str | None = None) -> list[RequeueResult]:
        """Mark pending records for redelivery by the fleet: no handler needed here.

        Each record gets a ``requeued`` mark (who, when), an entry in the
        requeue index ``<ns>:dlq:{dlq}:requeued`` and a ``requeued`` entry in
        the log stream (one Lua script per batch of 100). The replicas that
        have the handlers replay it (:meth:`replay_requeued`, or
        ``OrphanRecovery(requeue_handlers=...)``), one replica per record, as
        any replay. Marking twice changes nothing (``already``); replayed or
        abandoned records are refused (``final``).

        Returns:
            One :class:`RequeueResult` per id, in order.

        Raises:
            ConfigError: ``by`` is not a string (nothing sent).
            InvalidKey: An id that is not a string.
        """
        return drive(self._ops.requeue_steps(dlq_ids, by), self.store)

    def list_requeued(
        self, operation_type: str | None = None, *, limit: int | None = None
    ) -> list[DlqRecord]:
        """The pending records marked for redelivery, by operation type, oldest first."""
        return drive(self._ops.list_requeued_steps(operation_type, limit), self.store)

    def replay_requeued(
        self,
        handlers: Mapping[str, Callable[[DlqRecord], object]],
        limit: int | None = None,
        max_per_second: float | None = None,
    ) -> ReplaySummary:
        """Replay the records marked for redelivery whose operation type has a
        handler in ``handlers`` (operation type -> handler), each as
        :meth:`replay` does. A record whose replay fails loses its mark (it
        is replayed once per requeue); one deferred (breaker open, in
        progress) or met with a config error here keeps it."""
        plan = self._ops.replay_requeued_steps(
            {op: handler_plan(h) for op, h in handlers.items()}, limit, max_per_second
        )
        return drive(plan, self.store)

    def abandon_many(
        self, dlq_ids: Sequence[str], *, by: str | None = None
    ) -> dict[str, bool]:
        """:meth:`abandon` for each id (one script each): id -> abandoned now."""
        return drive(self._ops.abandon_steps(dlq_ids, by), self.store)

    def purge(
        self, dlq_ids: Sequence[str], *, by: str | None = None, status: str | None = None
    ) -> dict[str, str]:
        """Remove records for good (stream entry, hash, indexes, count), a
        ``purged`` log entry each, one Lua script per batch of 100.

        A record a replay holds (live claim) is kept (``"busy"``); with
        ``status`` (``pending``, ``requeued``, ``replayed``, ``abandoned``)
        a record in another status is kept (``"other:<status>"``).

        Returns:
            id -> ``"purged"``, ``"not_found"``, ``"busy"`` or ``"other:<status>"``.

        Raises:
            ConfigError: A bad ``by`` or ``status`` (nothing sent).
        """
        return drive(self._ops.purge_steps(dlq_ids, by, status), self.store)



class AsyncDeadLetterQueue:
    """The asyncio twin of :class:`DeadLetterQueue` (same methods, awaited).

    Replay handlers may be plain functions or coroutine functions.
    """

    def __init__(
        self,
        store: AsyncStore,
        config: DlqConfig | None = None,
        *,
        replayer_id: str | None = None,
    ) -> None:
        self.store = store
        self.config = config or DlqConfig()
        self.replayer_id = replayer_id or _default_owner()
        self._ops = _DlqOps(store.keys, self.config, self.replayer_id)

    async def enqueue(  # noqa: PLR0917  (the seed's signature)
        self,
        agent_id: str,
        operation_type: str,
        original_operation: Any,
        retry_count: int,
        last_error: str | None,
        ttl_seconds: float | None = None,
        *,
        metadata: Mapping[str, str] | None = None,
        dlq_id: str | None = None,
    ) -> str:
        """See :meth:`DeadLetterQueue.enqueue`."""
        call = self._ops.enqueue(
            agent_id,
            operation_type,
            original_operation,
            retry_count,
            last_error,
            ttl_seconds,
            metadata=metadata,
            dlq_id=dlq_id,
        )
        return self._ops.decode_enqueue(call, await self.store.run(call)).dlq_id

    async def get(self, dlq_id: str) -> DlqRecord | None:
        """See :meth:`DeadLetterQueue.get`."""
        if not self._ops.known_id(dlq_id):
            return None
        return self._ops.decode_get([dlq_id], await self.store.run(self._ops.get([dlq_id])))[0]

    async def list_pending(
        self,
        operation_type: str | None = None,
        *,
        limit: int | None = None,
        after: str | DlqRecord | None = None,
    ) -> list[DlqRecord]:
        """See :meth:`DeadLetterQueue.list_pending`."""
        plan = self._ops.list_pending_steps(operation_type, limit, after)
        return await adrive(plan, self.store)

    async def list_all(
        self,
        operation_type: str | None = None,
        *,
        limit: int | None = None,
        after: str | DlqRecord | None = None,
    ) -> DlqListing:
        """See :meth:`DeadLetterQueue.list_all`."""
        plan = self._ops.list_all_steps(operation_type, limit, after)
        return await adrive(plan, self.store)

    async def pending_count(self, operation_type: str | None = None) -> int:
        """See :meth:`DeadLetterQueue.pending_count`."""
        if operation_type is not None:
            self._ops.name("operation_type", operation_type)
        return (await self.stats()).pending_for(operation_type)

    async def stats(self) -> DlqStats:
        """See :meth:`DeadLetterQueue.stats`."""
        return self._ops.decode_stats(await self.store.run(self._ops.stats()))

    async def mark_replayed(self, dlq_id: str, *, replayed_by: str | None = None) -> bool:
        """See :meth:`DeadLetterQueue.mark_replayed`."""
        if not self._ops.known_id(dlq_id):
            return False
        call = self._ops.finish(dlq_id, DlqStatus.REPLAYED, by=replayed_by)
        return self._ops.decode_finish(dlq_id, DlqStatus.REPLAYED, await self.store.run(call))

    async def abandon(self, dlq_id: str, *, by: str | None = None) -> bool:
        """See :meth:`DeadLetterQueue.abandon`."""
        if not self._ops.known_id(dlq_id):
            return False
        call = self._ops.finish(dlq_id, DlqStatus.ABANDONED, by=by)
        return self._ops.decode_finish(dlq_id, DlqStatus.ABANDONED, await self.store.run(call))

    async def replay(
        self, dlq_id: str, handler: Callable[[DlqRecord], Awaitable[object] | object]
    ) -> ReplayResult:
        """See :meth:`DeadLetterQueue.replay`."""
        return await adrive(self._ops.replay_steps(dlq_id, handler_plan(handler)), self.store)

    async def replay_pending(
        self,
        handler: Callable[[DlqRecord], Awaitable[object] | object],
        operation_type: str | None = None,
        limit: int | None = None,
        max_per_second: float | None = None,
        *,
        requeued_only: bool = False,
    ) -> ReplaySummary:
        """See :meth:`DeadLetterQueue.replay_pending`."""
        plan = self._ops.replay_pending_steps(
            operation_type, limit, max_per_second, handler_plan(handler),
            requeued_only=requeued_only,
        )
        return await adrive(plan, self.store)

    async def cleanup_expired(self) -> int:
        """See :meth:`DeadLetterQueue.cleanup_expired`."""
        return await adrive(self._ops.cleanup_steps(), self.store)

    async def cleanup_due(
        self, every_seconds: float, *, holder: str | None = None
    ) -> CleanupReport | None:
        """See :meth:`DeadLetterQueue.cleanup_due`."""
        return await adrive(self._ops.cleanup_due_steps(every_seconds, holder), self.store)

    async def requeue(
        self, dlq_ids: Sequence[str], *, by: str | None = None
    ) -> list[RequeueResult]:
        """See :meth:`DeadLetterQueue.requeue`."""
        return await adrive(self._ops.requeue_steps(dlq_ids, by), self.store)

    async def list_requeued(
        self, operation_type: str | None = None, *, limit: int | None = None
    ) -> list[DlqRecord]:
        """See :meth:`DeadLetterQueue.list_requeued`."""
        return await adrive(self._ops.list_requeued_steps(operation_type, limit), self.store)

    async def replay_requeued(
        self,
        handlers: Mapping[str, Callable[[DlqRecord], Awaitable[object] | object]],
        limit: int | None = None,
        max_per_second: float | None = None,
    ) -> ReplaySummary:
        """See :meth:`DeadLetterQueue.replay_requeued`."""
        plan = self._ops.replay_requeued_steps(
            {op: handler_plan(h) for op, h in handlers.items()}, limit, max_per_second
        )
        return await adrive(plan, self.store)

    async def abandon_many(
        self, dlq_ids: Sequence[str], *, by: str | None = None
    ) -> dict[str, bool]:
        """See :meth:`DeadLetterQueue.abandon_many`."""
        return await adrive(self._ops.abandon_steps(dlq_ids, by), self.store)

    async def purge(
        self, dlq_ids: Sequence[str], *, by: str | None = None, status: str | None = None
    ) -> dict[str, str]:
        """See :meth:`DeadLetterQueue.purge`."""
        return await adrive(self._ops.purge_steps(dlq_ids, by, status), self.store)
