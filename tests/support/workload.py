"""A load of idempotent operations run by real worker processes through faults.

Every worker walks the SAME list of operations (so each one is raced by all
workers) and runs the standard pattern for each::

    claim = guard.check_and_record(op)      # New for exactly one caller
    if New: work, log the side effect (tests.support.effects), record(op, result, token)

A ``StorageUnavailable`` is timed and noted, and the step is tried again later
(a claim whose reply was lost shows up as "in progress" until its lease ends,
then someone takes it over; a record is retried with its token). Anything else
escaping is noted as unexpected. The worker stops when every operation is
done, or at its deadline, and reports what it saw.

Workers run the sync guard, or the async guard through :class:`AsyncGuardFacade`
(same loop, asyncio client underneath).

:func:`run_layer_ops` is the same load through the composed layer
(``run_load(..., worker=run_layer_ops)``): every operation goes through all five
pillars (claim, breaker, retry budget, checkpoint on success; operations named
``...~fails`` always fail, are retried and parked in the DLQ by the one worker
that owns them). The layer cannot re-send a lost record the way the guard's
workers do: an operation whose ``execute`` raised ``StorageUnavailable`` after
its ``fn`` ran is "unrecorded", and ONE re-run of it is allowed per such
outcome (the documented contract: the downstream dedups on the forwarded key).
:func:`layer_outcomes` then checks every pillar's records.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.backoff import NoBackoff
from redis.retry import Retry

import durabilis
from durabilis import (
    CircuitBreakerConfig,
    IdempotencyConfig,
    IdempotencyKey,
    OperationError,
    OperationInProgress,
    OutcomeUnrecorded,
    RetryExhausted,
    RetryPolicy,
    StorageUnavailable,
)
from durabilis.errors import CheckpointNotFound, LeaseLost
from durabilis.idempotency import Duplicate
from durabilis.layer import AsyncDurabilityLayer, DurabilityConfig, DurabilityLayer
from durabilis.retry import RetryBudget
from tests.support.backends import is_cluster_url, raw_client
from tests.support.effects import EffectLog

T = TypeVar("T")


@dataclass
class LoadOptions:
    """How a worker behaves.

    Attributes:
        socket_timeout: The client's socket (and connect) timeout, seconds.
        lease_s: ``in_progress_ttl_seconds``: must outlast the fault, or a
            claim held across it may be taken over (a legitimate double).
        work_s: Time an operation "works" between its claim and its record.
        deadline_s: The worker gives up (reporting what is unfinished) after this.
        hot: An operation every worker also claims between any two others, and
            keeps claiming until the fault is over (so the load spans the fault).
        flavour: ``"sync"`` or ``"async"`` guard (or layer).
        workers: How many workers share the load (set by :func:`run_load`).
    """

    socket_timeout: float = 0.5
    lease_s: float = 4.0
    work_s: float = 0.002
    deadline_s: float = 30.0
    hot: str | None = None
    flavour: str = "sync"
    workers: int = 1


@dataclass
class WorkerReport:
    """What one worker saw (pickled back to the test)."""

    me: int
    flavour: str = "sync"
    executed: list[str] = field(default_factory=list)
    executed_at: list[float] = field(default_factory=list)  # monotonic, one per executed
    completed: dict[str, str] = field(default_factory=dict)  # op -> token recorded
    unavailable: list[tuple[float, float]] = field(default_factory=list)  # (start, end)
    unexpected: list[str] = field(default_factory=list)
    lease_lost: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    parked: dict[str, str] = field(default_factory=dict)  # op -> dlq_id (layer)
    unrecorded: list[str] = field(default_factory=list)  # ran, then StorageUnavailable (layer)
    calls: int = 0
    finished_at: float = 0.0  # monotonic (system-wide on Linux)

    @property
    def longest_unavailable(self) -> float:
        return max((end - start for start, end in self.unavailable), default=0.0)


class AsyncGuardFacade:
    """The async guard behind the sync guard's methods (each call runs to completion)."""

    def __init__(self, url: str, namespace: str, config: IdempotencyConfig, **opts: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = durabilis.aio.connect(url, namespace=namespace, **opts)
        self.guard = durabilis.aio.IdempotencyGuard(self.store, config)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def check_and_record(self, key: str, placeholder: Any = None) -> Any:
        return self._run(self.guard.check_and_record(key, placeholder))

    def record(self, key: str, result: Any, token: str | None = None) -> None:
        self._run(self.guard.record(key, result, token))

    def check(self, key: str) -> Any:
        return self._run(self.guard.check(key))

    def close(self) -> None:
        self._run(self.store.close())
        self.loop.close()


class _SyncGuard:
    def __init__(self, url: str, namespace: str, config: IdempotencyConfig, **opts: Any) -> None:
        self.store = durabilis.connect(url, namespace=namespace, **opts)
        self.guard = durabilis.idempotency.IdempotencyGuard(self.store, config)
        self.check_and_record = self.guard.check_and_record
        self.record = self.guard.record
        self.check = self.guard.check

    def close(self) -> None:
        self.store.close()


_UNAVAILABLE = object()
NO_RETRY: dict[str, Any] = {"retry": Retry(NoBackoff(), 0)}


def run_idempotent_ops(
    url: str,
    effects_url: str,
    namespace: str,
    ops: list[str],
    me: int,
    opts: LoadOptions,
    start: Any,
    fault_over: Any,
    out: Any,
) -> None:
    """Worker process entry point: run ``ops`` and put a :class:`WorkerReport` on ``out``.

    With a hot key, the worker keeps claiming it until ``fault_over`` is set,
    so the faulted slot is under load for the whole fault.
    """
    report = WorkerReport(me=me, flavour=opts.flavour)
    config = IdempotencyConfig(in_progress_ttl_seconds=opts.lease_s)
    timeouts = {"socket_timeout": opts.socket_timeout,
                "socket_connect_timeout": opts.socket_timeout}
    guard: Any = (AsyncGuardFacade if opts.flavour == "async" else _SyncGuard)(
        url, namespace, config, **timeouts
    )
    effects = EffectLog(
        raw_client(effects_url, **timeouts, **({} if is_cluster_url(effects_url) else NO_RETRY)),
        namespace,
    )
    start.wait(timeout=60)
    deadline = time.monotonic() + opts.deadline_s

    def call(fn: Callable[[], T]) -> T | object:
        report.calls += 1
        began = time.monotonic()
        try:
            return fn()
        except StorageUnavailable:
            report.unavailable.append((began, time.monotonic()))
            return _UNAVAILABLE

    def attempt(op: str) -> bool:
        """One try at ``op``; True when it is done (by anyone)."""
        claim = call(lambda: guard.check_and_record(op, placeholder=me))
        if claim is _UNAVAILABLE:
            return False
        if isinstance(claim, Duplicate):
            return not claim.in_progress
        token = claim.token
        report.executed.append(op)
        report.executed_at.append(time.monotonic())
        time.sleep(opts.work_s)
        effects.executed(op, f"{me}:{token}", deadline=deadline)
        while time.monotonic() < deadline:  # the token makes a retried record harmless
            try:
                done = call(lambda: guard.record(op, {"by": me, "token": token}, token=token))
            except LeaseLost:
                report.lease_lost.append(op)
                return True
            if done is not _UNAVAILABLE:
                report.completed[op] = token
                return True
            time.sleep(0.02)
        return False

    try:
        _work_through(ops, attempt, report, opts, fault_over, deadline)
    finally:
        report.finished_at = time.monotonic()
        guard.close()
        effects.client.close()
        out.put(report)


def _work_through(
    ops: list[str],
    attempt: Callable[[str], bool],
    report: WorkerReport,
    opts: LoadOptions,
    fault_over: Any,
    deadline: float,
) -> None:
    """Try every op until done (``attempt`` True), the hot one until the fault is over."""
    pending = deque(ops)
    hot_done = opts.hot is None

    def busy() -> bool:
        hot_still = opts.hot is not None and not fault_over.is_set()
        return bool(pending) or not hot_done or hot_still

    while busy() and time.monotonic() < deadline:
        progressed = False
        if opts.hot is not None:  # claimed again and again: a duplicate once done
            try:
                hot_done = attempt(opts.hot) or hot_done
            except Exception as exc:
                report.unexpected.append(f"{type(exc).__name__}: {exc}")
        for _ in range(len(pending)):
            op = pending.popleft()
            try:
                if attempt(op):
                    progressed = True
                    break
            except Exception as exc:
                report.unexpected.append(f"{type(exc).__name__}: {exc}")
            pending.append(op)  # in progress elsewhere, or unavailable: later
        if not progressed:
            time.sleep(0.02)
    report.unfinished = list(pending) + ([] if hot_done else [str(opts.hot)])


# --- the same load through the composed layer ------------------------------------------

FAILS = "~fails"
"""Operations whose name ends with this always fail: retried, then parked in the DLQ."""
LAYER_OP = "fault_job"
LAYER_BREAKER = "fault_dependency"
LAYER_AGENT = "fault-agent"


def layer_config(lease_s: float) -> DurabilityConfig:
    """Every pillar in play: claim, breaker, fleet-wide retry budget, checkpoints, DLQ.

    The breaker sees every call but never trips (a failure rate cannot be above 1.0)
    and the budget never denies: the faults, not the failing operations, are on trial.
    """
    return DurabilityConfig(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=lease_s),
        retry_policies=(
            RetryPolicy(LAYER_OP, 3, 1, 2, 2.0, False, ("NETWORK_TIMEOUT",), (),
                        budget=RetryBudget(ratio=100.0, min_retries=100_000)),
        ),
        breakers=(CircuitBreakerConfig(LAYER_BREAKER, 1.0, 1000, 1, 1, 1000, 1),),
        dependencies={LAYER_OP: LAYER_BREAKER},
    )


