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
in a local variable then, and gives it back if that raises). On redis-py's
own paths, which take a connection before their ``try`` and give it back in
their ``finally``, the handlers stay held from the take to the give, and run
during the connection's sends and reads (:class:`HeldIO`).
"""

from __future__ import annotations

import queue
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from durabilis._signal_gate import GATE

T = TypeVar("T")

_SINCE = "_durabilis_since"
"""A connection's note of the gate's count of handlers run when redis-py took it
(main thread only: see :meth:`HeldPool._back`)."""

_FIRST_POLL = 0.001
_LAST_POLL = 0.05


def through(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` with the handlers that
    :meth:`~durabilis._signal_gate.SignalGate.hold` holds back let through
    (those held back already run first); held again after. Nothing changes
    where the gate is not held (by this thread).

    A plain function, not a context manager: the gate is opened inside its
    ``try`` and closed first thing in its ``finally``, with no call in
    between where a handler could run with the gate in the wrong state (a
    generator's ``finally``, left suspended by a handler raising in
    ``contextlib``, closed the gate later, at its collection: for good)."""
    if not GATE.held_here():
        return fn(*args, **kwargs)
    try:
        GATE.holding = GATE.closed = False
        GATE.deliver()
        return fn(*args, **kwargs)
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


class HeldIO:
    """A mixin for the connections of a :class:`HeldPool` (made on the pool's
    own connection class, TCP, TLS or a unix socket: :func:`held_io`): what
    redis-py's own paths send and read lets the handlers through
    (:func:`through`) while a connection lent to them holds them back
    (:meth:`HeldPool.get_connection`). Elsewhere it changes nothing."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if GATE.holding:
            through(super().send_packed_command, command, check_health)  # type: ignore[misc]
            return
        super().send_packed_command(command, check_health)  # type: ignore[misc]

    def connect(self) -> None:
        if GATE.holding:  # (redis-py reconnects in its finally, a maintenance's move)
            through(super().connect)  # type: ignore[misc]
            return
        super().connect()  # type: ignore[misc]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        if GATE.holding:
            return through(super().read_response, *args, **kwargs)  # type: ignore[misc]
        return super().read_response(*args, **kwargs)  # type: ignore[misc]


_HELD_IO: dict[type, type] = {}


def held_io(cls: type) -> type:
    """``cls`` with :class:`HeldIO` in front (made once per class)."""
    if issubclass(cls, HeldIO):
        return cls
    made = _HELD_IO.get(cls)
    if made is None:
        made = _HELD_IO[cls] = type(f"Held{cls.__name__}", (HeldIO, cls), {
            "__module__": __name__, "__doc__": cls.__doc__,
        })
    return made


_GIVES_BACK = frozenset({"_execute_command", "execute"})
"""The redis-py callers of ``get_connection`` that give the connection back
before they return (a plain command; a pipeline's execute, from its reset):
inside fn, only theirs are lent (a WATCH or a pub/sub keeps its connection
for as long as fn likes, and would hold every handler that long)."""


def _forgotten_by_caller(connection: Any) -> None:
    """``connection`` is back, and the gate is about to open, in ``release``:
    a handler may raise out of it from here. A redis-py pipeline's or
    pub/sub's ``reset`` forgets its connection just after giving it back
    (``self.connection = None``); raised before that, the reset ran again at
    the object's collection and gave the same connection back twice, maybe
    while another thread used it (two users of one connection). So that
    forgetting is done first, here, with the gate still closed."""
    caller = sys._getframe(2)
    if caller.f_code.co_name == "reset":
        owner: Any = caller.f_locals.get("self")
        if getattr(owner, "connection", None) is connection:
            owner.connection = None


class HeldPool:
    """A mixin for a redis-py pool (blocking, or a Cluster node's): its
    bookkeeping runs with the handlers held back.

    ``take`` and ``give`` are for durabilis's own sends, which hold the handlers
    themselves from before the take until the connection is in their ``try``,
    and again while it is given back (:meth:`durabilis._store._sync.Store._send`).

    ``get_connection`` and ``release`` are redis-py's paths (a plain command, a
    pipeline, Cluster routing), where the connection is taken before redis-py's
    ``try`` and given back in its ``finally``: a handler raising in between
    (before the ``try``, or at the entry of ``release``) lost the connection
    for good. So a connection is lent to them with the handlers held back
    (:attr:`~durabilis._signal_gate.SignalGate.lent`), until it is given back;
    they run during its sends and reads (:class:`HeldIO`), where redis-py's
    ``try`` holds it; what is still held back when it is given back runs at
    the end of the step. Inside ``fn`` (no ``SignalGate.lending``), whose
    redis-py calls may keep a connection out for long (a WATCH, a pub/sub),
    only the calls that give it back before they return are lent
    (:data:`_GIVES_BACK`), and what is held runs as it comes back; the others
    run as before. Either way the connection is dropped when a handler raised
    while redis-py had it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if isinstance(self, redis.BlockingConnectionPool):  # (a plain pool has no queue)
            kwargs.setdefault("queue_class", HeldLifo)
        super().__init__(*args, **kwargs)
        self.connection_class = held_io(self.connection_class)  # type: ignore[has-type]

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        since = GATE.ran_here()
        lent = GATE.lent
        held = GATE.hold()
        try:
            conn = self.take(*args, **kwargs)
        except BaseException:
            GATE.unhold(held)  # (no connection taken)
            raise
        conn.__dict__[_SINCE] = since
        if isinstance(conn, HeldIO) and (held or (lent and GATE.held_here())) and (
            GATE.lending or sys._getframe(1).f_code.co_name in _GIVES_BACK
        ):
            lent.append(conn)  # held back until its release (another's too: a Cluster pipeline)
            return conn
        # (Inside fn, or a connection of another class, e.g. redis-py's client-side
        # cache's: what was held back runs now, the connection given back first if
        # it raises.)
        if not (held and GATE.pending):
            GATE.unhold(held, deliver=False)
            return conn
        try:
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
        lent = GATE.lent
        back = False
        if lent and connection in lent:  # (held back since it was lent: see above)
            lent.remove(connection)
            try:
                self._back(connection)
                back = True
            finally:
                # What is still held back runs at the step's end (perform_open);
                # inside fn (no step's end soon), here, as release returns.
                if not lent and GATE.held_here():
                    if back:
                        _forgotten_by_caller(connection)
                    GATE.unhold(True, deliver=not GATE.lending)
            return
        held = GATE.hold()
        try:
            self._back(connection)
            back = True
        finally:
            if held and back:
                _forgotten_by_caller(connection)
            GATE.unhold(held)  # (inside fn, no step's end soon: what was held runs now)

    def _back(self, connection: Any) -> None:
        """``connection`` given back; dropped first if a handler raised while
        redis-py had it: its command was cut at an unknown point, a reply may
        still be on its way (the next user would read it as its own)."""
        since = connection.__dict__.pop(_SINCE, None)
        if since is not None and GATE.raised_since(since):
            connection.disconnect()
        self.give(connection)

    def ensure_connection(self, connection: Any) -> None:
        through(super().ensure_connection, connection)  # type: ignore[misc]  # (network)

    def take(self, *args: Any, **kwargs: Any) -> Any:
        """``get_connection`` for a caller that holds the gate itself."""
        return super().get_connection(*args, **kwargs)  # type: ignore[misc]

    def give(self, connection: Any) -> None:
        """``release`` for a caller that holds the gate itself."""
        super().release(connection)  # type: ignore[misc]
