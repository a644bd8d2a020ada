"""The replay plans: claim, run the handler, note the outcome; passes over
the pending and requeue indexes, paced and tallied (no I/O).

Events go to ``self.log`` (the shells hand in the package's logger)."""

from __future__ import annotations

import dataclasses
import random
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from durabilis import _codec
from durabilis._scripts import ScriptCall
from durabilis.core.dlq.listing import ListingPlans
from durabilis.core.dlq.plan import (
    ANSWERED,
    CONFIG_ERROR_QUIET_SECONDS,
    FINISHED,
    UNSETTLED,
    Handle,
    Plan,
    ReplayDeclined,
    TypeChanged,
)
from durabilis.core.dlq.records import (
    PAGE,
    Claimed,
    Member,
    corrupt_error,
    field_text,
    reply_tag,
    stream_id_of,
)
from durabilis.core.dlq.types import (
    DlqRecord,
    DlqStatus,
    ReplayOutcome,
    ReplayResult,
    ReplaySummary,
    check_number,
)
from durabilis.core.steps import IO, Sleep
from durabilis.errors import (
    CircuitOpen,
    ConfigError,
    DependencyNotFound,
    DurabilisError,
    OperationInProgress,
    StorageUnavailable,
)
from durabilis.events import error_text, redact_error

_BACKOFF_MAX = 10_000  # records one replica remembers backing off, at most

_POLL = Sleep(0.0)
"""An unshielded step that does nothing: where an interruption held back during
a shielded step (a claim, the note of the last record's outcome, a plain
handler in its thread) is delivered, before a handler starts."""

_NOTE_BACKOFF = (0.05, 1.0)  # first and longest pause between tries of a claim or a note
RESEND_SECONDS = 30.0
"""How long a replay's claim or note is sent again after a lost reply, at most
(a cancellation or a signal waits for it meanwhile)."""


class Pacer:
    """Spaces handler starts ``1 / max_per_second`` apart (pure: the caller sleeps)."""

    __slots__ = ("_interval", "_next")

    def __init__(self, max_per_second: float | None) -> None:
        self._interval = 0.0 if max_per_second is None else 1.0 / max_per_second
        self._next: float | None = None

    def wait(self, now: float) -> float:
        """Seconds to wait before the next claim attempt."""
        if self._next is None:
            return 0.0
        return max(0.0, self._next - now)

    def started(self, at: float) -> None:
        """A handler started at ``at`` (monotonic seconds)."""
        if self._interval:
            self._next = at + self._interval


class Tally:
    """Accumulates replay results into a :class:`ReplaySummary`."""

    __slots__ = ("config_ids", "deferred_ids", "expired_ids", "failed_ids", "lost_ids", "open",
                 "ran", "replayed", "skipped")

    def __init__(self) -> None:
        self.ran = self.replayed = self.skipped = 0
        self.failed_ids: list[str] = []
        self.lost_ids: list[str] = []
        self.deferred_ids: list[str] = []
        self.expired_ids: list[str] = []
        self.config_ids: list[str] = []
        self.open: dict[str, None] = {}  # dependencies with an open breaker (ordered set)

    def add(self, result: ReplayResult) -> bool:
        """Count ``result``; ``True`` when its handler ran."""
        outcome = result.outcome
        if outcome is ReplayOutcome.DEFERRED:
            self.deferred_ids.append(result.dlq_id)
            return False
        if outcome is ReplayOutcome.EXPIRED:
            self.expired_ids.append(result.dlq_id)
            return False
        if outcome is ReplayOutcome.CONFIG_ERROR:
            # Counted toward the pass's limit (it claimed and wrote), not an attempt.
            self.config_ids.append(result.dlq_id)
            self.ran += 1
            return False
        if outcome is ReplayOutcome.REPLAYED:
            self.replayed += 1
        elif outcome is ReplayOutcome.FAILED:
            self.failed_ids.append(result.dlq_id)
        elif outcome is ReplayOutcome.CLAIM_LOST:
            self.lost_ids.append(result.dlq_id)
        else:
            self.skipped += 1
            return False
        self.ran += 1
        return True

    def summary(self) -> ReplaySummary:
        return ReplaySummary(
            replayed=self.replayed,
            failed=len(self.failed_ids),
            skipped=self.skipped,
            lost=len(self.lost_ids),
            failed_ids=tuple(self.failed_ids),
            lost_ids=tuple(self.lost_ids),
            deferred=len(self.deferred_ids),
            deferred_ids=tuple(self.deferred_ids),
            breakers_open=tuple(self.open),
            expired=len(self.expired_ids),
            expired_ids=tuple(self.expired_ids),
            config_errors=len(self.config_ids),
            config_error_ids=tuple(self.config_ids),
        )


