"""The entry of an execution and the lean path, moved as they were (the common case
as one flat plan: standalone, a new key, ``fn`` succeeds)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from durabilis import _fork
from durabilis._scripts import Replies
from durabilis.core import logsink
from durabilis.core.breaker import Permit
from durabilis.core.layer import base as _base
from durabilis.core.layer.base import (
    _CLAIM_AGAIN,
    _breaker_refused,
    _Claim,
    _claim_refused,
    _ClaimAgain,
    _record_refused,
    _Request,
    _unknown,
)
from durabilis.core.layer.claim import _Claims
from durabilis.core.layer.types import OperationContext
from durabilis.core.retry import RetryPolicy
from durabilis.core.steps import IO, Hold, Plan, Run
from durabilis.errors import DurabilisError, ResultNotStored

# The lean path's claim step (the in-flight entry, then the claim, gated) and
# its record step: as _claim_and_run and _succeeded build them for its case.
_LEAN_AT: Mapping[str, int] = {"note": 0, "claim": 1}
_LEAN_GATES: Mapping[int, Callable[[Any], bool]] = {1: _claim_refused}
_LEAN_WAVES = (0, 1)
_LEAN_RECORD_GATES: Mapping[int, Callable[[Any], bool]] = {0: _record_refused}
_LEAN_RECORD_WAVES = (1, 1)  # the record, and a breaker's report beside it
# With a breaker: its admission (gated), and its registration the first time.
_LEAN_CB_AT: Mapping[str, int] = {"note": 0, "claim": 1, "cb": 2}
_LEAN_CB_GATES: Mapping[int, Callable[[Any], bool]] = {1: _claim_refused, 2: _breaker_refused}
_LEAN_CB_WAVES = (0, 1, 2)
_LEAN_CB_REG_AT: Mapping[str, int] = {"note": 0, "claim": 1, "cb": 2, "register": 3}
_LEAN_CB_REG_WAVES = (0, 1, 2, 0)


class _LeanPath(_Claims):
    """The entry of an execution, and the lean path (the common case, flat)."""

    # -- the durable operation --

    def execute_plan(self, req: _Request, fn: Callable[[OperationContext], Any]) -> Plan[Any]:
        # otel hook (start and end of a call): the plan, run inside the call's span
        # when tracing is on (tracing.begin is None when it is off: the plan as is).
        traced = self.tracing.begin(req)
        plan = self._execute_plan(req, fn)
        return plan if traced is None else traced.run(plan)

    def lean_entry(self, req: _Request) -> tuple[RetryPolicy | None, float | None] | None:
        """``(policy, wait_until)`` when ``req`` takes the lean path (see
        :meth:`_lean`) and no trace is taken (``tracing.begin`` is ``None``), else
        ``None``: then it runs as :meth:`execute_plan`'s plan."""
        wait_until = None if req.wait is None else self.clock() + req.wait
        policy = self._retry.get_policy(req.operation_type)
        if self._lean(req, policy) and self.tracing.begin(req) is None:
            return policy, wait_until
        return None

    def _execute_plan(self, req: _Request, fn: Callable[[OperationContext], Any]) -> Plan[Any]:
        wait_until = None if req.wait is None else self.clock() + req.wait
        policy = self._retry.get_policy(req.operation_type)
        # (_ClaimAgain: a parking its guard dropped, see _Parking._park)
        if self._lean(req, policy):
            try:
                outcome = yield from self._lean_plan(req, fn, policy, wait_until)
            except _ClaimAgain:
                outcome = _CLAIM_AGAIN
            if outcome is not _CLAIM_AGAIN:
                return outcome
        return (yield from self.claim_loop(req, fn, wait_until))

    def claim_loop(
        self, req: _Request, fn: Callable[[OperationContext], Any], wait_until: float | None,
    ) -> Plan[Any]:
        """The claim plans, from a claim step, as often as a parking's guard asks."""
        while True:
            try:
                outcome = yield from self._claim_and_run(req, fn, wait_until)
            except _ClaimAgain:
                continue
            if outcome is not _CLAIM_AGAIN:
                return outcome

    # -- the lean success path --

    def _lean(self, req: _Request, policy: RetryPolicy | None) -> bool:
        """Whether the operation can take the lean path: standalone (one fused
        claim step), a claim, no retry budget, no checkpoint, no key aliases,
        not a replay (a breaker or none). Its steps are those of the plans below."""
        return (
            self.fuses and req.task_id is None and not req.aliases
            and not req.replay and req.replay_claim is None
            and self.config.idempotency.enabled
            and (policy is None or policy.budget is None)
        )

    def _lean_plan(
        self, req: _Request, fn: Callable[[OperationContext], Any], policy: RetryPolicy | None,
        wait_until: float | None,
    ) -> Plan[Any]:
        """The common case straight-line: a new key, ``fn`` succeeds, its outcome
        recorded. The steps, their order, gates and shields are those of
        :meth:`_claim_and_run`, :meth:`_attempts` and :meth:`_succeeded` for such
        an operation (so every fault the simulator injects between them is met
        as there); at the first reply that is not the common case, those plans
        take over from where it stands.

        The sync layer runs the same steps without a plan
        (:func:`durabilis.layer._direct.run_lean`): both are made of the
        ``lean_*`` pieces below, and each hands over to the same plans."""
        begin = self.lean_begin(req)
        yield begin.hold
        try:
            replies = yield begin.step
        except DurabilisError as exc:
            yield from self.lean_undo(req, begin, exc.partial)
            raise
        except self.interrupts:
            yield from self.lean_undo(req, begin, None)
            raise
        cl = self.lean_claimed(req, begin, replies)
        if cl is None:  # a duplicate, a takeover, an earlier claim to settle, foreign data
            return (yield from self.lean_other(req, fn, policy, wait_until, begin, replies))
        permit = None
        if req.dependency is not None:
            permit = yield from self.lean_admission(req, cl, replies, begin)
        start = self.clock()
        ctx = self.lean_context(req, cl)
        try:
            ok, value = yield Run(fn, ctx, ctx)
        except GeneratorExit:
            raise  # the plan abandoned (its process died, in the simulator)
        except BaseException:
            if cl.pid != _fork.pid():
                raise  # (see _attempts)
            yield from self.lean_interrupted(req, cl, permit)
            raise
        if cl.pid != _fork.pid():
            return lean_child(ok, value)
        took_ms = (self.clock() - start) * 1000.0
        if not ok:  # the retry loop, from its first attempt's failure
            first = (value, start, took_ms)
            return (yield from self.lean_failed(req, fn, policy, cl, permit, first))
        record = self.lean_record(req, cl, permit, value, took_ms)
        try:
            done = yield record.step
        except DurabilisError as exc:
            return (yield from self.lean_unrecorded(req, record, exc))
        if not self.lean_recorded(req, record, done):
            return (yield from self.lean_unrecorded(req, record, done))
        return value

    # -- the pieces of the lean path (its plan above, and the sync layer's run_lean) --

    def lean_begin(self, req: _Request) -> _LeanBegin:
        """The claim step's calls (the in-flight entry, then the claim, gated; a
        breaker's admission, and its registration the first time)."""
        dep = req.dependency
        nonce = _base.nonce()  # (looked up each time: the simulator seeds it)
        member = f"{req.key.value}|{nonce}"
        calls = [self._note("add", [member]), self._idem.claim(req.key, None, req.envelope, nonce)]
        at, gates = _LEAN_AT, _LEAN_GATES
        waves: Sequence[int] = _LEAN_WAVES
        register = None
        if dep is not None:
            calls.append(self._breakers.ops.before_call(dep, probe_id=f"{nonce}.0"))
            at, gates, waves = _LEAN_CB_AT, _LEAN_CB_GATES, _LEAN_CB_WAVES
            register = self._breakers.registration_call(dep)
            if register is not None:
                calls.append(register)
                at, waves = _LEAN_CB_REG_AT, _LEAN_CB_REG_WAVES
        return _LeanBegin(
            Hold(req.key.value, nonce, member), IO(calls, gates, waves=waves), at,
            register is not None,
        )

    def lean_undo(self, req: _Request, begin: _LeanBegin, partial: Replies | None) -> Plan[None]:
        """The claim step failed (``partial``: what its error told) or was interrupted."""
        hold = begin.hold
        return self._undo_begin(
            req, hold.nonce, hold.member, begin.probe, partial or _unknown(len(begin.step.calls)),
            begin.at,
        )

    def lean_claimed(self, req: _Request, begin: _LeanBegin, replies: Replies) -> _Claim | None:
        """The claim, when the claim step's replies are the common case (a new
        key, claimed clean; the breaker's answer committed): else ``None``."""
        dep = req.dependency
        status = replies.status
        if begin.registers and dep is not None and status[3] == "c":
            self._breakers.mark_registered(dep)
        reply = replies[1]
        if (status[:2] == "cc" and type(reply) is list and len(reply) >= 6
                and reply[0] == b"new" and reply[4] == 0 and not reply[5]
                and type(reply[1]) is bytes and reply[1].isascii() and reply[1]
                and (dep is None or status[2] == "c")):
            hold = begin.hold
            return _Claim(hold.nonce, hold.member, reply[1].decode())
        return None

    def lean_other(  # noqa: PLR0917  (the claim step, as it stands)
        self, req: _Request, fn: Callable[[OperationContext], Any], policy: RetryPolicy | None,
        wait_until: float | None, begin: _LeanBegin, replies: Replies,
    ) -> Plan[Any]:
        """A claim step whose replies are not the common case: the claim plans' way."""
        hold = begin.hold
        return self._claimed(
            req, fn, policy, wait_until, replies, begin.at, hold.nonce, hold.member,
            begin.probe, None, None,
        )

    def lean_interrupted(self, req: _Request, cl: _Claim, permit: Permit | None) -> Plan[bool]:
        """``fn`` was interrupted (or raised what is no failure): the claim goes back touched."""
        return self._abandon(req, cl, permit, None, touched=True, started=1)

    def lean_admission(
        self, req: _Request, cl: _Claim, replies: Replies, begin: _LeanBegin,
    ) -> Plan[Permit]:
        """The breaker's answer in the claim step (:meth:`_admission`)."""
        return self._admission(req, cl, replies, begin.at, begin.probe)

    def lean_context(self, req: _Request, cl: _Claim) -> OperationContext:
        """``fn``'s context on the lean path (a first attempt of a clean claim)."""
        return OperationContext(
            req.agent_id, req.operation_type, req.payload, req.key.value, cl.token, 0,
            req.dependency, None, None, False, False, req.key.caller_key,
        )

    def lean_failed(  # noqa: PLR0917  (the attempt, as it stands)
        self, req: _Request, fn: Callable[[OperationContext], Any], policy: RetryPolicy | None,
        cl: _Claim, permit: Permit | None, first: tuple[BaseException, float, float],
    ) -> Plan[Any]:
        """``fn``'s first attempt failed: the retry loop, from there (:meth:`_attempts`)."""
        return self._attempts(req, fn, policy, cl, permit, first=first)

    def lean_unrecorded(
        self, req: _Request, record: _LeanRecord, first: Replies | DurabilisError,
    ) -> Plan[Any]:
        """The record step failed, or its replies are not the common case:
        :meth:`_succeeded` goes on from there."""
        return self._succeeded(
            req, record.claim, record.permit, record.value, record.took_ms, first=first,
        )

    def lean_record(
        self, req: _Request, cl: _Claim, permit: Permit | None, value: Any, took_ms: float,
    ) -> _LeanRecord:
        """The record step (as :meth:`_succeeded` sends it for its case): the
        record, and a breaker's report beside it."""
        dep, token = req.dependency, cl.token
        assert token is not None
        packed, _, not_stored = self._encode_result(req, value)
        calls = [self._idem.record_packed(req.key, packed, token, not_stored, cl.nonce)]
        if dep is not None:
            calls.append(self._breakers.ops.after_call(dep, True, permit, took_ms))
        step = IO(calls, _LEAN_RECORD_GATES, shield=True, waves=_LEAN_RECORD_WAVES[:len(calls)])
        return _LeanRecord(step, cl, permit, value, took_ms, not_stored)

    def lean_recorded(self, req: _Request, record: _LeanRecord, done: Replies) -> bool:
        """Whether the record step's replies are the common case (recorded): then
        the breaker's report is noted, the claim left, and a result that could
        not be stored raises ResultNotStored. ``False``: :meth:`_succeeded`
        goes on from these replies."""
        reply = done[0]
        if (done.status != "cc"[:len(record.step.calls)] or type(reply) is not list or not reply
                or reply[0] != b"ok"):
            return False
        dep = req.dependency
        if dep is not None:  # fires; notes the cache
            self._breakers.reported(dep, record.permit, done[1], record.took_ms)
        self._leave([record.claim.member], {"started": 1, "succeeded": 1})
        if record.not_stored:
            logsink.SINK.error(
                "durability_result_not_stored", idempotency_key=req.key.value,
                operation_type=req.operation_type, reason=record.not_stored,
            )
            raise ResultNotStored(req.key.value, record.not_stored, result=record.value)
        return True



def lean_child(ok: bool, value: Any) -> Any:
    """``fn``'s outcome in a child it forked (the claim is the parent's: nothing
    recorded, released or parked here): returned or raised as it came."""
    if ok:
        return value
    raise value


@dataclass(slots=True)
class _LeanBegin:
    """The lean path's claim step: its Hold, its IO step, the calls' indexes,
    whether it registers the breaker."""

    hold: Hold
    step: IO
    at: Mapping[str, int]
    registers: bool

    @property
    def probe(self) -> str:
        return f"{self.hold.nonce}.0"


@dataclass(slots=True)
class _LeanRecord:
    """The lean path's record step, and what its reply's handling needs."""

    step: IO
    claim: _Claim
    permit: Permit | None
    value: Any
    took_ms: float
    not_stored: str
