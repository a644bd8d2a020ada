"""The composed layer: one durable operation through all five pillars.

``layer.execute(agent_id, operation_type, payload, fn)``:

1. claims the idempotency key (the claim holds the payload, so a crash can
   be recovered) and asks the dependency's breaker, in ONE round trip; a
   completed duplicate returns the stored result without calling ``fn``;
2. runs ``fn(ctx)`` under the operation type's retry policy, asking the
   breaker before and reporting to it after every attempt;
3. on success records the result, reports to the breaker and (with
   ``task_id``/``phase``) saves the checkpoint, in ONE round trip;
4. when retries run out (or the breaker opens mid-way) parks the operation in
   the DLQ, releases the claim so a replay can run, and raises
   :class:`~durabilis.RetryExhausted`; a non-retryable error releases the claim
   and is raised as is.

The logic is written once, as a generator of steps (I/O, run ``fn``, sleep);
the sync and async layers only drive it. On standalone Redis the scripts of a
step are fused into one Lua script (``Store.run_fused``): the happy path is
exactly two round trips.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import structlog

from durabilis import _codec
from durabilis._retry_core import NON_RETRYABLE, TESTING, RetryDecision, decide
from durabilis._scripts import ScriptCall
from durabilis._store import AsyncStore, Store
from durabilis.breaker import (
    AsyncCircuitBreakerRegistry,
    CircuitBreakerConfig,
    CircuitBreakerRegistry,
    Permit,
)
from durabilis.checkpoint import (
    AsyncCheckpointManager,
    Checkpoint,
    CheckpointConfig,
    CheckpointManager,
)
from durabilis.dlq import AsyncDeadLetterQueue, DeadLetterQueue, DlqConfig, DlqRecord
from durabilis.errors import (
    CircuitOpen,
    ConfigError,
    CorruptData,
    DurabilisError,
    LeaseLost,
    OperationInProgress,
    RetryExhausted,
)
from durabilis.idempotency import (
    AsyncIdempotencyGuard,
    Duplicate,
    IdempotencyConfig,
    IdempotencyGuard,
    IdempotencyKey,
    New,
)
from durabilis.retry import (
    AsyncRetryEngine,
    RetryEngine,
    RetryPolicy,
    _BudgetOps,
    emit_retry_attempt,
    emit_retry_stop,
)

__all__ = [
    "DEFAULT_DEPENDENCIES",
    "AsyncDurabilityLayer",
    "DurabilityConfig",
    "DurabilityLayer",
    "LayerStats",
    "OperationContext",
    "current_operation",
]

_log = structlog.get_logger("durabilis")

T = TypeVar("T")

DEFAULT_DEPENDENCIES: Mapping[str, str] = MappingProxyType(
    {
        "mcp_call": "external_mcp_client",
        "memory_write": "memory_service",
        "wiki_write": "wiki_service",
    }
)
"""Which breaker guards which operation type by default (the seed's three breakers)."""

WORKER_LOST = "WORKER_LOST"
"""``last_error`` of an operation whose worker died mid-flight (``recover_orphans``)."""

CIRCUIT_OPEN = "CIRCUIT_OPEN"
"""``final_error`` of an operation parked because its breaker was open."""


# --- configuration -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DurabilityConfig:
    """The five pillars' settings, and which breaker guards which operation type.

    Attributes:
        idempotency: Dedup window, key limits and the claim's lease
            (``in_progress_ttl_seconds``: how long after a worker's death its
            operation can be recovered; a live worker renews it).
        retry_policies: The retry policies; ``None``: the seed's five.
        breakers: The breakers; ``None``: the seed's three.
        checkpoint: Checkpoint settings.
        dlq: Dead-letter queue settings.
        dependencies: Operation type -> breaker name (``execute(dependency=…)``
            overrides it); types not listed run without a breaker.
        renew_every_seconds: How often a live worker renews its leases;
            ``None``: a third of the lease.
    """

    idempotency: IdempotencyConfig = field(
        default_factory=lambda: IdempotencyConfig(in_progress_ttl_seconds=30)
    )
    retry_policies: tuple[RetryPolicy, ...] | None = None
    breakers: tuple[CircuitBreakerConfig, ...] | None = None
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dlq: DlqConfig = field(default_factory=DlqConfig)
    dependencies: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_DEPENDENCIES))
    renew_every_seconds: float | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ``ConfigError`` naming the first invalid field."""
        checks: tuple[tuple[str, object, type], ...] = (
            ("idempotency", self.idempotency, IdempotencyConfig),
            ("checkpoint", self.checkpoint, CheckpointConfig),
            ("dlq", self.dlq, DlqConfig),
        )
        for name, value, kind in checks:
            if not isinstance(value, kind):
                raise ConfigError(name, f"must be a {kind.__name__}, got {type(value).__name__}")
        if not isinstance(self.dependencies, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v
            for k, v in self.dependencies.items()
        ):
            raise ConfigError("dependencies", "must map operation types to breaker names (str)")
        renew = self.renew_every_seconds
        if renew is not None and (
            isinstance(renew, bool)
            or not isinstance(renew, (int, float))
            or not 0 < renew < self.idempotency.in_progress_ttl_seconds
        ):
            raise ConfigError(
                "renew_every_seconds",
                "must be > 0 and shorter than idempotency.in_progress_ttl_seconds",
            )

    @property
    def renew_interval(self) -> float:
        return self.renew_every_seconds or self.idempotency.in_progress_ttl_seconds / 3.0

    @classmethod
    def from_toml(
        cls, path: str | Path | None, *, environ: Mapping[str, str] | None = None
    ) -> DurabilityConfig:
        """Load a TOML file in the seed's layout, with environment overrides.

        See :func:`durabilis.config.load_config` (``docs/production.md``).

        Raises:
            ConfigFileError: Naming the file (or variable), section and field.
        """
        from durabilis.config import load_config  # noqa: PLC0415  (config imports this module)

        return load_config(path, environ=environ)


# --- what fn sees ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OperationContext:
    """What an operation is handed: forward ``idempotency_key`` and ``token`` downstream.

    A downstream that dedups on ``idempotency_key`` (and, to fence stale
    writers, refuses a ``token`` lower than one it has seen) makes even the
    rare re-run after a crash between its side effect and our record harmless.

    Attributes:
        agent_id: Who runs it.
        operation_type: Its type (selects the retry policy).
        payload: The operation's payload.
        idempotency_key: The key claimed for it.
        token: The claim's fencing token (``None`` with idempotency disabled);
            tokens of successive claims of one key increase.
        attempt: 0-based attempt number.
        dependency: The breaker guarding it, if any.
        task_id: The checkpointed task, if any.
        phase: The checkpoint phase, if any.
        replay: The operation runs from a DLQ replay.
    """

    agent_id: str
    operation_type: str
    payload: Any
    idempotency_key: str
    token: str | None
    attempt: int
    dependency: str | None = None
    task_id: str | None = None
    phase: str | None = None
    replay: bool = False


_CURRENT: contextvars.ContextVar[OperationContext | None] = contextvars.ContextVar(
    "durabilis_current_operation", default=None
)


def current_operation() -> OperationContext | None:
    """The context of the durable operation running now (inside ``@layer.durable`` functions)."""
    return _CURRENT.get()


@dataclass(frozen=True, slots=True)
class LayerStats:
    """Fleet-wide totals kept in Redis by every layer of the namespace.

    Attributes:
        started: Operations that won their claim and ran.
        succeeded: Operations whose result was recorded.
        duplicates: Calls answered from a stored result or refused as in progress.
        retries: Retries made (attempts after the first).
        parked: Operations parked in the DLQ (exhausted, circuit open, recovered).
        non_retryable: Operations stopped by a non-retryable error.
        recovered: Orphans (dead workers) moved to the DLQ by ``recover_orphans``.
        in_flight: Operations holding a claim now (including dead ones not yet recovered).
    """

    started: int = 0
    succeeded: int = 0
    duplicates: int = 0
    retries: int = 0
    parked: int = 0
    non_retryable: int = 0
    recovered: int = 0
    in_flight: int = 0


# --- the steps the drivers perform ------------------------------------------------


@dataclass(frozen=True, slots=True)
class _IO:
    calls: Sequence[ScriptCall]


@dataclass(frozen=True, slots=True)
class _Run:
    ctx: OperationContext


@dataclass(frozen=True, slots=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class _Hold:
    """Start renewing this claim's lease (until the plan ends)."""

    key: str
    token: str


