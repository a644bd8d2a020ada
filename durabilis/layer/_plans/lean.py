"""The entry of an execution and the lean path, moved as they were (the common case
as one flat plan: standalone, a new key, ``fn`` succeeds)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from durabilis import _fork, otel
from durabilis._steps import INTERRUPTS
from durabilis.core.breaker import Permit
from durabilis.core.retry import RetryPolicy
from durabilis.core.steps import IO, Hold, Plan, Run
from durabilis.errors import DurabilisError, ResultNotStored
from durabilis.layer._config import OperationContext
from durabilis.layer._plans import base as _base
from durabilis.layer._plans.base import (
    _CLAIM_AGAIN,
    _breaker_refused,
    _Claim,
    _claim_refused,
    _ClaimAgain,
    _log,
    _record_refused,
    _Request,
    _unknown,
)
from durabilis.layer._plans.claim import _Claims

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
        # when tracing is on (otel.begin is None when it is off: the plan as is).
        traced = otel.begin(req)
        plan = self._execute_plan(req, fn)
        return plan if traced is None else traced.run(plan)

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

    def _lean_plan(  # noqa: PLR0912, PLR0915  (the common case reads best as one piece)
        self, req: _Request, fn: Callable[[OperationContext], Any], policy: RetryPolicy | None,
        wait_until: float | None,
    ) -> Plan[Any]:
        """The common case straight-line: a new key, ``fn`` succeeds, its outcome
        recorded. The steps, their order, gates and shields are those of
        :meth:`_claim_and_run`, :meth:`_attempts` and :meth:`_succeeded` for such
        an operation (so every fault the simulator injects between them is met
        as there); at the first reply that is not the common case, those plans
        take over from where it stands."""
        key = req.key.value
        dep = req.dependency
        nonce = _base.nonce()  # (looked up each time: the simulator seeds it)
        member = f"{key}|{nonce}"
        probe = f"{nonce}.0"
        calls = [self._note("add", [member]), self._idem.claim(req.key, None, req.envelope, nonce)]
        at, gates = _LEAN_AT, _LEAN_GATES
        waves: Sequence[int] = _LEAN_WAVES
        register = None
        if dep is not None:  # the breaker's admission, and its registration the first time
            calls.append(self._breakers.ops.before_call(dep, probe_id=probe))
            at, gates, waves = _LEAN_CB_AT, _LEAN_CB_GATES, _LEAN_CB_WAVES
            register = self._breakers.registration_call(dep)
            if register is not None:
                calls.append(register)
                at, waves = _LEAN_CB_REG_AT, _LEAN_CB_REG_WAVES
        yield Hold(key, nonce, member)
        try:
            replies = yield IO(calls, gates, waves=waves)
        except DurabilisError as exc:
            yield from self._undo_begin(
                req, nonce, member, probe, exc.partial or _unknown(len(calls)), at
            )
            raise
        except INTERRUPTS:
            yield from self._undo_begin(req, nonce, member, probe, _unknown(len(calls)), at)
            raise
        if register is not None and dep is not None and replies.status[3] == "c":
            self._breakers.mark_registered(dep)
        reply = replies[1]
        token = None
        if (replies.status[:2] == "cc" and type(reply) is list and len(reply) >= 6
                and reply[0] == b"new" and reply[4] == 0 and not reply[5]
                and type(reply[1]) is bytes and reply[1].isascii()
                and (dep is None or replies.status[2] == "c")):
            token = reply[1].decode()
        if not token:  # a duplicate, a takeover, an earlier claim to settle, foreign data
            return (yield from self._claimed(
                req, fn, policy, wait_until, replies, at, nonce, member, probe, None, None,
            ))
        cl = _Claim(nonce, member, token)
        permit = None
        if dep is not None:
            permit = yield from self._admission(req, cl, replies, at, probe)
        start = self.clock()
        ctx = OperationContext(
            req.agent_id, req.operation_type, req.payload, key, token, 0, dep, None, None,
            False, False, req.key.caller_key,
        )
        try:
            ok, value = yield Run(fn, ctx, ctx)
        except GeneratorExit:
            raise  # the plan abandoned (its process died, in the simulator)
        except BaseException:
            if cl.pid != _fork.pid():
                raise  # (see _attempts)
            yield from self._abandon(req, cl, permit, None, touched=True, started=1)
            raise
        if cl.pid != _fork.pid():
            if ok:
                return value
            raise value
        took_ms = (self.clock() - start) * 1000.0
        if not ok:  # the retry loop, from its first attempt's failure
            return (yield from self._attempts(
                req, fn, policy, cl, permit, first=(value, start, took_ms)
            ))
        return (yield from self._lean_record(req, cl, permit, value, took_ms))

    def _lean_record(
        self, req: _Request, cl: _Claim, permit: Permit | None, value: Any, took_ms: float,
    ) -> Plan[Any]:
        """The lean path's record step (as :meth:`_succeeded` sends it for its
        case); any reply but the common one hands it to :meth:`_succeeded`."""
        key, dep, token = req.key.value, req.dependency, cl.token
        assert token is not None
        packed, _, not_stored = self._encode_result(req, value)
        record = [self._idem.record_packed(req.key, packed, token, not_stored, cl.nonce)]
        if dep is not None:  # (its report beside the record: one step, as _succeeded's)
            record.append(self._breakers.ops.after_call(dep, True, permit, took_ms))
        try:
            done = yield IO(
                record, _LEAN_RECORD_GATES, shield=True, waves=_LEAN_RECORD_WAVES[:len(record)],
            )
        except DurabilisError as exc:
            return (yield from self._succeeded(req, cl, permit, value, took_ms, first=exc))
        reply = done[0]
        if (done.status != "cc"[:len(record)] or type(reply) is not list or not reply
                or reply[0] != b"ok"):
            return (yield from self._succeeded(req, cl, permit, value, took_ms, first=done))
        if dep is not None:
            self._breakers.reported(dep, permit, done[1], took_ms)  # fires; notes the cache
        self._leave([cl.member], {"started": 1, "succeeded": 1})
        if not_stored:
            _log.error(
                "durability_result_not_stored", idempotency_key=key,
                operation_type=req.operation_type, reason=not_stored,
            )
            raise ResultNotStored(key, not_stored, result=value)
        return value
