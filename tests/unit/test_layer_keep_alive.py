"""The layer's keep-alive as a plan, tested the h11 way: scripted replies in,
steps out (no server, no store: ``answered`` steps the plan by hand).

Both twins drive this one plan each ``renew_interval``
(``_LayerCore.keep_alive_plan``); what it sends and what it makes of each
failure is asserted here.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from structlog.testing import capture_logs

from durabilis._keys import KeySpace
from durabilis._scripts import Replies, ScriptCall
from durabilis._steps import LeaseBook
from durabilis.core.layer import _LayerCore
from durabilis.core.steps import IO, Batch, Defer, Hold, answered
from durabilis.errors import CorruptData, StorageUnavailable
from durabilis.layer import DurabilityConfig
from durabilis.layer._shell import RUNTIME


@dataclass(frozen=True)
class Shape:
    """What the plans read of a store (``StoreShape``): no connection."""

    keys: KeySpace
    fuses: bool
    is_cluster: bool = False


def core(*, fuses: bool) -> _LayerCore:
    return _LayerCore(
        Shape(KeySpace("ka"), fuses), DurabilityConfig(), None, None,  # type: ignore[arg-type]
        None, None, None, new_lock=threading.Lock, runtime=RUNTIME,  # type: ignore[arg-type]
    )


def clocked(*, fuses: bool) -> tuple[_LayerCore, list[float]]:
    """A core whose clock reads ``now[0]`` (the test moves it)."""
    now = [0.0]
    ka = core(fuses=fuses)
    ka.clock = lambda: now[0]
    return ka, now


def book(*claims: tuple[str, str, str]) -> LeaseBook:
    leases = LeaseBook()
    for key, nonce, member in claims:
        leases.hold(Hold(key, nonce, member))
    return leases


def deferred(leases: LeaseBook, key: str, nonce: str, seconds: float = 60.0) -> ScriptCall:
    call = ScriptCall("idem_record", [f"ka:idem:{{{key}}}"], [nonce])
    leases.defer(Defer(key, nonce, "", [call], None, seconds))
    return call


def test_nothing_held_sends_nothing() -> None:
    steps, _ = answered(core(fuses=True).keep_alive_plan(LeaseBook()), [])
    assert steps == []


def test_standalone_renews_every_claim_in_one_call_beside_the_note() -> None:
    leases = book(("k1", "n1", "m1"), ("k2", "n2", ""))
    steps, _ = answered(core(fuses=True).keep_alive_plan(leases), [[[1, 1], 1]])
    [renew] = steps
    assert type(renew) is Batch
    idem, note = renew.calls
    assert (idem.name, idem.keys) == ("idem_renew", ["ka:idem:{k1}", "ka:idem:{k2}"])
    assert idem.args[:2] == ["n1", "n2"] and idem.args[-1] == "nonce"
    assert note.name == "layer_note" and note.args[0] == "renew" and note.args[2:] == [1, "m1"]


def test_unfused_renewals_are_independent_calls_then_the_entries_still_ours_go_back() -> None:
    leases = book(("k1", "n1", "m1"), ("k2", "n2", "m2"), ("k3", "n3", "m3"))
    plan = core(fuses=False).keep_alive_plan(leases)
    # k1 renewed, k2 no longer ours, k3 renewed; the note's reply last.
    steps, _ = answered(plan, [[[1], [0], [1], 1], [1]])
    first, back = steps
    assert type(first) is Batch and type(back) is Batch  # never one script
    assert [c.keys for c in first.calls[:3]] == [
        ["ka:idem:{k1}"], ["ka:idem:{k2}"], ["ka:idem:{k3}"],
    ]
    [add] = back.calls
    assert add.args[0] == "back" and add.args[2:] == [2, "m1", "m3"]


def test_a_failed_renewal_is_logged_and_the_deferred_outcomes_still_go() -> None:
    leases = book(("k1", "n1", "m1"))
    call = deferred(leases, "k2", "n2")
    with capture_logs() as logs:
        steps, _ = answered(
            core(fuses=False).keep_alive_plan(leases),
            [CorruptData("ka:idem:{k1}", "WRONGTYPE"), Replies(["ok"], "o")],
        )
    renew, record = steps
    assert type(renew) is Batch  # no reindex after a failed batch
    assert record == IO([call], None)
    assert [e["event"] for e in logs] == [
        "durability_lease_renew_failed", "durability_outcome_recorded_late",
    ]
    assert "CorruptData" in logs[0]["error"]
    assert leases.deferred() == [] and leases.held() == [("k1", "n1", "m1")]


def test_one_failed_renewal_still_puts_back_the_entries_of_the_others_renewed() -> None:
    """Cluster: one claim's node refusing (or its key holding foreign data) must
    not keep the other claims' in-flight entries out of the index: the batch's
    error carries what each call replied, and those renewed go back."""
    leases = book(("k1", "n1", "m1"), ("k2", "n2", "m2"), ("k3", "n3", "m3"))
    failed = StorageUnavailable("k2's node is down")
    failed.partial = Replies([[1], None, [1], 1], "c?cc")
    with capture_logs() as logs:
        steps, _ = answered(core(fuses=False).keep_alive_plan(leases), [failed, [1]])
    renew, back = steps
    assert type(renew) is Batch and type(back) is Batch
    [add] = back.calls
    assert add.args[0] == "back" and add.args[2:] == [2, "m1", "m3"]
    assert [e["event"] for e in logs] == ["durability_lease_renew_failed"]


def test_a_deferred_outcome_that_fails_waits_for_the_next_tick_the_others_go() -> None:
    leases = LeaseBook()
    first = deferred(leases, "k1", "n1")
    second = deferred(leases, "k2", "n2")
    steps, _ = answered(
        core(fuses=True).keep_alive_plan(leases),
        [[[1, 1], 1], StorageUnavailable("down"), Replies(["ok"], "o")],
    )
    assert steps[1:] == [IO([first], None), IO([second], None)]
    [left] = leases.deferred()  # the first is kept until its time runs out
    assert left.step.calls == [first]


def test_a_deferred_outcome_past_its_time_or_corrupt_is_abandoned() -> None:
    leases = LeaseBook()
    deferred(leases, "k1", "n1", seconds=-1.0)  # its time ran out
    deferred(leases, "k2", "n2")
    with capture_logs() as logs:
        answered(
            core(fuses=True).keep_alive_plan(leases),
            [[[1, 1], 1], StorageUnavailable("down"), CorruptData("ka:idem:{k2}", "garbage")],
        )
    assert leases.deferred() == [] and leases.held() == []
    assert [e["event"] for e in logs] == ["durability_outcome_abandoned"] * 2


def test_an_interruption_goes_through() -> None:
    leases = book(("k1", "n1", ""))
    deferred(leases, "k2", "n2")
    plan = core(fuses=True).keep_alive_plan(leases)
    with pytest.raises(asyncio.CancelledError):
        answered(plan, [asyncio.CancelledError()])
    assert len(leases.deferred()) == 1  # not sent: the next tick sends it


def test_a_deferred_outcome_sent_is_settled_by_the_plan() -> None:
    leases = LeaseBook()
    deferred(leases, "k1", "n1")
    answered(core(fuses=True).keep_alive_plan(leases), [[[1], 1], Replies(["ok"], "o")])
    assert leases.deferred() == [] and not leases.busy()



def test_the_put_back_adds_no_member_its_owner_marked_settled() -> None:
    """Cluster: the put-back is mode "back", with the settled set beside the
    index (same slot): Redis adds no member an owner's removal marked, in
    whatever order the two land (a claim may settle between its renewal and
    the put-back, its removal sent in its own step or in a batch)."""
    leases = book(("k1", "n1", "m1"))
    steps, _ = answered(core(fuses=False).keep_alive_plan(leases), [[[1], 1], [1]])
    _, back = steps
    [note] = back.calls
    assert note.args[:4] == ["back", note.args[1], 1, "m1"]
    assert note.keys == ["ka:layer:{layer}:inflight", "ka:layer:{layer}:stats",
                         "ka:layer:{layer}:settled"]


@pytest.mark.parametrize("mode", ["rem", "leave"])
def test_an_owner_s_removal_marks_its_members_settled_on_cluster_only(mode: str) -> None:
    cluster, standalone = core(fuses=False), core(fuses=True)
    assert cluster._note(mode, ["m1"]).keys[2:] == ["ka:layer:{layer}:settled"]
    assert cluster._found_note(mode, ["m1"]).keys[2:] == []  # (recovery's)
    assert cluster._note(mode, []).keys[2:] == []  # (counts alone)
    assert standalone._note(mode, ["m1"]).keys[2:] == []  # (no put-back there)
    assert cluster._note("add", ["m1"]).keys[2:] == []


def test_a_put_back_decided_late_is_not_sent_the_next_tick_puts_back() -> None:
    """Renewals that took longer than PUT_BACK_WITHIN_SECONDS (a node that hung)
    send no put-back: it could land after the removal marks that refuse it end."""
    from durabilis.core.layer.base import PUT_BACK_WITHIN_SECONDS

    now = [100.0]
    ka = core(fuses=False)
    ka.clock = lambda: now[0]
    leases = book(("k1", "n1", "m1"))
    plan = ka.keep_alive_plan(leases)
    assert type(next(plan)) is Batch
    now[0] += PUT_BACK_WITHIN_SECONDS + 0.1
    with pytest.raises(StopIteration):
        plan.send([[1], 1])  # renewed, but too late to put back
    plan = ka.keep_alive_plan(leases)
    next(plan)
    back = plan.send([[1], 1])  # (a prompt tick: it does)
    assert type(back) is Batch and back.calls[0].args[:1] == ["back"]


def test_the_next_renewal_is_due_an_interval_after_the_last_began(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal batch that waited on a slow node does not push the next one later."""
    import durabilis.layer._shell as shell

    clock = [1000.0]
    monkeypatch.setattr(shell.time, "monotonic", lambda: clock[0])
    ticks = shell._Ticks(10.0)
    clock[0] += 10.0
    assert ticks.renew_due()
    clock[0] += 6.0  # the batch took 6 s
    ticks.renewed()
    clock[0] += 4.5
    assert ticks.renew_due()  # 10.5 s after the last one began (4.5 after it ended)