Plan = Generator[Any, Any, T]


@dataclass(frozen=True, slots=True)
class _Request:
    agent_id: str
    operation_type: str
    payload: Any
    key: IdempotencyKey
    dependency: str | None
    task_id: str | None
    phase: str | None
    wait: float | None
    park_on_open: bool
    deadline: float | None
    replay: bool


def _dlq_id_for(key: str, claimed_ms: int) -> str:
    """One DLQ id per claim: two replicas parking the same claim write one record."""
    return hashlib.sha256(f"{key}\x00{claimed_ms}".encode()).hexdigest()[:32]


class _LayerCore:
    """The whole logic of the layer, as plans of steps. No I/O here."""

    def __init__(  # noqa: PLR0917  (the pillars, built by the twins)
        self,
        store: Store | AsyncStore,
        config: DurabilityConfig,
        idem_ops: Any,
        retry: RetryEngine | AsyncRetryEngine,
        breakers: CircuitBreakerRegistry | AsyncCircuitBreakerRegistry,
        checkpoint_ops: Any,
        dlq_ops: Any,
    ) -> None:
        self.config = config
        self._keys = store.keys
        self._idem = idem_ops
        self._retry = retry
        self._breakers = breakers
        self._ckpt = checkpoint_ops
        self._dlq = dlq_ops
        self._budget = _BudgetOps(store.keys)
        self._index = store.keys.layer("inflight")
        self._stats = store.keys.layer("stats")
        self._lease_ms = max(1, int(config.idempotency.in_progress_ttl_seconds * 1000))

    # -- request building (validation before any I/O) --

    def request(
        self,
        agent_id: str,
        operation_type: str,
        payload: Any,
        *,
        dependency: str | None,
        idempotency_key: IdempotencyKey | str | None,
        task_id: str | None,
        phase: str | None,
        wait: float | None,
        park_on_open: bool,
        deadline_seconds: float | None,
        replay: bool = False,
    ) -> _Request:
        key = self._idem.validate_key(
            IdempotencyKey.new(agent_id, operation_type, payload)
            if idempotency_key is None
            else idempotency_key
        )
        dep = dependency if dependency is not None else self.config.dependencies.get(
            operation_type
        )
        if dep is not None:
            self._breakers.ops.entry(dep)  # DependencyNotFound before any I/O
        if (task_id is None) != (phase is None):
            raise ConfigError("phase", "task_id and phase go together")
        for name, seconds in (("wait", wait), ("deadline_seconds", deadline_seconds)):
            if seconds is not None and (
                isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                or not 0 <= seconds < float("inf") or (name == "deadline_seconds" and not seconds)
            ):
                raise ConfigError(name, f"must be a finite number of seconds, got {seconds!r}")
        return _Request(
            agent_id, operation_type, payload, key, dep, task_id, phase, wait,
            park_on_open, deadline_seconds, replay,
        )

    # -- small call builders --

    def _note(self, mode: str, member: str | bytes = "", **counts: int) -> ScriptCall:
        args: list[Any] = [mode, member, self._lease_ms]
        for name, n in counts.items():
            if n:
                args += [name, n]
        return ScriptCall("layer_note", [self._index, self._stats], args)

    def _envelope(self, req: _Request) -> bytes:
        return bytes(self._idem.pack_value(
            {
                "agent_id": req.agent_id,
                "operation_type": req.operation_type,
                "payload": req.payload,
                "dependency": req.dependency,
                "task_id": req.task_id,
                "phase": req.phase,
            },
            "payload",
        ))

    def _metadata(self, req: _Request, reason: str) -> dict[str, str]:
        meta = {"idempotency_key": req.key.value, "reason": reason}
        for name, value in (
            ("dependency", req.dependency),
            ("task_id", req.task_id),
            ("phase", req.phase),
        ):
            if value:
                meta[name] = value
        return meta

    def _park_calls(
        self, req: _Request, token: str | None, claimed_ms: int, *, attempts: int, error: str,
        reason: str, **counts: int,
    ) -> tuple[list[ScriptCall], str | None]:
        """DLQ enqueue (unless replaying) + claim release + index/counters."""
        calls: list[ScriptCall] = []
        dlq_id = None
        if not req.replay:
            dlq_id = _dlq_id_for(req.key.value, claimed_ms)
            calls.append(
                self._dlq.enqueue(
                    req.agent_id, req.operation_type, req.payload, attempts, error,
                    metadata=self._metadata(req, reason), dlq_id=dlq_id,
                )
            )
        if token:
            calls.append(self._idem.release(req.key, token))
        parked = 0 if req.replay else 1
        calls.append(self._note("rem", req.key.value, parked=parked, **counts))
        return calls, dlq_id

    def _fire(self, transition: Any) -> None:
        if transition is not None:
            self._breakers.fire_transition(transition)

    def _decode_permit(self, dep: str, reply: Any) -> Permit:
        permit, transition = self._breakers.ops.decode_before(dep, reply)
        self._fire(transition)
        return permit

    # -- the durable operation --

    def execute_plan(self, req: _Request) -> Plan[Any]:
        waited_until = None if req.wait is None else time.monotonic() + req.wait
        while True:
            outcome = yield from self._claim_and_run(req, waited_until)
            if outcome is not _CLAIM_AGAIN:
                return outcome

    def _claim_and_run(self, req: _Request, waited_until: float | None) -> Plan[Any]:
        policy = self._retry.get_policy(req.operation_type)
        budget = policy.budget if policy is not None else None
        dep = req.dependency
        dedup = self.config.idempotency.enabled
        # The index entry goes FIRST: on Cluster these scripts run one after
        # another, and a worker killed just after its claim must already be
        # listed for recover_orphans (an entry without a claim is dropped there).
        calls = (
            [self._note("add", req.key.value), self._idem.claim(req.key, None, self._envelope(req))]
            if dedup
            else []
        )
        if dep is not None:
            calls.append(self._breakers.ops.before_call(dep))
        if budget is not None:
            calls.append(self._budget.record_call(req.operation_type, budget))
        # The first use of a breaker in this process lists it for operators.
        register = self._breakers.registration_call(dep) if dep is not None else None
        if register is not None:
            calls.append(register)
        replies: list[Any] = (yield _IO(calls)) if calls else []
        if register is not None and dep is not None:
            self._breakers.mark_registered(dep)
        if dedup:
            replies.pop(0)  # the index note
        claim = self._idem.decode_claim(req.key, replies.pop(0)) if dedup else New(token=None)
        breaker_reply = replies.pop(0) if dep is not None else None
        if budget is not None:
            self._budget.decode(req.operation_type, replies.pop(0))

        if isinstance(claim, Duplicate):
            return (yield from self._duplicate(req, claim, breaker_reply, waited_until))

        token = claim.token
        claimed_ms = round(claim.claimed_at.timestamp() * 1000) if claim.claimed_at else 0
        if token:
            yield _Hold(req.key.value, token)
        permit: Permit | None = None
        if dep is not None:
            try:
                permit = self._decode_permit(dep, breaker_reply)
            except CircuitOpen as exc:
                return (yield from self._refused(req, token, claimed_ms, exc, attempts=0))
        return (yield from self._attempts(req, policy, token, claimed_ms, permit))

    def _duplicate(
        self, req: _Request, dup: Duplicate, breaker_reply: Any, waited_until: float | None
    ) -> Plan[Any]:
        # Our claim step also (re)listed the key as in flight: while the winner
        # runs that entry is its own; once it is done, nobody's.
        done = "none" if dup.in_progress else "rem"
        calls = [self._note(done, req.key.value, duplicates=1)]
        if req.dependency is not None:
            try:
                permit, transition = self._breakers.ops.decode_before(
                    req.dependency, breaker_reply
                )
                self._fire(transition)
                if permit.is_probe:  # we will not call: give the probe slot back
                    calls.append(self._breakers.ops.release(req.dependency, permit))
            except CircuitOpen:
                pass  # a duplicate needs no call: an open breaker does not matter
        yield _IO(calls)
        while dup.in_progress:
            if waited_until is None or time.monotonic() >= waited_until:
                raise OperationInProgress(req.key.value, dup.original_timestamp)
            yield _Sleep(min(0.05, max(0.0, waited_until - time.monotonic())))
            replies = yield _IO([self._idem.check(req.key)])
            seen = self._idem.decode_check(req.key, replies[0])
            if seen is None or seen.lease_expired:
                return _CLAIM_AGAIN  # released or its worker died: claim it ourselves
            dup = seen
            if not dup.in_progress:
                yield _IO([self._note("rem", req.key.value)])
        return dup.original_result

    def _refused(
        self, req: _Request, token: str | None, claimed_ms: int, exc: CircuitOpen, attempts: int
    ) -> Plan[Any]:
        """The breaker refused an attempt: stop (before any attempt) or park."""
        if attempts == 0 and not req.park_on_open:
            calls = [self._idem.release(req.key, token)] if token else []
            calls.append(self._note("rem", req.key.value))
            yield _IO(calls)
            raise exc
        calls, dlq_id = self._park_calls(
            req, token, claimed_ms, attempts=attempts, error=CIRCUIT_OPEN, reason=CIRCUIT_OPEN,
            started=1 if attempts else 0,
        )
        replies = yield _IO(calls)
        if dlq_id is not None:
            self._dlq.decode_enqueue(calls[0], replies[0])
        raise RetryExhausted(req.operation_type, attempts, CIRCUIT_OPEN, dlq_id) from exc

    def _attempts(  # noqa: PLR0912  (the retry loop reads best as one piece)
        self,
        req: _Request,
        policy: RetryPolicy | None,
        token: str | None,
        claimed_ms: int,
        permit: Permit | None,
    ) -> Plan[Any]:
        dep = req.dependency
        budget = policy.budget if policy is not None else None
        deadline = req.deadline
        if deadline is None and policy is not None:
            deadline = policy.deadline_seconds
        start = time.monotonic()
        slept = 0.0
        attempt = 0
        while True:
            if attempt > 0 and dep is not None:
                admit = yield _IO([self._breakers.ops.before_call(dep)])
                try:
                    permit = self._decode_permit(dep, admit[0])
                except CircuitOpen as refused:
                    return (yield from self._refused(req, token, claimed_ms, refused, attempt))
            ctx = OperationContext(
                req.agent_id, req.operation_type, req.payload, req.key.value, token, attempt,
                dep, req.task_id, req.phase, req.replay,
            )
            began = time.perf_counter()
            ok, value = yield _Run(ctx)
            took_ms = (time.perf_counter() - began) * 1000.0
            if ok:
                return (
                    yield from self._succeeded(
                        req, token, permit=permit, result=value, took_ms=took_ms, attempt=attempt
                    )
                )

            exc: BaseException = value
            decision = decide(
                policy, attempt, exc, elapsed=time.monotonic() - start + slept,
                deadline=deadline,
            )
            if decision.stop_reason == NON_RETRYABLE:
                # Not a dependency failure: free a probe slot without a verdict.
                calls = [self._idem.release(req.key, token)] if token else []
                if dep is not None and permit is not None:
                    calls.append(self._breakers.ops.release(dep, permit))
                calls.append(self._note("rem", req.key.value, started=1, non_retryable=1))
                yield _IO(calls)
                emit_retry_stop(
                    req.operation_type, decision, agent_id=req.agent_id,
                    last_error=str(exc) or type(exc).__name__,
                )
                raise exc
            calls = []
            if dep is not None:
                calls.append(self._breakers.ops.after_call(dep, False, permit, took_ms))
            if decision.retry and budget is not None:
                calls.append(self._budget.spend_retry(req.operation_type, budget))
            elif decision.retry:
                calls.append(self._note("none", retries=1))
            replies: list[Any] = (yield _IO(calls)) if calls else []
            if dep is not None:
                self._fire(self._breakers.ops.decode_after(dep, replies[0])[1])
            if decision.retry and budget is not None:
                state = self._budget.decode(req.operation_type, replies[-1])
                if not state.allowed:
                    decision = decision.deny_budget()
                else:
                    yield _IO([self._note("none", retries=1)])
            if not decision.retry:
                return (yield from self._exhausted(req, token, claimed_ms, decision, exc))
            emit_retry_attempt(req.operation_type, decision, agent_id=req.agent_id)
            yield _Sleep(decision.delay)
            slept += decision.delay if TESTING.instant else 0.0
            attempt += 1

    def _succeeded(
        self,
        req: _Request,
        token: str | None,
        *,
        permit: Permit | None,
        result: Any,
        took_ms: float,
        attempt: int,
    ) -> Plan[Any]:
        calls: list[ScriptCall] = []
        save = None
        if req.task_id is not None and req.phase is not None:
            # The checkpoint goes FIRST: on Cluster these scripts run one by one
            # and stop at the first failure. A checkpoint without its record is
            # saved again by the re-run; a record without its checkpoint would
            # never get one (every later call answers from the record).
            save = self._ckpt.save(req.task_id, req.agent_id, req.phase, result)
            calls.append(save)
        if token:
            calls.append(self._idem.record(req.key, result, token))
        if req.dependency is not None:
            calls.append(self._breakers.ops.after_call(req.dependency, True, permit, took_ms))
        calls.append(self._note("rem", req.key.value, started=1, succeeded=1))
        # (with idempotency disabled nothing was listed: "rem" of a missing member is a no-op)
        replies = yield _IO(calls)
        i = 0 if save is None else 1
        lost = False
        if token:
            try:
                self._idem.decode_record(req.key, replies[i])
            except LeaseLost:
                lost = True
            i += 1
        if req.dependency is not None:
            self._fire(self._breakers.ops.decode_after(req.dependency, replies[i])[1])
            i += 1
        if save is not None:
            decoded = self._ckpt.decode_save(save, replies[0])
            while not isinstance(decoded, Checkpoint):  # stale eviction hints: resend alone
                again = yield _IO([decoded])
                decoded = self._ckpt.decode_save(decoded, again[0])
            # (decode_save logged durability_checkpoint_saved)
        if lost:
            _log.error(
                "durability_lease_lost", idempotency_key=req.key.value,
                operation_type=req.operation_type, attempts=attempt + 1,
            )
            raise LeaseLost(req.key.value)
        return result

    def _exhausted(
        self,
        req: _Request,
        token: str | None,
        claimed_ms: int,
        decision: RetryDecision,
        exc: BaseException,
    ) -> Plan[Any]:
        reason = str(decision.stop_reason)
        text = str(exc)
        error = text if text.startswith(decision.error_code) else f"{decision.error_code}: {text}"
        calls, dlq_id = self._park_calls(
            req, token, claimed_ms, attempts=decision.attempts, error=error, reason=reason,
            started=1,
        )
        replies = yield _IO(calls)
        if dlq_id is not None:
            self._dlq.decode_enqueue(calls[0], replies[0])
        emit_retry_stop(
            req.operation_type, decision, agent_id=req.agent_id, dlq_id=dlq_id, last_error=error
        )
        raise RetryExhausted(
            req.operation_type, decision.attempts, decision.error_code, dlq_id
        ) from exc

    # -- crash recovery --

    def recover_plan(self, limit: int) -> Plan[list[str]]:
        replies = yield _IO([ScriptCall("layer_orphans", [self._index], [limit])])
        parked: list[str] = []
        for raw_member in replies[0] or ():
            try:
                member = _codec.as_text(raw_member, key=self._index, field="member")
            except CorruptData:  # foreign data in the index: nothing to recover, drop it
                _log.error("durability_orphan_index_corrupt", member=repr(raw_member)[:200])
                yield _IO([self._note("rem", raw_member)])
                continue
            key = IdempotencyKey(member)
            rkey = self._keys.idem(member)
            got = yield _IO([ScriptCall("idem_reclaim", [rkey], [self._lease_ms])])
            reply = got[0]
            tag = _codec.as_text(reply[0], key=rkey, field="reply")
            if tag != "reclaimed":
                reason = _codec.as_text(reply[1], key=rkey, field="reason")
                if reason == "corrupt":  # foreign data: nothing to park, say so and drop it
                    _log.error("durability_orphan_record_corrupt", idempotency_key=member)
                if reason != "alive":
                    yield _IO([self._note("rem", member)])
                continue
            token = _codec.as_text(reply[1], key=rkey, field="tok")
            claimed_ms = _codec.as_int(reply[4], key=rkey, field="ts")
            try:
                env = _codec.unpack(reply[2], key=rkey) if reply[2] else {}
                if not isinstance(env, dict):
                    raise CorruptData(rkey, "the claim's payload is not a mapping")
            except CorruptData:
                _log.exception("durability_orphan_payload_unreadable", idempotency_key=member)
                env = {}
            req = _Request(
                str(env.get("agent_id") or "unknown"),
                str(env.get("operation_type") or "unknown"),
                env.get("payload"), key, env.get("dependency"), env.get("task_id"),
                env.get("phase"), None, False, None, False,
            )
            calls, dlq_id = self._park_calls(
                req, token, claimed_ms, attempts=0, error=WORKER_LOST, reason=WORKER_LOST
            )
            calls[-1] = self._note("rem", member, recovered=1, parked=1)
            out = yield _IO(calls)
            self._dlq.decode_enqueue(calls[0], out[0])
            parked.append(str(dlq_id))
            _log.warning(
                "durability_orphan_recovered", idempotency_key=member, dlq_id=dlq_id,
                operation_type=req.operation_type, agent_id=req.agent_id,
            )
        return parked

    # -- replay --

    def replay_request(self, record: DlqRecord) -> _Request:
        meta = record.metadata or {}
        key = meta.get("idempotency_key")
        return self.request(
            record.agent_id,
            record.operation_type,
            record.original_operation,
            dependency=meta.get("dependency") or None,
            idempotency_key=IdempotencyKey(key) if key else None,
            task_id=meta.get("task_id") or None,
            phase=meta.get("phase") or None,
            wait=None,
            park_on_open=False,
            deadline_seconds=None,
            replay=True,
        )

    def decode_stats(self, raw: Mapping[Any, Any], in_flight: int) -> LayerStats:
        values = {}
        for k, v in (raw or {}).items():
            name = k.decode() if isinstance(k, bytes) else str(k)
            values[name] = _codec.as_int(v, key=self._stats, field=name)
        known = {f: values.get(f, 0) for f in LayerStats.__dataclass_fields__ if f != "in_flight"}
        return LayerStats(**known, in_flight=in_flight)


