"""Cancellations (asyncio): one a library call swallowed, found and raised
again (Python 3.11+); one held back until a shielded step's end, in the
running task (:class:`HeldThrough`).

Shared by the store, the retry engine and the async driver."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


_HOLDING: dict[int, int] = {}
"""The tasks inside a :class:`HeldThrough` step (by ``id``: a task left in a
step is not kept alive by it; the step's end, or its collection, removes it),
each with its ``cancelling()`` count when the step began: what it is asked
meanwhile is held back for the plan, and stays counted by
``Task.cancelling()`` (as after ``asyncio.shield``: a ``timeout`` or
``TaskGroup`` around the call still tells its own cancellation from
another's)."""


if sys.version_info < (3, 12):  # (its current_task is Python: two C calls here)
    _TASKS = asyncio.tasks._current_tasks  # type: ignore[attr-defined]
    _running_loop = asyncio.get_running_loop

    def current_task() -> asyncio.Task[Any] | None:
        """The running task (``asyncio.current_task()``)."""
        task: asyncio.Task[Any] | None = _TASKS.get(_running_loop())
        return task
else:
    current_task = asyncio.current_task  # (C)


def cancel_requested() -> bool:
    """Whether the running task was asked to cancel (always outside a task:
    it cannot tell, and a cancellation must not be lost)."""
    task = current_task()
    return task is None or task.cancelling() > 0


def cancels() -> int:
    """How many times the running task was asked to cancel, not counting what
    it is asked while inside a held step (up to the step's end: then it is the
    plan's to deliver, and counts as any other, so an ``fn`` that swallows one
    is seen by the driver's check around ``fn``). Compare two readings taken
    in one task: an increase is a cancellation that came in between and was
    neither raised nor held back."""
    task = current_task()
    if task is None:
        return 0
    count: int = task.cancelling()
    if _HOLDING:
        base = _HOLDING.get(id(task))
        if base is not None and base < count:
            return base
    return count


def resurface(before: int) -> None:
    """Raise the cancellation a redis-py call swallowed, if one did.

    redis-py sends through ``asyncio.wait_for``, which on Python 3.11 returns
    the inner result when a ``cancel()`` arrives as the send completes, and the
    cancellation is lost: a poller's ``stop()`` then waited forever (seen under
    CPU load on Cluster), and a caller's ``asyncio.timeout`` would not fire. A
    cancellation asked for during the call and not raised is raised here, as if
    it had come just after the reply (the outcome is then unknown to the caller,
    as for any cancellation in flight).
    """
    if cancels() > before:
        raise asyncio.CancelledError


class HeldThrough(Generic[T]):
    """``await HeldThrough(work, defer)``: ``work`` awaited to its end in the
    running task; a cancellation that arrives meanwhile is held back (the
    work's own :func:`cancels` checks do not take it for one a library call
    swallowed) and handed to ``defer`` (the plan's
    :meth:`~durabilis._steps.Stepper.defer`: the plan gets the step's reply,
    then the cancellation). A shield without a task of its own:
    ``asyncio.shield`` needs one per step (a few us of a durable call's ~75 us
    at 64 in flight, benchmarks/README.md).

    Every future ``work`` awaits is awaited through a proxy future, so the
    task's cancellation cancels the proxy, never that future (one wake-up
    callback per future, whatever the number of cancellations: anyio cancels
    again at every loop turn). Only for work whose futures complete by
    themselves: a timeout inside ``work`` (``asyncio.timeout``, ``wait_for``
    on 3.12+) fires by cancelling the running task, and would be taken for the
    caller's cancellation and waited through. The async store says when its
    steps qualify (:attr:`~durabilis._store.AsyncStore.holds_in_task`: its
    batched steps, whose I/O and deadlines live in the batch's sender task).

    ``lost``: the error raised when the work ends cancelled without the
    caller's cancellation (else that ``CancelledError``).
    """

    __slots__ = ("_defer", "_lost", "_work")

    def __init__(
        self, work: Awaitable[T], defer: Callable[[BaseException], None],
        lost: Callable[[], BaseException] | None = None,
    ) -> None:
        self._work = work
        self._defer = defer
        self._lost = lost

    def __await__(self) -> Generator[Any, None, T]:
        task = asyncio.current_task()
        cancelling = getattr(task, "cancelling", None)
        # (the outermost hold of this task keeps it: a held step inside another)
        key = id(task)
        holds = cancelling is not None and key not in _HOLDING
        if holds:
            _HOLDING[key] = int(cancelling())  # type: ignore[misc]
        inner = self._work.__await__()
        try:
            while True:
                try:
                    waited = inner.send(None)  # (a future is resumed with None)
                except StopIteration as end:
                    value: T = end.value
                    return value
                except asyncio.CancelledError:
                    # Not the caller's (held back below): a future the work
                    # awaited was cancelled by another (a sweep cancelling a
                    # task it waits for). ``lost``: what the step's fate is then.
                    if self._lost is None:
                        raise
                    raise self._lost() from None
                yield from _through(waited, self._defer)
        finally:
            inner.close()
            if holds:
                del _HOLDING[key]


def _through(waited: Any, defer: Callable[[BaseException], None]) -> Generator[Any, None, None]:
    """Wait, as the task would, for what the work yielded (a future, or
    ``None``: a bare yield), the task's cancellations meanwhile to ``defer``."""
    if waited is None:  # (asyncio.sleep(0))
        try:
            yield None
        except asyncio.CancelledError as exc:
            defer(exc)
        return
    waited._asyncio_future_blocking = False  # (what the task would do)
    wake: _Wake | None = None
    while not waited.done():
        proxy = waited.get_loop().create_future()
        if wake is None:
            wake = _Wake(proxy)
            waited.add_done_callback(wake)
        else:
            wake.proxy = proxy
        proxy._asyncio_future_blocking = True
        try:
            yield proxy
        except asyncio.CancelledError as exc:
            defer(exc)


class _Wake:
    """A future's done-callback that wakes the proxy awaited for it now."""

    __slots__ = ("proxy",)

    def __init__(self, proxy: asyncio.Future[None]) -> None:
        self.proxy = proxy

    def __call__(self, _: Any) -> None:
        if not self.proxy.done():
            self.proxy.set_result(None)