def test_deferred_outcomes_go_while_the_tick_has_time_the_next_tick_starts_after_them(
) -> None:
    """A node that hangs costs each of its deferred outcomes a socket timeout: the
    tick sends them for half a renew_interval at most (the next renewal waits for
    the tick), and the next tick starts with the ones this one did not reach."""
    ka, now = clocked(fuses=True)
    half = ka.config.renew_interval / 2
    leases = LeaseBook()
    calls = [deferred(leases, f"k{i}", f"n{i}") for i in range(3)]
    plan = ka.keep_alive_plan(leases)
    next(plan)  # the renewal
    assert plan.send([[1, 1, 1], 1]) == IO([calls[0]], None)
    now[0] += half + 0.1  # its node hangs: a socket timeout
    with capture_logs(), pytest.raises(StopIteration):
        plan.throw(StorageUnavailable("timed out"))
    plan = ka.keep_alive_plan(leases)  # the next tick: the others first
    next(plan)
    assert plan.send([[1, 1, 1], 1]) == IO([calls[1]], None)


def test_renewals_that_took_long_leave_the_deferred_outcomes_their_own_time() -> None:
    """Found by a review: renewals waiting on a node that hangs used the tick's
    whole budget, and an outcome whose node is healthy waited out the hang."""
    ka, now = clocked(fuses=True)
    leases = LeaseBook()
    first, second = deferred(leases, "k0", "n0"), deferred(leases, "k1", "n1")
    plan = ka.keep_alive_plan(leases)
    next(plan)  # the renewal...
    now[0] += ka.config.renew_interval  # ...waited on a node that hangs
    assert plan.send([[1, 1], 1]) == IO([first], None)
    assert plan.send(Replies(["ok"], "c")) == IO([second], None)


