"""The DLQ's core, tested the h11 way: scripted replies in, steps and results out.

No server and no store: the enqueue plan and the replay plan are stepped by
hand (``answered``, or ``send`` one reply at a time), so what they send (which
script, KEYS, ARGV) and what they make of each reply is asserted directly.
"""

from __future__ import annotations

from typing import Any

import pytest

from durabilis._keys import KeySpace
from durabilis._scripts import ScriptCall
from durabilis.core.dlq import (
    DlqConfig,
    Enqueued,
    EnqueueOps,
    ListingPlans,
    OpsBase,
    ReplayPlans,
    handler_plan,
)
from durabilis.core.dlq.enqueue import MISS_ROUNDS
from durabilis.core.steps import IO, Run, SilentLog, Sleep, answered
from durabilis.dlq import DlqRecord, ReplayOutcome, _DlqOps
from durabilis.errors import CorruptData, DurabilisError, OperationInProgress
from tests.unit.test_dlq import hash_fields, stream_fields

K = KeySpace("unit")
NOW_MS = 1_700_000_000_000


class Recorded:
    """A Log that keeps (level, event, fields)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def _keep(self, level: str) -> Any:
        return lambda event, **fields: self.events.append((level, event, fields))

    def __getattr__(self, level: str) -> Any:
        return self._keep(level)


def core(log: Any = None, **config: Any) -> EnqueueOps:
    return EnqueueOps(K, DlqConfig(**config), "me", log=log)


def test_the_old_private_modules_re_export_the_cores_very_objects() -> None:
    from durabilis.core.dlq import calls, enqueue, listing, plan, records, types
    from durabilis.dlq import _calls, _enqueue, _listing, _plan, _records, _types

    assert _types.DlqRecord is types.DlqRecord and _records.Prepared is records.Prepared
    assert _plan.handler_plan is plan.handler_plan and _enqueue.EnqueueOps is enqueue.EnqueueOps
    assert _calls.DlqCalls is calls.DlqCalls and _listing.ListingPlans is listing.ListingPlans
    assert issubclass(_DlqOps, OpsBase)


# --- enqueue ----------------------------------------------------------------------------


def created(call: ScriptCall, *, pending: int = 1, expired: list[bytes] | None = None) -> list[Any]:
    """A ``dlq_enqueue`` reply that made a record."""
    return [b"ok", b"1700000000000-0", NOW_MS, NOW_MS + 86_400_000, pending,
            str(call.args[0]).encode(), 0, expired or []]


def test_an_enqueue_is_one_dlq_enqueue_step_and_returns_the_new_record() -> None:
    log = Recorded()
    o = core(log)
    call = o.enqueue("agent-1", "wiki_write", {"page": "Home"}, 3, "TIMEOUT", dlq_id="d1")
    assert call.name == "dlq_enqueue"
    assert all("{dlq}" in str(k) and str(k).startswith("unit:") for k in call.keys)
    assert call.keys[5] == call.keys[7] == o.record_key("d1")  # no merge key: its own record
    assert call.args[9] == ""  # no merge key
    steps, made = answered(o.enqueue_plan(call), [created(call)])
    assert steps == [call]
    assert made == Enqueued("d1", created=True, stream_id="1700000000000-0", pending=1)
    assert [e[1] for e in log.events] == ["durability_dlq_enqueued"]


def test_a_park_whose_key_names_another_record_is_sent_again_naming_it() -> None:
    o = core()
    prepared = o.prepare("agent-1", "wiki_write", {"page": "Home"}, {"idempotency_key": "k1"})
    call = o.enqueue_prepared(prepared, 3, "TIMEOUT", dlq_id="p1", merge_key="k1")
    assert call.args[9] == "k1" and call.args[10] == call.keys[7].rpartition(":")[2]
    plan = o.enqueue_plan(call)
    assert next(plan) is call
    again = plan.send([b"miss", b"older"])
    assert isinstance(again, ScriptCall) and again.name == "dlq_enqueue"
    assert again.keys[7] == o.record_key("older") and again.args[10] == "older"
    assert again.keys[5] == call.keys[5] and again.args[0] == "p1"  # the same parking
    with pytest.raises(StopIteration) as done:
        plan.send([b"merged", b"1700000000000-0", b"older", 2])
    assert done.value.value == Enqueued("older", created=False, stream_id="1700000000000-0",
                                        merged=True)


def test_a_park_missing_its_record_every_time_gives_up_with_nothing_written() -> None:
    o = core()
    prepared = o.prepare("agent-1", "wiki_write", {}, {"idempotency_key": "k1"})
    call = o.enqueue_prepared(prepared, 0, "x", dlq_id="p1", merge_key="k1")
    with pytest.raises(DurabilisError, match="kept changing"):
        answered(o.enqueue_plan(call), [[b"miss", f"r{i}".encode()] for i in range(MISS_ROUNDS)])


def test_a_parking_sent_again_after_a_lost_reply_finds_itself_in() -> None:
    o = core()
    call = o.enqueue("agent-1", "wiki_write", {}, 0, "x", dlq_id="d1")
    _, made = answered(o.enqueue_plan(call), [[b"exists", b"1-0", b"d1", 1]])
    assert made == Enqueued("d1", created=False, stream_id="1-0", made_here=True)
    assert made.new_record  # this very parking made it: counted once, as made


def test_records_purged_expired_on_the_way_are_logged_to_the_log_the_core_was_handed() -> None:
    log = Recorded()
    o = core(log)
    call = o.enqueue("agent-1", "wiki_write", {}, 0, "x", dlq_id="d1")
    answered(o.enqueue_plan(call), [created(call, expired=[b"old", b"wiki_write", b"k9", b"a2"])])
    expired = [f for level, e, f in log.events if e == "durability_dlq_expired"]
    assert expired == [{"dlq_id": "old", "operation_type": "wiki_write",
                        "idempotency_key": "k9", "agent_id": "a2"}]


def test_pending_over_max_pending_is_a_warning_not_a_refusal() -> None:
    log = Recorded()
    o = core(log, max_pending=2)
    call = o.enqueue("agent-1", "wiki_write", {}, 0, "x", dlq_id="d1")
    _, made = answered(o.enqueue_plan(call), [created(call, pending=3)])
    assert made.created
    assert ("warning", "durability_dlq_max_pending_exceeded") in [e[:2] for e in log.events]


def test_a_foreign_key_reported_by_the_enqueue_raises_corrupt_data_naming_it() -> None:
    o = core()
    call = o.enqueue("agent-1", "wiki_write", {}, 0, "x", dlq_id="d1")
    with pytest.raises(CorruptData) as err:
        answered(o.enqueue_plan(call), [[b"corrupt", b"unit:dlq:{dlq}:stream", b"a string"]])
    assert "unit:dlq:{dlq}:stream" in str(err.value)


def test_the_core_logs_nowhere_unless_handed_a_log() -> None:
    assert isinstance(core().log, SilentLog)


# --- listing plans ----------------------------------------------------------------------


def test_a_requeue_is_one_step_per_batch_and_logs_each_record_marked_to_the_handed_log() -> None:
    log = Recorded()
    o = ListingPlans(K, DlqConfig(), "me", log=log)
    steps, results = answered(
        o.requeue_steps(["a", "no spaces", "b"], "ops"),
        [[b"ok", [b"ok", NOW_MS], [b"final", b"replayed"]]],
    )
    assert [s.name for s in steps] == ["dlq_requeue"]
    assert steps[0].keys[2:] == [o.record_key("a"), o.record_key("b")]  # a malformed id: unsent
    assert [r.outcome for r in results] == ["requeued", "not_found", "final"]
    assert [(e, f["dlq_id"]) for _, e, f in log.events] == [("durability_dlq_requeued", "a")]


# --- replay ------------------------------------------------------------------------------


def claimed_reply(dlq_id: str = "abc", token: bytes = b"1-5") -> list[Any]:
    h = [x for kv in hash_fields(co=b"me", ct=token, ce=b"1").items() for x in kv]
    s = [x for kv in stream_fields(dlq_id).items() for x in kv]
    return [b"ok", token, 0, h, s]


def _shielded_call(step: object, name: str) -> ScriptCall:
    assert isinstance(step, IO) and step.shield and len(step.calls) == 1, step
    assert step.calls[0].name == name, step.calls[0].name
    return step.calls[0]


def _poll(step: object) -> None:
    assert isinstance(step, Sleep) and step.seconds == 0 and not step.shield, step


def _never(record: DlqRecord) -> None:
    raise AssertionError("the plan asks its driver to run the handler")


def test_a_replay_claims_runs_the_handler_then_finishes_the_record_fenced_by_its_claim() -> None:
    plan = _DlqOps(K, DlqConfig(), "me").replay_steps("abc", handler_plan(_never))
    _poll(next(plan))
    claim = _shielded_call(plan.send(None), "dlq_claim")
    assert claim.keys[0].endswith(":rec:abc") or any(k.endswith(":rec:abc") for k in claim.keys)
    _poll(plan.send([claimed_reply()]))
    run = plan.send(None)
    assert isinstance(run, Run) and run.fn is _never and run.arg.dlq_id == "abc"
    finish = _shielded_call(plan.send((True, None)), "dlq_finish")
    assert "1-5" in finish.args  # fenced by the claim's token
    with pytest.raises(StopIteration) as done:
        plan.send([[b"ok", b"replayed"]])
    assert done.value.value.outcome is ReplayOutcome.REPLAYED


def test_a_handler_refused_as_in_progress_defers_the_record_without_an_attempt() -> None:
    plan = _DlqOps(K, DlqConfig(), "me").replay_steps("abc", handler_plan(_never))
    _poll(next(plan))
    plan.send(None)
    _poll(plan.send([claimed_reply()]))
    plan.send(None)  # the handler's Run
    defer = plan.send((False, OperationInProgress("k1")))
    call = _shielded_call(defer, "dlq_fail")
    assert call.args[-1] == "defer" and "1-5" in call.args  # released, fenced, not counted
    with pytest.raises(StopIteration) as done:
        plan.send([[b"ok"]])
    result = done.value.value
    assert result.outcome is ReplayOutcome.DEFERRED and result.replay_attempts == 0


def test_a_replay_of_a_malformed_id_sends_nothing() -> None:
    steps, result = answered(
        _DlqOps(K, DlqConfig(), "me").replay_steps("no spaces allowed", handler_plan(_never)), [])
    assert steps == [] and result.outcome is ReplayOutcome.NOT_FOUND


def test_the_replay_core_takes_cancellations_and_exits_for_interruptions_not_plan_closes() -> None:
    import asyncio

    from durabilis._steps import INTERRUPTS
    from durabilis.core.dlq.replay import interruption

    assert all(interruption(kind()) for kind in INTERRUPTS)
    assert interruption(asyncio.CancelledError())
    assert not interruption(GeneratorExit()) and not interruption(OperationInProgress("k"))


def test_a_replay_interrupted_in_its_handler_releases_the_claim_shielded_then_re_raises() -> None:
    plan = ReplayPlans(K, DlqConfig(), "me").replay_steps("abc", handler_plan(_never))
    _poll(next(plan))
    plan.send(None)
    _poll(plan.send([claimed_reply()]))
    assert isinstance(plan.send(None), Run)
    release = plan.throw(KeyboardInterrupt())
    assert isinstance(release, IO) and release.shield
    assert any("1-5" in c.args for c in release.calls)  # fenced by the claim's token
    with pytest.raises(KeyboardInterrupt):
        plan.send([[b"ok"] for _ in release.calls])