def interruption(exc: BaseException) -> bool:
    """Whether ``exc``, thrown into a plan, stops it now (compensate, then
    re-raise): a cancellation, ``KeyboardInterrupt``, ``SystemExit`` - any
    ``BaseException`` that is no ``Exception``, named without importing
    asyncio. ``GeneratorExit`` is none: an abandoned plan (its process died, in
    the simulator) must not run anything more."""
    return not isinstance(exc, (Exception, GeneratorExit))


class ReplayPlans(ListingPlans):
    """The replay plans over every other call builder and plan (no I/O)."""

    __slots__ = ()

    @property
    def resend_seconds(self) -> float:
        """How long a replay's claim or note is sent again after a lost reply."""
        return RESEND_SECONDS

    def replay_steps(
        self, dlq_id: str, handle: Handle, open_breakers: dict[str, None] | None = None,
        operation_type: str | None = None, stream_id: str = "", *, via: bytes = b"",
    ) -> Plan[ReplayResult]:
        """Claim, run the handler, then finish (fenced) or report the failure.

        A handler refused before it could replay (``OperationInProgress``,
        ``CircuitOpen``) defers the record: claim released, nothing counted. With
        ``open_breakers`` (a pass's), a record whose dependency is in it is
        deferred without running, and a ``CircuitOpen`` adds its dependency.
        With ``operation_type`` (a filtered pass's), a record of another type
        (a payload-less record filled in since it was listed) is deferred too.
        """
        if not self.known_id(dlq_id):
            return ReplayResult(dlq_id, ReplayOutcome.NOT_FOUND)
        yield _POLL  # an interruption held back (a pass's last record) stops here
        claim = self.claim(dlq_id, secrets.token_hex(8), stream_id, requeued=bool(via))
        until = time.monotonic() + self.config.claim_ttl_seconds
        claimed = self.decode_claim(dlq_id, (yield from self._sent(claim, dlq_id, until))[0])
        if isinstance(claimed, ReplayResult):
            return claimed
        claimed = dataclasses.replace(claimed, until=until, via=via)
        record = claimed.record
        key = self.record_key(dlq_id)
        error = yield from self._handled(claimed, handle, open_breakers, operation_type)
        if error is FINISHED:
            return self._replayed(record, claimed)
        if error is UNSETTLED:  # (its finish, fenced by the claim, goes on: see UNSETTLED)
            self.log.warning(
                "durability_dlq_replay_deferred", dlq_id=dlq_id,
                operation_type=record.operation_type, reason="outcome_unrecorded",
            )
            return ReplayResult(
                dlq_id, ReplayOutcome.DEFERRED,
                error="the operation succeeded; its outcome is still being recorded",
                replay_attempts=record.replay_attempts, status=DlqStatus.PENDING,
            )
        if isinstance(error, (OperationInProgress, CircuitOpen, TypeChanged, ReplayDeclined)):
            if isinstance(error, CircuitOpen) and open_breakers is not None:
                open_breakers[error.dependency] = None
            reply, _ = yield from self._noted(self.defer(dlq_id, claimed.token, error), claimed)
            if reply_tag(reply, key) not in ("ok", "none", "final", "lost"):
                raise corrupt_error(reply, key)
            self.log.info(
                "durability_dlq_replay_deferred", dlq_id=dlq_id,
                operation_type=record.operation_type,
                reason=TypeChanged.reason if isinstance(error, TypeChanged)
                else type(error).__name__,
            )
            return ReplayResult(
                dlq_id, ReplayOutcome.DEFERRED, error=error_text(error),
                replay_attempts=record.replay_attempts, status=DlqStatus.PENDING,
            )
        if isinstance(error, (ConfigError, DependencyNotFound)):
            return (yield from self._replay_unconfigured(record, claimed, error))
        if isinstance(error, BaseException):
            return (yield from self._replay_failed(record, claimed, error))
        reply, unsure = yield from self._noted(
            self.finish(dlq_id, DlqStatus.REPLAYED, claimed.token, self.owner), claimed)
        tag = reply_tag(reply, key)
        # Replayed by another (the operation's later delivery settled it) when
        # nothing ran, or by an earlier try of this very note whose reply was lost.
        if tag == "ok" or ((error is ANSWERED or unsure) and tag == "final"
                           and field_text(reply[1], key, "st") == DlqStatus.REPLAYED.value):
            return self._replayed(record, claimed)
        if tag not in ("none", "final", "lost"):
            raise corrupt_error(reply, key)
        return self._lost(record)

    def _replay_unconfigured(
        self, record: DlqRecord, claimed: Claimed, error: BaseException
    ) -> Plan[ReplayResult]:
        """The replaying process lacks config the record needs (a durabilis
        ``ConfigError`` / ``DependencyNotFound``: the library's own text, shown
        in clear): the claim released, no attempt counted, ``last_error`` kept."""
        dlq_id, key = record.dlq_id, self.record_key(record.dlq_id)
        call = self.config_failed(dlq_id, claimed.token, error)
        reply, _ = yield from self._noted(call, claimed)
        tag = reply_tag(reply, key)
        if tag not in ("ok", "none", "final", "lost"):
            raise corrupt_error(reply, key)
        self.log.warning(
            "durability_dlq_replay_config_error", dlq_id=dlq_id,
            operation_type=record.operation_type, replayer=self.owner,
            error=str(call.args[1]),
        )
        return ReplayResult(
            dlq_id, ReplayOutcome.CONFIG_ERROR, error=str(call.args[1]),
            replay_attempts=record.replay_attempts, status=DlqStatus.PENDING,
        )

    def _replay_failed(
        self, record: DlqRecord, claimed: Claimed, error: BaseException
    ) -> Plan[ReplayResult]:
        """The handler raised: the record stays pending, one more attempt noted."""
        dlq_id, key = record.dlq_id, self.record_key(record.dlq_id)
        payloadless = (record.metadata or {}).get("payload_error") and record.stream_id
        call = self.fail(dlq_id, claimed.token, error, payloadless=payloadless or "",
                         via=claimed.via)
        reply, unsure = yield from self._noted(call, claimed)
        tag = reply_tag(reply, key)
        if tag == "filled":  # its payload was parked meanwhile: replayable now
            text = str(call.args[1]) + " (the payload was parked meanwhile: replay it again)"
            self.log.warning("durability_dlq_replay_deferred", dlq_id=dlq_id,
                         operation_type=record.operation_type, reason="filled_in",
                         error=redact_error(text))
            return ReplayResult(
                dlq_id, ReplayOutcome.DEFERRED,
                error=text,
                replay_attempts=_codec.as_int(reply[1], key=key, field="ra"),
                status=DlqStatus.PENDING,
            )
        if tag == "ok" or (unsure and tag == "lost"):
            # ("lost" after a try whose reply was lost: that try may have
            # noted it and released the claim; the handler failed either way.)
            attempts = _codec.as_int(reply[1], key=key, field="ra") if tag == "ok" else None
            self.log.warning(
                "durability_dlq_replay_failed",
                dlq_id=dlq_id,
                operation_type=record.operation_type,
                replay_attempts=attempts,
                error=redact_error(str(call.args[1])),
            )
            return ReplayResult(
                dlq_id,
                ReplayOutcome.FAILED,
                error=str(call.args[1]),
                replay_attempts=attempts,
                status=DlqStatus.PENDING,
            )
        if tag not in ("none", "final", "lost"):
            raise corrupt_error(reply, key)
        return self._lost(record, error=error_text(error))

    def _handled(
        self, claimed: Claimed, handle: Handle, open_breakers: dict[str, None] | None,
        operation_type: str | None,
    ) -> Plan[BaseException | object | None]:
        """What the handler answered, or the refusal that kept it from running."""
        record = claimed.record
        dependency = (record.metadata or {}).get("dependency")
        if operation_type is not None and record.operation_type != operation_type:
            return TypeChanged(operation_type, record.operation_type)
        if open_breakers is not None and dependency is not None and dependency in open_breakers:
            return CircuitOpen(dependency, 0.0)
        try:
            yield _POLL  # one held back during the claim: the handler does not start
            return (yield from handle(record, claimed.token))
        except BaseException as exc:
            if not interruption(exc):
                raise
            yield from self._interrupted(record, claimed, exc)
            raise

    def _noted(self, call: ScriptCall, claimed: Claimed) -> Plan[tuple[Any, bool]]:
        """Send a note of the replay's outcome (see :meth:`_sent`): a note lost
        to a blip, or to a sweep that cancelled its step's task, would leave a
        handler that ran to run again once the claim expired."""
        return (yield from self._sent(call, claimed.record.dlq_id, claimed.until))

    def _sent(self, call: ScriptCall, dlq_id: str, until: float) -> Plan[tuple[Any, bool]]:
        """Send a step of a replay (shielded) until it lands, with backoff, for
        :attr:`resend_seconds` at most and while the claim lasts (``until``,
        monotonic: after it the step would be refused anyway). The claim and
        the notes can be sent again: a claim's nonce gets its own earlier try
        back, a note is fenced by the claim's token. Returns the reply and
        whether an earlier try may have landed."""
        unsure = False
        delay = _NOTE_BACKOFF[0]
        stop: float | None = None
        while True:
            try:
                return (yield IO([call], shield=True))[0], unsure
            except StorageUnavailable as exc:  # (a script's own error is not sent again)
                now = time.monotonic()
                stop = min(until, now + self.resend_seconds) if stop is None else stop
                if now + delay >= stop:
                    raise
                unsure = True
                self.log.warning("durability_dlq_step_retry", dlq_id=dlq_id, script=call.name,
                             error=f"{type(exc).__name__}: {exc}",
                             delay_seconds=round(delay, 3))
                yield Sleep(delay * (0.5 + random.random() / 2), shield=True)
                delay = min(delay * 2, _NOTE_BACKOFF[1])

    def _interrupted(
        self, record: DlqRecord, claimed: Claimed, interruption: BaseException
    ) -> Plan[None]:
        """A cancellation (``KeyboardInterrupt``, ``SystemExit``) while the
        handler ran: the claim is released, nothing counted (the handler did not
        finish: as a refusal, not a failure), so the record can be replayed at
        once instead of after ``claim_ttl_seconds``. If the release cannot be
        sent, the claim expires as after a crash."""
        key = self.record_key(record.dlq_id)
        released: bool | None = None  # unknown: its reply was lost
        try:
            # Shielded (a cancellation waits for it), sent once.
            call = self.defer(record.dlq_id, claimed.token, interruption)
            reply = (yield IO([call], shield=True))[0]
            released = reply_tag(reply, key) == "ok"
        except DurabilisError:
            pass
        self.log.warning(
            "durability_dlq_replay_interrupted", dlq_id=record.dlq_id,
            operation_type=record.operation_type, interruption=type(interruption).__name__,
            claim_released=released,
        )

    def _replayed(self, record: DlqRecord, claimed: Claimed) -> ReplayResult:
        self.log.info(
            "durability_dlq_replayed",
            dlq_id=record.dlq_id,
            operation_type=record.operation_type,
            agent_id=record.agent_id,
            replayed_by=self.owner,
            replay_attempts=record.replay_attempts,
            claim_taken_over=claimed.taken_over,
        )
        return ReplayResult(
            record.dlq_id,
            ReplayOutcome.REPLAYED,
            replay_attempts=record.replay_attempts,
            status=DlqStatus.REPLAYED,
        )

    def _lost(self, record: DlqRecord, error: str | None = None) -> ReplayResult:
        # The claim expired and another replayer took the record over (or an
        # operator finished it): our handler's effect is not recorded here.
        self.log.warning(
            "durability_dlq_replay_claim_lost",
            dlq_id=record.dlq_id,
            operation_type=record.operation_type,
            replayer=self.owner,
            claim_ttl_seconds=self.config.claim_ttl_seconds,
        )
        return ReplayResult(record.dlq_id, ReplayOutcome.CLAIM_LOST, error=error)

    def replay_pending_steps(
        self,
        operation_type: str | None,
        limit: int | None,
        max_per_second: float | None,
        handle: Handle,
        on_result: Callable[[ReplayResult], object] | None = None,
        *,
        requeued_only: bool = False,
    ) -> Plan[ReplaySummary]:
        """Walk the pending index once, oldest first, replaying each record
        (``on_result`` is called with each record's result: progress). With
        ``requeued_only``, the requeue index instead: only the records marked
        for redelivery (:meth:`requeue`)."""
        if operation_type is not None:
            self.name("operation_type", operation_type)
        self._check_pass(limit, max_per_second)
        tally = Tally()
        yield from self._pass_steps(operation_type, limit, handle, pacer=Pacer(max_per_second),
                                    tally=tally, on_result=on_result, requeued=requeued_only)
        if tally.expired_ids:  # met expired records: they are reported now, not skipped
            yield from self.cleanup_steps()
        return tally.summary()

    def replay_requeued_steps(
        self,
        handles: Mapping[str, Handle],
        limit: int | None,
        max_per_second: float | None,
        on_result: Callable[[ReplayResult], object] | None = None,
    ) -> Plan[ReplaySummary]:
        """One pass over the records marked for redelivery whose operation type
        has a handler in ``handles`` (operation type -> handle), oldest first
        per type; records of other types are not touched (a replica that has
        their handler replays them). ``limit`` and pacing span the pass."""
        if not isinstance(handles, Mapping):
            raise ConfigError("handlers", "must map operation types to handlers")
        for op in handles:
            self.name("operation_type", op)
        self._check_pass(limit, max_per_second)
        tally = Tally()
        pacer = Pacer(max_per_second)
        for op in sorted(handles):
            if limit is not None and tally.ran >= limit:
                break
            yield from self._pass_steps(op, limit, handles[op], pacer=pacer, tally=tally,
                                        on_result=on_result, requeued=True)
        if tally.expired_ids:
            yield from self.cleanup_steps()
        return tally.summary()

    def _check_pass(self, limit: int | None, max_per_second: float | None) -> None:
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 0
        ):
            raise ConfigError("limit", f"must be an integer >= 0 or None, got {limit!r}")
        if max_per_second is not None:
            check_number("max_per_second", max_per_second)

    def _pass_steps(
        self,
        operation_type: str | None,
        limit: int | None,
        handle: Handle,
        *,
        pacer: Pacer,
        tally: Tally,
        on_result: Callable[[ReplayResult], object] | None,
        requeued: bool,
    ) -> Plan[None]:
        after: bytes | None = None
        while limit is None or tally.ran < limit:
            if requeued:
                page = self.decode_requeued((yield self.requeue_range(operation_type, after)))
            else:
                page = self.decode_members(
                    operation_type, (yield self.pending_range(operation_type, after))
                )
            stale: list[Member] = []
            # (a requeued record met with a config error here lately: left to the others)
            todo = [m for m in page if not self._backed_off(m.dlq_id)] if requeued else page
            for member in todo:
                if limit is not None and tally.ran >= limit:
                    break
                wait = pacer.wait(time.monotonic())
                if wait > 0:
                    yield Sleep(wait)
                started = time.monotonic()
                result = yield from self.replay_steps(member.dlq_id, handle, tally.open,
                                                      operation_type,
                                                      stream_id_of(member.sort_key),
                                                      via=member.raw if requeued else b"")
                if result.outcome is ReplayOutcome.EXPIRED:
                    self.log.warning("durability_dlq_replay_expired", dlq_id=member.dlq_id,
                                 outcome=result.outcome.value)
                if requeued:
                    self._requeued_result(member, result, stale)
                if tally.add(result):
                    pacer.started(started)
                if on_result is not None:
                    on_result(result)
            if stale:  # marks of records gone or finished meanwhile (e.g. expired)
                yield self.prune(stale)
            if len(page) < PAGE:
                break
            after = page[-1].raw

    def _requeued_result(
        self, member: Member, result: ReplayResult, stale: list[Member]
    ) -> None:
        """A requeue pass's bookkeeping: a mark of a record gone or finished is
        pruned; a record met with a config error is backed off here."""
        if result.outcome in (
            ReplayOutcome.NOT_FOUND, ReplayOutcome.EXPIRED, ReplayOutcome.NOT_PENDING
        ):
            stale.append(member)
        elif result.outcome is ReplayOutcome.CONFIG_ERROR:
            self._back_off(member.dlq_id)

    def _backed_off(self, dlq_id: str) -> bool:
        until = self._backoff.get(dlq_id)
        if until is None:
            return False
        if until > time.monotonic():
            return True
        del self._backoff[dlq_id]
        return False

    def _back_off(self, dlq_id: str) -> None:
        """Skip ``dlq_id`` in this replica's requeue passes for a while (bounded)."""
        now = time.monotonic()
        if len(self._backoff) >= _BACKOFF_MAX:
            self._backoff = {k: v for k, v in self._backoff.items() if v > now}
            while len(self._backoff) >= _BACKOFF_MAX:  # the soonest-ending go first
                del self._backoff[min(self._backoff, key=self._backoff.__getitem__)]
        self._backoff[dlq_id] = now + CONFIG_ERROR_QUIET_SECONDS
