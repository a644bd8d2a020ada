"""The two layers, sync and asyncio: thin shells over the plans and a driver."""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from durabilis import _codec
from durabilis._fork import reset_in_child
from durabilis._log import get_logger
from durabilis._steps import LeaseBook, adrive, drive
from durabilis._store import AsyncStore, Store
from durabilis.breaker import AsyncCircuitBreakerRegistry, CircuitBreakerRegistry
from durabilis.checkpoint import AsyncCheckpointManager, CheckpointManager
from durabilis.dlq import AsyncDeadLetterQueue, DeadLetterQueue, ReplayResult, ReplaySummary
from durabilis.errors import DurabilisError, LayerClosed
from durabilis.idempotency import AsyncIdempotencyGuard, IdempotencyGuard, IdempotencyKey
from durabilis.layer._config import DurabilityConfig, LayerStats, OperationContext
from durabilis.layer._plans import DUPLICATES_FLUSH_SECONDS, _LayerCore
from durabilis.retry import AsyncRetryEngine, RetryEngine

_log = get_logger()

T = TypeVar("T")


class _Ticks:
    """The keep-alive's clock: it wakes every second at most (what waits in the
    process, counts and index removals, goes once a second old) and renews the
    leases held every ``renew_interval``. A renewal is due until it is done: one
    that was interrupted (the keep-alive task cancelled by a sweep) goes at once
    on the next wake, which never comes later than the renewal's time."""

    def __init__(self, renew_interval: float) -> None:
        self.every = renew_interval
        self.wait = min(renew_interval, DUPLICATES_FLUSH_SECONDS)
        self._next = time.monotonic() + renew_interval

    def pause(self) -> float:
        """How long to sleep before the next wake."""
        return max(0.0, min(self.wait, self._next - time.monotonic()))

    def renew_due(self) -> bool:
        # (a wake a little early counts: a sleep may end before its time)
        return time.monotonic() >= self._next - self.wait / 2

    def renewed(self) -> None:
        self._next = time.monotonic() + self.every


def _keep_alive_ends(leases: LeaseBook, core: _LayerCore, closed: bool) -> bool:
    """Idle (nothing held, nothing waiting) or closed with nothing held, the
    keep-alive ends: a layer left unclosed keeps no thread (or task). A claim
    held or a count waiting after it ended starts another."""
    return not leases.busy() and (closed or not core.waiting())


# Sync layers alive in this process, for their counts at interpreter exit (weak:
# registering keeps no layer alive). A forked child's copies have nothing waiting
# (the core resets what waits at fork, durabilis/_fork.py): it sends only its own.
_AT_EXIT: weakref.WeakSet[DurabilityLayer] = weakref.WeakSet()


def _close_at_exit() -> None:
    """Interpreter exit: every layer left unclosed with counts (or index
    removals) waiting in this process is closed and they are sent (best effort:
    one try per store; what cannot go is named in one warning)."""
    failed: dict[int, str] = {}  # id(store client) -> why
    lost = 0
    for layer in list(_AT_EXIT):
        core = layer._core
        if not core.waiting():
            continue
        layer._closed = True
        core.on_wait = None  # (what fails waits again: no keep-alive to start now)
        client = id(layer.store.client)
        if client in failed:  # (its server is gone: no second wait for a timeout)
            lost += 1
            continue
        try:
            drive(core.flush_plan(), layer.store)
        except Exception as exc:  # (a store closed already, a server gone: not raised)
            failed[client] = f"{type(exc).__name__}: {exc}"
            lost += 1
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


def _payload_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return {"args": list(args), "kwargs": kwargs}


def _is_default(value: Any, default: Any) -> bool:
    """``value`` is the parameter's default: the same object, or the same JSON
    (what the content key hashes: ``-0.0`` is not ``0.0``, nor ``1.0`` ``1``)."""
    if value is default:
        return True
    try:
        return _codec.canonical_json([value]) == _codec.canonical_json([default])
    except DurabilisError:  # not JSON: only the default object itself is the default
        return False