def deferred_step(leases: LeaseBook, key: str, nonce: str, n: int) -> list[ScriptCall]:
    """A deferred outcome of ``n`` calls (a record, then e.g. a breaker's report),
    the first gated: a refusal ends the step."""
    calls = [ScriptCall("idem_record", [f"ka:idem:{{{key}}}"], [nonce, i]) for i in range(n)]
    leases.defer(Defer(key, nonce, "", calls, {0: lambda r: r == "refused"}, 60.0))
    return calls


def test_unfused_deferred_outcomes_go_side_by_side_one_hung_node_costs_one_round() -> None:
    """Found by the fifth review: with K outcomes on a node that hangs listed
    ahead of one on a healthy node, each hung one spent the tick's budget and
    the healthy one waited K ticks. On Cluster the outcomes now go in rounds:
    the next call of every step at once (one Batch: one wave's time for the
    hung node, however many of its outcomes), each step on to its next call
    once this one replied."""
    ka, now = clocked(fuses=False)
    leases = LeaseBook()
    hung = [deferred_step(leases, f"h{i}", f"nh{i}", 2) for i in range(3)]
    healthy = deferred_step(leases, "ok", "nok", 2)
    refused = deferred_step(leases, "gone", "ngone", 2)
    plan = ka.keep_alive_plan(leases)
    renew = next(plan)  # (the claims the outcomes keep: renewed first)
    first = plan.send([[1]] * (len(renew.calls) - 1) + [1])
    assert type(first) is Batch  # every step's first call, at once
    assert first.calls == [*(h[0] for h in hung), healthy[0], refused[0]]
    timed_out = StorageUnavailable("node 1 did not answer in this step")
    timed_out.partial = Replies([timed_out, timed_out, timed_out, "ok", "refused"], "???cc")
    now[0] += 5.0  # one socket timeout for the whole round
    with capture_logs() as logs:
        second = plan.throw(timed_out)
        assert type(second) is Batch and second.calls == [healthy[1]]  # on to its next call
        with pytest.raises(StopIteration):
            plan.send(["reported"])
    left = sorted(d.step.key for d in leases.deferred())
    assert left == ["h0", "h1", "h2"]  # kept for the next tick (their time is not out)
    assert [(e["event"], e["idempotency_key"]) for e in logs] == [
        ("durability_outcome_refused_late", "gone"),  # (its gate refused: not recorded)
        ("durability_outcome_recorded_late", "ok"),
    ]


