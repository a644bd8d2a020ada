"""The keep-alive's put-back never lists a settled claim again (Cluster).

On Cluster a claim's in-flight entry is written in a wave beside its claim,
not with it, so the keep-alive puts back the entries of the claims it just
renewed (recovery may have dropped one whose claim step came late). A claim
may settle between its renewal and that put-back: its owner's removal is sent
in its own step (a park, a release) or in a batch (a success), and may land
before the put-back. An owner's removal marks its members settled (a sorted
set beside the index, same slot) and the put-back (``layer_note`` mode
``back``) adds none of them: Redis decides, whatever order the two land in.
Found by the review of the first fix, which decided in the process and missed
the removals sent in a step.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import durabilis
from durabilis import OperationError, RetryPolicy
from durabilis._scripts import ScriptCall
from durabilis.errors import RetryExhausted
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext

pytestmark = pytest.mark.topologies("cluster")


def note(store: durabilis.Store, mode: str, members: list[str], *, settled: bool) -> Any:
    keys = [store.keys.layer("inflight"), store.keys.layer("stats")]
    if settled:
        keys.append(store.keys.layer("settled"))
    return store.run(ScriptCall("layer_note", keys, [mode, 30000, len(members), *members]))


def listed(raw: Any, store: durabilis.Store) -> list[str]:
    return sorted(m.decode() for m in raw.zrange(store.keys.layer("inflight"), 0, -1))


def test_a_member_its_owner_removed_is_not_put_back_in_either_order(
    store: durabilis.Store, raw: Any
) -> None:
    note(store, "add", ["a|1", "b|2", "c|3"], settled=False)
    note(store, "rem", ["a|1"], settled=True)  # removal first, then the put-back
    note(store, "back", ["a|1", "b|2"], settled=True)
    assert listed(raw, store) == ["b|2", "c|3"]
    note(store, "back", ["c|3"], settled=True)  # the put-back first, then the removal
    note(store, "leave", ["c|3"], settled=True)
    assert listed(raw, store) == ["b|2"]
    mark = raw.zscore(store.keys.layer("settled"), "a|1")
    assert mark is not None and 0 < mark - time.time() * 1000 <= 10_000  # (marks end)
    assert 0 < raw.pttl(store.keys.layer("settled")) <= 10_000


def test_recovery_s_removal_marks_nothing_so_the_put_back_restores_a_live_claim(
    store: durabilis.Store, raw: Any
) -> None:
    """Recovery drops an entry whose claim it did not find (a claim step that
    came late): that is what the put-back is for."""
    note(store, "add", ["late|1"], settled=False)
    note(store, "rem", ["late|1"], settled=False)  # recovery's removal
    assert note(store, "back", ["late|1"], settled=True) == 1
    assert listed(raw, store) == ["late|1"]


def test_foreign_data_in_the_settled_key_stops_no_removal_and_goes_at_the_next(
    store: durabilis.Store, raw: Any
) -> None:
    settled = store.keys.layer("settled")
    raw.set(settled, "not a sorted set")
    note(store, "add", ["a|1", "b|2"], settled=False)
    note(store, "rem", ["a|1"], settled=False)  # (recovery's: no mark)
    assert note(store, "back", ["a|1"], settled=True) == 1  # (unreadable: put back, as before)
    assert note(store, "rem", ["a|1"], settled=True) == 1  # (the set is ours: replaced)
    assert listed(raw, store) == ["b|2"]
    assert raw.type(settled) in (b"zset", "zset") and 0 < raw.pttl(settled) <= 10_000
    note(store, "back", ["a|1"], settled=True)
    assert listed(raw, store) == ["b|2"]


def test_a_replay_whose_handler_fails_is_not_listed_again_by_a_keep_alive_tick(
    store: durabilis.Store, raw: Any
) -> None:
    """A replay pass holds each claim it made until the pass ends. Replay 1's
    handler fails (its claim released, its entry removed in that step) while
    a keep-alive tick that renewed it is between its renewal and its put-back
    (the tick is stepped by hand: its real plan, lease book and store)."""
    cfg = DurabilityConfig(retry_policies=(RetryPolicy(
        "w", max_attempts=1, initial_delay_ms=1, max_delay_ms=1, jitter=False),))
    layer = DurabilityLayer(store, cfg)
    index = store.keys.layer("inflight")
    try:
        def down(ctx: OperationContext) -> Any:
            raise OperationError("NETWORK_TIMEOUT", "down")

        for i in (1, 2):
            with pytest.raises(RetryExhausted):
                layer.execute("a", "w", {"i": i}, down)
        started = {1: threading.Event(), 2: threading.Event()}
        go = {1: threading.Event(), 2: threading.Event()}

        def handler(ctx: OperationContext) -> Any:
            i = ctx.payload["i"]
            started[i].set()
            assert go[i].wait(30)
            if i == 1:
                raise OperationError("NETWORK_TIMEOUT", "still down")
            return "ok"

        passes: list[Any] = []
        replaying = threading.Thread(target=lambda: passes.append(layer.replay_pending(handler)))
        replaying.start()
        try:
            assert started[1].wait(30)
            ((_, _, first),) = layer._leases.held()
            tick = layer._core.keep_alive_plan(layer._leases)
            renew = next(tick)
            renewed = store.run_many(renew.calls)  # replay 1's claim: in progress, renewed
            go[1].set()  # its handler fails: released, its entry removed, the pass goes on
            assert started[2].wait(30)
            assert first not in listed(raw, store)
            assert first in [m for _, _, m in layer._leases.held()]  # (held to the pass's end)
            try:
                back = tick.send(renewed)
            except StopIteration:  # (standalone: the entry goes with the claim, no put-back)
                assert store.fuses
            else:
                assert not store.fuses and back.calls[0].args[0] == "back"
                with pytest.raises(StopIteration):
                    tick.send(store.run_many(back.calls))
            assert first not in listed(raw, store)
        finally:
            go[1].set()
            go[2].set()
            replaying.join(30)
        assert passes and passes[0].replayed == 1
        layer.close()
        assert raw.zrange(index, 0, -1) == []
        assert layer.stats().in_flight == 0
    finally:
        layer.close()