class _CallPayload:
    """The payload (hence the content key) of a call of a ``@durable`` function,
    keyed by the call, not its spelling: the arguments bound to the function's
    signature (read once, at decoration), every argument equal to its
    parameter's default left out, in one canonical form: ``{"args": [...],
    "kwargs": {...}}`` with the parameters that can be passed by position in
    ``args`` (up to the first one left out; ``*args`` after them) and the rest
    in ``kwargs``. With ``def f(fact, n=1)``, ``f("x")``, ``f(fact="x")``,
    ``f("x", 1)`` and ``f("x", n=1)`` give one payload; so do the calls that
    leave out a parameter added later with a default, or whose default changed
    (a rolling deploy keys a re-delivery as its first delivery was keyed).

    A call that passes every parameter by position, none at its default, gives
    the payload the decorator made before it bound arguments, so its key did
    not change.
    """

    __slots__ = ("_fast", "_signature", "_var_positional")

    def __init__(self, func: Callable[..., Any]) -> None:
        try:
            signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):  # no signature to read (some builtins): as spelled
            signature = None
        self._signature = signature
        # Plain parameters without defaults only: a call passing each by
        # position is already canonical (no bind needed).
        self._fast = -1
        self._var_positional = False
        if signature is not None:
            params = list(signature.parameters.values())
            plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            if all(p.kind in plain and p.default is inspect.Parameter.empty for p in params):
                self._fast = len(params)
            self._var_positional = any(
                p.kind is inspect.Parameter.VAR_POSITIONAL for p in params
            )

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The payload of one call.

        Raises:
            TypeError: The arguments do not fit the signature (as calling the
                function would), before anything is claimed.
        """
        if self._signature is None or (not kwargs and len(args) == self._fast):
            return _payload_of(args, kwargs)
        bound = self._signature.bind(*args, **kwargs)
        # With values in *args, a positional parameter left out would move them
        # to kwargs under *args' name, where a **kwargs entry could spell them.
        keep_positional = self._var_positional and any(
            p.kind is inspect.Parameter.VAR_POSITIONAL and bound.arguments.get(p.name)
            for p in self._signature.parameters.values()
        )
        for name, param in self._signature.parameters.items():
            if (
                name in bound.arguments
                and param.default is not inspect.Parameter.empty
                and not (keep_positional and param.kind in (
                    inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                ))
                and _is_default(bound.arguments[name], param.default)
            ):
                del bound.arguments[name]
        return _payload_of(bound.args, bound.kwargs)


class DurabilityLayer:
    """The five pillars composed; what a gateway replica calls for every critical write.

    Args:
        store: From :func:`durabilis.connect`.
        config: Settings of every pillar (the gateway defaults when omitted;
            :meth:`DurabilityConfig.seed` for the seed's).
        replica_id: Identifies this process (breaker reports, DLQ replays).

    Attributes:
        idempotency, retry, breakers, checkpoints, dlq: The pillars, usable alone.
    """

    def __init__(
        self,
        store: Store,
        config: DurabilityConfig | None = None,
        *,
        replica_id: str | None = None,
    ) -> None:
        self.config = config or DurabilityConfig()
        cfg = self.config
        if cfg.acks_level is not None:
            store = store.with_acks(cfg.acks_level)
        self.store = store
        self.idempotency = IdempotencyGuard(store, cfg.idempotency)
        self.retry = RetryEngine.empty(store)
        for policy in cfg.policies:
            self.retry.upsert_policy(policy)
        self.breakers = CircuitBreakerRegistry(store, cfg.breaker_configs, replica_id=replica_id)
        self.checkpoints = CheckpointManager(store, cfg.checkpoint)
        self.dlq = DeadLetterQueue(store, cfg.dlq, replayer_id=self.breakers.replica_id)
        self._core = _LayerCore(
            store, cfg, self.idempotency.ops, self.retry, self.breakers,
            self.checkpoints.ops, self.dlq.ops,
        )
        self._leases = LeaseBook(on_hold=self._ensure_renewer)
        self._core.on_wait = self._ensure_renewer  # (counts wait without a claim held too)
        self._renewer: threading.Thread | None = None
        self._renewer_lock = threading.Lock()
        self._closed = False
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
                _log.warning("durability_counts_not_sent", error=f"{type(exc).__name__}: {exc}")
            with self._renewer_lock:  # (what _ensure_renewer takes: none is missed)
                if _keep_alive_ends(self._leases, self._core, last):
                    self._renewer = None
                    return

    def _renew_once(self) -> None:
        try:
            held = self._leases.held()
            replies = self.store.run_many(self._core.renew_calls(held))
            back = self._core.reindex_calls(held, replies)
            if back:
                self.store.run_many(back)
        except DurabilisError as exc:
            _log.warning("durability_lease_renew_failed", error=f"{type(exc).__name__}: {exc}")
        for item in self._leases.deferred():
            try:
                replies = self.store.run_step(item.step.calls, item.step.gates)
            except DurabilisError as exc:
                self._core.deferred_failed(self._leases, item, exc)
                continue
            self._core.deferred_sent(self._leases, item, replies)

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
            LeaseLost: ``fn`` succeeded but its claim had been taken over.
            StorageUnavailable: Redis is down; nothing ran (fail closed).
            LayerClosed: :meth:`close` was called.
            Exception: ``fn``'s own non-retryable error (the claim is released).
            KeyboardInterrupt, SystemExit: Interrupted; once ``fn`` had
                started, the claim is released so that the next delivery runs
                with ``ctx.recovered`` (same key, higher token).
        """
        self._open()
        req = self._core.request(
            agent_id, operation_type, payload, dependency=dependency,
            idempotency_key=idempotency_key, task_id=task_id, phase=phase, wait=wait,
            park_on_open=park_on_open, deadline_seconds=deadline_seconds,
        )
        result: T = drive(self._core.execute_plan(req, fn), self.store, leases=self._leases)
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
        return drive(
            self.dlq.ops.replay_steps(dlq_id, self._core.replay_plan(fn, wait)), self.store,
            leases=self._leases,
        )

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
        return drive(
            self.dlq.ops.replay_pending_steps(
                operation_type, limit, max_per_second, self._core.replay_plan(fn, wait),
                on_result, requeued_only=requeued_only,
            ),
            self.store, leases=self._leases,
        )

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
        return drive(
            self.dlq.ops.replay_requeued_steps(
                {op: self._core.replay_plan(fn, wait) for op, fn in handlers.items()},
                limit, max_per_second, on_result,
            ),
            self.store, leases=self._leases,
        )

    def stats(self) -> LayerStats:
        """The fleet-wide totals of this namespace (read from Redis).

        This process's waiting duplicate counts are sent first; other
        processes' may lag by up to a second (see docs/layer.md, Counters).
        """
        drive(self._core.flush_plan(), self.store)
        return self._core.decode_stats_reply(self.store.run(self._core.stats_call()))

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
            _log.warning("durability_counts_not_sent", error=f"{type(exc).__name__}: {exc}")


class AsyncDurabilityLayer:
    """The asyncio twin of :class:`DurabilityLayer` (same methods, awaited).

    ``fn`` may be an ``async def`` function (awaited on the event loop) or a
    plain function: a plain function runs in a worker thread
    (``asyncio.to_thread``), never on the loop, whose keep-alive must go on
    renewing the claim's lease while ``fn`` runs.
    """

    def __init__(
        self,
        store: AsyncStore,
        config: DurabilityConfig | None = None,
        *,
        replica_id: str | None = None,
    ) -> None:
        self.config = config or DurabilityConfig()
        cfg = self.config
        if cfg.acks_level is not None:
            store = store.with_acks(cfg.acks_level)
        self.store = store
        self.idempotency = AsyncIdempotencyGuard(store, cfg.idempotency)
        self.retry = AsyncRetryEngine.empty(store)
        for policy in cfg.policies:
            self.retry.upsert_policy(policy)
        self.breakers = AsyncCircuitBreakerRegistry(
            store, cfg.breaker_configs, replica_id=replica_id
        )
        self.checkpoints = AsyncCheckpointManager(store, cfg.checkpoint)
        self.dlq = AsyncDeadLetterQueue(store, cfg.dlq, replayer_id=self.breakers.replica_id)
        self._core = _LayerCore(
            store, cfg, self.idempotency.ops, self.retry, self.breakers,
            self.checkpoints.ops, self.dlq.ops,
        )
        self._leases = LeaseBook(on_hold=self._ensure_renewer)
        self._core.on_wait = self._ensure_renewer  # (counts wait without a claim held too)
        self._renewer: asyncio.Task[None] | None = None  # on the store's loop, the only one
        self._closed = False
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
                    _log.warning(
                        "durability_counts_not_sent", error=f"{type(exc).__name__}: {exc}"
                    )
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
            _log.warning("durability_counts_not_sent", error=f"{type(exc).__name__}: {exc}")

    async def _renew_once(self) -> None:
        try:
            held = self._leases.held()
            replies = await self.store.run_many(self._core.renew_calls(held))
            back = self._core.reindex_calls(held, replies)
            if back:
                await self.store.run_many(back)
        except DurabilisError as exc:
            _log.warning("durability_lease_renew_failed", error=f"{type(exc).__name__}: {exc}")
        for item in self._leases.deferred():
            try:
                replies = await self.store.run_step(item.step.calls, item.step.gates)
            except DurabilisError as exc:
                self._core.deferred_failed(self._leases, item, exc)
                continue
            self._core.deferred_sent(self._leases, item, replies)

    def _open(self) -> None:
        if self._closed:
            raise LayerClosed("this AsyncDurabilityLayer was closed; it accepts no new operation")
        self._on_home_loop()

    def _on_home_loop(self) -> None:
        # Before any hold or flush: a refused loop gets no keep-alive, which
        # would take (and fail to send) what the store's own loop has waiting.
        # So the layer's keep-alive only ever runs on the store's loop.
        self.store._on_home_loop()

    async def execute(
        self,
        agent_id: str,
        operation_type: str,
        payload: Any,
        fn: Callable[[OperationContext], Awaitable[T] | T],
        *,
        dependency: str | None = None,
        idempotency_key: IdempotencyKey | str | None = None,
        task_id: str | None = None,
        phase: str | None = None,
        wait: float | None = None,
        park_on_open: bool = False,
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
        self._open()
        req = self._core.request(
            agent_id, operation_type, payload, dependency=dependency,
            idempotency_key=idempotency_key, task_id=task_id, phase=phase, wait=wait,
            park_on_open=park_on_open, deadline_seconds=deadline_seconds,
        )
        result: T = await adrive(self._core.execute_plan(req, fn), self.store, leases=self._leases)
        return result

    def durable(
        self,
        operation_type: str,
        *,
        agent_id: str = "default",
        dependency: str | None = None,
        key: Callable[..., str] | None = None,
        wait: float | None = None,
    ) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
        """See :meth:`DurabilityLayer.durable` (decorates ``async def`` functions)."""

        def decorate(func: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
            payload_of = _CallPayload(func)  # the signature, read once

            @functools.wraps(func)
            async def wrapper(*args: Any, **kwargs: Any) -> T:
                async def call(_ctx: OperationContext) -> T:
                    return await func(*args, **kwargs)

                return await self.execute(
                    agent_id, operation_type, payload_of(args, kwargs), call,
                    dependency=dependency,
                    idempotency_key=None if key is None else key(*args, **kwargs), wait=wait,
                )

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
        return await adrive(
            self.dlq.ops.replay_steps(dlq_id, self._core.replay_plan(fn, wait)), self.store,
            leases=self._leases,
        )

    async def replay_pending(
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
        """See :meth:`DurabilityLayer.replay_pending`."""
        self._on_home_loop()
        return await adrive(
            self.dlq.ops.replay_pending_steps(
                operation_type, limit, max_per_second, self._core.replay_plan(fn, wait),
                on_result, requeued_only=requeued_only,
            ),
            self.store, leases=self._leases,
        )

    async def replay_requeued(
        self,
        handlers: Mapping[str, Callable[[OperationContext], Any]],
        limit: int | None = None,
        max_per_second: float | None = None,
        *,
        wait: float | None = None,
        on_result: Callable[[ReplayResult], object] | None = None,
    ) -> ReplaySummary:
        """See :meth:`DurabilityLayer.replay_requeued`."""
        self._on_home_loop()
        return await adrive(
            self.dlq.ops.replay_requeued_steps(
                {op: self._core.replay_plan(fn, wait) for op, fn in handlers.items()},
                limit, max_per_second, on_result,
            ),
            self.store, leases=self._leases,
        )

    async def stats(self) -> LayerStats:
        """See :meth:`DurabilityLayer.stats`."""
        self._on_home_loop()
        await adrive(self._core.flush_plan(), self.store)
        return self._core.decode_stats_reply(await self.store.run(self._core.stats_call()))

    async def close(self) -> None:
        """See :meth:`DurabilityLayer.close`."""
        self._on_home_loop()
        self._closed = True
        try:
            await adrive(self._core.flush_plan(), self.store)
        except DurabilisError as exc:
            _log.warning("durability_counts_not_sent", error=f"{type(exc).__name__}: {exc}")
        # Nothing left to renew: this loop's keep-alive stops now rather than at
        # its next tick (a loop closed meanwhile would destroy it pending).
        if self._renewer is not None and not self._leases.busy():
            await self._stop_renewer()
            try:  # what a flush of the keep-alive cancelled midway left
                await adrive(self._core.flush_plan(), self.store)
            except DurabilisError as exc:
                _log.warning("durability_counts_not_sent", error=f"{type(exc).__name__}: {exc}")
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
