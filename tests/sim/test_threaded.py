"""The simulator's adapter that runs the sync layer's lean call as a plan
(tests/sim/threaded.py): each port call is a step of the plan, faults thrown
at a step reach the function there, hand-overs are yielded from, and a
deferred interruption is delivered as the sync driver delivers it. No server."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from durabilis._steps import IO, Run, Sleep
from tests.sim.threaded import Threads, threaded_plan

SHIELDED = IO([], shield=True)
OPEN = IO([])


def test_each_port_call_is_a_step_and_a_fault_reaches_the_function_there() -> None:
    seen: list[Any] = []

    def body(port: Any) -> str:
        seen.append(port.shielded(SHIELDED))
        try:
            port.open(OPEN)
        except ValueError as exc:
            seen.append(f"caught {exc}")
        return "done"

    plan = threaded_plan(body)
    assert plan.send(None) is SHIELDED
    assert plan.send("reply") is OPEN
    with pytest.raises(StopIteration) as end:
        plan.throw(ValueError("lost"))
    assert end.value.value == "done" and seen == ["reply", "caught lost"]


def test_a_hand_over_is_yielded_from_and_its_value_comes_back() -> None:
    def handed() -> Any:
        got = yield OPEN
        return f"plan got {got}"

    plan = threaded_plan(lambda port: port.rest(handed()))
    assert plan.send(None) is OPEN
    with pytest.raises(StopIteration) as end:
        plan.send(7)
    assert end.value.value == "plan got 7"


def test_a_deferred_interruption_waits_for_the_first_unshielded_step() -> None:
    def handed() -> Any:
        yield SHIELDED  # (shielded: the interruption waits)
        yield Run(lambda _: None, None)  # (unshielded: delivered here, not performed)
        return "never"

    plan = threaded_plan(lambda port: port.rest_after(handed(), KeyboardInterrupt()))
    assert plan.send(None) is SHIELDED
    with pytest.raises(KeyboardInterrupt):
        plan.send(None)


def test_a_call_whose_process_died_ends_its_thread_at_close() -> None:
    threads = Threads()
    before = set(threading.enumerate())
    plan = threaded_plan(lambda port: port.open(Sleep(1.0)), threads)
    assert type(plan.send(None)) is Sleep  # (then never stepped again: the process died)
    [waiting] = [t for t in threading.enumerate() if t not in before]
    assert waiting.is_alive()
    threads.end()
    assert not waiting.is_alive()
