""":class:`OrphanRecovery`: periodic orphan recovery and DLQ cleanup, one replica per period."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from durabilis.core.lease import lease_taken, period_lease
from durabilis.dlq import ReplaySummary
from durabilis.errors import (
    ConfigError,
    DurabilisError,
)
from durabilis.http._common import (
    _log,
    _number,
)
from durabilis.layer import AsyncDurabilityLayer, OperationContext


async def _period(once: Callable[[], Awaitable[object]], failed_event: str) -> str | None:
    """One period's pass: ``None`` when it ran, else its error (``"Type: message"``),
    logged as ``failed_event``; Redis down (or a bug) is tried again next period."""
    try:
        await once()
    except Exception as exc:
        _log.warning(failed_event, error=type(exc).__name__)
        return f"{type(exc).__name__}: {exc}"
    return None


class OrphanRecovery:
    """Run ``layer.recover_orphans`` periodically, one replica per period.

    Every replica may run one; each period, the first to take the lease
    (``<ns>:layer:{layer}:lease:recover_orphans``, as long as the period)
    recovers and the others skip. A request whose worker died (SIGKILL, OOM)
    is parked in the DLQ as ``WORKER_LOST`` and its key released, so the
    client's retry runs it again instead of waiting out the lease;
    :meth:`DurableIdempotencyMiddleware.replay_stored` can replay the parked
    record without the client.

    Beside it, on a schedule of its own, the DLQ's expired records are cleaned
    up (``layer.dlq.cleanup_due``: one replica per period, through the lease
    ``<ns>:dlq:{dlq}:lease:cleanup``), so a pending record that expires
    unreplayed is reported (event ``durability_dlq_expired``, an ``expired``
    log entry, ``DlqStats.expired``) even when nothing new is parked.

    With ``requeue_handlers`` (operation type -> the ``fn`` the application
    replays it with, as given to ``layer.replay``), this replica also serves
    the records an operator marked for redelivery (``durabilis dlq requeue``):
    every ``requeue_every_seconds`` it runs ``layer.replay_requeued`` over
    those types. Every replica with handlers runs it at once, no lease: each
    record is claimed first, so one replica replays it, under the breaker,
    pacing and exactly-once rules of any replay. Records of a type without a
    handler here are left to the replicas that have one.

    Args:
        layer: The layer whose orphans to recover.
        every_seconds: The period (and the lease).
        limit: Most orphans recovered per period.
        holder: The name kept in the lease (default: host and pid).
        dlq_cleanup_every_seconds: The DLQ cleanup's period (and lease);
            ``None`` turns it off.
        requeue_handlers: Operation type -> replay ``fn``; ``None`` (or empty):
            this replica serves no requeued record.
        requeue_every_seconds: The period of the requeue pass.
        requeue_limit: Most handlers one requeue pass runs.
        requeue_max_per_second: Most handlers started per second (``None``: no pacing).
    """

    def __init__(
        self,
        layer: AsyncDurabilityLayer,
        *,
        every_seconds: float = 10.0,
        limit: int = 1000,
        holder: str | None = None,
        dlq_cleanup_every_seconds: float | None = 60.0,
        requeue_handlers: Mapping[str, Callable[[OperationContext], Any]] | None = None,
        requeue_every_seconds: float = 5.0,
        requeue_limit: int = 100,
        requeue_max_per_second: float | None = None,
    ) -> None:
        self.layer = layer
        if requeue_handlers is not None and not isinstance(requeue_handlers, Mapping):
            raise ConfigError("requeue_handlers", "must map operation types to replay functions")
        self.requeue_handlers = dict(requeue_handlers or {})
        for op, fn in self.requeue_handlers.items():
            if not isinstance(op, str) or not op or not callable(fn):
                raise ConfigError("requeue_handlers",
                                  f"must map operation types to callables, got {op!r}: {fn!r}")
        self.requeue_every_seconds = _number("requeue_every_seconds", requeue_every_seconds,
                                             0.05, 86400.0)
        self.requeue_limit = int(_number("requeue_limit", requeue_limit, 1, 1_000_000))
        self.requeue_max_per_second = None if requeue_max_per_second is None else (
            _number("requeue_max_per_second", requeue_max_per_second, 0.001, 1_000_000.0)
        )
        self.requeue_runs = 0
        self.requeue_replayed = 0
        self.requeue_failed = 0
        self.requeue_error: str | None = None
        self.every_seconds = _number("every_seconds", every_seconds, 0.05, 86400.0)
        self.dlq_cleanup_every_seconds = None if dlq_cleanup_every_seconds is None else (
            _number("dlq_cleanup_every_seconds", dlq_cleanup_every_seconds, 0.05, 86400.0)
        )
        self.cleanup_runs = 0
        self.cleanup_skipped = 0
        self.cleanup_removed = 0
        self.cleanup_expired = 0
        self.cleanup_error: str | None = None
        self.limit = int(_number("limit", limit, 1, 1_000_000))
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        self.runs = 0
        self.skipped = 0
        self.recovered = 0
        self.last_run_at: float | None = None
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._lease = layer.store.keys.layer("lease", "recover_orphans")

    async def run_once(self) -> list[str] | None:
        """Take this period's lease and recover; ``None`` when another replica has it.

        Returns:
            The DLQ ids of the orphans parked (possibly none).

        Raises:
            StorageUnavailable: Redis is down.
        """
        lease = period_lease(self._lease, self.holder, self.every_seconds)
        reply = await self.layer.store.run(lease)
        if not lease_taken(reply):
            self.skipped += 1
            return None
        parked = await self.layer.recover_orphans(self.limit)
        self.runs += 1
        self.recovered += len(parked)
        self.last_run_at = time.time()
        return parked

    async def cleanup_once(self) -> int | None:
        """Take this period's DLQ cleanup lease and clean up; ``None`` when
        another replica has it (or the cleanup is turned off).

        Returns:
            The DLQ records removed (each pending one reported as expired).

        Raises:
            StorageUnavailable: Redis is down.
        """
        if self.dlq_cleanup_every_seconds is None:
            return None
        done = await self.layer.dlq.cleanup_due(
            self.dlq_cleanup_every_seconds, holder=self.holder
        )
        if done is None:
            self.cleanup_skipped += 1
            return None
        self.cleanup_runs += 1
        self.cleanup_removed += done.removed
        self.cleanup_expired += len(done.expired)
        return done.removed

    async def requeue_once(self) -> ReplaySummary | None:
        """One pass over the requeued records this replica has handlers for
        (``layer.replay_requeued``); ``None`` when it has none.

        Raises:
            StorageUnavailable: Redis is down.
        """
        if not self.requeue_handlers:
            return None
        summary = await self.layer.replay_requeued(
            self.requeue_handlers, self.requeue_limit, self.requeue_max_per_second
        )
        self.requeue_runs += 1
        self.requeue_replayed += summary.replayed
        self.requeue_failed += summary.failed
        return summary

    def start(self) -> None:
        """Start the periodic task on the running loop (no-op when running, or
        once :meth:`stop` was called: a request after shutdown does not restart it)."""
        if self._stopped or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop the periodic task and wait for it."""
        self._stopped = True
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # The task's own CancelledError is returned, not raised; a cancellation
        # of the caller itself still propagates.
        await asyncio.gather(task, return_exceptions=True)

    async def _loop(self) -> None:
        clean_every = self.dlq_cleanup_every_seconds
        requeue_every = self.requeue_every_seconds if self.requeue_handlers else None
        next_recover = next_clean = next_requeue = time.monotonic()
        while not self._stopped:  # (stop() stays final should a cancellation be lost)
            if time.monotonic() >= next_recover:
                self.last_error = await _period(self.run_once, "durability_recovery_failed")
                next_recover = time.monotonic() + self.every_seconds
            if clean_every is not None and time.monotonic() >= next_clean:
                self.cleanup_error = await _period(
                    self.cleanup_once, "durability_dlq_cleanup_failed")
                next_clean = time.monotonic() + clean_every
            if requeue_every is not None and time.monotonic() >= next_requeue:
                self.requeue_error = await _period(
                    self.requeue_once, "durability_dlq_requeue_pass_failed")
                next_requeue = time.monotonic() + requeue_every
            wake = next_recover if clean_every is None else min(next_recover, next_clean)
            if requeue_every is not None:
                wake = min(wake, next_requeue)
            await asyncio.sleep(max(0.0, wake - time.monotonic()))

    async def health(self) -> dict[str, Any]:
        """What a health endpoint shows: this replica's recovery and the fleet's totals.

        ``ok`` is false when the last recovery failed or Redis cannot be read.
        """
        report: dict[str, Any] = {
            "ok": self.last_error is None and self.cleanup_error is None
            and self.requeue_error is None,
            "recovery": {
                "running": self._task is not None and not self._task.done(),
                "every_seconds": self.every_seconds, "runs": self.runs,
                "skipped": self.skipped, "recovered": self.recovered,
                "last_run_at": self.last_run_at, "last_error": self.last_error,
            },
            "dlq_cleanup": {
                "every_seconds": self.dlq_cleanup_every_seconds, "runs": self.cleanup_runs,
                "skipped": self.cleanup_skipped, "removed": self.cleanup_removed,
                "expired": self.cleanup_expired, "last_error": self.cleanup_error,
            },
            "dlq_requeue": {
                "operation_types": sorted(self.requeue_handlers),
                "every_seconds": self.requeue_every_seconds, "runs": self.requeue_runs,
                "replayed": self.requeue_replayed, "failed": self.requeue_failed,
                "last_error": self.requeue_error,
            },
        }
        try:
            report["layer"] = dataclasses.asdict(await self.layer.stats())
        except DurabilisError as exc:
            report["ok"] = False
            report["layer"] = None
            report["error"] = type(exc).__name__
        return report
