"""Parking a failure in the DLQ, and abandoning a claim (released, probe slot freed)."""

from __future__ import annotations

from typing import Any

from durabilis._retry_events import emit_retry_stop
from durabilis._scripts import ScriptCall
from durabilis.core import logsink
from durabilis.core.breaker import Permit
from durabilis.core.layer.base import (
    _Claim,
    _ClaimAgain,
    _missed,
    _Request,
    _Unsent,
    dlq_id_for,
)
from durabilis.core.layer.record import _Records
from durabilis.core.layer.types import WORKER_LOST
from durabilis.core.retry import RetryDecision
from durabilis.core.steps import IO, Plan
from durabilis.errors import (
    CorruptData,
    DurabilisError,
    LeaseLost,
    OutcomeUnrecorded,
    RetryExhausted,
)
from durabilis.events import error_text


class _Parking(_Records):
    """Parking a failure in the DLQ, and releasing (abandoning) a claim."""

    def _park_inherited(self, req: _Request, nonce: str, member: str) -> Plan[None]:
        """Park an inherited orphan (a taken-over claim this call will not run), as
        a compensating step: shielded, a storage failure logged (what it leaves
        behind is found by recovery). ``parked`` is counted from the enqueue's
        reply: only a new record is a new operation parked (not one merged into
        the operation's pending record)."""
        dlq_id = dlq_id_for(req.key.value, nonce)
        logsink.SINK.warning(
            "durability_orphan_recovered", idempotency_key=req.key.value, dlq_id=dlq_id,
            operation_type=req.operation_type, agent_id=req.agent_id,
        )
        calls = [
            self._dlq.enqueue_prepared(
                self._park_record(req), 0, WORKER_LOST, dlq_id=dlq_id,
                metadata={"reason": WORKER_LOST, "claim": nonce},
                merge_key=self._merge_key(req.key.value),
            ),
            self._idem.release(req.key, None, nonce, hold_ms=self._dlq.hold_ms(),
                               touched=True),
            self._note("rem", [member] if member else [], recovered=1, parkings=1),
            *([self._birth_gone(req.key.value, nonce)] if self._buckets else []),
        ]
        try:
            out = yield IO(calls, {0: _missed}, shield=True)
        except DurabilisError as exc:
            logsink.SINK.error("durability_claim_undo_failed", idempotency_key=req.key.value,
                               error=f"{type(exc).__name__}: {exc}")
            return
        if out.status[0] != "c":
            return
        try:
            made = self._dlq.decode_enqueue(calls[0], out[0])
        except DurabilisError as exc:  # (CorruptData: nothing to count)
            logsink.SINK.error("durability_claim_undo_failed", idempotency_key=req.key.value,
                               error=f"{type(exc).__name__}: {exc}")
            return
        if made.new_record:
            self._leave([], {"parked": 1})

    def _abandon(
        self, req: _Request, cl: _Claim, permit: Permit | None, probe: str | None,
        *, touched: bool = False, **counts: int,
    ) -> Plan[bool]:
        """The operation stops without an outcome to record: release claim and probe slot.

        ``touched``: interrupted once ``fn`` had started: the claim is given back
        as a touched tombstone, so the next delivery runs with ``ctx.recovered``
        (an earlier run may have had its effect), never as if untouched.
        """
        if req.dependency is not None:
            self._breakers.forget(req.dependency)  # no report confirms the cache (Cluster)
        calls: list[ScriptCall] = []
        if cl.token or cl.member:
            # A run flagged recovered passes the mark on (its own key may hold it
            # only through an alias, under another secret, that expires sooner).
            # A claim taken over (a lapsed owner, or a touched tombstone's): that
            # owner's parking may still come, late (its keep-alive, cut off from
            # Redis): the tombstone is held as long as a DLQ record, so that
            # parking meets it, never a missing key past its guard's bound
            # ("stale": dropped, the operation lost).
            calls.append(self._idem.release(
                req.key, cl.token, cl.nonce, touched=touched or cl.taken_over,
                hold_ms=self._dlq.hold_ms() if cl.taken_over else 0,
            ))
        dep = req.dependency
        if dep is not None:
            if permit is not None and permit.is_probe:
                calls.append(self._breakers.ops.release(dep, permit))
            elif probe is not None:
                calls.append(self._breakers.ops.release_probe(dep, probe))
        released = len(calls)
        calls.append(self._note("rem", [cl.member] if cl.member else [], **counts))
        if self._buckets and cl.token and self.config.idempotency.enabled:
            calls.append(self._birth_gone(req.key.value, cl.nonce))
        # Cluster: the releases at once (one failing never holds back the other),
        # the index entries only after them (a claim whose release failed stays
        # listed, so recovery finds it).
        waves = [0] * released + [1] * (len(calls) - released)
        return (yield from self._best_effort(
            calls, "durability_release_failed", req.key.value, waves=waves,
        ))

    def _guard_gave_way(self, req: _Request, cl: _Claim) -> None:
        """A parking its guard refused (nothing of it written). With a claim of
        its own (``fn`` may have run): the operation completed elsewhere, its
        claim having passed to another delivery, so :class:`LeaseLost` (the new
        owner recorded the outcome). Without one (nothing ran: its breaker was
        open before it could claim): :class:`_ClaimAgain`, a duplicate's answer
        (the stored result, or in progress)."""
        if cl.token or cl.member:
            raise LeaseLost(req.key.value)
        raise _ClaimAgain

    def _parking_guard(self, req: _Request, cl: _Claim) -> tuple[ScriptCall, str] | None:
        """The guard in front of a parking's enqueue (``None``: no idempotency).

        A parking sent late (a lost reply, the keep-alive) of an operation that
        succeeded meanwhile must park nothing, nor one made while another
        delivery holds the operation (its success would not settle it). With a
        claim of its own, fn ran: only a completed record refuses it (another's
        live claim may end without parking: an interrupted holder). A missing
        key parks (nothing is dropped on a guess): a delivery that completed
        the operation after taking this claim over keeps its record as long
        as a DLQ record (``_succeeded``). Without one, another's live claim refuses it
        too: the call claims again (nothing ran, nothing is lost).
        """
        if not self.config.idempotency.enabled:
            return None
        wait = not (cl.token or cl.member)
        return self._idem.parking_guard(req.key, wait=wait), "enqueue"

    def _park_failed(
        self, req: _Request, cl: _Claim, failed: tuple[BaseException, RetryDecision] | None,
        broke: DurabilisError | None,
    ) -> Plan[Any]:
        """Park an operation whose last attempt failed: retries ran out, or Redis
        failed before the next one (then ``broke``: an attempt ran, so the
        operation is parked, never silently given back)."""
        if failed is None:  # nothing ran since the claim was confirmed: nothing to park
            assert broke is not None
            yield from self._abandon(req, cl, None, None)
            raise broke
        exc, decision = failed
        text = error_text(exc)  # (never raises: a __str__ that exits is named by its type)
        error = text if text.startswith(decision.error_code) else f"{decision.error_code}: {text}"
        reason = (
            str(decision.stop_reason) if broke is None
            else "CORRUPT_DATA" if isinstance(broke, CorruptData) else "STORAGE_UNAVAILABLE"
        )
        return (yield from self._park(
            req, cl, attempts=decision.attempts if broke is None else decision.attempt + 1,
            error=error, reason=reason, cause=broke or exc,
            decision=decision if broke is None else None, started=1,
        ))

    def _park(
        self,
        req: _Request,
        cl: _Claim,
        *,
        attempts: int,
        error: str,
        reason: str,
        cause: BaseException,
        decision: RetryDecision | None = None,
        **counts: int,
    ) -> Plan[Any]:
        """Park the failed operation in the DLQ (unless replaying) and release its claim."""
        calls: dict[str, ScriptCall] = {}
        dlq_id = None
        if not req.replay:
            dlq_id = dlq_id_for(req.key.value, cl.nonce)
            record, meta = self._park_record(req), {"reason": reason, "claim": cl.nonce}
            # otel hook: the call's trace context kept with the record, in the bytes
            # the payload cap leaves it ({}: off, or no room)
            meta.update(self.tracing.parking_fields(self._dlq.room(record, meta)))
            calls["enqueue"] = self._dlq.enqueue_prepared(
                record, attempts, error, dlq_id=dlq_id, metadata=meta,
                merge_key=self._merge_key(req.key.value),
            )
        if cl.token or cl.member:
            calls["release"] = self._idem.release(
                req.key, cl.token, cl.nonce,
                hold_ms=self._dlq.hold_ms(),  # the record is pending (a replay's too)
                touched=cl.taken_over,  # (a mark held only by an alias passes on)
                late=not req.replay,  # (its hold left on whatever holds the key)
            )
        elif self.config.idempotency.enabled and not req.replay:
            # Parked before any claim (open breaker): nothing at the key says it
            # was delivered; a tombstone does, so a later success settles it.
            calls["release"] = self._idem.tombstone(req.key, self._dlq.hold_ms())
        calls["note"] = self._note(
            "rem", [cl.member] if cl.member else [], parkings=0 if req.replay else 1, **counts
        )
        if self._buckets and cl.token and self.config.idempotency.enabled:
            calls["birth"] = self._birth_gone(req.key.value, cl.nonce)

        guard = self._parking_guard(req, cl) if "enqueue" in calls else None
        parked = False

        def on_reply(name: str, reply: Any) -> Any:
            nonlocal dlq_id, parked
            if name == "enqueue":
                again = self._dlq.enqueue_again(calls["enqueue"], reply)
                if again is not None:  # the operation's record is another: park there
                    calls["enqueue"] = again
                    return again
                parked = True
                made = self._dlq.decode_enqueue(calls["enqueue"], reply)
                dlq_id = made.dlq_id
                if made.new_record:  # an operation parked, not a re-parking
                    self._leave([], {"parked": 1})
            return None

        try:
            yield from self._persist(
                req.key.value, calls, ("enqueue", "release", "note", "birth"),
                {"enqueue": _missed} if "enqueue" in calls else {}, on_reply,
                {"enqueue": 0, "release": 1, "note": 2, "birth": 2}, guard=guard,
            )
        except _Unsent as unsent:
            if unsent.guarded:  # (the keep-alive parks: only a completed record refuses)
                unsent.calls[0] = self._idem.parking_guard(req.key, wait=False)
            yield from self._defer(req, cl, unsent)
            raise OutcomeUnrecorded(req.key.value, succeeded=False) from unsent.cause
        except DurabilisError as exc:
            logsink.SINK.error(
                "durability_park_failed", idempotency_key=req.key.value,
                operation_type=req.operation_type, error=f"{type(exc).__name__}: {exc}",
            )
            raise OutcomeUnrecorded(req.key.value, succeeded=False) from exc
        if guard is not None and not parked:  # the guard refused: nothing was written
            self._guard_gave_way(req, cl)
        if decision is not None:
            emit_retry_stop(
                req.operation_type, decision, agent_id=req.agent_id, dlq_id=dlq_id,
                last_error=error,
            )
        code = decision.error_code if decision is not None else reason
        raise RetryExhausted(req.operation_type, attempts, code, dlq_id) from cause
