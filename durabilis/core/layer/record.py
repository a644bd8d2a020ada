"""The record step (:meth:`_Records._succeeded`): sent again, shielded, while the lease lasts."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from durabilis._scripts import Replies, ScriptCall
from durabilis.core import logsink
from durabilis.core.breaker import Permit
from durabilis.core.dlq import DlqStatus, record_id_for
from durabilis.core.layer.base import (
    _GIVE_UP,
    _LATE_TRIES,
    _RECORD_BACKOFF,
    _SETTLED_BY,
    _VOID,
    _Claim,
    _guard_refused,
    _log_guard_refusal,
    _record_refused,
    _Request,
    _save_refused,
    _settle,
    _tag,
    _Unsent,
)
from durabilis.core.layer.notes import _Notes
from durabilis.core.steps import IO, Defer, Plan, Sleep
from durabilis.errors import (
    CorruptData,
    DurabilisError,
    LeaseLost,
    OutcomeUnrecorded,
    ResultNotStored,
)
from durabilis.events import exception_str


def _guarded(
    key: str, order: Sequence[str], gates: Mapping[str, Callable[[Any], bool]],
    waves: Mapping[str, int] | None, on_reply: Callable[[str, Any], Any],
) -> tuple[Sequence[str], Mapping[str, Callable[[Any], bool]], Mapping[str, int] | None,
           Callable[[str, Any], Any]]:
    """A step's order, gates, waves and decoding with a parking's guard in front
    (see :meth:`_Records._persist`)."""

    def decode(name: str, reply: Any) -> Any:
        if name != "guard":
            return on_reply(name, reply)
        if _guard_refused(reply):
            _log_guard_refusal(key, reply)
            return _VOID
        return None  # (armed again in front of its call while that is pending)

    return (
        ("guard", *order), {**gates, "guard": _guard_refused},
        {**waves, "guard": min(waves.values()) - 1} if waves else None, decode,
    )


class _Records(_Notes):
    """The record step: after the effect, the outcome recorded first."""

    def _persist(  # noqa: PLR0912, PLR0917  (a step's calls, their order, waves, gates, decoding)
        self, key: str, calls: dict[str, ScriptCall], order: Sequence[str],
        gates: Mapping[str, Callable[[Any], bool]], on_reply: Callable[[str, Any], Any],
        waves: Mapping[str, int] | None = None, *, first: Replies | DurabilisError | None = None,
        guard: tuple[ScriptCall, str] | None = None,
    ) -> Plan[None]:
        """Send a step until every call of it is settled, shielded, while the lease lasts.

        ``on_reply(name, reply)`` decodes a call's reply (committed or refused)
        and returns ``None`` (settled), a call to send instead (a checkpoint save
        whose eviction hints were stale), or ``_GIVE_UP`` (settled, and the
        other gated calls and the index note are dropped: the claim was lost). A step that fails is
        sent again, less the calls that committed, with backoff; once the
        lease's time has run out it is given up after ``_LATE_TRIES`` more
        failures (after a long pause, the process tries again before it gives up).

        ``guard``: ``(call, name)``, a parking's guard (``idem_check`` modes
        ``"g"``/``"G"``) and the enqueue it guards: it goes in front of every
        send of that call, gated (a wave before it unfused), and once it
        refuses (the operation completed, or another delivery holds it)
        nothing more of the step goes (its enqueue
        may have landed with its reply lost, and a redelivery succeeded since:
        parked again, the completed operation would be run again by a replay).
        It stays in front of the call in what is left to the keep-alive.
        """
        pending = dict(calls)
        if guard is not None:
            order, gates, waves, on_reply = _guarded(key, order, gates, waves, on_reply)

        def arm() -> None:
            if guard is not None and guard[1] in pending:
                pending["guard"] = guard[0]

        retry_until: float | None = None
        late = 0  # failures since the lease's time ran out (a paused process tries again first)
        delay = _RECORD_BACKOFF[0]
        while pending:
            arm()
            names = [n for n in order if n in pending]
            step_gates = {i: gates[n] for i, n in enumerate(names) if n in gates}
            try:
                if first is not None:  # (the lean path sent this step once already)
                    outcome, first = first, None
                    if isinstance(outcome, DurabilisError):
                        raise outcome
                    replies = outcome
                else:
                    replies = yield IO(
                        [pending[n] for n in names], step_gates, shield=True,
                        waves=[waves[n] for n in names] if waves else None,
                    )
            except CorruptData:
                raise
            except DurabilisError as exc:
                # A birth entry's removal goes once, whatever came of it: left
                # behind, recovery drops it with one look; it never holds back
                # (nor fails) the outcome's record.
                pending.pop("birth", None)
                if exc.partial is not None:
                    for i, name in enumerate(names):
                        if exc.partial.status[i] == "c":
                            _settle(name, exc.partial[i], pending, gates, on_reply)
                now = self.clock()
                if retry_until is None:
                    retry_until = now + self._lease_s
                late += now >= retry_until
                if late >= self._late_tries:
                    arm()
                    names = [n for n in order if n in pending]
                    raise _Unsent(exc, [pending[n] for n in names], {
                        i: gates[n] for i, n in enumerate(names) if n in gates
                    }, guarded="guard" in pending) from exc
                logsink.SINK.warning(
                    "durability_record_retry", idempotency_key=key,
                    error=f"{type(exc).__name__}: {exc}", delay_seconds=round(delay, 3),
                )
                yield Sleep(delay * (0.5 + random.random() / 2), shield=True)
                delay = min(delay * 2, _RECORD_BACKOFF[1])
                continue
            pending.pop("birth", None)  # (once, as above)
            for i, name in enumerate(names):
                if replies.status[i] != "n":  # "n": aborted by another's refusal: again
                    _settle(name, replies[i], pending, gates, on_reply)

    def _encode_result(
        self, req: _Request, result: Any
    ) -> tuple[bytes, ScriptCall | None, str]:
        """The result encoded for every pillar that stores it; never raises.

        After the effect, nothing may raise before the outcome is recorded: a
        result some pillar cannot keep is recorded as "completed, result not
        stored" (the third value says why; no checkpoint then).
        """
        try:
            packed = bytes(self._idem.pack_value(result, "result"))
            save = None
            if req.task_id is not None and req.phase is not None:
                save = self._ckpt.save(req.task_id, req.agent_id, req.phase, result)
        except BaseException as exc:  # (a result whose own code raises SystemExit & co., too)
            return b"", None, f"{type(exc).__name__}: {exception_str(exc)}"[:500]
        return packed, save, ""

    def _succeeded(  # noqa: PLR0912, PLR0915  (the record step reads best as one piece)
        self, req: _Request, cl: _Claim, permit: Permit | None, result: Any, took_ms: float,
        *, first: Replies | DurabilisError | None = None,
    ) -> Plan[Any]:
        """Record the outcome of ``fn``'s success. ``first``: what the lean
        path's first sending of this very step gave (its replies, or its
        failure): the step goes on from there."""
        packed, save, not_stored = self._encode_result(req, result)
        calls: dict[str, ScriptCall] = {}
        if cl.token:
            # An operation parked, or claimed by a dead worker, under another
            # secret's key: its DLQ record is settled in a later wave on Cluster
            # (a crash between the waves leaves it pending), or recovery may
            # park the dead claim after this success: the record outlives any
            # such DLQ record, so its replay finds the operation done.
            aliased = cl.orphaned_aliases or cl.settle_aliases
            calls["record"] = self._idem.record_packed(
                req.key, packed, cl.token, not_stored, cl.nonce,
                # A claim taken over (from a lapsed owner, or a touched
                # tombstone's): that owner's parking may still come, late (its
                # keep-alive, cut off from Redis); the record outlives it, so
                # its guard meets the operation completed, never a missing key.
                hold_ms=self._dlq.hold_ms() * 2 if aliased
                else self._dlq.hold_ms() if cl.taken_over else 0,
            )
        # The dead claims themselves are recorded done (never parked, then).
        for i, alias in enumerate(cl.orphaned_aliases):
            calls[f"orphan.{i}"] = self._idem.record_packed(
                alias, packed, None, not_stored, orphan=True
            )
        if save is not None:
            calls["save"] = save
        if req.dependency is not None:
            calls["report"] = self._breakers.ops.after_call(
                req.dependency, True, permit, took_ms
            )
        if (settle := self._settle_call(req, cl)) is not None:
            calls["settle"] = settle
        # A rotation: the operation parked under another secret's key (a
        # released alias) is settled too (DLQ keys share one slot: same wave).
        for i, alias in enumerate(cl.settle_aliases):
            calls[f"settle.{i}"] = self._dlq.finish(
                record_id_for(alias.value), DlqStatus.REPLAYED, by=_SETTLED_BY,
                merge_key=alias.value,
            )
        if self._buckets and cl.member and cl.token:
            # The birth entry is no longer needed once the index entry landed
            # (cl.member): beside the record, no round trip of its own. (Not
            # listed there, it stays until recovery finds the record done.)
            calls["birth"] = self._birth_gone(req.key.value, cl.nonce)
        counts = {"started": 1, "succeeded": 1}
        # Standalone: one atomic step; the record goes first, its first write
        # frees memory, so maxmemory never refuses it. Cluster, in waves: the
        # checkpoint first (a checkpoint without its record is saved again by a
        # re-run; a record without its checkpoint would never get one); the
        # record and the breaker's report at once; the DLQ record settled once
        # the outcome is recorded. On both, the index entry is removed later,
        # with the counts, in a batch (_leave): three commands fewer per call.
        order = ("record", "save", "settle", "report") if self.fuses else (
            "save", "record", "report", "birth", "settle"
        )
        waves = {"save": 0, "record": 1, "report": 1, "birth": 1, "settle": 2}
        if cl.settle_aliases:
            named = [f"settle.{i}" for i in range(len(cl.settle_aliases))]
            order = (*order, *named)
            waves.update((n, 2) for n in named)
        if cl.orphaned_aliases:
            named = [f"orphan.{i}" for i in range(len(cl.orphaned_aliases))]
            order = (*order, *named)
            waves.update((n, 2) for n in named)
        lost = False
        misses: dict[str, list[str]] = {}

        def on_reply(name: str, reply: Any) -> Any:
            nonlocal lost
            if name == "record":
                try:
                    self._idem.decode_record(req.key, reply)
                except LeaseLost:
                    lost = True  # taken over: the new owner records (and saves)
                    return _GIVE_UP
                return None
            if name == "save":
                if _tag(reply) == "exists":  # ours, sent again after a lost reply
                    return None
                try:
                    out = self._ckpt.decode_save(calls["save"], reply)
                except DurabilisError as exc:
                    # Refused for good (foreign data at a checkpoint key): the
                    # outcome is recorded all the same, without its checkpoint
                    # (a gated refusal wrote nothing; the record is sent again alone).
                    logsink.SINK.error(
                        "durability_checkpoint_not_saved", idempotency_key=req.key.value,
                        task_id=req.task_id, error=f"{type(exc).__name__}: {exc}",
                    )
                    return None
                if isinstance(out, ScriptCall):
                    calls["save"] = out
                return out if isinstance(out, ScriptCall) else None
            if name == "report" and req.dependency is not None:
                self._breakers.reported(req.dependency, permit, reply, took_ms)
            if name == "settle":
                return self._settle_again(req, reply, misses.setdefault(name, []),
                                          req.key.value, own=True)
            if name.startswith("orphan."):
                # "lost": no longer a dead claim (recovery reclaimed or parked
                # it first: the settle above, and this record's hold, cover it).
                return None
            if name.startswith("settle."):  # a record parked under an alias
                alias = cl.settle_aliases[int(name[len("settle."):])].value
                return self._settle_again(req, reply, misses.setdefault(name, []), alias,
                                          own=False)
            return None

        gates: dict[str, Callable[[Any], bool]] = {"record": _record_refused}
        if save is not None:
            gates["save"] = _save_refused
        try:
            yield from self._persist(
                req.key.value, calls, order, gates, on_reply, waves, first=first
            )
        except _Unsent as unsent:
            if req.dependency is not None:
                self._breakers.forget(req.dependency)  # its report did not land (yet)
            # After the record, by the keep-alive.
            unsent.calls.append(self._note("rem", [cl.member] if cl.member else [], **counts))
            # The keep-alive decodes nothing: a checkpoint save it sends that is
            # refused (stale eviction hints, a conflict) must not end the step
            # before the record, as a gate would (the claim would then lapse and
            # a replay run the operation again). The outcome is recorded; the
            # checkpoint may not be, as when _persist gives up a save for good.
            unsent.gates = {i: g for i, g in unsent.gates.items() if g is not _save_refused}
            yield from self._defer(req, cl, unsent)
            if req.replay_claim is not None:  # (its finish goes with it: the claim stays)
                req.replay_claim.unsettled = True
            raise OutcomeUnrecorded(
                req.key.value, succeeded=True, result=result
            ) from unsent.cause
        except DurabilisError as exc:  # foreign data at a key: nothing to retry
            logsink.SINK.error(
                "durability_outcome_unrecorded", idempotency_key=req.key.value,
                operation_type=req.operation_type, error=f"{type(exc).__name__}: {exc}",
            )
            raise OutcomeUnrecorded(req.key.value, succeeded=True, result=result) from exc
        if lost:
            # The index entry stays (see _attempts): recovery settles it.
            logsink.SINK.error(
                "durability_lease_lost", idempotency_key=req.key.value,
                operation_type=req.operation_type,
            )
            raise LeaseLost(req.key.value)
        self._leave([cl.member] if cl.member else [], counts)
        if not_stored:
            logsink.SINK.error(
                "durability_result_not_stored", idempotency_key=req.key.value,
                operation_type=req.operation_type, reason=not_stored,
            )
            raise ResultNotStored(req.key.value, not_stored, result)
        return result

    def _settle_call(self, req: _Request, cl: _Claim) -> ScriptCall | None:
        """Finishing the key's parked DLQ record, when an earlier delivery may
        have been parked: the success of a later one settles it, so that no
        replay runs it again (after the dedup window, when the record that
        would answer it is gone). A replay finishes its own record."""
        if req.replay_claim is not None:  # a replay: its own record, by its claim
            req.replay_claim.ran = True
            mine: ScriptCall = self._dlq.finish(
                req.replay_claim.dlq_id, DlqStatus.REPLAYED, req.replay_claim.token,
                self._dlq.owner,
            )
            return mine
        mkey = self._merge_key(req.key.value)
        if not (cl.settle and mkey and not req.replay):
            return None
        call: ScriptCall = self._dlq.finish(
            record_id_for(mkey), DlqStatus.REPLAYED, by=_SETTLED_BY, merge_key=mkey
        )
        return call

    def _settle_again(
        self, req: _Request, reply: Any, misses: list[str], merge_key: str, *, own: bool,
    ) -> ScriptCall | None:
        """The settle call to send again when the key's record has another id
        (``merge_key``: the key settled; ``own``: the request's own key's record)."""
        other = self._dlq.settle_miss(reply)
        if other is not None and len(misses) < _LATE_TRIES:
            misses.append(other)
            call: ScriptCall = self._dlq.finish(
                other, DlqStatus.REPLAYED, by=_SETTLED_BY, merge_key=merge_key
            )
            return call
        if _tag(reply) == "ok":
            if own and req.replay_claim is not None:
                req.replay_claim.finished = True
            else:
                logsink.SINK.info("durability_dlq_settled", idempotency_key=merge_key,
                                  operation_type=req.operation_type)
        return None

    def _defer(self, req: _Request, cl: _Claim, unsent: _Unsent) -> Plan[None]:
        """Leave what could not be recorded to the process's keep-alive: it keeps the
        claim and sends it until it lands (an outcome recorded late beats a re-run)."""
        logsink.SINK.error(
            "durability_outcome_unrecorded", idempotency_key=req.key.value,
            operation_type=req.operation_type,
            error=f"{type(unsent.cause).__name__}: {unsent.cause}",
        )
        yield Defer(
            req.key.value, cl.nonce, cl.member, unsent.calls, unsent.gates,
            self.config.idempotency.dedup_window_seconds, guarded=unsent.guarded,
        )
