"""The layer's attempts (:meth:`_Attempts._attempts`): its hooks on THE retry loop
(:func:`durabilis.core.retry.retry_loop`), which the engines drive too."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from durabilis import _fork
from durabilis._retry_events import emit_retry_attempt, emit_retry_stop
from durabilis._scripts import Replies, ScriptCall
from durabilis.core import logsink
from durabilis.core.breaker import Permit
from durabilis.core.layer.base import _Claim, _renewed, _Request
from durabilis.core.layer.park import _Parking
from durabilis.core.layer.types import CIRCUIT_OPEN, OperationContext
from durabilis.core.retry import (
    EXHAUSTED,
    NON_RETRYABLE,
    TESTING,
    RetryDecision,
    RetryHooks,
    RetryPolicy,
    Stopped,
    decide_coded,
    retry_loop,
)
from durabilis.core.steps import IO, Plan, Run, Sleep
from durabilis.errors import CircuitOpen, DurabilisError, LeaseLost
from durabilis.events import error_text


class _Attempts(_Parking):
    """The layer's attempts of ``fn`` under one claim: its hooks on THE retry loop."""

    def _attempts(  # noqa: PLR0915  (the hooks share the loop's state: read as one piece)
        self,
        req: _Request,
        fn: Callable[[OperationContext], Any],
        policy: RetryPolicy | None,
        cl: _Claim,
        permit: Permit | None,
        *,
        first: tuple[BaseException, float, float] | None = None,
    ) -> Plan[Any]:
        """The attempts, retried as the policy says, as :func:`retry_loop` with
        the layer's hooks (each yields exactly the steps named in it). ``first``:
        the lean path's first attempt failed (its error, when the attempts
        started, how long it took in ms): the loop goes on from there."""
        dep = req.dependency
        budget = policy.budget if policy is not None else None
        deadline = req.deadline
        if deadline is None and policy is not None:
            deadline = policy.deadline_seconds
        start = self.clock() if first is None else first[1]
        confirmed = start  # when this claim was last known to be ours
        failed: tuple[BaseException, RetryDecision] | None = None  # the last attempt's failure
        slept = 0.0
        probe: str | None = None  # this attempt's breaker probe, when it was admitted as one
        took_ms = 0.0
        stop_now: BaseException | None = None  # SystemExit & co. raised by the policy's own code

        def before_attempt(attempt: int) -> Plan[Stopped[Any] | None]:
            nonlocal confirmed, permit, probe
            probe = None
            if (first is None and cl.token
                    and self.clock() - confirmed >= self.config.renew_interval):
                # A long pause (a backoff, or a stalled process): before the next
                # effect, make sure the lease did not lapse and pass to another
                # worker, who may have completed the operation meanwhile.
                try:
                    held = yield IO([self._idem.renew(req.key, cl.token, self._lease_ms)])
                except self.interrupts:
                    yield from self._abandon(req, cl, None, None, touched=attempt > 0, started=1)
                    raise
                except DurabilisError as broke:
                    return Stopped((yield from self._park_failed(req, cl, failed, broke)))
                if not _renewed(held[0]):
                    # Its index entry stays: if recovery reclaimed the claim (same
                    # nonce), the entry is how a crashed recoverer is recovered in
                    # turn; otherwise recover_orphans drops it.
                    raise LeaseLost(req.key.value)
                confirmed = self.clock()
            if attempt == 0:
                return None
            assert failed is not None
            if dep is not None:
                probe = f"{cl.nonce}.{attempt}"
                try:
                    admit = yield IO([self._breakers.ops.before_call(dep, probe_id=probe)])
                    permit = self._decode_permit(dep, admit[0])
                except CircuitOpen as refused:
                    return Stopped((yield from self._park(
                        req, cl, attempts=attempt, error=CIRCUIT_OPEN, reason=CIRCUIT_OPEN,
                        cause=refused, started=1,
                    )))
                except self.interrupts:
                    yield from self._abandon(req, cl, None, probe, touched=True, started=1)
                    raise
                except DurabilisError as broke:
                    yield from self._best_effort(
                        [self._breakers.ops.release_probe(dep, probe)],
                        "durability_release_failed", req.key.value,
                    )
                    return Stopped((yield from self._park_failed(req, cl, failed, broke)))
            if self._past(deadline, start, slept):
                # The round trips after the backoff (renewal, admission) ran
                # into the deadline: no attempt starts past it.
                if probe is not None:
                    assert dep is not None
                    yield from self._best_effort(
                        [self._breakers.ops.release_probe(dep, probe)],
                        "durability_release_failed", req.key.value,
                    )
                late = (failed[0], failed[1].deny_deadline())
                return Stopped((yield from self._park_failed(req, cl, late, None)))
            # Counted and announced as it starts (never one denied after its
            # decision: a cancellation held back until the backoff, a lease
            # lost, a breaker opened or the deadline reached meanwhile), in
            # this process's batch of counts, like the other counters.
            announced = failed[1]
            emit_retry_attempt(req.operation_type, announced, agent_id=req.agent_id)
            self.tracing.retried(  # otel hook
                announced.attempts, announced.delay, announced.error_code)
            self._leave([], {"retries": 1})
            return None

        def attempt(attempt: int) -> Plan[tuple[bool, Any]]:
            nonlocal first, took_ms
            if first is not None:  # (attempt 0, run by the lean path)
                exc, took_ms, first = first[0], first[2], None
                return False, exc
            ctx = OperationContext(
                req.agent_id, req.operation_type, req.payload, req.key.value, cl.token,
                attempt, dep, req.task_id, req.phase, req.replay, cl.taken_over,
                req.key.caller_key,
            )
            began = self.clock()
            ok, value = yield from self._attempt(req, fn, cl, permit, probe=probe, ctx=ctx)
            if not ok and cl.pid != _fork.pid():
                # A child forked inside fn that returned: it records, releases
                # and retries nothing (its parent does); its fn's outcome is its
                # own (a success: on_success).
                raise value
            took_ms = (self.clock() - began) * 1000.0
            return ok, value

        def on_success(value: Any, _: int) -> Plan[Any]:
            if cl.pid != _fork.pid():  # (a child forked inside fn: see attempt)
                return value
            return (yield from self._succeeded(req, cl, permit, value, took_ms))

        def decide_(attempt: int, exc: BaseException) -> RetryDecision:
            nonlocal stop_now
            code = "Exception"  # (if the classification itself is what raised)
            try:
                code = self.classify(exc)
                return decide_coded(
                    policy, attempt, exc, code,
                    elapsed=self.clock() - start + slept, deadline=deadline,
                )
            except Exception as bug:  # a policy's own code raised (a subclass's bug)
                # An attempt ran: park it (never hold the claim for the lease).
                with contextlib.suppress(Exception):
                    logsink.SINK.error(
                        "durability_retry_decision_failed", agent_id=req.agent_id,
                        operation_type=req.operation_type, error=type(bug).__qualname__,
                    )
            except BaseException as stop:  # (SystemExit, KeyboardInterrupt, ...)
                # Raised by the policy's own code (sys.exit in is_retryable): no
                # step is running to compensate, so on_stop does, then raises it.
                stop_now = stop
            return RetryDecision(False, 0.0, attempt, attempt + 1, code, EXHAUSTED)

        def after_failure(
            decision: RetryDecision, exc: BaseException
        ) -> Plan[RetryDecision | Stopped[Any]]:
            nonlocal failed
            if decision.stop_reason == NON_RETRYABLE or stop_now is not None:
                return decision  # not a dependency failure, or stopping: nothing reported (on_stop)
            calls: list[ScriptCall] = []
            if dep is not None:
                calls.append(self._breakers.ops.after_call(dep, False, permit, took_ms))
            if decision.retry and budget is not None:
                calls.append(self._budget.spend_retry(req.operation_type, budget))
            failed = (exc, decision)
            try:  # the report and the budget are independent: at once
                replies = (yield IO(calls, waves=[0] * len(calls))) if calls else Replies([], "")
            except self.interrupts:
                yield from self._abandon(req, cl, permit, probe, touched=True, started=1)
                raise
            except DurabilisError as broke:
                if dep is not None:
                    self._breakers.forget(dep)  # a report that did not reach Redis
                return Stopped((yield from self._park_failed(req, cl, failed, broke)))
            if dep is not None:
                self._breakers.reported(dep, permit, replies[0], took_ms)  # fires; notes the cache
            if decision.retry and budget is not None:
                try:
                    state = self._budget.decode(req.operation_type, replies[-1])
                except DurabilisError as broke:  # foreign data at the budget's key
                    return Stopped((yield from self._park_failed(req, cl, failed, broke)))
                if not state.allowed:
                    decision = decision.deny_budget()
            if decision.retry and self._past(deadline, start, slept, decision.delay):
                # The round trip itself (the breaker's report, the budget's
                # answer) took the time left: the retry is not made (a budget
                # stays spent: a retry charged, never run).
                decision = decision.deny_deadline()
            failed = (exc, decision)
            return decision

        def on_stop(decision: RetryDecision, exc: BaseException) -> Plan[Any]:
            if stop_now is not None:
                # As an interruption after fn: the claim goes back touched, the
                # probe slot freed without a verdict; then the policy's exception.
                yield from self._abandon(req, cl, permit, probe, touched=True, started=1)
                raise stop_now
            if decision.stop_reason == NON_RETRYABLE:
                # Not a dependency failure: free a probe slot without a verdict.
                yield from self._abandon(req, cl, permit, probe, started=1, non_retryable=1)
                emit_retry_stop(
                    req.operation_type, decision, agent_id=req.agent_id,
                    last_error=error_text(exc),
                )
                raise exc
            return (yield from self._park_failed(req, cl, (exc, decision), None))

        def sleep(decision: RetryDecision) -> Plan[None]:
            nonlocal slept
            try:
                yield Sleep(decision.delay)
            except self.interrupts:
                yield from self._abandon(req, cl, None, None, touched=True, started=1)
                raise
            slept += decision.delay if TESTING.instant else 0.0

        return retry_loop(RetryHooks(
            attempt, decide_, on_success, on_stop, before_attempt=before_attempt,
            after_failure=after_failure, sleep=sleep,
        ))

    def _attempt(
        self, req: _Request, fn: Callable[[OperationContext], Any], cl: _Claim,
        permit: Permit | None, *, probe: str | None, ctx: OperationContext,
    ) -> Plan[tuple[bool, Any]]:
        """Run ``fn`` once: ``(True, result)`` or ``(False, its error)``."""
        try:
            outcome: tuple[bool, Any] = yield Run(fn, ctx, ctx)
        except GeneratorExit:
            raise  # the plan abandoned (its process died, in the simulator)
        except BaseException:
            if cl.pid != _fork.pid():
                # A child forked inside fn leaving by an exception (sys.exit
                # is the usual way): the claim is its parent's, still running.
                raise
            # Interrupted while fn ran (a cancellation, a timeout, SystemExit,
            # KeyboardInterrupt, any BaseException not fn's ordinary error):
            # nothing to record, but its effect may have happened. Give the
            # probe slot back and the claim as touched (the next delivery
            # runs with ctx.recovered), then re-raise.
            yield from self._abandon(req, cl, permit, probe, touched=True, started=1)
            raise
        return outcome

    def _past(
        self, deadline: float | None, start: float, slept: float, delay: float = 0.0
    ) -> bool:
        """Whether ``delay`` more seconds reach the attempts' deadline."""
        return deadline is not None and self.clock() - start + slept + delay >= deadline