_CLAIM_AGAIN = object()


# --- lease keep-alive -------------------------------------------------------------


class _Leases:
    """The claims this process holds now, for the keep-alive loop."""

    def __init__(self, store: Store | AsyncStore) -> None:
        self._keys = store.keys
        self._cluster = store.is_cluster
        self._held: dict[tuple[str, str], None] = {}
        self._lock = threading.Lock()

    def hold(self, key: str, token: str) -> tuple[str, str]:
        item = (key, token)
        with self._lock:
            self._held[item] = None
        return item

    def drop(self, item: tuple[str, str]) -> None:
        with self._lock:
            self._held.pop(item, None)

    def renew_calls(self, lease_ms: int) -> list[ScriptCall]:
        with self._lock:
            held = list(self._held)
        if not held:
            return []
        if self._cluster:  # one key per script: every record is its own slot
            return [
                ScriptCall("idem_renew", [self._keys.idem(k)], [t, lease_ms]) for k, t in held
            ]
        return [
            ScriptCall(
                "idem_renew",
                [self._keys.idem(k) for k, _ in held],
                [*(t for _, t in held), lease_ms],
            )
        ]


# --- the twins ----------------------------------------------------------------------


def _payload_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return {"args": list(args), "kwargs": kwargs}


class DurabilityLayer:
    """The five pillars composed; what a gateway replica calls for every critical write.

    Args:
        store: From :func:`durabilis.connect`.
        config: Settings of every pillar (seed defaults when omitted).
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
        self.store = store
        self.config = config or DurabilityConfig()
        cfg = self.config
        self.idempotency = IdempotencyGuard(store, cfg.idempotency)
        self.retry = RetryEngine(store) if cfg.retry_policies is None else RetryEngine.empty(store)
        for policy in cfg.retry_policies or ():
            self.retry.upsert_policy(policy)
        self.breakers = CircuitBreakerRegistry(store, cfg.breakers, replica_id=replica_id)
        self.checkpoints = CheckpointManager(store, cfg.checkpoint)
        self.dlq = DeadLetterQueue(store, cfg.dlq, replayer_id=self.breakers.replica_id)
        self._core = _LayerCore(
            store, cfg, self.idempotency._ops, self.retry, self.breakers,
            self.checkpoints._ops, self.dlq._ops,
        )
        self._leases = _Leases(store)
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()

    # -- driving plans --

    def _drive(self, plan: Plan[T], fn: Callable[[OperationContext], Any] | None) -> T:
        held: list[tuple[str, str]] = []
        send: Any = None
        try:
            while True:
                step = plan.send(send)
                kind = type(step)
                if kind is _IO:
                    send = self.store.run_fused(step.calls) if step.calls else []
                elif kind is _Run:
                    assert fn is not None
                    reset = _CURRENT.set(step.ctx)
                    try:
                        send = (True, fn(step.ctx))
                    except Exception as exc:
                        send = (False, exc)
                    finally:
                        _CURRENT.reset(reset)
                elif kind is _Sleep:
                    if not TESTING.instant and step.seconds > 0:
                        time.sleep(step.seconds)
                    send = None
                else:  # _Hold
                    held.append(self._leases.hold(step.key, step.token))
                    self._ensure_renewer()
                    send = None
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            for item in held:
                self._leases.drop(item)

    def _ensure_renewer(self) -> None:
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = threading.Thread(
                target=self._renew_loop, name="durabilis-lease-renewer", daemon=True
            )
            self._renewer.start()

    def _renew_loop(self) -> None:
        lease_ms = self._core._lease_ms
        while not self._stop.wait(self.config.renew_interval):
            calls = self._leases.renew_calls(lease_ms)
            if not calls:
                continue
            try:
                self.store.run_many(calls)
            except DurabilisError as exc:
                _log.warning("durability_lease_renew_failed", error=str(exc))

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
        """Run ``fn(ctx)`` once, durably (see the module docstring for the steps).

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
            RetryExhausted: Parked in the DLQ (``dlq_id``); the claim is released.
            CircuitOpen: The breaker refused before any attempt (nothing ran).
            OperationInProgress: Another caller runs it (and ``wait`` ran out).
            LeaseLost: ``fn`` succeeded but its claim had been taken over.
            StorageUnavailable: Redis is down (fail closed: nothing ran, or the
                result could not be recorded and the operation will be recovered).
            Exception: ``fn``'s own non-retryable error (the claim is released).
        """
        req = self._core.request(
            agent_id, operation_type, payload, dependency=dependency,
            idempotency_key=idempotency_key, task_id=task_id, phase=phase, wait=wait,
            park_on_open=park_on_open, deadline_seconds=deadline_seconds,
        )
        result: T = self._drive(self._core.execute_plan(req), fn)
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

        The payload is ``{"args": [...], "kwargs": {...}}`` of the call (so it must
        be JSON-compatible for content keys); ``key(*args, **kwargs)`` supplies a
        raw idempotency key instead. Inside, :func:`current_operation` gives the
        context (key, fencing token, attempt).
        """

        def decorate(func: Callable[..., T]) -> Callable[..., T]:
            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> T:
                return self.execute(
                    agent_id, operation_type, _payload_of(args, kwargs),
                    lambda _ctx: func(*args, **kwargs), dependency=dependency,
                    idempotency_key=None if key is None else key(*args, **kwargs), wait=wait,
                )

            return wrapper

        return decorate

    def recover_orphans(self, limit: int = 1000) -> list[str]:
        """Park the operations whose worker died (lease ended) in the DLQ.

        Safe to run from every replica at once (each orphan is reclaimed by one);
        returns the DLQ ids written. The DLQ records carry ``last_error=WORKER_LOST``
        and the original idempotency key, so :meth:`replay` never runs twice an
        operation that had in fact completed.
        """
        return self._drive(self._core.recover_plan(limit), None)

    def replay(self, dlq_id: str, fn: Callable[[OperationContext], Any]) -> Any:
        """Replay a parked operation through the layer with its original key.

        A completed operation is not run again (its stored result counts as the
        replay's success). Returns the DLQ's ``ReplayResult``.
        """
        return self.dlq.replay(dlq_id, functools.partial(self._replay_one, fn))

    def replay_pending(
        self,
        fn: Callable[[OperationContext], Any],
        operation_type: str | None = None,
        limit: int | None = None,
        max_per_second: float | None = None,
    ) -> Any:
        """Replay pending DLQ records through the layer (see :meth:`replay`)."""
        return self.dlq.replay_pending(
            functools.partial(self._replay_one, fn), operation_type, limit, max_per_second
        )

    def _replay_one(self, fn: Callable[[OperationContext], Any], record: DlqRecord) -> Any:
        return self._drive(self._core.execute_plan(self._core.replay_request(record)), fn)

    def stats(self) -> LayerStats:
        """The fleet-wide totals of this namespace (read from Redis)."""
        raw = self.store.command("HGETALL", self._core._stats)
        in_flight = self.store.command("ZCARD", self._core._index)
        return self._core.decode_stats(raw, int(in_flight or 0))

    def close(self) -> None:
        """Stop the lease keep-alive thread (the store stays open)."""
        self._stop.set()


