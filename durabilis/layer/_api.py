"""The sync layer: a thin shell over the plans (:mod:`durabilis.layer._shell`)
driven by ``drive``, its keep-alive thread, and its counts sent at exit."""

from __future__ import annotations

import atexit
import functools
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from durabilis._fork import reset_in_child
from durabilis._steps import drive
from durabilis._store import Store
from durabilis.breaker import CircuitBreakerRegistry
from durabilis.checkpoint import CheckpointManager
from durabilis.dlq import DeadLetterQueue, ReplayResult, ReplaySummary
from durabilis.errors import DurabilisError, LayerClosed
from durabilis.idempotency import IdempotencyGuard, IdempotencyKey
from durabilis.layer._config import DurabilityConfig, LayerStats, OperationContext
from durabilis.layer._direct import run_lean
from durabilis.layer._shell import (
    _CallPayload,
    _counts_not_sent,
    _keep_alive_ends,
    _LayerShell,
    _log,
    _Ticks,
)
from durabilis.retry import RetryEngine

T = TypeVar("T")


# Sync layers alive in this process, for their counts at interpreter exit (weak:
# registering keeps no layer alive). A forked child's copies have nothing waiting
# (the core resets what waits at fork, durabilis/_fork.py): it sends only its own.
_AT_EXIT: weakref.WeakSet[DurabilityLayer] = weakref.WeakSet()


def _close_at_exit() -> None:
    """Interpreter exit: every layer left unclosed with counts (or index
    removals) waiting in this process is closed and they are sent (best effort:
    one try per store; what cannot go is named in one warning)."""
    failed: dict[int, str] = {}  # id(store client) -> why
    lost = sum(not layer._flush_at_exit(failed) for layer in list(_AT_EXIT))
    if lost:
        _log.warning("durability_counts_not_sent", at_exit=True, layers=lost,
                     error=next(iter(failed.values())))


def _register_at_exit(layer: DurabilityLayer) -> None:
    _AT_EXIT.add(layer)
    # Moved to the end each time, so that it runs before the exit handlers of
    # the stores made before this layer (LIFO): the embedded server's, which
    # drops this process's connections, must come after the last flush.
    atexit.unregister(_close_at_exit)
    atexit.register(_close_at_exit)


