"""The sync shell: :class:`DeadLetterQueue` (each method builds, drives, decodes)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from durabilis._steps import drive
from durabilis._store import Store
from durabilis.core.dlq.plan import handler_plan
from durabilis.core.dlq.types import (
    CleanupReport,
    DlqListing,
    DlqRecord,
    DlqScan,
    DlqStats,
    DlqStatus,
    ReplayResult,
    ReplaySummary,
    RequeueResult,
)
from durabilis.dlq._shell import DlqShell


class DeadLetterQueue(DlqShell[Store]):
    """The dead-letter queue shared by every process using the store.

    Args:
        store: From :func:`durabilis.connect`.
        config: Settings; the seed's defaults when omitted.
        replayer_id: Who this instance is when it replays (claims and
            ``replayed_by``); ``host:pid:random`` when omitted.
    """

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
        call = self._ops.enqueue(agent_id, operation_type, original_operation, retry_count,
                                 last_error, ttl_seconds, metadata=metadata, dlq_id=dlq_id)
        return drive(self._ops.enqueue_plan(call), self.store).dlq_id

    def get(self, dlq_id: str) -> DlqRecord | None:
        """The live record with this id, or ``None`` (unknown, malformed or expired)."""
        return drive(self._ops.get_steps(dlq_id), self.store)

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

    def scan(
        self,
        operation_type: str | None = None,
        *,
        pending: bool = True,
        limit: int | None = None,
        after: str | DlqRecord | None = None,
        max_examined: int | None = None,
    ) -> DlqScan:
        """One bounded page of :meth:`list_pending` (``pending=True``) or of
        :meth:`list_all`'s records, in enqueue order, and where to go on from.

        Args:
            operation_type: Only this type.
            pending: Pending records (the pending index) or every live one (the stream).
            limit: At most this many records (``None``: no bound).
            after: Continue after this record or stream id (a previous
                page's ``next_after``).
            max_examined: Look at most at this many index or stream entries,
                expired records awaiting cleanup and other types' entries
                included (``None``: no bound), so one call's work is bounded
                however many dead entries lie in the way.

        Returns:
            The records, ``next_after`` (the stream id of the last entry looked
            at; ``None`` once the end was reached) and how many entries were
            looked at.
        """
        ops = self._ops
        plan = (ops.scan_pending_steps if pending else ops.scan_all_steps)(
            operation_type, limit, after, max_examined)
        return drive(plan, self.store)

    def pending_count(self, operation_type: str | None = None) -> int:
        """How many live records are pending (of ``operation_type`` when given)."""
        return drive(self._ops.pending_count_steps(operation_type), self.store)

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
        plan = self._ops.finish_steps(dlq_id, DlqStatus.REPLAYED, replayed_by)
        return drive(plan, self.store)

    def abandon(self, dlq_id: str, *, by: str | None = None,
                expected: Mapping[str, tuple[str, int]] | None = None) -> bool:
        """Give up on a pending record (final). Same returns as :meth:`mark_replayed`;
        a record a running replay holds (live claim) is not abandoned (``False``,
        as :meth:`purge` answers ``"busy"``): try again once that replay ends.
        With ``dlq_id`` in ``expected`` (dlq_id -> ``(stream_id, parkings)``, as
        :meth:`purge` takes it: the record the caller saw), a record parked again
        since under the same id, or into it, is not abandoned (``False``).

        Raises:
            ConfigError: ``by`` is not a string, a bad ``expected`` (nothing sent).
        """
        plan = self._ops.finish_steps(dlq_id, DlqStatus.ABANDONED, by, expected)
        return drive(plan, self.store)

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

    def requeue(
        self, dlq_ids: Sequence[str], *, by: str | None = None,
        expected: Mapping[str, tuple[str, int]] | None = None,
    ) -> list[RequeueResult]:
        """Mark pending records for redelivery by the fleet: no handler needed here.

        Each record gets a ``requeued`` mark (who, when), an entry in the
        requeue index ``<ns>:dlq:{dlq}:requeued`` and a ``requeued`` entry in
        the log stream (one Lua script per batch of 100). The replicas that
        have the handlers replay it (:meth:`replay_requeued`, or
        ``OrphanRecovery(requeue_handlers=...)``), one replica per record, as
        any replay. Marking twice changes nothing (``already``); replayed or
        abandoned records are refused (``final``).

        ``expected`` (dlq_id -> ``(stream_id, parkings)``, as a
        :class:`DlqRecord` read earlier shows them): such a record is marked
        only while it is still that one, checked in the same script; one
        parked again since, under the same id (purged or expired, then the
        operation failed again) or into it (a merge), is ``changed`` and
        left as it is. The web console's confirmations pass what they showed.

        Returns:
            One :class:`RequeueResult` per id, in order.

        Raises:
            ConfigError: ``by`` is not a string, a bad ``expected`` (nothing sent).
            InvalidKey: An id that is not a string.
        """
        return drive(self._ops.requeue_steps(dlq_ids, by, expected), self.store)

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
        self, dlq_ids: Sequence[str], *, by: str | None = None, status: str | None = None,
        expected: Mapping[str, tuple[str, int]] | None = None,
    ) -> dict[str, str]:
        """Remove records for good (stream entry, hash, indexes, count), a
        ``purged`` log entry each, one Lua script per batch of 100.

        A record a replay holds (live claim) is kept (``"busy"``); with
        ``status`` (``pending``, ``requeued``, ``replayed``, ``abandoned``)
        a record in another status is kept (``"other:<status>"``); with
        ``expected`` (dlq_id -> ``(stream_id, parkings)``, as :meth:`requeue`
        takes it) a record that is no longer that one is kept (``"changed"``).

        Returns:
            id -> ``"purged"``, ``"not_found"``, ``"busy"``, ``"other:<status>"``
            or ``"changed"``.

        Raises:
            ConfigError: A bad ``by``, ``status`` or ``expected`` (nothing sent).
        """
        return drive(self._ops.purge_steps(dlq_ids, by, status, expected), self.store)
