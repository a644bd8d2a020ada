"""Checkpoints' core, tested the h11 way: scripted replies in, steps and results out.

No server and no store: each plan is stepped by hand (``answered``), so what
it sends (which script, KEYS, ARGV) and what it makes of each reply is
asserted directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from durabilis import _codec
from durabilis._keys import KeySpace
from durabilis._scripts import ScriptCall
from durabilis.core.checkpoint import (
    NO_CHECKPOINT,
    Checkpoint,
    CheckpointConfig,
    CheckpointOps,
    RunPlan,
    part,
)
from durabilis.core.steps import IO, Run, Sleep, answered
from durabilis.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    InvalidKey,
    StorageUnavailable,
)

NOW_MS = 1_700_000_000_000
K = KeySpace("unit")


def ids() -> Iterator[str]:
    n = 0
    while True:
        n += 1
        yield f"{n:032x}"


def ops(**config: Any) -> CheckpointOps:
    return CheckpointOps(K, CheckpointConfig(**config), new_id=ids().__next__)


def saved(call: ScriptCall, *, parent: bytes = b"", agent: bytes = b"a", phase: bytes = b"p",
          packed: bytes = b"") -> list[Any]:
    """A ``ckpt_save`` reply that landed."""
    return [b"ok", call.args[0], NOW_MS, NOW_MS + 5000, parent, agent, phase, packed, [], []]


def record(task: str, agent: str, phase: str, state: Any, parent: str = "") -> list[Any]:
    """A ``ckpt_get`` reply for a live record."""
    return [b"ok", task.encode(), agent.encode(), phase.encode(), _codec.pack(state),
            NOW_MS, NOW_MS + 5000, parent.encode()]


def found(*entries: tuple[str, str, str, int]) -> list[Any]:
    """A ``ckpt_find`` reply: (agent, phase, id, sequence) per live current checkpoint."""
    flat: list[Any] = []
    for agent, phase, cid, seq in entries:
        flat += [f"{agent}:{phase}".encode(), cid.encode(), str(seq).encode()]
    return [b"ok", flat]


# --- save ------------------------------------------------------------------------------


def test_a_save_is_one_ckpt_save_step_and_returns_the_checkpoint_with_its_state() -> None:
    o = ops()
    call = o.save("t", "a", "p", {"n": 1}, 10)
    assert call.name == "ckpt_save"
    assert call.keys[0] == K.ckpt("rec", "1".zfill(32))
    assert call.keys[1] == K.ckpt("task", "t")
    assert call.args[:4] == ["1".zfill(32), "t", "a", "p"]
    assert call.args[5] == 10_000  # the TTL in ms
    steps, cp = answered(o.save_plan(call), [saved(call, parent=b"prev")])
    assert steps == [call]
    assert isinstance(cp, Checkpoint)
    assert (cp.checkpoint_id, cp.task_id, cp.state, cp.parent_checkpoint_id) == (
        "1".zfill(32), "t", {"n": 1}, "prev",
    )


def test_a_save_with_stale_eviction_hints_is_sent_again_with_the_fresh_candidates() -> None:
    o = ops()
    call = o.save("t", "a", "p", 1)
    plan = o.save_plan(call)
    assert next(plan) is call
    again = plan.send([b"miss", [b"v1:t9"]])
    assert isinstance(again, ScriptCall) and again.args[0] == call.args[0]  # same id
    assert again.args[-1] == "v1:t9"
    assert K.ckpt("rec", "v1") in again.keys and K.ckpt("task", "t9") in again.keys
    with pytest.raises(StopIteration) as done:
        plan.send(saved(again))
    assert done.value.value.checkpoint_id == call.args[0]


def test_an_expected_checkpoint_that_is_not_the_latest_is_a_conflict() -> None:
    o = ops()
    call = o.save("t", "a", "p", 1, expected=NO_CHECKPOINT)
    assert call.args[7:9] == ["1", ""]
    with pytest.raises(CheckpointConflict) as conflict:
        answered(o.save_plan(call), [[b"conflict", b"other-id"]])
    assert conflict.value.actual == "other-id"


def test_a_phases_save_that_lost_its_reply_is_resent_shielded_and_read_back_if_it_landed() -> (
    None
):
    o = ops()
    call = o.save("t", "a", "p", {"done": True})
    plan = o.kept_save_plan(call)
    first = next(plan)
    assert isinstance(first, IO) and first.shield and first.calls == [call]
    pause = plan.throw(StorageUnavailable("reply lost"))
    assert isinstance(pause, Sleep) and pause.shield
    resend = plan.send(None)
    assert isinstance(resend, IO) and resend.calls == [call]  # the same id again
    read = plan.send([[b"exists"]])  # that id landed the first time
    assert isinstance(read, IO) and read.shield
    assert read.calls[0].name == "ckpt_get" and read.calls[0].args[0] == call.args[0]
    with pytest.raises(StopIteration) as done:
        plan.send([record("t", "a", "p", {"done": True})])
    assert done.value.value.state == {"done": True}


# --- restore, get ---------------------------------------------------------------------------


def test_restore_finds_the_agents_newest_checkpoint_then_reads_it() -> None:
    o = ops()
    steps, cp = answered(
        o.restore_plan("t", "a", None),
        [found(("a", "p1", "i1", 1), ("a", "p2", "i2", 5), ("b", "p3", "i3", 9)),
         record("t", "a", "p2", "two", parent="i1")],
    )
    assert [s.name for s in steps] == ["ckpt_find", "ckpt_get"]
    assert steps[1].args == ["i2", "t"]
    assert (cp.checkpoint_id, cp.phase, cp.state, cp.parent_checkpoint_id) == (
        "i2", "p2", "two", "i1",
    )


def test_restore_looks_again_when_the_record_expired_meanwhile_then_says_not_found() -> None:
    o = ops()
    with pytest.raises(CheckpointNotFound):
        answered(
            o.restore_plan("t", "a", "p1"),
            [found(("a", "p1", "i1", 1)), [b"none"], found()],
        )


def test_a_bad_phase_is_refused_before_any_step() -> None:
    with pytest.raises(InvalidKey):
        answered(ops().restore_plan("t", "a", ""), [])


def test_get_by_id_of_a_gone_record_is_not_found() -> None:
    with pytest.raises(CheckpointNotFound):
        answered(ops().get_by_id_plan("gone"), [[b"none"]])


# --- fork, rewind -----------------------------------------------------------------------------


def test_a_fork_copies_the_source_into_the_new_task_with_the_source_as_parent() -> None:
    o = ops()
    call = o.fork("src", "t2")
    assert call.name == "ckpt_save" and call.args[9:11] == ["fork", "src"]
    assert call.keys[6] == K.ckpt("rec", "src")
    _, cp = answered(o.save_plan(call), [saved(call, parent=b"src", packed=_codec.pack([1]))])
    assert (cp.task_id, cp.parent_checkpoint_id, cp.state) == ("t2", "src", [1])


def test_a_rewind_to_a_checkpoint_of_another_task_is_not_found() -> None:
    o = ops()
    call = o.rewind("t", "elsewhere")
    assert call.args[9] == "rewind"
    with pytest.raises(CheckpointNotFound, match="in task 't'"):
        answered(o.save_plan(call), [[b"notfound"]])


# --- count, clear, history ------------------------------------------------------------------


def test_clear_runs_pass_after_pass_until_no_id_is_left() -> None:
    o = ops()
    steps, removed = answered(o.clear_plan("t"), [[b"ok", 2, [b"r1", b"r2"]], [b"ok", 0, []]])
    first, second = steps
    assert first.args == [256, "t"]
    assert second.args == ["r1", "r2", 256, "t"]
    assert K.ckpt("rec", "r1") in second.keys
    assert removed == 2


def test_count_is_one_step() -> None:
    steps, n = answered(ops().count_plan(), [7])
    assert [s.name for s in steps] == ["ckpt_count"] and n == 7


def test_history_follows_parents_through_a_record_that_is_not_current() -> None:
    o = ops()
    steps, chain = answered(
        o.history_plan("t", "a", None),
        [found(("a", "p2", "i2", 5)),
         [record("t", "a", "p2", 2, parent="i1")],  # the current ones, in one step
         record("t", "a", "p1", 1)],  # a replaced ancestor, one step each
    )
    assert [type(s).__name__ for s in steps] == ["ScriptCall", "IO", "ScriptCall"]
    assert [cp.checkpoint_id for cp in chain] == ["i2", "i1"]


# --- a task run --------------------------------------------------------------------------------


def test_a_task_run_skips_a_completed_phase_and_checkpoints_a_new_one() -> None:
    o = ops()
    run = RunPlan(o, "t", "a", None, exclusive=True)
    steps, state = answered(
        run.phase_plan("one", lambda: "fresh"),
        [found(("a", "one", "r1", 4)), [record("t", "a", "one", "kept")]],
    )
    assert state == "kept"  # done before: fn did not run
    assert [type(s).__name__ for s in steps] == ["ScriptCall", "IO"]
    plan = run.phase_plan("two", lambda: {"x": 2})
    step = next(plan)
    assert isinstance(step, Run)
    save = plan.send((True, {"x": 2}))
    assert isinstance(save, IO) and save.shield
    (call,) = save.calls
    assert call.args[3] == "two" and call.args[8] == "r1"  # exclusive: builds on r1
    with pytest.raises(StopIteration) as done:
        plan.send([saved(call, phase=b"two")])
    assert done.value.value == {"x": 2}
    assert run.expected == call.args[0]


def test_a_phase_whose_fn_raises_saves_nothing_and_raises_it() -> None:
    run = RunPlan(ops(), "t", "a", None, exclusive=False)
    run.loaded = True
    plan = run.phase_plan("p", lambda: None)
    next(plan)
    with pytest.raises(ValueError, match="boom"):
        plan.send((False, ValueError("boom")))


def test_part_is_the_public_name_of_the_layers_id_check() -> None:
    assert part("task_id", "t") == "t"
    with pytest.raises(InvalidKey):
        part("task_id", "")
