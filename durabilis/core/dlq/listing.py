"""The plans of listings, requeue, purge, abandon and cleanup (no I/O)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any

from durabilis import _codec
from durabilis.core.dlq.calls import DlqCalls
from durabilis.core.dlq.plan import Plan
from durabilis.core.dlq.records import (
    CLEANUP_BATCHES,
    PAGE,
    corrupt_error,
    field_text,
    reply_tag,
    sort_key,
    stream_id_of,
)
from durabilis.core.dlq.types import (
    CleanupReport,
    DlqListing,
    DlqRecord,
    DlqScan,
    DlqStatus,
    RequeueResult,
)
from durabilis.errors import (
    ConfigError,
    CorruptData,
)

_Rows = Generator[tuple[str, "DlqRecord | None"], None, None]
_Page = Plan[tuple[int, Iterable[tuple[str, "DlqRecord | None"]]]]
"""A scan's fetch: how many entries it read and, per entry, its stream id and record."""


class ListingPlans(DlqCalls):
    """The plans of the listings, requeue, purge, abandon and cleanup (no I/O)."""

    __slots__ = ()

    def requeue_steps(
        self, dlq_ids: Sequence[str], by: str | None,
        expected: Mapping[str, tuple[str, int]] | None = None,
    ) -> Plan[list[RequeueResult]]:
        """Mark records for redelivery, a bounded batch (one script) at a time;
        unknown and malformed ids are ``not_found`` without a call; a record
        that is not the one ``expected`` names is ``changed``."""
        ids = list(dlq_ids)
        # each id once: the script reads before it writes, so an id given twice
        # was counted twice (the pending count went below the truth)
        known = list(dict.fromkeys(i for i in ids if self.known_id(i)))
        self.requeue(known, by, expected)  # checks the arguments before any I/O
        found: dict[str, RequeueResult] = {}
        for start in range(0, len(known), PAGE):
            batch = known[start:start + PAGE]
            call = self.requeue(batch, by, expected)
            for r in self.decode_requeue(batch, (yield call), by):
                found[r.dlq_id] = r
                if r.outcome == "requeued":
                    self.log.info("durability_dlq_requeued", dlq_id=r.dlq_id, by=by)
        return [found.get(i) or RequeueResult(i, "not_found") for i in ids]

    def list_requeued_steps(
        self, operation_type: str | None, limit: int | None
    ) -> Plan[list[DlqRecord]]:
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
            if len(page) < PAGE:
                break
            after = page[-1].raw
        return out

    def purge_steps(
        self, dlq_ids: Sequence[str], by: str | None, status: str | None,
        expected: Mapping[str, tuple[str, int]] | None = None,
    ) -> Plan[dict[str, str]]:
        """Purge records a bounded batch (one script) at a time: dlq_id ->
        ``"purged"``, ``"not_found"``, ``"busy"`` (a replay holds it),
        ``"other:<status>"`` (kept: not in ``status``) or ``"changed"`` (kept:
        not the record ``expected`` names)."""
        ids = list(dlq_ids)
        known = list(dict.fromkeys(i for i in ids if self.known_id(i)))  # each once
        self.purge(known, by, status, expected)  # checks the arguments before any I/O
        out: dict[str, str] = {i: "not_found" for i in ids}
        key = self.stream_key
        for start in range(0, len(known), PAGE):
            batch = known[start:start + PAGE]
            reply = yield self.purge(batch, by, status, expected)
            if reply_tag(reply, key) != "ok" or len(reply) != len(batch) + 1:
                raise corrupt_error(reply, key)
            for dlq_id, item in zip(batch, reply[1:], strict=True):
                tag = reply_tag(item, key)
                if tag == "ok":
                    out[dlq_id] = "purged"
                    self.log.info("durability_dlq_purged", dlq_id=dlq_id, by=by)
                elif tag == "other":
                    out[dlq_id] = "other:" + field_text(item[1], key, "status")
                elif tag == "changed":
                    out[dlq_id] = "changed"
                elif tag in ("busy", "none"):
                    out[dlq_id] = "busy" if tag == "busy" else "not_found"
                else:
                    raise corrupt_error(item, key)
        return out

    def get_steps(self, dlq_id: str) -> Plan[DlqRecord | None]:
        """The live record with this id, or ``None`` (unknown, malformed or expired:
        nothing sent for an id no record can have)."""
        if not self.known_id(dlq_id):
            return None
        return self.decode_get([dlq_id], (yield self.get([dlq_id])))[0]

    def finish_steps(
        self, dlq_id: str, target: DlqStatus, by: str | None,
        expected: Mapping[str, tuple[str, int]] | None = None,
    ) -> Plan[bool]:
        """Finish one pending record as ``target`` (one ``dlq_finish``): ``True``
        when it moved; ``False`` for an id no record can have (nothing checked
        or sent) or a record not finished (see :meth:`decode_finish`)."""
        if not self.known_id(dlq_id):
            return False
        call = self.finish(dlq_id, target, by=by, expected=expected)
        return self.decode_finish(dlq_id, target, (yield call))

    def pending_count_steps(self, operation_type: str | None) -> Plan[int]:
        """How many live records are pending (of ``operation_type`` when given)."""
        if operation_type is not None:
            self.name("operation_type", operation_type)
        return self.decode_stats((yield self.stats())).pending_for(operation_type)

    def abandon_steps(self, dlq_ids: Sequence[str], by: str | None) -> Plan[dict[str, bool]]:
        """Abandon records, one ``dlq_finish`` script each (bounded work per
        call): dlq_id -> abandoned now (``False``: unknown, expired or final)."""
        ids = list(dlq_ids)
        self.finish("_", DlqStatus.ABANDONED, by=by)  # checks ``by`` before any I/O
        out = dict.fromkeys(ids, False)
        for dlq_id in out:  # each id once (a second finish answered "final": False)
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

    def _examined(self, max_examined: int | None) -> None:
        if max_examined is not None and (
            not isinstance(max_examined, int) or isinstance(max_examined, bool)
            or max_examined < 1
        ):
            raise ConfigError(
                "max_examined", f"must be an integer >= 1 or None, got {max_examined!r}")

    def list_pending_steps(
        self, operation_type: str | None, limit: int | None,
        after: str | DlqRecord | None, max_examined: int | None = None,
    ) -> Plan[list[DlqRecord]]:
        page = yield from self.scan_pending_steps(operation_type, limit, after, max_examined)
        return page.records

    def scan_pending_steps(
        self, operation_type: str | None, limit: int | None,
        after: str | DlqRecord | None, max_examined: int | None = None,
    ) -> Plan[DlqScan]:
        """Pending records in enqueue order after ``after``: at most ``limit``,
        looking at most at ``max_examined`` index entries (expired records
        awaiting cleanup included; ``None``: no bound)."""
        last = self._scan_start(operation_type, limit, max_examined, after)
        bound = self.cursor(after)
        key = self.pending_key if operation_type is None else self.pending_by_op_key

        def rows(page: list[Any], records: list[DlqRecord | None]) -> _Rows:
            for member, record in zip(page, records, strict=True):
                sid = stream_id_of(member.sort_key)
                if not sid:
                    raise CorruptData(key, f"index member {member.raw!r} has no stream id")
                # Expired (None) and just-finished records are not pending.
                yield sid, (
                    record if record is not None and record.status is DlqStatus.PENDING else None)

        def fetch(count: int) -> _Page:
            nonlocal bound
            page = self.decode_members(
                operation_type, (yield self.pending_range(operation_type, bound, count))
            )
            if not page:
                return 0, ()
            ids = [m.dlq_id for m in page]
            records = self.decode_get(ids, (yield self.get(ids)))
            bound = page[-1].raw
            return len(page), rows(page, records)

        return (yield from self._scan(limit, max_examined, last, fetch))

    def list_all_steps(
        self, operation_type: str | None, limit: int | None,
        after: str | DlqRecord | None, max_examined: int | None = None,
    ) -> Plan[DlqListing]:
        page = yield from self.scan_all_steps(operation_type, limit, after, max_examined)
        stats = self.decode_stats((yield self.stats()))
        return DlqListing(page.records, stats.pending_for(operation_type))

    def scan_all_steps(
        self, operation_type: str | None, limit: int | None,
        after: str | DlqRecord | None, max_examined: int | None = None,
    ) -> Plan[DlqScan]:
        """Live records (any status) in enqueue order after ``after``: at most
        ``limit``, looking at most at ``max_examined`` stream entries (other
        types' and expired ones included; ``None``: no bound)."""
        cursor = self._scan_start(operation_type, limit, max_examined, after)
        if cursor is not None:
            sort_key(cursor)  # validates before any I/O

        def fetch(count: int) -> _Page:
            nonlocal cursor
            entries = self.decode_entries((yield self.stream_range(cursor, count)))
            if not entries:
                return 0, ()
            wanted = [
                (sid, fields)
                for sid, fields in entries
                if operation_type is None
                or fields.get("operation_type") in (operation_type, operation_type.encode())
            ]
            ids = [
                field_text(fields.get("dlq_id", b""), self.stream_key, "dlq_id")
                for _, fields in wanted
            ]
            if any(not self.known_id(i) for i in ids):
                raise CorruptData(self.stream_key, "an entry has no valid dlq_id field")
            found: dict[str, DlqRecord | None] = {}
            if ids:
                reply = yield self.get(ids, with_stream=False)
                records = self.decode_get(ids, reply, [f for _, f in wanted])
                found = {sid: r for (sid, _), r in zip(wanted, records, strict=True)}
            cursor = entries[-1][0]
            return len(entries), [(sid, found.get(sid)) for sid, _ in entries]

        return (yield from self._scan(limit, max_examined, cursor, fetch))

    def _scan_start(
        self, operation_type: str | None, limit: int | None, max_examined: int | None,
        after: str | DlqRecord | None,
    ) -> str | None:
        """Checks a scan's arguments; returns the stream id it starts after."""
        if operation_type is not None:
            self.name("operation_type", operation_type)
        self._limit(limit)
        self._examined(max_examined)
        return after.stream_id if isinstance(after, DlqRecord) else after

    @staticmethod
    def _scan(
        limit: int | None,
        max_examined: int | None,
        last: str | None,
        fetch: Callable[[int], _Page],
    ) -> Plan[DlqScan]:
        """The paging both scans share: ``fetch(count)`` reads the next page of
        at most ``count`` entries and answers how many it read and, per entry in
        order, its stream id and the record it shows (``None``: not listed)."""
        out: list[DlqRecord] = []
        examined = 0
        while limit is None or len(out) < limit:
            count = PAGE if max_examined is None else min(PAGE, max_examined - examined)
            if count <= 0:
                return DlqScan(out, last, examined)
            read, rows = yield from fetch(count)
            if not read:
                break
            for sid, record in rows:
                examined += 1
                last = sid
                if record is not None:
                    out.append(record)
                    if limit is not None and len(out) >= limit:
                        return DlqScan(out, last, examined)
            if read < count:
                break
        return DlqScan(out, None if limit is None or len(out) < limit else last, examined)

    def cleanup_steps(self, max_batches: int | None = None) -> Plan[int]:
        """Remove expired records, one bounded batch (one script) at a time (at
        most ``max_batches``); each pending one is reported as it goes."""
        removed, _ = yield from self.cleanup_report_steps(max_batches)
        return removed

    def cleanup_report_steps(
        self, max_batches: int | None = None
    ) -> Plan[tuple[int, list[tuple[str, str, str]]]]:
        """:meth:`cleanup_steps`, also returning the pending records reported
        expired (dlq_id, operation type, idempotency key)."""
        total = 0
        reported: list[tuple[str, str, str]] = []
        batches = 0
        while max_batches is None or batches < max_batches:
            batches += 1
            reply = yield self.expired()
            if reply_tag(reply, self.expiry_key) != "ok":
                raise corrupt_error(reply, self.expiry_key)
            members = [bytes(m) if not isinstance(m, str) else m.encode() for m in reply[1:]]
            if not members:
                break
            result = yield self.cleanup(members)
            if reply_tag(result, self.stream_key) != "ok":
                raise corrupt_error(result, self.stream_key)
            removed = _codec.as_int(result[1], key=self.expiry_key, field="removed")
            if len(result) > 2:
                reported += self.report_expired(result[2], self.log_key)
            total += removed
            if len(members) < self.config.cleanup_batch_size or removed == 0:
                break
        if total:
            self.log.info("durability_dlq_cleaned", removed=total, expired=len(reported))
        return total, reported

    def cleanup_due_steps(
        self, every_seconds: float, holder: str | None
    ) -> Plan[CleanupReport | None]:
        """The scheduled cleanup: ``None`` when another replica holds this
        period's lease, else what it removed and reported (bounded)."""
        call = self.lease(every_seconds, holder)
        if not int((yield call) or 0):
            return None
        removed, reported = yield from self.cleanup_report_steps(CLEANUP_BATCHES)
        return CleanupReport(removed, tuple(dlq_id for dlq_id, _, _ in reported))
