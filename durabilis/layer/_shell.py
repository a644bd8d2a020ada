"""What the two layers (sync and asyncio) share: the pillars composed over one
store, the plans' core, the lease book, and the plans each public method hands
its driver (``drive`` in :mod:`durabilis.layer._api`, ``await adrive`` in
:mod:`durabilis.layer._aio`). No I/O here."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from durabilis import _codec, otel
from durabilis._log import get_logger
from durabilis._steps import INTERRUPTS, LeaseBook
from durabilis._store import AsyncStore, Store
from durabilis.breaker import AsyncCircuitBreakerRegistry, CircuitBreakerRegistry
from durabilis.checkpoint import AsyncCheckpointManager, CheckpointManager
from durabilis.core.layer import DUPLICATES_FLUSH_SECONDS, LayerCore, Runtime
from durabilis.core.steps import Plan
from durabilis.dlq import AsyncDeadLetterQueue, DeadLetterQueue, ReplayResult, ReplaySummary
from durabilis.errors import DurabilisError
from durabilis.idempotency import AsyncIdempotencyGuard, IdempotencyGuard
from durabilis.layer._config import DurabilityConfig, LayerStats, OperationContext
from durabilis.retry import AsyncRetryEngine, RetryEngine, error_code

_log = get_logger()

S = TypeVar("S", Store, AsyncStore)


class _OtelHooks:
    """:mod:`durabilis.otel`'s hooks, as the plans' ``Tracing``."""

    __slots__ = ()
    begin = staticmethod(otel.begin)
    retried = staticmethod(otel.retried)
    answered_duplicate = staticmethod(otel.answered_duplicate)
    parking_fields = staticmethod(otel.parking_fields)


RUNTIME = Runtime(INTERRUPTS, error_code, _OtelHooks())
"""What the plans take from the process: its interruptions, its error
classification, its tracing hooks."""


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
        self._began = self._next

    def pause(self) -> float:
        """How long to sleep before the next wake."""
        return max(0.0, min(self.wait, self._next - time.monotonic()))

    def renew_due(self) -> bool:
        # (a wake a little early counts: a sleep may end before its time)
        now = time.monotonic()
        if now < self._next - self.wait / 2:
            return False
        self._began = now
        return True

    def renewed(self) -> None:
        """The renewal done: the next is due ``renew_interval`` after this one
        began (a batch that waited on a slow node does not push it later)."""
        self._next = self._began + self.every


def _keep_alive_ends(leases: LeaseBook, core: LayerCore, closed: bool) -> bool:
    """Idle (nothing held, nothing waiting) or closed with nothing held, the
    keep-alive ends: a layer left unclosed keeps no thread (or task). A claim
    held or a count waiting after it ended starts another."""
    return not leases.busy() and (closed or not core.waiting())


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


class _LayerShell(Generic[S]):
    """The state both layers share, and the plans their public methods drive.

    A twin names its pillar classes (``_PILLARS``: the sync or the asyncio
    ones, which :meth:`_compose` builds) and runs its keep-alive (a thread or
    a task: :meth:`_ensure_renewer`); the rest is here, written once.
    """

    idempotency: IdempotencyGuard | AsyncIdempotencyGuard
    retry: RetryEngine | AsyncRetryEngine
    breakers: CircuitBreakerRegistry | AsyncCircuitBreakerRegistry
    checkpoints: CheckpointManager | AsyncCheckpointManager
    dlq: DeadLetterQueue | AsyncDeadLetterQueue

    def __init__(
        self, store: S, config: DurabilityConfig | None, replica_id: str | None
    ) -> None:
        self.config = config or DurabilityConfig()
        cfg = self.config
        if cfg.acks_level is not None:
            store = store.with_acks(cfg.acks_level)
        self.store: S = store
        _check_lease(store, cfg)
        self._compose(store, cfg, replica_id)
        self._core = LayerCore(
            store, cfg, self.idempotency.ops, self.retry, self.breakers,
            self.checkpoints.ops, self.dlq.ops, new_lock=threading.Lock, runtime=RUNTIME,
        )
        self._leases = LeaseBook(on_hold=self._ensure_renewer)
        self._core.on_wait = self._ensure_renewer  # (counts wait without a claim held too)
        self._closed = False

    _PILLARS: tuple[Any, Any, Any, Any, Any]
    """The twin's pillar classes: guard, retry engine, breaker registry,
    checkpoint manager, DLQ (the sync or the asyncio ones)."""

    def _compose(self, store: S, cfg: DurabilityConfig, replica_id: str | None) -> None:
        """Build the pillars (``idempotency``, ``retry`` with the configured
        policies, ``breakers``, ``checkpoints``, ``dlq``) over ``store``."""
        guard, engine, registry, manager, queue = self._PILLARS
        self.idempotency = guard(store, cfg.idempotency)
        self.retry = engine.empty(store)
        for policy in cfg.policies:
            self.retry.upsert_policy(policy)
        self.breakers = registry(store, cfg.breaker_configs, replica_id=replica_id)
        self.checkpoints = manager(store, cfg.checkpoint)
        self.dlq = queue(store, cfg.dlq, replayer_id=self.breakers.replica_id)

    def _ensure_renewer(self) -> None:
        """Start the keep-alive if it is not running."""
        raise NotImplementedError

    def _open(self) -> None:
        raise NotImplementedError

    # -- the plans the public methods drive --

    def _operation_plan(
        self,
        agent_id: str,
        operation_type: str,
        payload: Any,
        fn: Callable[[OperationContext], Any],
        **options: Any,
    ) -> Plan[Any]:
        """The plan of one ``execute``, once the layer is open and every
        argument checked (``options``: execute's keyword arguments)."""
        self._open()
        req = self._core.request(agent_id, operation_type, payload, **options)
        return self._core.execute_plan(req, fn)

    def _replay_plan(
        self, dlq_id: str, fn: Callable[[OperationContext], Any], wait: float | None
    ) -> Plan[ReplayResult]:
        return self.dlq.ops.replay_steps(dlq_id, self._core.replay_plan(fn, wait))

    def _replay_pending_plan(
        self,
        fn: Callable[[OperationContext], Any],
        operation_type: str | None,
        limit: int | None,
        max_per_second: float | None,
        *,
        wait: float | None,
        on_result: Callable[[ReplayResult], object] | None,
        requeued_only: bool,
    ) -> Plan[ReplaySummary]:
        return self.dlq.ops.replay_pending_steps(
            operation_type, limit, max_per_second, self._core.replay_plan(fn, wait),
            on_result, requeued_only=requeued_only,
        )

    def _replay_requeued_plan(
        self,
        handlers: Mapping[str, Callable[[OperationContext], Any]],
        limit: int | None,
        max_per_second: float | None,
        wait: float | None,
        on_result: Callable[[ReplayResult], object] | None,
    ) -> Plan[ReplaySummary]:
        return self.dlq.ops.replay_requeued_steps(
            {op: self._core.replay_plan(fn, wait) for op, fn in handlers.items()},
            limit, max_per_second, on_result,
        )

    def _stats_plan(self) -> Plan[LayerStats]:
        """This process's waiting counts sent, then the fleet's totals read."""
        yield from self._core.flush_plan()
        return self._core.decode_stats_reply((yield self._core.stats_call()))


LEASE_SOCKET_TIMEOUTS = 6
"""On Cluster, the lease a hung node leaves the claims on healthy nodes, in socket
timeouts (docs/layer.md, "Orphans": a keep-alive tick may wait that long)."""


def _check_lease(store: Any, cfg: DurabilityConfig) -> None:
    """Warn when, on Cluster, the lease is shorter than LEASE_SOCKET_TIMEOUTS socket
    timeouts: one hung node could then hold the keep-alive's renewals of claims on
    healthy nodes past their lease, and a live operation could be taken over."""
    timeout = getattr(store, "socket_timeout", None)
    lease = float(cfg.idempotency.in_progress_ttl_seconds)
    if store.is_cluster and timeout and lease < LEASE_SOCKET_TIMEOUTS * timeout:
        _log.warning(
            "durability_lease_short_for_socket_timeout", lease_seconds=lease,
            socket_timeout=timeout, at_least=LEASE_SOCKET_TIMEOUTS * timeout,
            why="a hung Cluster node can hold renewals of healthy claims this long",
        )


def _counts_not_sent(exc: BaseException) -> None:
    _log.warning("durability_counts_not_sent", error=f"{type(exc).__name__}: {exc}")

