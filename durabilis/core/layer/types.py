"""What the layer hands out and reports (no I/O): the context ``fn`` is
handed, the fleet's totals, and the codes the layer writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CIRCUIT_OPEN", "WORKER_LOST", "LayerStats", "OperationContext"]

WORKER_LOST = "WORKER_LOST"
"""``last_error`` of an operation whose worker died mid-flight (``recover_orphans``): it
may or may not have run."""

CIRCUIT_OPEN = "CIRCUIT_OPEN"
"""``final_error`` of an operation parked because its breaker was open."""


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
        idempotency_key: The key claimed for it, as stored: for a caller's key
            (``idempotency_key=``, an HTTP ``Idempotency-Key``) its scoped form
            ``%raw:<agent>:<key>``, which two agents sending the same key to
            one downstream never share (docs/layer.md, "Which key to forward").
        token: The claim's fencing token (``None`` with idempotency disabled);
            tokens of successive claims of one key increase.
        attempt: 0-based attempt number.
        dependency: The breaker guarding it, if any.
        task_id: The checkpointed task, if any.
        phase: The checkpoint phase, if any.
        replay: The operation runs from a DLQ replay.
        recovered: An earlier run of this operation may have had its effect:
            it was taken over from a worker whose lease ended (it died, or
            could not record its outcome), or an earlier run was interrupted
            after ``fn`` started (a cancellation or timeout, ``SystemExit``,
            ``KeyboardInterrupt``: any ``BaseException`` not ``fn``'s own
            ``Exception``), or a dead worker's claim was parked by
            recovery. It stays set for every later run until one records an
            outcome. With ``replay``, the two cases in which ``fn`` may see an
            operation again after its effect: forward ``idempotency_key`` (the
            same on every run; ``token`` higher) so the downstream keeps it
            exactly once.
        caller_key: The caller's key as given (``order-1`` of
            ``%raw:gw-1:order-1``; the same on replays); ``None`` for a content
            key. Forward it instead of ``idempotency_key`` only to a downstream
            that keeps each agent's keys apart itself (one account per agent).
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
    recovered: bool = False
    caller_key: str | None = None


@dataclass(frozen=True, slots=True)
class LayerStats:
    """Fleet-wide totals kept in Redis by every layer of the namespace.

    Attributes:
        started: Operations that won their claim and ran.
        succeeded: Operations whose result was recorded.
        duplicates: Calls answered from a stored result or refused as in progress.
        retries: Retries made (attempts after the first), counted as each
            starts, in the process's batch of counts.
        parked: Operations parked in the DLQ (exhausted, circuit open, recovered):
            each counted once, when its parking makes a new pending record
            (as ``durabilis dlq stats`` and ``dlq ls`` count them). Counted
            after the record is written, in the process's batch of counts.
        parkings: Every parking, a re-parking of an operation already pending
            in the DLQ too (it merges into that record: ``DlqRecord.parkings``).
        non_retryable: Operations stopped by a non-retryable error.
        recovered: Orphans (dead workers) moved to the DLQ by ``recover_orphans``.
        in_flight: Operations holding a live claim now: the in-flight index's
            entries whose lease has not ended (a live worker renews its own).
        lease_ended: The index's entries whose lease ended: workers that died
            (or processes that ended without removing theirs), until
            ``recover_orphans`` parks or drops them. Never counted in flight:
            a crashed process cannot leave ``in_flight`` wrong past one lease.
    """

    started: int = 0
    succeeded: int = 0
    duplicates: int = 0
    retries: int = 0
    parked: int = 0
    parkings: int = 0
    non_retryable: int = 0
    recovered: int = 0
    in_flight: int = 0
    lease_ended: int = 0
