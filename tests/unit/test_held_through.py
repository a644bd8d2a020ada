"""A shielded step awaited in its caller's task (``durabilis._cancel.HeldThrough``):
a cancellation meanwhile waits for the step, which keeps its reply, and is handed
to the plan after it; the task's count of cancellations stays as after
``asyncio.shield``, and the step's own checks (``cancels``) do not take it for one
a library call swallowed. No server: the step awaits futures the test completes."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from durabilis._cancel import HeldThrough, cancels
from durabilis._steps import IO, Sleep, _held
from durabilis.core.steps import Run
from durabilis.errors import StorageUnavailable


class _Run:
    """What the driver's ``Stepper`` is to the step: where a cancellation goes."""

    def __init__(self) -> None:
        self.deferred: list[BaseException] = []

    def defer(self, exc: BaseException) -> None:
        self.deferred.append(exc)


def _run_and_reply() -> tuple[_Run, asyncio.Future[str]]:
    """The plan's stand-in, and the future the step awaits (the test completes it)."""
    return _Run(), asyncio.get_running_loop().create_future()


def _noting(
    reply: asyncio.Future[str], seen: list[int], *, bare_yield: bool = False,
) -> Callable[[], Awaitable[str]]:
    """A step that awaits ``reply`` and notes what the store's own check
    (``cancels()`` before and after) sees meanwhile."""
    async def step() -> str:
        before = cancels()
        if bare_yield:
            await asyncio.sleep(0)  # a bare yield: held too
        value = await reply
        seen.append(cancels() - before)
        return value

    return step


def _held_task(step: Callable[[], Awaitable[Any]], run: _Run) -> asyncio.Task[Any]:
    async def held() -> Any:
        return await HeldThrough(step(), run.defer)  # type: ignore[arg-type]

    return asyncio.get_running_loop().create_task(held())


def _counted(task: asyncio.Task[Any]) -> int | None:
    cancelling = getattr(task, "cancelling", None)
    return None if cancelling is None else int(cancelling())


def test_a_cancellation_during_a_held_step_waits_for_it_and_the_reply_is_kept() -> None:
    async def main() -> None:
        run, reply = _run_and_reply()
        seen: list[int] = []
        step = _noting(reply, seen)

        after: list[int] = []

        async def held() -> str:
            before = cancels()
            value = await HeldThrough(step(), run.defer)
            # The plan's to deliver now: counted like any other from here (an
            # fn that swallows it is seen by the driver's check around fn).
            after.append(cancels() - before)
            return value

        task = asyncio.get_running_loop().create_task(held())
        await asyncio.sleep(0)  # the step awaits its reply
        task.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
        assert not task.done()  # it waits for the step
        assert not reply.cancelled()  # the step's future was not cancelled
        reply.set_result("committed")
        assert await task == "committed"  # the plan gets the reply: the step did commit
        assert [type(e) for e in run.deferred] == [asyncio.CancelledError]  # then this
        assert seen == [0]  # not a cancellation the step swallowed
        assert after == [0 if _counted(task) is None else 1]
        assert _counted(task) in (None, 1)  # still counted (3.11+), as after asyncio.shield

    asyncio.run(main())


def test_a_cancellation_as_the_held_step_s_reply_comes_keeps_the_reply() -> None:
    async def main() -> None:
        run, reply = _run_and_reply()

        async def step() -> str:
            return await reply

        task = _held_task(step, run)
        await asyncio.sleep(0)
        reply.set_result("committed")  # the task is not resumed yet...
        task.cancel()  # ...when the cancellation arrives
        assert await task == "committed"
        assert len(run.deferred) == 1

    asyncio.run(main())


def test_cancellations_at_every_loop_turn_are_all_held_until_the_step_ends() -> None:
    """anyio's cancel scopes cancel again at every turn until the task leaves them."""
    async def main() -> None:
        run, reply = _run_and_reply()
        seen: list[int] = []
        step = _noting(reply, seen, bare_yield=True)

        task = _held_task(step, run)
        await asyncio.sleep(0)  # the step started
        for _ in range(5):
            task.cancel()
            await asyncio.sleep(0)
        reply.set_result("committed")
        assert await task == "committed"
        assert len(run.deferred) == 5 and seen == [0]
        assert _counted(task) in (None, 5)

    asyncio.run(main())


def test_two_cancellations_in_one_turn_are_not_taken_for_one_the_step_swallowed() -> None:
    """Two ``cancel()`` in one loop turn count twice and are delivered once: the
    step's own check still sees nothing to raise (its reply is not thrown away)."""
    async def main() -> None:
        run, reply = _run_and_reply()
        seen: list[int] = []
        step = _noting(reply, seen)

        task = _held_task(step, run)
        await asyncio.sleep(0)
        task.cancel()
        task.cancel()
        await asyncio.sleep(0)
        reply.set_result("committed")
        assert await task == "committed"
        assert seen == [0] and len(run.deferred) == 1
        assert _counted(task) in (None, 2)

    asyncio.run(main())