def test_unfused_deferred_rounds_abandon_only_the_corrupt_one_and_stop_when_time_is_up(
) -> None:
    ka, now = clocked(fuses=False)
    leases = LeaseBook()
    corrupt = deferred_step(leases, "bad", "nb", 1)
    slow = deferred_step(leases, "slow", "ns", 2)
    plan = ka.keep_alive_plan(leases)
    next(plan)  # the renewal
    assert plan.send([[1], [1], 1]).calls == [corrupt[0], slow[0]]
    bad = CorruptData("ka:idem:{bad}", "WRONGTYPE")
    failed = CorruptData("ka:idem:{bad}", "WRONGTYPE")
    failed.partial = Replies([bad, "ok"], "?c")
    now[0] += ka.config.renew_interval  # the round took the tick's time
    with capture_logs() as logs, pytest.raises(StopIteration):
        plan.throw(failed)
    assert [e["event"] for e in logs] == ["durability_outcome_abandoned"]
    [left] = leases.deferred()  # cut short: its next call at the next tick
    assert left.step.key == "slow" and left.step.calls == slow[1:]
    plan = ka.keep_alive_plan(leases)
    next(plan)
    assert plan.send([[1], 1]) == IO(slow[1:], {})  # (one outcome: its own step)


def test_unfused_deferred_rounds_keep_what_landed_so_a_hung_node_never_stalls_the_others() -> None:
    """Found by the review of the rounds: with a round on a hung node taking the
    tick's whole time (the default socket timeout is half the default
    renew_interval), a healthy step cut short started again from its first
    call at each tick: its release was never sent (the claim held for the
    outcome's whole time), a landed breaker report counted again every tick.
    Now what landed stays sent: the step moves by a call a tick at least."""
    ka, now = clocked(fuses=False)
    leases = LeaseBook()
    hung = deferred_step(leases, "h", "nh", 2)
    healthy = deferred_step(leases, "ok", "nok", 3)
    sent: list[ScriptCall] = []
    for _tick in range(3):
        plan = ka.keep_alive_plan(leases)
        step = next(plan)  # the renewal
        step = plan.send([[1]] * (len(step.calls) - 1) + [1])
        assert type(step) is Batch
        sent += step.calls
        replies = ["ok" if c not in hung else None for c in step.calls]
        failed = StorageUnavailable("node h did not answer in this step")
        failed.partial = Replies(replies, "".join("c" if r else "?" for r in replies))
        if hung[0] in step.calls:
            now[0] += ka.config.renew_interval  # the round waited on the hung node
        with capture_logs(), pytest.raises(StopIteration):
            plan.throw(failed) if None in replies else plan.send(replies)
    assert [c for c in sent if c in healthy] == healthy  # each call once, in order
    assert [d.step.key for d in leases.deferred()] == ["h"]  # the healthy one settled
    assert leases.held() == [("h", "nh", "")]


