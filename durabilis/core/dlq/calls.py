"""The DLQ's other script calls and commands, and the decoding of their replies (no I/O)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from durabilis import _codec
from durabilis._scripts import ScriptCall
from durabilis.core.dlq.enqueue import EnqueueOps
from durabilis.core.dlq.plan import CONFIG_ERROR_QUIET_SECONDS
from durabilis.core.dlq.records import (
    BY_BYTES,
    JSON_FIELD,
    META_PREFIX,
    MSGPACK_FIELD,
    PAGE,
    Claimed,
    Member,
    clean,
    corrupt_error,
    expected_args,
    field_text,
    flat_to_dict,
    reply_tag,
    sort_key,
    truncate,
)
from durabilis.core.dlq.types import (
    MAX_TTL_SECONDS,
    DlqRecord,
    DlqStats,
    DlqStatus,
    ReplayOutcome,
    ReplayResult,
    RequeueResult,
    check_number,
)
from durabilis.core.steps import Command
from durabilis.errors import (
    ConfigError,
    CorruptData,
)
from durabilis.events import error_text


class DlqCalls(EnqueueOps):
    """The DLQ's other script calls and commands, and the decoding of their replies
    (no I/O)."""

    __slots__ = ()

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
            tag = reply_tag(item, key)
            if tag == "none":
                out.append(None)
            elif tag == "ok":
                stream = entries[i] if entries is not None else flat_to_dict(item[2], key)
                out.append(self.record(dlq_id, flat_to_dict(item[1], key), stream))
            else:
                raise corrupt_error(item, key)
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
            return None if raw is None else field_text(raw, hkey, name)

        status_text = field_text(req(h, "st", hkey), hkey, "st")
        try:
            status = DlqStatus(status_text)
        except ValueError as exc:
            raise CorruptData(hkey, f"unknown status {status_text!r}") from exc
        stream_dlq_id = field_text(req(s, "dlq_id", skey), skey, "dlq_id")
        if stream_dlq_id != dlq_id:
            raise CorruptData(skey, f"entry of record {dlq_id} names record {stream_dlq_id}")
        if JSON_FIELD in s:
            raw_op = field_text(s[JSON_FIELD], skey, JSON_FIELD)
            try:
                operation = json.loads(raw_op)
            except ValueError as exc:
                raise CorruptData(skey, f"{JSON_FIELD} of {dlq_id} is not JSON") from exc
        elif MSGPACK_FIELD in s:
            operation = _codec.unpack(bytes(s[MSGPACK_FIELD]), key=skey)
        else:
            raise CorruptData(skey, f"entry of record {dlq_id} holds no original_operation")
        original_error = field_text(req(s, "last_error", skey), skey, "last_error")
        replay_error = opt_text("le")
        return DlqRecord(
            dlq_id=dlq_id,
            original_operation=operation,
            agent_id=field_text(req(s, "agent_id", skey), skey, "agent_id"),
            operation_type=field_text(req(s, "operation_type", skey), skey, "operation_type"),
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
                k[len(META_PREFIX) :]: field_text(v, skey, k)
                for k, v in s.items()
                if k.startswith(META_PREFIX)
            },
            stream_id=field_text(req(h, "sid", hkey), hkey, "sid"),
            original_error=original_error,
            parkings=_codec.as_int(h.get("pk", 1), key=hkey, field="pk"),
            last_parked_at=opt_ms("pat"),
            requeued_at=opt_ms("rq"),
            requeued_by=(opt_text("rqb") or None) if "rq" in h else None,
            last_replay_error=opt_text("lre"),
            last_replay_error_at=opt_ms("lrat"),
        )

    def pending_range(
        self, operation_type: str | None, after: bytes | None, count: int = PAGE
    ) -> Command:
        """One page (``count`` members) of the pending index (lex order = enqueue order).

        ``after`` is exclusive: a raw member, or ``sort_key(sid) + b"|\\xff"``.
        """
        if operation_type is None:
            low = b"-" if after is None else b"(" + after
            return Command(
                ("ZRANGEBYLEX", self.pending_key, low, b"+", "LIMIT", 0, count), self.pending_key
            )
        prefix = operation_type.encode("utf-8") + b"\x00"
        low = b"[" + prefix if after is None else b"(" + prefix + after
        high = b"(" + operation_type.encode("utf-8") + b"\x01"
        return Command(
            ("ZRANGEBYLEX", self.pending_by_op_key, low, high, "LIMIT", 0, count),
            self.pending_by_op_key,
        )

    def decode_members(self, operation_type: str | None, reply: Any) -> list[Member]:
        key = self.pending_key if operation_type is None else self.pending_by_op_key
        skip = 0 if operation_type is None else len(operation_type.encode("utf-8")) + 1
        out: list[Member] = []
        for item in reply or ():
            raw = bytes(item[skip:]) if isinstance(item, bytes) else str(item)[skip:].encode()
            sk, sep, dlq_id = raw.partition(b"|")
            if not sep or not dlq_id:
                raise CorruptData(key, f"index member {raw!r} is not <sort key>|<dlq_id>")
            out.append(
                Member(raw, field_text(sk, key, "member"), field_text(dlq_id, key, "member"))
            )
        return out

    def stream_range(self, after: str | None, count: int = PAGE) -> Command:
        low = "-" if after is None else "(" + after
        return Command(("XRANGE", self.stream_key, low, "+", "COUNT", count), self.stream_key)

    def decode_entries(self, reply: Any) -> list[tuple[str, dict[str, Any]]]:
        key = self.stream_key
        out = []
        for item in reply or ():
            try:
                sid, fields = item[0], item[1]
            except (TypeError, IndexError, KeyError) as exc:
                raise CorruptData(key, f"unexpected XRANGE item {item!r}") from exc
            out.append((field_text(sid, key, "id"), flat_to_dict(fields, key)))
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

    def decode_claim(self, dlq_id: str, reply: Any) -> Claimed | ReplayResult:
        key = self.record_key(dlq_id)
        tag = reply_tag(reply, key)
        if tag == "ok":
            token = field_text(reply[1], key, "token")
            record = self.record(
                dlq_id, flat_to_dict(reply[3], key), flat_to_dict(reply[4], key)
            )
            return Claimed(token, record, taken_over=bool(int(reply[2])))
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
                error=f"claimed by {field_text(reply[1], key, 'owner')}",
                status=DlqStatus.PENDING,
            )
        raise corrupt_error(reply, key)

    @staticmethod
    def _status(raw: Any, key: str) -> DlqStatus:
        text = field_text(raw, key, "st")
        try:
            return DlqStatus(text)
        except ValueError as exc:
            raise CorruptData(key, f"unknown status {text!r}") from exc

    def finish(
        self, dlq_id: str, target: DlqStatus, token: str = "", by: str | None = None,
        merge_key: str | None = None, *,
        expected: Mapping[str, tuple[str, int]] | None = None,
    ) -> ScriptCall:
        """The finish call of a record; with ``merge_key``, only if it is that
        key's current record (else a ``"miss"`` reply names the current one,
        see :meth:`settle_miss`, or ``"none"`` when the key has none); with
        ``dlq_id`` in ``expected`` (``(stream id, parkings)``), only while it
        is that record (else ``"changed"``).

        Raises:
            ConfigError: A bad ``by`` or ``expected``.
        """
        if target is DlqStatus.PENDING:
            raise ValueError("a record can only be finished as replayed or abandoned")
        if by is not None and not isinstance(by, str):
            raise ConfigError("by", f"must be a string or None, got {type(by).__name__}")
        seen = expected_args([dlq_id], expected)[0].split(" ", 1)[1:]  # checks it
        return ScriptCall(
            "dlq_finish",
            [*self.status_keys(dlq_id), self.log_key, self.requeue_key],
            [dlq_id, target.value, token, truncate(clean(by or ""), BY_BYTES), merge_key or "",
             *seen],
        )

    def settle_miss(self, reply: Any) -> str | None:
        """The id a ``"miss"`` reply of :meth:`finish` names, else ``None``."""
        if reply_tag(reply, self.bykey_key) != "miss":
            return None
        return field_text(reply[1], self.bykey_key, "dlq_id")

    def decode_finish(self, dlq_id: str, target: DlqStatus, reply: Any) -> bool:
        """``True`` when the record moved to ``target`` (logs the event)."""
        key = self.record_key(dlq_id)
        tag = reply_tag(reply, key)
        if tag == "ok":
            event = (
                "durability_dlq_replayed"
                if target is DlqStatus.REPLAYED
                else "durability_dlq_abandoned"
            )
            self.log.info(event, dlq_id=dlq_id)
            return True
        if tag in ("none", "final", "lost", "miss"):
            return False
        if tag == "changed":  # not the record the caller saw (its expectation)
            self.log.info("durability_dlq_abandon_refused_changed", dlq_id=dlq_id)
            return False
        if tag == "busy":  # (abandon) a running replay holds it: its outcome lands first
            self.log.info("durability_dlq_abandon_refused_busy", dlq_id=dlq_id,
                      held_by=field_text(reply[1], key, "owner"))
            return False
        raise corrupt_error(reply, key)

    def defer(self, dlq_id: str, token: str, error: BaseException) -> ScriptCall:
        """Release the claim of a replay that did not run, counting nothing."""
        text = truncate(error_text(error), self.config.max_error_bytes)
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
        text = truncate(error_text(error), self.config.max_error_bytes)
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
        text = truncate(error_text(error), self.config.max_error_bytes)
        return ScriptCall("dlq_fail", [self.record_key(dlq_id), self.log_key],
                          [token, text, dlq_id, "config", "", self.owner,
                           int(CONFIG_ERROR_QUIET_SECONDS * 1000)])

    # requeue (redelivery by the fleet) -----------------------------------------

    def requeue(self, dlq_ids: Sequence[str], by: str | None,
                expected: Mapping[str, tuple[str, int]] | None = None) -> ScriptCall:
        """Mark up to a batch of records for redelivery (``dlq_requeue`` "mark");
        ``expected``: dlq_id -> (stream id, parkings) of the record to mark."""
        if by is not None and not isinstance(by, str):
            raise ConfigError("by", f"must be a string or None, got {type(by).__name__}")
        return ScriptCall(
            "dlq_requeue",
            [self.requeue_key, self.log_key, *(self.record_key(i) for i in dlq_ids)],
            ["mark", truncate(clean(by or ""), BY_BYTES), *expected_args(dlq_ids, expected)],
        )

    def decode_requeue(
        self, dlq_ids: Sequence[str], reply: Any, by: str | None = None,
    ) -> list[RequeueResult]:
        """The replies of :meth:`requeue` (``by``: who marked, as given to it)."""
        key = self.requeue_key
        marker = truncate(clean(by), BY_BYTES) or None if by else None
        if reply_tag(reply, key) != "ok" or len(reply) != len(dlq_ids) + 1:
            raise corrupt_error(reply, key)
        out = []
        for dlq_id, item in zip(dlq_ids, reply[1:], strict=True):
            tag = reply_tag(item, key)
            if tag == "ok":
                at = _codec.as_datetime(item[1], key=key, field="rq")
                out.append(RequeueResult(dlq_id, "requeued", at, marker, DlqStatus.PENDING))
            elif tag == "already":
                at = _codec.as_datetime(item[1], key=key, field="rq")
                out.append(RequeueResult(dlq_id, "already", at, field_text(item[2], key, "rqb")
                                         or None, DlqStatus.PENDING))
            elif tag == "final":
                out.append(RequeueResult(dlq_id, "final", status=self._status(item[1], key)))
            elif tag == "none":
                out.append(RequeueResult(dlq_id, "not_found"))
            elif tag == "changed":
                out.append(RequeueResult(dlq_id, "changed"))
            else:
                raise corrupt_error(item, key)
        return out

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
        return Command(("ZRANGEBYLEX", key, low, high, "LIMIT", 0, PAGE), key)

    def decode_requeued(self, reply: Any) -> list[Member]:
        """Requeue-index members (``raw`` is the whole member: the cursor)."""
        key = self.requeue_key
        out: list[Member] = []
        for item in reply or ():
            raw = bytes(item) if isinstance(item, bytes) else str(item).encode()
            _, zero, rest = raw.partition(b"\x00")
            sk, sep, dlq_id = rest.partition(b"|")
            if not zero or not sep or not dlq_id:
                raise CorruptData(key, f"index member {raw!r} is not <op>\\0<sort key>|<dlq_id>")
            out.append(
                Member(raw, field_text(sk, key, "member"), field_text(dlq_id, key, "member"))
            )
        return out

    def prune(self, members: Sequence[Member]) -> ScriptCall:
        """Drop requeue marks whose record is gone, finished or another."""
        return ScriptCall(
            "dlq_requeue",
            [self.requeue_key, self.log_key,
             *(self.record_key(m.dlq_id if self.known_id(m.dlq_id) else "_") for m in members)],
            ["prune", "", *(m.raw for m in members)],
        )

    # operators' bulk actions -----------------------------------------------------

    def purge(self, dlq_ids: Sequence[str], by: str | None, status: str | None,
              expected: Mapping[str, tuple[str, int]] | None = None) -> ScriptCall:
        """Remove up to a batch of records for good (``dlq_purge``); ``expected``:
        dlq_id -> (stream id, parkings) of the record to remove."""
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
            [truncate(clean(by or ""), BY_BYTES), status or "",
             *expected_args(dlq_ids, expected)],
        )

    # stats -----------------------------------------------------------------

    def stats(self) -> ScriptCall:
        return ScriptCall(
            "dlq_stats",
            [self.expiry_key, self.pending_key, self.counts_key, self.stream_key],
            [self.config.stats_scan_limit],
        )

    def decode_stats(self, reply: Any) -> DlqStats:
        key = self.counts_key
        tag = reply_tag(reply, key)
        if tag != "ok":
            raise corrupt_error(reply, key)
        now_ms = _codec.as_int(reply[1], key=key, field="now")
        table: dict[str, dict[DlqStatus, int]] = {}
        gone: dict[str, int] = {}  # pending records expired: reported, and awaiting it

        def add(flat: Any, sign: int) -> int:
            total = 0
            for field_name, n in flat_to_dict(flat, key).items():
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
        oldest_raw = field_text(reply[4], self.pending_key, "member")
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

    def lease(self, every_seconds: float, holder: str | None) -> ScriptCall:
        """Take this period's cleanup lease (``layer_lease``; reply 1 when taken)."""
        check_number("every_seconds", every_seconds)
        if every_seconds > MAX_TTL_SECONDS:
            raise ConfigError("every_seconds", f"must be at most {MAX_TTL_SECONDS}")
        if holder is not None and not isinstance(holder, str):
            raise ConfigError("holder", f"must be a string or None, got {type(holder).__name__}")
        ms = max(1, int(every_seconds * 1000))
        who = truncate(clean(holder or self.owner), BY_BYTES)
        return ScriptCall("layer_lease", [self.lease_key], [who, ms])