def test_a_held_step_holds_nothing_back_for_another_task_of_the_same_context() -> None:
    """Tasks started with one context (``create_task(..., context=ctx)``) share
    its variables: what a held step holds back is its own task's alone."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        run = _Run()
        ctx = contextvars.copy_context()
        reply: asyncio.Future[str] = loop.create_future()
        other_s: asyncio.Future[str] = loop.create_future()
        seen: list[int] = []

        async def held() -> str:
            async def step() -> str:
                return await reply
            return await HeldThrough(step(), run.defer)

        async def other() -> str:
            before = cancels()
            value = await other_s
            seen.append(cancels() - before)  # nobody cancelled this task
            return value

        a = loop.create_task(held(), context=ctx)
        await asyncio.sleep(0)
        a.cancel()
        await asyncio.sleep(0)  # held back by a's step...
        b = loop.create_task(other(), context=ctx)
        await asyncio.sleep(0)  # ...as b takes its first reading
        reply.set_result("a")
        assert await a == "a"
        other_s.set_result("b")
        assert await b == "b" and seen == [0]

    asyncio.run(main())


def test_a_held_step_s_own_error_is_raised_with_the_cancellation_held() -> None:
    async def main() -> None:
        run, reply = _run_and_reply()

        async def step() -> str:
            await reply
            raise ValueError("the step failed")

        task = _held_task(step, run)
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0)
        reply.set_result("x")
        with pytest.raises(ValueError, match="the step failed"):
            await task
        assert len(run.deferred) == 1  # the plan gets the error, then the cancellation

    asyncio.run(main())


@pytest.mark.parametrize("lost", [None, StorageUnavailable])
def test_a_future_the_held_step_awaits_that_is_cancelled_by_another_ends_it(
    lost: type[BaseException] | None,
) -> None:
    """Only the caller's cancellation is held back: the step's own future
    cancelled elsewhere (a sweep cancelling a task it waits for) ends the
    step, with ``lost``'s error when given (the driver's: a lost reply)."""
    async def main() -> None:
        run, reply = _run_and_reply()

        async def step() -> str:
            return await reply

        async def held() -> str:
            return await HeldThrough(step(), run.defer, lost)

        task = asyncio.get_running_loop().create_task(held())
        await asyncio.sleep(0)
        reply.cancel()
        with pytest.raises(lost or asyncio.CancelledError):
            await task
        assert run.deferred == []

    asyncio.run(main())


class _Store:
    """The async store as the driver sees it for one step: whether its steps
    may be held in the caller's task, and the step (which notes its task)."""

    def __init__(self, holds_in_task: bool) -> None:
        self.holds_in_task = holds_in_task
        self.tasks: list[asyncio.Task[Any] | None] = []

    async def run_step(self, calls: Any, gates: Any, waves: Any) -> str:
        self.tasks.append(asyncio.current_task())
        await asyncio.sleep(0)
        return "replies"


@pytest.mark.parametrize("holds_in_task", [True, False])
def test_the_driver_holds_a_shielded_io_step_in_its_task_only_where_the_store_allows(
    holds_in_task: bool,
) -> None:
    async def main() -> None:
        store = _Store(holds_in_task)
        run = _Run()
        me = asyncio.current_task()
        reply = await _held(run, store, IO([], shield=True), None, [])  # type: ignore[arg-type]
        assert reply == "replies"
        assert (store.tasks == [me]) is holds_in_task  # else a task of its own

    asyncio.run(main())


@pytest.mark.parametrize("step", [Sleep(0, shield=True), Run(print, None)])
def test_steps_other_than_the_stores_scripts_keep_a_task_of_their_own(step: Any) -> None:
    async def main() -> None:
        run = _Run()
        awaited = _held(run, _Store(True), step, None, [])  # type: ignore[arg-type]
        assert not isinstance(awaited, HeldThrough)
        await awaited

    asyncio.run(main())


def test_a_timeout_around_a_held_step_still_tells_its_own_cancellation_from_another_s() -> None:
    """Held, not taken back: ``asyncio.timeout`` turns its own cancellation into
    TimeoutError, and one from elsewhere that came too is not swallowed."""
    async def main(also_cancelled: bool) -> str:
        run = _Run()
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[str] = loop.create_future()

        async def step() -> str:
            return await reply

        async def caller() -> str:
            async with asyncio.timeout(0.01):
                value = await HeldThrough(step(), run.defer)
                raise run.deferred[0]  # the plan delivers it at its next step
            return value

        task = loop.create_task(caller())
        await asyncio.sleep(0.05)  # the timeout fired: held
        if also_cancelled:
            task.cancel()
            await asyncio.sleep(0)
        reply.set_result("committed")
        try:
            await task
        except TimeoutError:
            return "timeout"
        except asyncio.CancelledError:
            return "cancelled"
        return "returned"

    assert asyncio.run(main(False)) == "timeout"
    assert asyncio.run(main(True)) == "cancelled"