def task_of(op: str) -> str:
    """The checkpoint task an operation saves its result to."""
    return f"task-{op}"


def owner_of(op: str, workers: int) -> int:
    """The one worker that runs an operation that always fails (the others skip it).

    A parked operation's claim is released, so another worker would run it again
    as a NEW call (a legitimate second DLQ record): one owner keeps the count exact.
    """
    return zlib.crc32(op.encode()) % workers


class _SyncLayer:
    def __init__(self, url: str, namespace: str, config: DurabilityConfig, **opts: Any) -> None:
        self.store = durabilis.connect(url, namespace=namespace, **opts)
        self.layer = DurabilityLayer(self.store, config)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self.layer.execute(*args, **kwargs)

    def close(self) -> None:
        self.layer.close()
        self.store.close()


class AsyncLayerFacade:
    """The async layer behind the sync layer's ``execute`` (``fn`` stays a plain function)."""

    def __init__(self, url: str, namespace: str, config: DurabilityConfig, **opts: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = durabilis.aio.connect(url, namespace=namespace, **opts)
        self.layer = AsyncDurabilityLayer(self.store, config)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self.loop.run_until_complete(self.layer.execute(*args, **kwargs))

    def close(self) -> None:
        self.loop.run_until_complete(self.layer.close())
        self.loop.run_until_complete(self.store.close())
        self.loop.close()


def run_layer_ops(
    url: str,
    effects_url: str,
    namespace: str,
    ops: list[str],
    me: int,
    opts: LoadOptions,
    start: Any,
    fault_over: Any,
    out: Any,
) -> None:
    """Worker process entry point: run ``ops`` through the layer; put a :class:`WorkerReport`.

    Each op is ``layer.execute(..., idempotency_key=op, task_id=task_of(op), phase="done")``;
    its ``fn`` logs the side effect (execution id ``<worker>:<claim token>``) and
    returns ``{"by", "token"}``. Done: a result (own or a duplicate's), or parked
    (``RetryExhausted``); tried again later: ``OperationInProgress``, ``StorageUnavailable``.
    """
    report = WorkerReport(me=me, flavour=opts.flavour)
    timeouts = {"socket_timeout": opts.socket_timeout,
                "socket_connect_timeout": opts.socket_timeout}
    layer: Any = (AsyncLayerFacade if opts.flavour == "async" else _SyncLayer)(
        url, namespace, layer_config(opts.lease_s), **timeouts
    )
    effects = EffectLog(
        raw_client(effects_url, **timeouts, **({} if is_cluster_url(effects_url) else NO_RETRY)),
        namespace,
    )
    start.wait(timeout=60)
    deadline = time.monotonic() + opts.deadline_s
    mine = [op for op in ops if not op.endswith(FAILS) or owner_of(op, opts.workers) == me]

    def attempt(op: str) -> bool:
        """One ``execute`` of ``op``; True when it is done (by anyone) or parked."""
        ran: list[str] = []

        def fn(ctx: Any) -> dict[str, Any]:
            ran.append(str(ctx.token))
            if op.endswith(FAILS):
                raise OperationError("NETWORK_TIMEOUT", "this dependency call always fails")
            report.executed.append(op)
            report.executed_at.append(time.monotonic())
            time.sleep(opts.work_s)
            effects.executed(op, f"{me}:{ctx.token}", deadline=deadline)
            return {"by": me, "token": str(ctx.token)}

        report.calls += 1
        began = time.monotonic()
        try:
            result = layer.execute(LAYER_AGENT, LAYER_OP, {"op": op}, fn, idempotency_key=op,
                                   task_id=task_of(op), phase="done")
        except StorageUnavailable:
            report.unavailable.append((began, time.monotonic()))
            if ran:  # its record (or its park) may not have been written: may run again
                report.unrecorded.append(op)
            return False
        except OutcomeUnrecorded:  # it ran; Redis did not take the outcome within the lease
            report.unavailable.append((began, time.monotonic()))
            report.unrecorded.append(op)
            return False
        except OperationInProgress:
            return False
        except RetryExhausted as exc:
            report.parked[op] = str(exc.dlq_id)
            return True
        except LeaseLost:
            report.lease_lost.append(op)
            return True
        if ran and isinstance(result, dict) and result.get("token") == ran[-1]:
            report.completed[op] = ran[-1]
        return True

    try:
        _work_through(mine, attempt, report, opts, fault_over, deadline)
    finally:
        report.finished_at = time.monotonic()
        layer.close()
        effects.client.close()
        out.put(report)


@dataclass
class LoadResult:
    """Everything a fault test asserts on."""

    ops: list[str]
    reports: list[WorkerReport]
    counts: dict[str, int]  # executions per op, from the effect log in Redis
    fault_window: tuple[float, float]  # monotonic start/end of the injected fault

    @property
    def executed_locally(self) -> dict[str, int]:
        """Executions per op as the workers saw them (independent of Redis)."""
        seen: dict[str, int] = {}
        for r in self.reports:
            for op in r.executed:
                seen[op] = seen.get(op, 0) + 1
        return seen

    @property
    def allowed_reruns(self) -> Counter[str]:
        """Re-runs the layer's contract allows: one per outcome that was never recorded."""
        return Counter(op for r in self.reports for op in r.unrecorded)

    @property
    def reruns(self) -> int:
        """Executions beyond the first of every operation (all of them allowed, or doubled)."""
        return sum(max(0, n - 1) for n in self.executed_locally.values())

    @property
    def doubled(self) -> list[str]:
        both = (self.counts, self.executed_locally)
        allowed = self.allowed_reruns
        return sorted({op for c in both for op, n in c.items() if n > 1 + allowed[op]})

    @property
    def lost(self) -> list[str]:
        """Operations that never ran (those that always fail are checked in the DLQ)."""
        return sorted(op for op in self.ops if not op.endswith(FAILS) and (
            self.counts.get(op, 0) == 0 or self.executed_locally.get(op, 0) == 0))

    @property
    def parked(self) -> dict[str, str]:
        """op -> dlq_id of every park a worker was told about (``RetryExhausted``)."""
        return {op: dlq for r in self.reports for op, dlq in r.parked.items()}

    @property
    def spanned_the_fault(self) -> bool:
        """Every worker was still working when the fault ended."""
        return min(r.finished_at for r in self.reports) > self.fault_window[1]

    @property
    def executed_during_fault(self) -> int:
        """Operations that ran (won their claim) while the fault was going on."""
        began, ended = self.fault_window
        return sum(began <= t <= ended for r in self.reports for t in r.executed_at)

    @property
    def unavailable(self) -> list[tuple[float, float]]:
        return sorted(span for r in self.reports for span in r.unavailable)

    def assert_bounded_burst(self, recovery_s: float) -> None:
        """``StorageUnavailable`` only around the fault, and no worker spinning on it.

        A refused call is not instant: redis-py follows the ASK/TRYAGAIN
        redirects of a migrating slot until its redirect TTL runs out (10-20 ms
        with redis-py 8.2 here; ~40-70 ms was measured with older ones), a
        failover is a socket timeout. A worker may see ten, plus one per 5 ms of
        the fault; one spinning on instant errors (a layer retrying storage
        errors in a tight loop, well under a millisecond each) would see
        thousands. Every error starts between 1 s before the fault and
        ``recovery_s`` after it: then normal service.
        """
        began, ended = self.fault_window
        allowed = 10 + int((ended - began) / 0.005)
        for report in self.reports:
            assert len(report.unavailable) <= allowed, f"> {allowed}: " + self.summary()
        for start, _ in self.unavailable:
            assert began - 1.0 <= start <= ended + recovery_s, self.summary()

    @property
    def unexpected(self) -> list[str]:
        return [u for r in self.reports for u in r.unexpected]

    @property
    def unfinished(self) -> list[str]:
        return sorted({u for r in self.reports for u in r.unfinished})

    @property
    def lease_lost(self) -> list[str]:
        return [u for r in self.reports for u in r.lease_lost]

    @property
    def completed(self) -> dict[str, str]:
        """op -> token of the record its executor stored."""
        return {op: tok for r in self.reports for op, tok in r.completed.items()}

    def summary(self) -> str:
        spans = self.unavailable
        longest = max((e - s for s, e in spans), default=0.0)
        took = max(r.finished_at for r in self.reports) - self.fault_window[0]
        return (f"{len(self.ops)} ops, {sum(r.calls for r in self.reports)} calls, "
                f"{self.executed_during_fault} ran during the fault, "
                f"done {took:.2f}s after the fault began, "
                f"{len(spans)} StorageUnavailable (longest {longest:.2f}s), "
                f"doubled={self.doubled}, lost={self.lost}, unfinished={self.unfinished}, "
                f"unexpected={self.unexpected[:3]}, lease_lost={self.lease_lost}")


def run_load(
    url: str,
    namespace: str,
    ops: list[str],
    fault: Callable[[], None],
    *,
    flavours: tuple[str, ...] = ("sync", "sync", "async"),
    fault_after_s: float = 0.3,
    effects_url: str | None = None,
    worker: Callable[..., None] | None = None,
    **options: Any,
) -> LoadResult:
    """Run ``ops`` on one worker process per flavour; call ``fault()`` mid-load.

    ``fault`` runs in the test process ``fault_after_s`` after every worker is
    connected, while they work; it returns when the fault is over (e.g. after
    SIGCONT). Then the workers are waited for (each stops by its own deadline).
    Side effects are logged at ``effects_url`` (default ``url``): a server
    the fault does not touch keeps the count exact and the workers busy with
    the guard, not with the log. ``worker`` is the process entry point
    (default :func:`run_idempotent_ops`; :func:`run_layer_ops` for the layer).
    """
    effects_url = effects_url or url
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(len(flavours) + 1)
    fault_over = ctx.Event()
    out = ctx.Queue()
    procs = []
    for me, flavour in enumerate(flavours):
        opts = LoadOptions(flavour=flavour, workers=len(flavours), **options)
        procs.append(ctx.Process(target=worker or run_idempotent_ops,
                                 args=(url, effects_url, namespace, ops, me, opts, start,
                                       fault_over, out)))
    for p in procs:
        p.start()
    try:
        start.wait(timeout=60)
        time.sleep(fault_after_s)
        began = time.monotonic()
        try:
            fault()
        finally:
            fault_over.set()
        window = (began, time.monotonic())
        limit = LoadOptions(**options).deadline_s + 30
        reports = [out.get(timeout=limit) for _ in procs]
        for p in procs:
            p.join(timeout=10)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    client = raw_client(effects_url)
    try:
        counts = dict(EffectLog(client, namespace).counts())
    finally:
        client.close()
    every = sorted({*ops, *([options["hot"]] if options.get("hot") else [])})
    return LoadResult(every, sorted(reports, key=lambda r: r.me), counts, window)


def stored_records_disagreeing(url: str, namespace: str, result: LoadResult) -> list[str]:
    """Ops whose stored record is not done with the result its one executor recorded."""
    store = durabilis.connect(url, namespace=namespace)
    try:
        guard = durabilis.idempotency.IdempotencyGuard(store)
        bad = []
        completed = result.completed
        for op in result.ops:
            dup = guard.check(op)
            ok = (dup is not None and not dup.in_progress
                  and isinstance(dup.original_result, dict)
                  and dup.original_result.get("token") == completed.get(op))
            if not ok:
                bad.append(op)
        return bad
    finally:
        store.close()


def layer_outcomes(url: str, namespace: str, result: LoadResult,
                   effects_url: str | None = None) -> dict[str, list[str]]:
    """What every pillar holds for a layer load, as lists of problems (all empty: all well).

    - ``record_lost``: an operation without a completed idempotency record, or whose
      record is not the one its caller was told about (a completed record lost and
      re-made), or not from one of its executions;
    - ``ran_after_record``: the stored record is not from the op's LAST execution
      (it ran again after its result was recorded: doubled);
    - ``checkpoint_lost``: no checkpoint for the op's task, or not the recorded result;
    - ``dlq_lost``: a parked op (``dlq_id`` given to its caller) no longer in the DLQ,
      or an always-failing op with no DLQ record at all;
    - ``dlq_doubled``: an always-failing op with more DLQ records than one plus its
      unrecorded outcomes.
    """
    problems: dict[str, list[str]] = {k: [] for k in (
        "record_lost", "ran_after_record", "checkpoint_lost", "dlq_lost", "dlq_doubled")}
    client = raw_client(effects_url or url)
    try:
        runs = EffectLog(client, namespace).executions()
    finally:
        client.close()
    acked = result.completed
    allowed = result.allowed_reruns
    with durabilis.connect(url, namespace=namespace) as store:
        layer = DurabilityLayer(store, layer_config(60.0))
        try:
            records, _ = layer.dlq.list_all()
            dlq_ops = Counter(str((r.metadata or {}).get("idempotency_key")) for r in records)
            for op in result.ops:
                key = stored_key(op)  # as the layer stores a caller's key
                if op.endswith(FAILS):
                    if dlq_ops[key] == 0:
                        problems["dlq_lost"].append(op)
                    elif dlq_ops[key] > 1 + allowed[op]:
                        problems["dlq_doubled"].append(f"{op} x{dlq_ops[key]}")
                    continue
                seen = layer.idempotency.check(key)
                stored = seen.original_result if seen is not None else None
                token = stored.get("token") if isinstance(stored, dict) else None
                tokens = sorted(runs.get(op, []), key=int)
                if (seen is None or seen.in_progress or token not in tokens
                        or (op in acked and acked[op] != token)):
                    problems["record_lost"].append(op)
                    continue
                if token != tokens[-1]:
                    problems["ran_after_record"].append(op)
                try:
                    cp = layer.checkpoints.restore(task_of(op), LAYER_AGENT, "done")
                    if cp.state != stored:
                        problems["checkpoint_lost"].append(f"{op}: {cp.state} != {stored}")
                except CheckpointNotFound:
                    problems["checkpoint_lost"].append(op)
            for op, dlq_id in result.parked.items():
                if layer.dlq.get(dlq_id) is None:
                    problems["dlq_lost"].append(f"{op} ({dlq_id})")
        finally:
            layer.close()
    return problems


def stored_key(op: str) -> str:
    """The idempotency key the layer stores for op's caller-supplied key."""
    return IdempotencyKey.caller(LAYER_AGENT, op, {"op": op}).value


LOSS_KINDS = ("lost", "record_lost", "checkpoint_lost", "dlq_lost")
DOUBLE_KINDS = ("doubled", "ran_after_record", "dlq_doubled")


def layer_load_problems(url: str, namespace: str, result: LoadResult,
                        effects_url: str | None = None) -> dict[str, list[str]]:
    """Everything that went wrong in a layer load (every list empty: nothing did).

    The workers' view (unexpected errors, unfinished or lost operations, doubles
    beyond the allowed re-runs, lease lost) plus :func:`layer_outcomes`.
    """
    problems = {
        "unexpected": result.unexpected,
        "unfinished": result.unfinished,
        "lease_lost": result.lease_lost,
        "lost": result.lost,
        "doubled": result.doubled,
    }
    problems.update(layer_outcomes(url, namespace, result, effects_url))
    return problems