class AsyncDurabilityLayer:
    """The asyncio twin of :class:`DurabilityLayer` (same methods, awaited).

    ``fn`` may be a coroutine function or a plain function.
    """

    def __init__(
        self,
        store: AsyncStore,
        config: DurabilityConfig | None = None,
        *,
        replica_id: str | None = None,
    ) -> None:
        self.store = store
        self.config = config or DurabilityConfig()
        cfg = self.config
        self.idempotency = AsyncIdempotencyGuard(store, cfg.idempotency)
        self.retry = (
            AsyncRetryEngine(store) if cfg.retry_policies is None
            else AsyncRetryEngine.empty(store)
        )
        for policy in cfg.retry_policies or ():
            self.retry.upsert_policy(policy)
        self.breakers = AsyncCircuitBreakerRegistry(store, cfg.breakers, replica_id=replica_id)
        self.checkpoints = AsyncCheckpointManager(store, cfg.checkpoint)
        self.dlq = AsyncDeadLetterQueue(store, cfg.dlq, replayer_id=self.breakers.replica_id)
        self._core = _LayerCore(
            store, cfg, self.idempotency._ops, self.retry, self.breakers,
            self.checkpoints._ops, self.dlq._ops,
        )
        self._leases = _Leases(store)
        self._renewers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}

    async def _drive(
        self, plan: Plan[T], fn: Callable[[OperationContext], Any] | None
    ) -> T:
        held: list[tuple[str, str]] = []
        send: Any = None
        try:
            while True:
                step = plan.send(send)
                kind = type(step)
                if kind is _IO:
                    send = await self.store.run_fused(step.calls) if step.calls else []
                elif kind is _Run:
                    assert fn is not None
                    reset = _CURRENT.set(step.ctx)
                    try:
                        value = fn(step.ctx)
                        if inspect.isawaitable(value):
                            value = await value
                        send = (True, value)
                    except Exception as exc:
                        send = (False, exc)
                    finally:
                        _CURRENT.reset(reset)
                elif kind is _Sleep:
                    if not TESTING.instant and step.seconds > 0:
                        await asyncio.sleep(step.seconds)
                    send = None
                else:  # _Hold
                    held.append(self._leases.hold(step.key, step.token))
                    self._ensure_renewer()
                    send = None
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            for item in held:
                self._leases.drop(item)

    def _ensure_renewer(self) -> None:
        loop = asyncio.get_running_loop()
        task = self._renewers.get(loop)
        if task is None or task.done():
            self._renewers[loop] = loop.create_task(self._renew_loop())

    async def _renew_loop(self) -> None:
        lease_ms = self._core._lease_ms
        while True:
            await asyncio.sleep(self.config.renew_interval)
            calls = self._leases.renew_calls(lease_ms)
            if not calls:
                continue
            try:
                await self.store.run_many(calls)
            except DurabilisError as exc:
                _log.warning("durability_lease_renew_failed", error=str(exc))

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
        """See :meth:`DurabilityLayer.execute`."""
        req = self._core.request(
            agent_id, operation_type, payload, dependency=dependency,
            idempotency_key=idempotency_key, task_id=task_id, phase=phase, wait=wait,
            park_on_open=park_on_open, deadline_seconds=deadline_seconds,
        )
        result: T = await self._drive(self._core.execute_plan(req), fn)
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
            @functools.wraps(func)
            async def wrapper(*args: Any, **kwargs: Any) -> T:
                return await self.execute(
                    agent_id, operation_type, _payload_of(args, kwargs),
                    lambda _ctx: func(*args, **kwargs), dependency=dependency,
                    idempotency_key=None if key is None else key(*args, **kwargs), wait=wait,
                )

            return wrapper

        return decorate

    async def recover_orphans(self, limit: int = 1000) -> list[str]:
        """See :meth:`DurabilityLayer.recover_orphans`."""
        return await self._drive(self._core.recover_plan(limit), None)

    async def replay(self, dlq_id: str, fn: Callable[[OperationContext], Any]) -> Any:
        """See :meth:`DurabilityLayer.replay`."""
        return await self.dlq.replay(dlq_id, functools.partial(self._replay_one, fn))

    async def replay_pending(
        self,
        fn: Callable[[OperationContext], Any],
        operation_type: str | None = None,
        limit: int | None = None,
        max_per_second: float | None = None,
    ) -> Any:
        """See :meth:`DurabilityLayer.replay_pending`."""
        return await self.dlq.replay_pending(
            functools.partial(self._replay_one, fn), operation_type, limit, max_per_second
        )

    async def _replay_one(self, fn: Callable[[OperationContext], Any], record: DlqRecord) -> Any:
        return await self._drive(self._core.execute_plan(self._core.replay_request(record)), fn)

    async def stats(self) -> LayerStats:
        """See :meth:`DurabilityLayer.stats`."""
        raw = await self.store.command("HGETALL", self._core._stats)
        in_flight = await self.store.command("ZCARD", self._core._index)
        return self._core.decode_stats(raw, int(in_flight or 0))

    async def close(self) -> None:
        """Stop the lease keep-alive tasks (the store stays open)."""
        for task in self._renewers.values():
            task.cancel()
        self._renewers.clear()