def test_a_deferred_step_that_failed_midway_goes_on_from_the_call_that_failed() -> None:
    """Standalone-unfused or a single outcome (its own step): the calls that
    landed before the failure are not sent again at the next tick."""
    leases = LeaseBook()
    calls = deferred_step(leases, "k", "n", 3)
    plan = core(fuses=False).keep_alive_plan(leases)
    next(plan)
    gates = leases.deferred()[0].step.gates
    assert plan.send([[1], 1]) == IO(calls, gates)
    failed = StorageUnavailable("the third call's node is down")
    failed.partial = Replies(["ok", "ok", None], "cc?")
    with capture_logs(), pytest.raises(StopIteration):
        plan.throw(failed)
    [left] = leases.deferred()
    assert left.step.calls == calls[2:] and not left.step.gates  # (the gate was call 0's)


def test_an_unfused_deferred_outcome_with_no_call_left_is_settled() -> None:
    leases = LeaseBook()
    leases.defer(Defer("e", "ne", "", [], None, 60.0))
    deferred_step(leases, "k", "n", 1)
    plan = core(fuses=False).keep_alive_plan(leases)
    next(plan)
    batch = plan.send([[1], [1], 1])
    with capture_logs(), pytest.raises(StopIteration):
        plan.send(["ok"] * len(batch.calls))
    assert leases.deferred() == [] and not leases.busy()


def test_an_interruption_between_rounds_keeps_what_the_earlier_rounds_landed() -> None:
    """Found by the third review of this stop: a cancellation during a round
    left the lease book as the tick found it, and the next tick sent again
    the calls earlier rounds had landed (an enqueue, a release)."""
    leases = LeaseBook()
    one = deferred_step(leases, "a", "na", 3)
    two = deferred_step(leases, "b", "nb", 2)
    plan = core(fuses=False).keep_alive_plan(leases)
    next(plan)
    assert plan.send([[1], [1], 1]).calls == [one[0], two[0]]
    assert plan.send(["ok", "ok"]).calls == [one[1], two[1]]
    with pytest.raises(asyncio.CancelledError):
        plan.throw(asyncio.CancelledError())
    assert [d.step.calls for d in leases.deferred()] == [one[1:], two[1:]]


def deferred_parking(leases: LeaseBook, key: str, nonce: str) -> list[ScriptCall]:
    """A parking left to the keep-alive as the park plan leaves it: its guard
    (idem_check mode "g", gated), the enqueue (gated on a miss), the release."""
    calls = [
        ScriptCall("idem_check", [f"ka:idem:{{{key}}}"], ["g"]),
        ScriptCall("dlq_enqueue", [f"ka:dlq:{{dlq}}:rec:{key}"], [nonce]),
        ScriptCall("idem_release", [f"ka:idem:{{{key}}}"], [nonce]),
    ]
    gates = {0: lambda r: r == [b"done"], 1: lambda r: r == [b"miss"]}
    leases.defer(Defer(key, nonce, "", calls, gates, 60.0, guarded=True))
    return calls


