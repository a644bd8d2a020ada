"""The asyncio shell: :class:`AsyncDeadLetterQueue` (the same methods, awaited)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durabilis._steps import adrive
from durabilis._store import AsyncStore
from durabilis.core.dlq.plan import handler_plan
from durabilis.core.dlq.types import DlqStatus
from durabilis.dlq._shell import DlqShell

if TYPE_CHECKING:  # the annotations' types (the sync shell's list)
    from durabilis.core.dlq.types import (
        CleanupReport,
        DlqListing,
        DlqRecord,
        DlqScan,
        DlqStats,
        ReplayResult,
        ReplaySummary,
        RequeueResult,
    )


class AsyncDeadLetterQueue(DlqShell[AsyncStore]):
    """The asyncio twin of :class:`DeadLetterQueue` (same methods, awaited).

    Replay handlers may be plain functions or coroutine functions.
    """

    async def enqueue(  # noqa: PLR0917  (the seed's signature)
        self, agent_id: str, operation_type: str, original_operation: Any, retry_count: int,
        last_error: str | None, ttl_seconds: float | None = None, *,
        metadata: Mapping[str, str] | None = None, dlq_id: str | None = None,
    ) -> str:
        """See :meth:`DeadLetterQueue.enqueue`."""
        call = self._ops.enqueue(agent_id, operation_type, original_operation, retry_count,
                                 last_error, ttl_seconds, metadata=metadata, dlq_id=dlq_id)
        return (await adrive(self._ops.enqueue_plan(call), self.store)).dlq_id

    async def get(self, dlq_id: str) -> DlqRecord | None:
        """See :meth:`DeadLetterQueue.get`."""
        return await adrive(self._ops.get_steps(dlq_id), self.store)

    async def list_pending(
        self, operation_type: str | None = None, *, limit: int | None = None,
        after: str | DlqRecord | None = None,
    ) -> list[DlqRecord]:
        """See :meth:`DeadLetterQueue.list_pending`."""
        plan = self._ops.list_pending_steps(operation_type, limit, after)
        return await adrive(plan, self.store)

    async def list_all(
        self, operation_type: str | None = None, *, limit: int | None = None,
        after: str | DlqRecord | None = None,
    ) -> DlqListing:
        """See :meth:`DeadLetterQueue.list_all`."""
        plan = self._ops.list_all_steps(operation_type, limit, after)
        return await adrive(plan, self.store)

    async def scan(
        self, operation_type: str | None = None, *, pending: bool = True,
        limit: int | None = None, after: str | DlqRecord | None = None,
        max_examined: int | None = None,
    ) -> DlqScan:
        """See :meth:`DeadLetterQueue.scan`."""
        ops = self._ops
        plan = (ops.scan_pending_steps if pending else ops.scan_all_steps)(
            operation_type, limit, after, max_examined)
        return await adrive(plan, self.store)

    async def pending_count(self, operation_type: str | None = None) -> int:
        """See :meth:`DeadLetterQueue.pending_count`."""
        return await adrive(self._ops.pending_count_steps(operation_type), self.store)

    async def stats(self) -> DlqStats:
        """See :meth:`DeadLetterQueue.stats`."""
        return self._ops.decode_stats(await self.store.run(self._ops.stats()))

    async def mark_replayed(self, dlq_id: str, *, replayed_by: str | None = None) -> bool:
        """See :meth:`DeadLetterQueue.mark_replayed`."""
        plan = self._ops.finish_steps(dlq_id, DlqStatus.REPLAYED, replayed_by)
        return await adrive(plan, self.store)

    async def abandon(self, dlq_id: str, *, by: str | None = None,
                      expected: Mapping[str, tuple[str, int]] | None = None) -> bool:
        """See :meth:`DeadLetterQueue.abandon`."""
        plan = self._ops.finish_steps(dlq_id, DlqStatus.ABANDONED, by, expected)
        return await adrive(plan, self.store)

    async def replay(
        self, dlq_id: str, handler: Callable[[DlqRecord], Awaitable[object] | object]
    ) -> ReplayResult:
        """See :meth:`DeadLetterQueue.replay`."""
        return await adrive(self._ops.replay_steps(dlq_id, handler_plan(handler)), self.store)

    async def replay_pending(
        self, handler: Callable[[DlqRecord], Awaitable[object] | object],
        operation_type: str | None = None, limit: int | None = None,
        max_per_second: float | None = None, *, requeued_only: bool = False,
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
        self, dlq_ids: Sequence[str], *, by: str | None = None,
        expected: Mapping[str, tuple[str, int]] | None = None,
    ) -> list[RequeueResult]:
        """See :meth:`DeadLetterQueue.requeue`."""
        return await adrive(self._ops.requeue_steps(dlq_ids, by, expected), self.store)

    async def list_requeued(
        self, operation_type: str | None = None, *, limit: int | None = None
    ) -> list[DlqRecord]:
        """See :meth:`DeadLetterQueue.list_requeued`."""
        return await adrive(self._ops.list_requeued_steps(operation_type, limit), self.store)

    async def replay_requeued(
        self, handlers: Mapping[str, Callable[[DlqRecord], Awaitable[object] | object]],
        limit: int | None = None, max_per_second: float | None = None,
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
        self, dlq_ids: Sequence[str], *, by: str | None = None, status: str | None = None,
        expected: Mapping[str, tuple[str, int]] | None = None,
    ) -> dict[str, str]:
        """See :meth:`DeadLetterQueue.purge`."""
        return await adrive(self._ops.purge_steps(dlq_ids, by, status, expected), self.store)
