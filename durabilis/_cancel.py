"""Cancellations (asyncio): one a library call swallowed, found and raised
again (Python 3.11+); one held back until a shielded step's end, in the
running task (:class:`HeldThrough`).

Shared by the store, the retry engine and the async driver."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from contextvars import ContextVar
from functools import partial
from typing import Any, Generic, TypeVar

T = TypeVar("T")


_HELD: ContextVar[int] = ContextVar("durabilis_cancels_held", default=0)
"""The running task's cancellations held back by the :class:`HeldThrough` step
it is in (they stay counted by ``Task.cancelling()``, as after ``asyncio.shield``:
a ``timeout`` or ``TaskGroup`` around the call still tells its own from
another's). Once the step ends they are the plan's to deliver, and count as
any other: an ``fn`` that swallows one (a nested durable call's, caught) is
seen by the driver's check around ``fn``."""


def cancels() -> int:
    """How many times the running task was asked to cancel, less those held back
    until a shielded step's end (0 before Python 3.11). Compare two readings
    taken in one task: an increase is a cancellation that came in between and
    was neither raised nor held back."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return int(cancelling()) - _HELD.get() if cancelling is not None else 0


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
    """``await HeldThrough(work, defer)``: ``work`` (a coroutine) awaited to its
    end in the running task; a cancellation that arrives meanwhile is held
    back (counted in ``_HELD``, so that the work's own :func:`cancels` checks
    do not take it for one a library call swallowed) and handed to ``defer``
    (the plan's :meth:`~durabilis._steps.Stepper.defer`: the plan gets the
    step's reply, then the cancellation). A shield without a task of its own:
    ``asyncio.shield`` needs one per step (a few us of a durable call's ~75 us
    at 64 in flight, benchmarks/README.md).

    Every future ``work`` awaits is awaited through a proxy future, so the
    task's cancellation cancels the proxy, never that future. Only for work
    whose futures complete by themselves: a timeout inside ``work``
    (``asyncio.timeout``, ``wait_for`` on 3.12+) fires by cancelling the running
    task, and would be taken for the caller's cancellation and waited through.
    The async store says when its steps qualify
    (:attr:`~durabilis._store.AsyncStore.holds_in_task`: its batched steps,
    whose I/O and deadlines live in the batch's sender task).

    ``lost``: the error raised when the work ends cancelled without the
    caller's cancellation (else that ``CancelledError``).
    """

    __slots__ = ("_defer", "_lost", "_taken", "_work")

    def __init__(
        self, work: Coroutine[Any, Any, T], defer: Callable[[BaseException], None],
        lost: Callable[[], BaseException] | None = None,
    ) -> None:
        self._work = work
        self._defer = defer
        self._lost = lost
        self._taken = 0

    def __await__(self) -> Generator[Any, None, T]:
        inner = self._work.__await__()
        try:
            while True:
                try:
                    waited = inner.send(None)  # (a future is resumed with None)
                except StopIteration as end:
                    value: T = end.value
                    return value
                except asyncio.CancelledError:
                    # Not the caller's (held back above): a future the work
                    # awaited was cancelled by another (a sweep cancelling a
                    # task it waits for). ``lost``: what the step's fate is then.
                    if self._lost is None:
                        raise
                    raise self._lost() from None
                if waited is None:  # a bare yield (asyncio.sleep(0))
                    try:
                        yield None
                    except asyncio.CancelledError as exc:
                        self._take(exc)
                    continue
                waited._asyncio_future_blocking = False  # (what the task would do)
                while not waited.done():
                    proxy = waited.get_loop().create_future()
                    waited.add_done_callback(partial(_wake, proxy))
                    proxy._asyncio_future_blocking = True
                    try:
                        yield proxy
                    except asyncio.CancelledError as exc:
                        self._take(exc)
        finally:
            inner.close()
            if self._taken:  # handed to the plan: from here on, a cancellation like any
                _HELD.set(_HELD.get() - self._taken)

    def _take(self, exc: asyncio.CancelledError) -> None:
        self._taken += 1
        _HELD.set(_HELD.get() + 1)  # (not a cancellation the work swallowed: see cancels)
        self._defer(exc)


def _wake(proxy: asyncio.Future[None], _: Any) -> None:
    if not proxy.done():
        proxy.set_result(None)