def test_a_deferred_parkings_guard_goes_again_in_front_of_an_enqueue_that_did_not_land() -> None:
    """The guard of a parking (it refuses once the operation completed) landed,
    then the enqueue failed: the next tick sends the guard again before the
    enqueue (a step cut short goes on from the call that failed, but a guard
    read earlier says nothing of what happened since)."""
    for fuses in (False, True):
        ka = core(fuses=fuses)
        leases = LeaseBook()
        calls = deferred_parking(leases, "k", "n")
        lost = StorageUnavailable("the enqueue's reply was lost")
        lost.partial = Replies([[b"open"], None, None], "c?n")
        plan = ka.keep_alive_plan(leases)
        next(plan)  # the renewal
        assert plan.send([[1], 1]) == IO(calls, leases.deferred()[0].step.gates)
        with pytest.raises(StopIteration):
            plan.throw(lost)
        [item] = leases.deferred()
        assert list(item.step.calls) == calls and item.step.guarded  # guard kept in front


def two_parkings_at_their_guards(
    ka: _LayerCore,
) -> tuple[LeaseBook, Any, list[ScriptCall], list[ScriptCall]]:
    """Two deferred parkings (unfused: side by side in rounds), stepped to the
    round that sends both guards."""
    leases = LeaseBook()
    first, second = deferred_parking(leases, "a", "na"), deferred_parking(leases, "b", "nb")
    plan = ka.keep_alive_plan(leases)
    renew = next(plan)
    guards = plan.send([[1]] * (len(renew.calls) - 1) + [1])
    assert type(guards) is Batch and guards.calls == [first[0], second[0]]
    return leases, plan, first, second


def test_unfused_rounds_keep_a_guard_in_front_of_its_enqueue() -> None:
    leases, plan, first, second = two_parkings_at_their_guards(core(fuses=False))
    enqueues = plan.send([[b"open"], [b"open"]])
    assert type(enqueues) is Batch and enqueues.calls == [first[1], second[1]]
    lost = StorageUnavailable("one node did not answer")
    lost.partial = Replies([lost, [b"ok"]], "?c")
    releases = plan.throw(lost)
    assert type(releases) is Batch and releases.calls == [second[2]]
    with pytest.raises(StopIteration):
        plan.send([1])
    [item] = leases.deferred()
    assert list(item.step.calls) == first  # from its guard again, not from the enqueue


def test_a_deferred_parking_whose_guard_finds_the_operation_completed_sends_nothing_more() -> None:
    """A redelivery succeeded meanwhile (and the operator may have purged its
    settled DLQ record): the guard refuses and the parking is dropped, with
    its own event (not "recorded late")."""
    ka = core(fuses=False)
    leases = LeaseBook()
    calls = deferred_parking(leases, "k", "n")
    plan = ka.keep_alive_plan(leases)
    next(plan)
    assert plan.send([[1], 1]) == IO(calls, leases.deferred()[0].step.gates)
    with capture_logs() as logs, pytest.raises(StopIteration):
        plan.send(Replies([[b"done"], None, None], "rnn"))
    assert leases.deferred() == []
    assert [e["event"] for e in logs] == ["durability_parking_dropped"]



def test_slow_rounds_never_stop_a_parking_between_its_guard_and_its_enqueue() -> None:
    """Found by the third review of the guard: with rounds slow enough that a
    tick had time for one (a hung node: one socket timeout a round), each
    guarded parking sent its guard, was kept whole (a guard goes with its
    call) and started from its guard again at the next tick: its enqueue was
    never sent, and the keep-alive renewed its claim, so recovery could not
    park it (STUCK). Now a parking whose guard landed gets its enqueue's
    round before the tick ends."""
    ka, now = clocked(fuses=False)
    leases, plan, first, second = two_parkings_at_their_guards(ka)
    now[0] += ka.config.renew_interval  # (a round that took a whole tick)
    enqueues = plan.send([[b"open"], [b"open"]])
    assert type(enqueues) is Batch and enqueues.calls == [first[1], second[1]]
    now[0] += ka.config.renew_interval
    with pytest.raises(StopIteration):
        plan.send([[b"ok"], [b"ok"]])
    left = [list(d.step.calls) for d in leases.deferred()]
    assert left == [first[2:], second[2:]]  # (on from the release at the next tick)