class DurabilityLayer(_LayerShell[Store]):
    """The five pillars composed; what a gateway replica calls for every critical write.

    Args:
        store: From :func:`durabilis.connect`.
        config: Settings of every pillar (the gateway defaults when omitted;
            :meth:`DurabilityConfig.seed` for the seed's).
        replica_id: Identifies this process (breaker reports, DLQ replays).

    Attributes:
        idempotency, retry, breakers, checkpoints, dlq: The pillars, usable alone.
    """

    idempotency: IdempotencyGuard
    retry: RetryEngine
    breakers: CircuitBreakerRegistry
    checkpoints: CheckpointManager
    dlq: DeadLetterQueue
    _PILLARS = (
        IdempotencyGuard, RetryEngine, CircuitBreakerRegistry, CheckpointManager, DeadLetterQueue
    )

    def __init__(
        self,
        store: Store,
        config: DurabilityConfig | None = None,
        *,
        replica_id: str | None = None,
    ) -> None:
        super().__init__(store, config, replica_id)
        self._renewer: threading.Thread | None = None
        self._renewer_lock = threading.Lock()
        reset_in_child(self)
        _register_at_exit(self)

    def __enter__(self) -> DurabilityLayer:
        return self

    def __exit__(self, *exc: object) -> None:
        """:meth:`close` (the store stays open: ``with durabilis.connect() as store``)."""
        self.close()

    def after_fork_in_child(self) -> None:
        """A forked child has no keep-alive (the parent's thread is not copied, and
        its lock may have been held at fork): the child's first claim starts its
        own. The lease book and the waiting counts reset themselves
        (docs/production.md, "Processes and fork")."""
        self._renewer_lock = threading.Lock()
        self._renewer = None

    # -- the keep-alive --

    def _flush_at_exit(self, failed: dict[int, str]) -> bool:
        """Interpreter exit (``_close_at_exit``): if counts or index removals wait
        in this process, close the layer and send them, one try per store.

        Args:
            failed: Why a store's sends failed, by ``id(store.client)``: a store
                found there is not tried again (its server is gone).

        Returns:
            False if what waited could not be sent.
        """
        core = self._core
        if not core.waiting():
            return True
        self._closed = True
        core.on_wait = None  # (what fails waits again: no keep-alive to start now)
        client = id(self.store.client)
        if client in failed:  # (its server is gone: no second wait for a timeout)
            return False
        try:
            drive(core.flush_plan(), self.store)
        except Exception as exc:  # (a store closed already, a server gone: not raised)
            failed[client] = f"{type(exc).__name__}: {exc}"
            return False
        return True

    def _ensure_renewer(self) -> None:
        with self._renewer_lock:
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(
                    target=self._renew_loop, name="durabilis-lease-renewer", daemon=True
                )
                try:
                    self._renewer.start()
                except RuntimeError as exc:  # at interpreter shutdown (a close() from atexit)
                    self._renewer = None
                    _log.warning("durability_keep_alive_not_started", error=str(exc))

    def _renew_loop(self) -> None:
        stop = threading.Event()
        ticks = _Ticks(self.config.renew_interval)
        while not stop.wait(ticks.pause()):
            if ticks.renew_due():
                if self._leases.busy():
                    self._renew_once()
                ticks.renewed()
            last = self._closed and not self._leases.busy()  # then all of it goes
            try:  # idle too: what waits in the process still goes (after the leases)
                drive(self._core.flush_plan(due_only=not last), self.store)
            except DurabilisError as exc:
                _counts_not_sent(exc)
            with self._renewer_lock:  # (what _ensure_renewer takes: none is missed)
                if _keep_alive_ends(self._leases, self._core, last):
                    self._renewer = None
                    return

    def _renew_once(self) -> None:
        drive(self._core.keep_alive_plan(self._leases), self.store)

    def _open(self) -> None:
        if self._closed:
            raise LayerClosed("this DurabilityLayer was closed; it accepts no new operation")

    # -- the API --

    def execute(
        self,
        agent_id: str,
        operation_type: str,
        payload: Any,
        fn: Callable[[OperationContext], T],
        *,
        dependency: str | None = None,
        idempotency_key: IdempotencyKey | str | None = None,
        task_id: str | None = None,
        phase: str | None = None,
        wait: float | None = None,
        park_on_open: bool = False,
        deadline_seconds: float | None = None,
    ) -> T:
        """Run ``fn(ctx)`` once, durably (``docs/layer.md`` states the guarantee).

        Args:
            agent_id: Who runs it.
            operation_type: Selects the retry policy and, through
                ``config.dependencies``, the breaker.
            payload: The operation's payload: hashed into the idempotency key
                (unless ``idempotency_key`` is given), kept with the claim for
                crash recovery and parked in the DLQ on failure.
            fn: The operation; receives an :class:`OperationContext`.
            dependency: The breaker to use instead of the configured one.
            idempotency_key: A caller-supplied key (e.g. an HTTP Idempotency-Key).
            task_id: With ``phase``: save the result as this task's checkpoint.
            phase: The checkpoint phase.
            wait: When another caller runs the same operation, wait up to this
                many seconds for its result instead of raising OperationInProgress.
            park_on_open: When the breaker refuses the first attempt, park the
                operation in the DLQ (fire-and-forget writes) instead of raising
                CircuitOpen.
            deadline_seconds: Total time for all attempts (overrides the policy's).

        Returns:
            ``fn``'s result, or the stored result of a completed duplicate.

        Raises:
            InvalidKey, InvalidPayload, PayloadTooLarge, ConfigError,
                DependencyNotFound: Bad input, found before anything ran.
            RetryExhausted: Parked in the DLQ (``dlq_id``); the claim is released.
            CircuitOpen: The breaker refused before any attempt (nothing ran).
            OperationInProgress: Another caller runs it (and ``wait`` ran out).
            ResultNotStored: ``fn`` ran and completed, but its result cannot be
                stored (recorded as such: never run again for this key).
            OutcomeUnrecorded: ``fn`` ran, but Redis did not take its outcome
                for the whole lease.
            LeaseLost: ``fn`` succeeded but its claim had been taken over (or
                failed, and the delivery its claim passed to completed it).
            StorageUnavailable: Redis is down; nothing ran (fail closed).
            LayerClosed: :meth:`close` was called.
            Exception: ``fn``'s own non-retryable error (the claim is released).
            KeyboardInterrupt, SystemExit: Interrupted; once ``fn`` had
                started, the claim is released so that the next delivery runs
                with ``ctx.recovered`` (same key, higher token).
        """
        self._open()
        core = self._core
        req = core.request(
            agent_id, operation_type, payload, dependency=dependency,
            idempotency_key=idempotency_key, task_id=task_id, phase=phase, wait=wait,
            park_on_open=park_on_open, deadline_seconds=deadline_seconds,
        )
        lean = core.lean_entry(req)
        if lean is not None:  # the common case, its steps performed in place
            result: T = run_lean(core, req, fn, *lean, self.store, self._leases)
        else:
            result = drive(core.execute_plan(req, fn), self.store, leases=self._leases)
        return result

    def durable(
        self,
        operation_type: str,
        *,
        agent_id: str = "default",
        dependency: str | None = None,
        key: Callable[..., str] | None = None,
        wait: float | None = None,
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: each call of the function becomes a durable operation.

        The payload is the call's arguments bound to the function's signature,
        those equal to their default (the same JSON) left out:
        ``{"args": [...], "kwargs": {...}}`` (so it must be
        JSON-compatible for content keys). The key is the call's, not its
        spelling's: ``f("x")`` and ``f(fact="x")`` (and, with a default
        ``n=1``, ``f("x", 1)``) are one operation. Arguments that do not fit
        the signature raise ``TypeError`` before anything is claimed.
        ``key(*args, **kwargs)`` supplies a raw idempotency key instead (called
        with the arguments as spelled). Inside, :func:`current_operation` gives
        the context (key, fencing token, attempt).
        """

        def decorate(func: Callable[..., T]) -> Callable[..., T]:
            payload_of = _CallPayload(func)  # the signature, read once

            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> T:
                return self.execute(
                    agent_id, operation_type, payload_of(args, kwargs),
                    lambda _ctx: func(*args, **kwargs), dependency=dependency,
                    idempotency_key=None if key is None else key(*args, **kwargs), wait=wait,
                )

            return wrapper

        return decorate

    def recover_orphans(self, limit: int = 1000) -> list[str]:
        """Park the operations whose worker died (lease ended) in the DLQ.

        Safe to run from every replica at once (each orphan is reclaimed by one);
        looks at up to ``limit`` in-flight entries whose lease has ended and
        returns the DLQ ids written. The records carry ``last_error=WORKER_LOST``
        and the original idempotency key, so :meth:`replay` never runs twice an
        operation that had in fact completed.
        """
        return drive(self._core.recover_plan(limit), self.store)

    def replay(
        self, dlq_id: str, fn: Callable[[OperationContext], Any], *, wait: float | None = None
    ) -> ReplayResult:
        """Replay a parked operation through the layer with its original key.

        A completed operation is not run again (its stored result counts as the
        replay's success). An operation in progress elsewhere is waited for up
        to ``wait`` seconds (``None``: the claim's lease), then the record is
        ``DEFERRED``, like one whose breaker is open: no attempt counted.
        """
        return drive(self._replay_plan(dlq_id, fn, wait), self.store, leases=self._leases)

    def replay_pending(
        self,
        fn: Callable[[OperationContext], Any],
        operation_type: str | None = None,
        limit: int | None = None,
        max_per_second: float | None = None,
        *,
        wait: float | None = None,
        on_result: Callable[[ReplayResult], object] | None = None,
        requeued_only: bool = False,
    ) -> ReplaySummary:
        """Replay pending DLQ records through the layer (see :meth:`replay`); the
        pass replays no record of a dependency found with an open breaker
        (``summary.breakers_open``). ``on_result`` is called with each record's
        :class:`ReplayResult` as the pass goes (progress). ``requeued_only``:
        only the records an operator marked for redelivery (``dlq requeue``)."""
        plan = self._replay_pending_plan(
            fn, operation_type, limit, max_per_second,
            wait=wait, on_result=on_result, requeued_only=requeued_only,
        )
        return drive(plan, self.store, leases=self._leases)

    def replay_requeued(
        self,
        handlers: Mapping[str, Callable[[OperationContext], Any]],
        limit: int | None = None,
        max_per_second: float | None = None,
        *,
        wait: float | None = None,
        on_result: Callable[[ReplayResult], object] | None = None,
    ) -> ReplaySummary:
        """Replay through the layer the records an operator marked for
        redelivery (``durabilis dlq requeue``) whose operation type has a
        handler here: ``handlers`` maps operation type -> ``fn`` (as given to
        :meth:`replay`). Records of other types are left to the replicas that
        have their handler. Each record is claimed first (one replica per
        record) and replayed under the breaker, pacing and exactly-once rules
        of :meth:`replay_pending`; a failed replay ends the record's mark, a
        deferred one (breaker open, in progress) or one met with a config error
        keeps it. ``OrphanRecovery(requeue_handlers=...)`` runs this on a schedule.
        """
        plan = self._replay_requeued_plan(handlers, limit, max_per_second, wait, on_result)
        return drive(plan, self.store, leases=self._leases)

    def stats(self) -> LayerStats:
        """The fleet-wide totals of this namespace (read from Redis).

        This process's waiting duplicate counts are sent first; other
        processes' may lag by up to a second (see docs/layer.md, Counters).
        """
        return drive(self._stats_plan(), self.store)

    def close(self) -> None:
        """Accept no new operation (they raise :class:`~durabilis.LayerClosed`).

        Operations already running finish normally; the keep-alive renews their
        leases until the last one ends, then stops. The store stays open.
        This process's waiting duplicate counts are sent (best effort).
        """
        self._closed = True
        try:
            drive(self._core.flush_plan(), self.store)
        except DurabilisError as exc:
            _counts_not_sent(exc)
