"""The asyncio layer: the sync layer's twin (:mod:`durabilis.layer._api`), the
plans driven by ``await adrive``, its keep-alive a task on the store's loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from durabilis._fork import reset_in_child
from durabilis._steps import adrive
from durabilis._store import AsyncStore
from durabilis.breaker import AsyncCircuitBreakerRegistry
from durabilis.checkpoint import AsyncCheckpointManager
from durabilis.dlq import AsyncDeadLetterQueue, ReplayResult, ReplaySummary
from durabilis.errors import DurabilisError, LayerClosed
from durabilis.idempotency import AsyncIdempotencyGuard, IdempotencyKey
from durabilis.layer._config import DurabilityConfig, LayerStats, OperationContext
from durabilis.layer._shell import (
    _CallPayload,
    _counts_not_sent,
    _keep_alive_ends,
    _LayerShell,
    _Ticks,
)
from durabilis.retry import AsyncRetryEngine

T = TypeVar("T")


class AsyncDurabilityLayer(_LayerShell[AsyncStore]):
    """The asyncio twin of :class:`DurabilityLayer` (same methods, awaited).

    ``fn`` may be an ``async def`` function (awaited on the event loop) or a
    plain function: a plain function runs in a worker thread
    (``asyncio.to_thread``), never on the loop, whose keep-alive must go on
    renewing the claim's lease while ``fn`` runs.
    """

    idempotency: AsyncIdempotencyGuard
    retry: AsyncRetryEngine
    breakers: AsyncCircuitBreakerRegistry
    checkpoints: AsyncCheckpointManager
    dlq: AsyncDeadLetterQueue
    _PILLARS = (
        AsyncIdempotencyGuard, AsyncRetryEngine, AsyncCircuitBreakerRegistry,
        AsyncCheckpointManager, AsyncDeadLetterQueue,
    )

    def __init__(self, store: AsyncStore, config: DurabilityConfig | None = None, *,
                 replica_id: str | None = None) -> None:
        super().__init__(store, config, replica_id)
        self._renewer: asyncio.Task[None] | None = None  # on the store's loop, the only one
        reset_in_child(self)

    async def __aenter__(self) -> AsyncDurabilityLayer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """:meth:`close` (the store stays open: ``async with durabilis.connect_async()``)."""
        await self.close()

    def after_fork_in_child(self) -> None:
        """The parent's keep-alive task is the parent loop's (see
        :meth:`DurabilityLayer.after_fork_in_child`)."""
        self._renewer = None

    def _ensure_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())
            self._renewer.add_done_callback(self._renewer_ended)

    def _renewer_ended(self, task: asyncio.Task[None]) -> None:
        # A keep-alive cancelled before its first step ran none of its code (a
        # sweep of every task in the loop turn after a claim was held): the
        # claims held still need one. (Stopped by close(), it is not ours.)
        if task is self._renewer and task.cancelled() and self._leases.busy():
            self._ensure_renewer()

    async def _renew_loop(self) -> None:
        ticks = _Ticks(self.config.renew_interval)
        swept = False  # cancelled by someone else than _stop_renewer
        while True:
            try:
                await asyncio.sleep(ticks.pause())
                if ticks.renew_due():
                    if self._leases.busy():
                        await self._renew_once()
                    ticks.renewed()
                last = (self._closed or swept) and not self._leases.busy()  # all of it goes
                try:  # idle too: what waits in the process still goes (after the leases)
                    await adrive(self._core.flush_plan(due_only=not last), self.store)
                except DurabilisError as exc:
                    _counts_not_sent(exc)
                if _keep_alive_ends(self._leases, self._core, last):
                    break
            except asyncio.CancelledError:
                if asyncio.current_task() is not self._renewer:
                    raise  # stopped (close): it ends as asked
                if not self._leases.busy():
                    # Swept with nothing held: the loop is shutting down (asyncio.run's
                    # end, a layer left unclosed). What waits goes now, or never.
                    await self._flush_swept()
                    raise
                # Cancelled by a sweep of every task (a shutdown) while claims are
                # held: their operations' fn still run (a plain fn in its thread) or
                # their outcomes wait to be sent, so their leases must still be
                # renewed. It goes on until nothing is held, then ends cancelled.
                swept = True
                _uncancel()
        if swept:
            raise asyncio.CancelledError

    async def _flush_swept(self) -> None:
        """The last flush of a keep-alive cancelled by a shutdown's sweep (best effort)."""
        if not self._core.waiting():
            return
        _uncancel()  # (a sweep cancels once: the flush's own waits must not misread it)
        try:
            await adrive(self._core.flush_plan(), self.store)
        except (DurabilisError, asyncio.CancelledError) as exc:
            _counts_not_sent(exc)

    async def _renew_once(self) -> None:
        await adrive(self._core.keep_alive_plan(self._leases), self.store)

    def _open(self) -> None:
        if self._closed:
            raise LayerClosed("this AsyncDurabilityLayer was closed; it accepts no new operation")
        self._on_home_loop()

    def _on_home_loop(self) -> None:
        # Before any hold or flush: a refused loop gets no keep-alive, which
        # would take (and fail to send) what the store's own loop has waiting.
        # So the layer's keep-alive only ever runs on the store's loop.
        self.store.check_loop()

    async def execute(  # (the twin's signature, compact: DurabilityLayer.execute documents it)
        self, agent_id: str, operation_type: str, payload: Any,
        fn: Callable[[OperationContext], Awaitable[T] | T], *, dependency: str | None = None,
        idempotency_key: IdempotencyKey | str | None = None, task_id: str | None = None,
        phase: str | None = None, wait: float | None = None, park_on_open: bool = False,
        deadline_seconds: float | None = None,
    ) -> T:
        """See :meth:`DurabilityLayer.execute`.

        A cancellation (``wait_for``, ``TaskGroup``) before ``fn`` returned
        releases the claim and the probe slot (shielded) and re-raises
        ``CancelledError``; once ``fn`` had started, the next delivery runs
        with ``ctx.recovered`` (its effect may have happened). Once ``fn``
        returned, its outcome is recorded (shielded) before
        ``CancelledError`` is raised.
        """
        plan = self._operation_plan(agent_id, operation_type, payload, fn,
                                    dependency=dependency, idempotency_key=idempotency_key,
                                    task_id=task_id, phase=phase, wait=wait,
                                    park_on_open=park_on_open, deadline_seconds=deadline_seconds)
        result: T = await adrive(plan, self.store, leases=self._leases)
        return result

    def durable(
        self, operation_type: str, *, agent_id: str = "default", dependency: str | None = None,
        key: Callable[..., str] | None = None, wait: float | None = None,
    ) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
        """See :meth:`DurabilityLayer.durable` (decorates ``async def`` functions)."""

        def decorate(func: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
            payload_of = _CallPayload(func)  # the signature, read once

            @functools.wraps(func)
            async def wrapper(*args: Any, **kwargs: Any) -> T:
                async def call(_ctx: OperationContext) -> T:
                    return await func(*args, **kwargs)

                own_key = None if key is None else key(*args, **kwargs)
                return await self.execute(agent_id, operation_type, payload_of(args, kwargs),
                                          call, dependency=dependency,
                                          idempotency_key=own_key, wait=wait)

            return wrapper

        return decorate

    async def recover_orphans(self, limit: int = 1000) -> list[str]:
        """See :meth:`DurabilityLayer.recover_orphans`."""
        self._on_home_loop()
        return await adrive(self._core.recover_plan(limit), self.store)

    async def replay(
        self, dlq_id: str, fn: Callable[[OperationContext], Any], *, wait: float | None = None
    ) -> ReplayResult:
        """See :meth:`DurabilityLayer.replay`."""
        self._on_home_loop()
        return await adrive(self._replay_plan(dlq_id, fn, wait), self.store, leases=self._leases)

    async def replay_pending(
        self, fn: Callable[[OperationContext], Any], operation_type: str | None = None,
        limit: int | None = None, max_per_second: float | None = None, *,
        wait: float | None = None, on_result: Callable[[ReplayResult], object] | None = None,
        requeued_only: bool = False,
    ) -> ReplaySummary:
        """See :meth:`DurabilityLayer.replay_pending`."""
        self._on_home_loop()
        plan = self._replay_pending_plan(
            fn, operation_type, limit, max_per_second,
            wait=wait, on_result=on_result, requeued_only=requeued_only,
        )
        return await adrive(plan, self.store, leases=self._leases)

    async def replay_requeued(
        self, handlers: Mapping[str, Callable[[OperationContext], Any]],
        limit: int | None = None, max_per_second: float | None = None, *,
        wait: float | None = None, on_result: Callable[[ReplayResult], object] | None = None,
    ) -> ReplaySummary:
        """See :meth:`DurabilityLayer.replay_requeued`."""
        self._on_home_loop()
        plan = self._replay_requeued_plan(handlers, limit, max_per_second, wait, on_result)
        return await adrive(plan, self.store, leases=self._leases)

    async def stats(self) -> LayerStats:
        """See :meth:`DurabilityLayer.stats`."""
        self._on_home_loop()
        return await adrive(self._stats_plan(), self.store)

    async def close(self) -> None:
        """See :meth:`DurabilityLayer.close`."""
        self._on_home_loop()
        self._closed = True
        try:
            await adrive(self._core.flush_plan(), self.store)
        except DurabilisError as exc:
            _counts_not_sent(exc)
        # Nothing left to renew: this loop's keep-alive stops now rather than at
        # its next tick (a loop closed meanwhile would destroy it pending).
        if self._renewer is not None and not self._leases.busy():
            await self._stop_renewer()
            try:  # what a flush of the keep-alive cancelled midway left
                await adrive(self._core.flush_plan(), self.store)
            except DurabilisError as exc:
                _counts_not_sent(exc)
            # A failed flush starts the keep-alive again for the removals it
            # leaves waiting (_unsent); closed and idle, that one stops too.
            if self._renewer is not None and not self._leases.busy():
                await self._stop_renewer()

    async def _stop_renewer(self) -> None:
        task, self._renewer = self._renewer, None
        assert task is not None
        task.cancel()
        await asyncio.wait([task])  # its end, whatever it was (not ours to raise)


def _uncancel() -> None:
    """Take back the running task's cancellation request (it was not ours to
    obey; Python 3.11+ counts them, and a ``timeout`` inside would misread one)."""
    uncancel = getattr(asyncio.current_task(), "uncancel", None)
    if uncancel is not None:
        uncancel()
