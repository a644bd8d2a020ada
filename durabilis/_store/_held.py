"""Connection pools whose bookkeeping no signal handler interrupts.

The sync driver lets the main thread's signal handlers run during an open step
(:mod:`durabilis._signal_gate`): a Ctrl-C or a ``SIGALRM`` timeout cuts a
blocked read. But a pool's bookkeeping is not safe against an exception raised
between two bytecodes: a handler raising just after ``Queue.get`` acquired its
lock left the lock held (every later caller waited on it forever), and one
raising just after a connection was taken lost that connection (the pool had
one fewer, for good). So the sync pools hold the handlers back
(:meth:`~durabilis._signal_gate.SignalGate.hold`) while they take or give back
a connection, and run them just after. Where the bookkeeping waits, they run
as before: between the polls of a wait for a free connection
(:class:`HeldLifo`), and while a connection (re)connects (the pool holds it
in a local variable then, and gives it back if that raises).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from durabilis._signal_gate import GATE

T = TypeVar("T")

_FIRST_POLL = 0.001
_LAST_POLL = 0.05


def through(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with the handlers that :meth:`~durabilis._signal_gate.SignalGate.hold`
    holds back let through (those held back already run first); held again
    after. Nothing changes where the gate is not held (by this thread).

    A plain function, not a context manager: the gate is opened inside its
    ``try`` and closed first thing in its ``finally``, with no call in
    between where a handler could run with the gate in the wrong state (a
    generator's ``finally``, left suspended by a handler raising in
    ``contextlib``, closed the gate later, at its collection: for good)."""
    if not GATE.held_here():
        return fn(*args)
    GATE.holding = GATE.closed = False
    try:
        GATE.deliver()
        return fn(*args)
    finally:
        GATE.closed = GATE.holding = True


def _nothing() -> None:
    return None


class HeldLifo(queue.LifoQueue):  # type: ignore[type-arg]
    """The pool's queue. A blocking ``get`` while the gate is held (the main
    thread waiting for a free connection inside an open step) waits in short
    spans (up to 50 ms), in the queue's own line of waiters, and lets the
    handlers run between them, with no lock held: an interruption still cuts
    the wait (within a span), and leaves the queue as it was."""

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not block or not GATE.held_here():
            return super().get(block, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause, left = _FIRST_POLL, timeout
        while True:
            try:  # (in the queue's own line of waiters, the handlers held back)
                return super().get(True, pause if left is None else max(0.0, min(pause, left)))
            except queue.Empty:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise
            through(_nothing)  # (what was held back meanwhile runs here: no lock held)
            pause = min(pause * 2, _LAST_POLL)


class HeldPool:
    """A mixin for a redis-py pool (blocking, or a Cluster node's): its
    ``get_connection`` and ``release`` run with the handlers held back. One
    held back during ``get_connection`` runs as it returns (the connection is
    given back first if it raises), or at the caller's own
    :meth:`~durabilis._signal_gate.SignalGate.unhold` when the caller held the
    gate across the call (:meth:`durabilis._store._sync.Store._send`: the
    connection is then in its hands, never lost between the two); one held back
    during ``release`` runs as it returns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if isinstance(self, redis.BlockingConnectionPool):  # (a plain pool has no queue)
            kwargs.setdefault("queue_class", HeldLifo)
        super().__init__(*args, **kwargs)

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        held = GATE.hold()
        try:
            conn = self.take(*args, **kwargs)
        except BaseException:
            GATE.unhold(held)  # (no connection taken)
            raise
        if not (held and GATE.pending):
            GATE.unhold(held, deliver=False)
            return conn
        try:  # what was held back meanwhile runs now (not after the caller's read)
            GATE.unhold(held)
        except BaseException:  # the connection goes back first (no call before the hold)
            GATE.closed = GATE.holding = True
            try:
                self.give(conn)
            finally:
                GATE.unhold(held, deliver=False)
            raise
        return conn

    def release(self, connection: Any) -> None:
        held = GATE.hold()
        try:
            self.give(connection)
        finally:
            GATE.unhold(held)

    def ensure_connection(self, connection: Any) -> None:
        through(super().ensure_connection, connection)  # type: ignore[misc]  # (network)

    def take(self, *args: Any, **kwargs: Any) -> Any:
        """``get_connection`` for a caller that holds the gate itself."""
        return super().get_connection(*args, **kwargs)  # type: ignore[misc]

    def give(self, connection: Any) -> None:
        """``release`` for a caller that holds the gate itself."""
        super().release(connection)  # type: ignore[misc]
