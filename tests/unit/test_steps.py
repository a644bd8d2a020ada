"""The step drivers' handling of interruptions around shielded steps."""

from __future__ import annotations

import asyncio

from durabilis._steps import _shielded


class _Run:
    def __init__(self) -> None:
        self.deferred: BaseException | None = None

    def defer(self, exc: BaseException) -> None:
        self.deferred = exc


def test_a_cancellation_as_a_shielded_step_finishes_keeps_the_steps_reply() -> None:
    async def main() -> tuple[object, BaseException | None]:
        run = _Run()

        async def step() -> str:
            return "committed"

        waiter = asyncio.ensure_future(_shielded(run, step()))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the waiter starts the step and awaits it
        await asyncio.sleep(0)  # the step finishes; the waiter is not resumed yet
        waiter.cancel()  # the cancellation arrives in that instant
        return await waiter, run.deferred

    reply, deferred = asyncio.run(main())
    assert reply == "committed"  # the plan gets the reply: the step did commit
    assert isinstance(deferred, asyncio.CancelledError)  # delivered after the step


def test_a_cancellation_during_a_shielded_step_waits_for_it() -> None:
    async def main() -> tuple[object, BaseException | None]:
        run = _Run()
        gate = asyncio.Event()

        async def step() -> str:
            await gate.wait()
            return "committed"

        waiter = asyncio.ensure_future(_shielded(run, step()))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0)
        assert not waiter.done()
        gate.set()
        return await waiter, run.deferred

    reply, deferred = asyncio.run(main())
    assert reply == "committed" and isinstance(deferred, asyncio.CancelledError)
