"""The claim step (:meth:`_Claims._claim_and_run`) and what its replies lead to."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from durabilis._scripts import Replies, ScriptCall, fuse
from durabilis.core import logsink
from durabilis.core.breaker import Permit
from durabilis.core.idempotency import Duplicate, IdempotencyKey, New
from durabilis.core.layer import base as _base
from durabilis.core.layer.attempts import _Attempts
from durabilis.core.layer.base import (
    _CLAIM_AGAIN,
    _born_claim_refused,
    _breaker_refused,
    _Claim,
    _claim_refused,
    _had_previous,
    _Request,
    _unwrap_born_claim,
)
from durabilis.core.layer.types import CIRCUIT_OPEN, OperationContext
from durabilis.core.retry import RetryPolicy
from durabilis.core.steps import IO, Hold, Plan, Sleep
from durabilis.errors import (
    CircuitOpen,
    CorruptData,
    DurabilisError,
    OperationInProgress,
    ResultNotStored,
)


class _Claims(_Attempts):
    """The claim step, and what its replies lead to (duplicates, takeovers, aliases)."""

    def _claim_and_run(  # noqa: PLR0912, PLR0915  (the claim step reads best as one piece)
        self, req: _Request, fn: Callable[[OperationContext], Any], wait_until: float | None
    ) -> Plan[Any]:
        policy = self._retry.get_policy(req.operation_type)
        budget = policy.budget if policy is not None else None
        dep = req.dependency
        dedup = self.config.idempotency.enabled
        nonce = _base.nonce()  # (looked up each time: the simulator seeds it)
        member = self.member(req.key.value, nonce) if dedup else ""
        probe = f"{nonce}.0"
        # On Cluster these go in waves (Store.run_step), and no wave is sent
        # after a refusal. First the index entry (an entry without its claim
        # is dropped by recover_orphans), the breaker's registration and the
        # claim, fused with its birth entry in its own slot's index bucket: a
        # worker killed just after its claim is listed there even if the
        # index entry beside it never landed (a duplicate writes neither, and
        # asks nothing else: it gets its result while the circuit is open, and
        # never takes a probe slot); then the breaker and the budget (charged
        # only for a new claim). A healthy breaker admits from its cache
        # without a call (CircuitBreakerRegistry cached_admission_seconds):
        # then the claim's is the only wave.
        calls: list[ScriptCall] = []
        at: dict[str, int] = {}
        gates: dict[int, Callable[[Any], bool]] = {}
        waves: list[int] = []
        gone: tuple[list[str], dict[str, int]] = ([], {})
        if dedup:
            at["note"] = len(calls)
            calls.append(self._note("add", [member]))
            waves.append(0)
            if not self.fuses:
                gone = self._take_gone()
                if (note := self._gone_note(*gone)) is not None:
                    at["gone"] = len(calls)  # settled claims' entries: beside ours (_leave)
                    calls.append(note)
                    waves.append(0)
            at["claim"] = len(calls)
            claim_call = self._idem.claim(req.key, None, req.envelope, nonce)
            if self._buckets:  # with its birth entry, beside the index entry
                gates[len(calls)] = _born_claim_refused
                birth = self._birth("add", self._bucket(req.key.value), [member])
                calls.append(fuse([birth, claim_call], [False, True]))
                waves.append(0)
            else:
                gates[len(calls)] = _claim_refused
                calls.append(claim_call)
                waves.append(1)
        if dedup and req.aliases:
            # A rotation of the key secret: the operation's key under each other
            # secret (its aliases) may hold it, completed, in progress or parked.
            # Aliases live in other hash slots, so they are never in the claim's
            # script: the claim of the current key comes first, then the aliases
            # are read (read-only). Standalone: in the claim's own atomic script,
            # after it; Cluster: in the wave after the claim's (with the
            # breaker's admission). Two replicas of a rolling rotation, one with
            # current=old and one with current=new (each knowing the other's
            # secret), can then never both run it: each writes its own key and
            # then reads the other's. Every key is linearizable, so order the
            # four operations: if A's read of B's key comes before B's claim of
            # it, then A's claim (before A's read) comes before B's claim, which
            # comes before B's read of A's key: B sees A's claim. So at least
            # one sees the other in progress (or done) and gives its claim back
            # (both may, and both then wait or answer OperationInProgress: never
            # both run). See _alias_holder for what each answer means.
            at["aliases"] = len(calls)
            for alias in req.aliases:
                calls.append(self._idem.check(alias, tombstones=True))
                waves.append(2)
        cached = None if self.fuses or dep is None else self._breakers.cached(dep)
        if dep is not None and cached is None:
            at["cb"] = len(calls)
            gates[len(calls)] = _breaker_refused
            calls.append(self._breakers.ops.before_call(dep, probe_id=probe))
            waves.append(2)
        if budget is not None:  # after the breaker: a refused call is not charged
            at["budget"] = len(calls)
            calls.append(self._budget.record_call(req.operation_type, budget))
            waves.append(3 if "cb" in at else 2)
        register = self._breakers.registration_call(dep) if dep is not None else None
        if register is not None:
            at["register"] = len(calls)
            calls.append(register)
            waves.append(0)
        unknown = Replies([None] * len(calls), "?" * len(calls))
        if dedup:
            # The keep-alive holds the claim from before it exists: between
            # the claim and its compensation (or the first attempt) it is
            # renewed like any other.
            yield Hold(req.key.value, nonce, member)
        try:
            replies = (yield IO(calls, gates, waves=waves)) if calls else Replies([], "")
        except DurabilisError as exc:
            if "gone" in at and (exc.partial or unknown).status[at["gone"]] != "c":
                self._unsent(*gone)  # not surely removed: again later, alone
            yield from self._undo_begin(req, nonce, member, probe, exc.partial or unknown, at)
            raise
        except self.interrupts:
            if "gone" in at:
                self._unsent(*gone)
            yield from self._undo_begin(req, nonce, member, probe, unknown, at)
            raise
        if "claim" in at and self._buckets:
            replies = _unwrap_born_claim(replies, at["claim"])
        if register is not None and dep is not None and replies.status[at["register"]] == "c":
            self._breakers.mark_registered(dep)
        return (yield from self._claimed(
            req, fn, policy, wait_until, replies, at, nonce, member, probe, cached, budget,
        ))

    def _claimed(  # noqa: PLR0917  (what the claim step held, one by one)
        self, req: _Request, fn: Callable[[OperationContext], Any], policy: RetryPolicy | None,
        wait_until: float | None, replies: Replies, at: Mapping[str, int], nonce: str,
        member: str, probe: str, cached: Permit | None, budget: Any,
    ) -> Plan[Any]:
        """What follows a claim step that ran: its replies decoded (a duplicate,
        the aliases, the breaker's answer, the budget), then the attempts."""
        dep = req.dependency
        dedup = self.config.idempotency.enabled
        claim: New | Duplicate | None = New(token=None)
        if dedup:
            claim = None
            if replies.status[at["claim"]] != "n":  # "n": the breaker refused, nothing ran
                try:
                    claim = self._idem.decode_claim(req.key, replies[at["claim"]], times=False)
                except DurabilisError:  # KeyReuseMismatch, CorruptData
                    yield from self._undo_begin(req, nonce, member, probe, replies, at)
                    raise
        listed = dedup and replies.ran(at["note"])
        if isinstance(claim, Duplicate):
            return (yield from self._duplicate(req, claim, member if listed else "", wait_until))
        orphaned = False
        dead: tuple[IdempotencyKey, ...] = ()
        parked: tuple[IdempotencyKey, ...] = ()
        if "aliases" in at:
            try:
                holder, orphaned, dead, parked = self._alias_holder(
                    req, replies, at["aliases"]
                )
            except DurabilisError:  # CorruptData at an alias
                yield from self._undo_begin(req, nonce, member, probe, replies, at)
                raise
            if holder is not None:
                # The operation is another key's (completed or running under
                # another secret): this claim goes back, the answer is that key's.
                yield from self._undo_begin(req, nonce, member, probe, replies, at)
                return (yield from self._duplicate(req, holder[1], "", wait_until, holder[0]))

        token = claim.token if claim is not None else None
        cl = _Claim(
            nonce, member if listed else "", token,
            taken_over=bool(claim is not None and claim.taken_over) or orphaned,
            settle=dedup and token is not None and _had_previous(replies[at["claim"]]),
            settle_aliases=parked if token is not None else (),
            orphaned_aliases=dead if token is not None else (),
        )
        permit: Permit | None = cached
        if dep is not None and cached is None:
            permit = yield from self._admission(req, cl, replies, at, probe)
        if budget is not None and replies.status[at["budget"]] == "c":
            try:
                self._budget.decode(req.operation_type, replies[at["budget"]])
            except CorruptData:
                logsink.SINK.exception(
                    "durability_retry_budget_corrupt", operation_type=req.operation_type
                )
        return (yield from self._attempts(req, fn, policy, cl, permit))

    def _admission(
        self, req: _Request, cl: _Claim, replies: Replies, at: Mapping[str, int], probe: str,
    ) -> Plan[Permit]:
        """The breaker's answer in a claim step: its permit (its transition fired,
        noted for the registry). Refused: the claim goes back and CircuitOpen is
        raised, or, with ``park_on_open``, the operation is parked."""
        assert req.dependency is not None
        try:
            return self._decode_permit(req.dependency, replies[at["cb"]])
        except CircuitOpen as exc:
            if not req.park_on_open:
                yield from self._undo_begin(req, cl.nonce, cl.member, probe, replies, at)
                raise
            yield from self._park(
                req, cl, attempts=0, error=CIRCUIT_OPEN, reason=CIRCUIT_OPEN, cause=exc,
            )
            raise  # (_park raises: RetryExhausted, or OutcomeUnrecorded)
        except DurabilisError:
            yield from self._undo_begin(req, cl.nonce, cl.member, probe, replies, at)
            raise

    def _undo_begin(  # noqa: PLR0917  (what the claim step held, one by one)
        self, req: _Request, nonce: str, member: str, probe: str, replies: Replies,
        at: Mapping[str, int],
    ) -> Plan[None]:
        """Give back what a claim step that will not go on may have taken.

        A claim taken over from a dead owner is not simply given back: that
        owner's operation may have run, and this claim is now the only trace
        of it. It is parked (``WORKER_LOST``), as recovery would have done.
        """
        claimed = "claim" in at and replies.ran(at["claim"])
        listed = "note" in at and replies.ran(at["note"])
        first: list[ScriptCall] = []
        if claimed:
            first.append(self._idem.release(req.key, None, nonce, keep_taken=True))
        if "cb" in at and replies.ran(at["cb"]) and req.dependency is not None:
            first.append(self._breakers.ops.release_probe(req.dependency, probe))
        if first:
            try:  # Cluster: at once (one failing never holds back the other)
                done = yield IO(first, shield=True, waves=[0] * len(first))
            except DurabilisError as exc:  # what is left is settled by recovery
                logsink.SINK.error("durability_claim_undo_failed", idempotency_key=req.key.value,
                                   error=f"{type(exc).__name__}: {exc}")
                return
            if claimed and done[0] == 2:
                yield from self._park_inherited(req, nonce, member if listed else "")
                return
        gone = [self._note("rem", [member])] if listed else []
        if claimed and self._buckets:  # its birth entry (recovery drops it otherwise)
            gone.append(self._birth_gone(req.key.value, nonce))
        if gone:
            yield from self._best_effort(gone, "durability_claim_undo_failed", req.key.value,
                                         waves=[0] * len(gone))

    def _alias_holder(
        self, req: _Request, replies: Replies, first: int
    ) -> tuple[
        tuple[IdempotencyKey, Duplicate] | None,
        bool,
        tuple[IdempotencyKey, ...],
        tuple[IdempotencyKey, ...],
    ]:
        """What the claim step read at the key's aliases: the alias holding the
        operation (completed, else in progress with a live lease) and its record;
        whether an alias is in progress with its lease run out (a dead owner: this
        claim runs it, told an earlier run may have had its effect, as a takeover
        of its own key would be; recovery parks the dead claim, whose replay then
        finds this key's outcome; or released "touched", after an interruption
        once fn had started there); the aliases released (their operation may be
        parked: this run's success settles those records).

        Raises:
            CorruptData: Foreign data at an alias.
        """
        done: tuple[IdempotencyKey, Duplicate] | None = None
        running: tuple[IdempotencyKey, Duplicate] | None = None
        orphaned = False
        dead: list[IdempotencyKey] = []
        parked: list[IdempotencyKey] = []
        for i, alias in enumerate(req.aliases):
            if replies.status[first + i] not in "rc":  # not read: the step was refused
                continue
            seen = self._idem.decode_alias(alias, replies[first + i])
            if seen == "touched":  # released after fn started there: it may have run
                orphaned = True
                parked.append(alias)
            elif seen == "released":
                parked.append(alias)
            elif isinstance(seen, Duplicate):
                if not seen.in_progress:
                    done = done or (alias, seen)
                elif seen.lease_expired:
                    # A dead claim: recovery may park it (before or after this
                    # run's success): settled if parked first, recorded done here.
                    orphaned = True
                    dead.append(alias)
                    parked.append(alias)
                else:
                    running = running or (alias, seen)
        return done or running, orphaned, tuple(dead), tuple(parked)

    def _duplicate(
        self, req: _Request, dup: Duplicate, member: str, wait_until: float | None,
        alias: IdempotencyKey | None = None,
    ) -> Plan[Any]:
        """Answer as a duplicate of the key's record (of ``alias``'s: the key under
        another secret), waiting while it is in progress, up to ``wait_until``."""
        # Counting must not fail the call: the answer is known. Standalone: the
        # claim step wrote nothing, the count waits for a note sent anyway.
        # Cluster: its index entry (no claim of it exists) goes with its count
        # later (_leave).
        if member and not self.fuses:
            self._leave([member], {"duplicates": 1})
            member, n = "", 0
        else:
            n = self._take_duplicates() + 1 if member else self._count_duplicate()
        if member or n:
            calls = [self._note("rem" if member else "none", [member] if member else [],
                                duplicates=n)]
            yield from self._best_effort(calls, "durability_duplicate_note_failed",
                                         req.key.value)
        while dup.in_progress:
            now = self.clock()
            if wait_until is None or now >= wait_until:
                raise OperationInProgress(req.key.value, dup.original_timestamp)
            yield Sleep(min(0.05, max(0.0, wait_until - now)))
            watched = alias or req.key
            replies = yield IO([self._idem.check(watched)])
            seen = self._idem.decode_check(watched, replies[0])
            if seen is None or seen.lease_expired:
                if alias is not None:
                    # Two replicas of a rotation that each gave their claim back
                    # on seeing the other's: they do not claim again in step.
                    yield Sleep(random.uniform(0.0, 0.05))
                return _CLAIM_AGAIN  # released or its worker died: claim it ourselves
            dup = seen
        self.tracing.answered_duplicate()  # otel hook: the answer is the record's, nothing ran
        if dup.not_stored:
            raise ResultNotStored(req.key.value, dup.not_stored)
        return dup.original_result
