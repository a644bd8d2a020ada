"""The signal gate of the sync driver (:func:`durabilis._steps.drive`): while the
main thread runs a plan's own code or a shielded step, the Python handlers of
the usual signals are held back, and run at the next unshielded step."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from durabilis.errors import DurabilisError

_get_ident = threading.get_ident
_main_thread = threading.main_thread

_C_SIGNAL: Any = getattr(signal, "_signal", signal)
"""The C module under ``signal``: its getsignal is ~200x faster (no enum conversion)."""

_GUARDED = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGQUIT", "SIGHUP", "SIGALRM", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)


_BLOCKS = hasattr(_C_SIGNAL, "pthread_sigmask") and hasattr(_C_SIGNAL, "raise_signal")
"""Whether the gate can hand held signals to the OS at a plan's end (POSIX)."""

def _signums(pending: list[tuple[Any, int, Any]]) -> set[int]:
    return {signum for _, signum, _ in pending}


_REMEMBERED = 4
"""How many handlers' exceptions the gate remembers (see ``SignalGate.made_of``)."""


class SignalGate:
    """Where the main thread's signal handlers may raise during a sync plan.

    A handler that raises (``KeyboardInterrupt``, a ``SIGTERM`` handler that
    calls ``sys.exit``) runs between any two bytecodes of the main thread: in
    the plan's own code too, where an exception closes the plan for good (an
    ``fn`` that returned, its result being encoded: no record, the claim left
    to lapse, the operation run again). So while the main thread runs a plan's
    own code or a shielded step, the Python handlers of SIGINT, SIGTERM,
    SIGQUIT, SIGHUP, SIGALRM, SIGUSR1 and SIGUSR2 are held back, and run at the
    next unshielded step (first thing in it: at the start of ``fn``, what one
    raises is ``fn``'s) or when the plan ends. For the length of the outermost
    plan, and only then, those handlers are wrapped (``signal.getsignal``
    returns the wrapper; its ``__wrapped__`` is the handler; one ``fn``
    installs is wrapped after it); they are put back when it ends. Other
    threads never run Python signal handlers.

    What a handler raises inside ``fn`` (or at its start, or in a backoff) is
    an interruption after ``fn`` started: the layer gives the claim back
    touched, and the next delivery runs with ``ctx.recovered``. In the claim
    step, before ``fn``, the claim goes back clean. The gate installs no
    handler of its own: a signal left at its default disposition (``SIGTERM``)
    kills the process at once, like ``SIGKILL``.
    """

    __slots__ = (
        "closed", "depth", "holding", "installed", "lending", "lent", "main", "pending",
        "raised", "raised_at", "ran",
    )

    def __init__(self) -> None:
        self.ran = 0  # handlers run through the gate (each may install another)
        # (ran, what it raised) of the last handlers run through the gate that raised
        # (a few: a second one swallowed where it landed must not hide the first)
        # (forgotten when the outermost plan ends: a traceback is not kept)
        self.raised: list[tuple[int, BaseException]] = []
        # The count of the last handler that raised: kept past the plan, unlike
        # ``raised`` (no traceback held), for a connection given back later.
        self.raised_at = 0
        self.closed = False
        self.holding = False  # closed by hold(): a pool's bookkeeping in an open step
        # Connections a pool lent to redis-py's own paths with the gate held until
        # they are given back (durabilis._store._held.HeldPool.get_connection).
        self.lent: list[Any] = []
        self.lending = False  # in a plan's own open step (not fn's): pools lend (see lent)
        self.depth = 0  # plans running on the main thread (one inside another's fn)
        self.main = _main_thread().ident  # (the main thread's: set again by enter())
        self.pending: list[tuple[Any, int, Any]] = []
        self.installed: dict[int, HeldBack] = {}

    def enter(self) -> bool | None:
        """A plan starts: hold signals back. Returns what :meth:`leave` needs
        (``None`` off the main thread: nothing to do)."""
        if threading.current_thread() is not threading.main_thread():
            return None
        # (No call between closing and the try: a handler not wrapped yet that
        # raised there would leave the gate closed for good.)
        main = _get_ident()  # (a forked child's main thread is the one that forked)
        was, self.closed = self.closed, True  # first: a wrapper holds back at once
        self.main = main
        self.depth += 1
        try:
            self.wrap()
        except BaseException:  # a signal not wrapped yet, raising: as if never entered
            self._exit(was)
            raise
        return was

    def hold(self) -> bool:
        """Hold the handlers back for a moment inside an open step (the main
        thread, a plan running): while a connection pool takes or gives back a
        connection. Its locks, its queue and its count of connections are not
        safe against an exception raised between two bytecodes: a handler
        raising just after a lock's acquire left the queue's lock held, and
        every later caller stuck on it; one raising just after a connection
        was taken lost it for good. Returns whether it closed the gate (pass
        it to :meth:`unhold`)."""
        if self.closed or not self.installed or _get_ident() != self.main:
            return False
        self.closed = self.holding = True
        return True

    def unhold(self, held: bool, deliver: bool = True) -> None:
        """Open the gate :meth:`hold` closed; ``deliver``: the handlers held back
        meanwhile run now (raises what one raised)."""
        if held:
            self.holding = self.closed = False
            if deliver and self.pending:
                self.deliver()

    def ran_here(self) -> int | None:
        """How many handlers ran so far, on the main thread (``None`` on another:
        its handlers are none of that thread's business)."""
        return self.ran if _get_ident() == self.main else None

    def raised_since(self, since: int) -> bool:
        """Whether a handler run after the ``since``-th raised (the plan may have
        ended since: a redis-py object fn kept gives its connection back later)."""
        return self.raised_at > since

    def after_step(self, ran: int) -> None:
        """A plan's own open step returned (``ran``: the count when it began):
        the handlers held back as a pool took a connection back run now, and a
        handler's exception that code below caught interrupts the step all the
        same (:meth:`raise_swallowed`)."""
        if self.pending:
            self.deliver()
        if self.ran != ran:
            self.raise_swallowed(ran)

    def end_step(self, lending: bool) -> None:
        """An open step ended (the gate closed again): pools lend as before it
        (``lending``), and whatever one lent in it and never got back (a
        connection redis-py keeps, as a pub/sub's) holds the gate no more."""
        self.lending = lending
        if self.holding:
            self.holding = False
            self.lent.clear()

    def held_here(self) -> bool:
        """Whether :meth:`hold` holds the gate closed, and this is its thread."""
        return self.holding and _get_ident() == self.main

    def wrap(self) -> None:
        """Wrap the Python handlers (not SIG_DFL / SIG_IGN) not wrapped yet: at
        every plan's start and after every ``fn`` (or a handler that ran: either
        may install one)."""
        get = _C_SIGNAL.getsignal
        for signum in _GUARDED:
            handler = get(signum)
            # (SIG_DFL / SIG_IGN are ints: no Python handler to wrap)
            if type(handler) is not int and callable(handler) and not isinstance(
                handler, HeldBack
            ):
                wrapper = HeldBack(handler, self)
                # (noted first: one installed but not noted was never put back)
                self.installed[signum] = wrapper
                _C_SIGNAL.signal(signum, wrapper)

    def leave(self, was: bool | None) -> None:
        """The plan ended: back to how it was (the handlers too, after the
        outermost); open, the signals held back are handled now.

        Should that be cut short by a handler raising (one held back, or a
        signal landing there) with others still held, those go to Python's own
        signal machinery (:meth:`_hand_over_rest`): left in line, they waited
        for the next durable call of the process, which they then interrupted
        (or, after a plan run inside another's ``fn``, for that plan's next
        step)."""
        if was is None:
            return
        count = max(0, self.depth - 1)  # (the plans left running after this one)
        try:
            self._exit(was)
            self.deliver()
        except BaseException as exc:
            if self.depth != count or self.closed is not was:
                # (_exit cut short before it counted this plan out or reopened, by a
                # handler the gate does not hold: left so, closed for good; here,
                # not in _cut_short, whose entry a second such raise may skip)
                self.depth, self.closed = count, was
            try:
                self._cut_short(was, count)
            except Exception:
                if isinstance(exc, Exception):
                    raise
                # (an interruption cut the end short: it outranks a handler's error)
            raise

    def _cut_short(self, was: bool, count: int) -> None:
        """A plan's end cut short: the count and the gate put right, the handlers
        put back after the outermost plan, what is still held handed over."""
        self.depth, self.closed = count, was
        if self.closed:
            return  # (an outer plan holds the gate: what waits is its to deliver)
        try:
            if self.installed and self.depth == 0:
                self.uninstall()
        finally:
            # Inside an outer plan's fn too: left in line, they waited for that
            # plan's next step, fn running on meanwhile.
            if self.pending and _BLOCKS:
                self._hand_over_rest()

    def _hand_over_rest(self) -> None:
        """The signals still held back after a plan's end was cut short, raised
        again for Python to handle as it handles any: blocked on this thread
        meanwhile (the OS keeps them: one held twice comes once, and a wakeup
        fd gets a second byte for it), then unblocked, when Python runs their
        handlers (yours, put back after the outermost plan), each
        interruptible, one raising leaving the others for its next check."""
        mask = None
        raised: BaseException | None = None
        try:
            # The mask as it is first (blocking nothing): a handler raising as
            # the blocking call returns must not leave the signals blocked.
            # (A handler Python runs in either call, as it checks for signals
            # there: what it raises is raised after, the hand-over goes on.)
            for _ in range(4):
                try:
                    mask = _C_SIGNAL.pthread_sigmask(signal.SIG_BLOCK, ())
                    break
                except BaseException as exc:
                    raised = raised or exc
            # Only theirs (a handler Python runs meanwhile, for a signal another
            # thread took, runs with these blocked, and so would a child it
            # starts); tried again if a handler raised as it was asked for.
            for _ in range(4 if mask is not None else 0):
                try:
                    _C_SIGNAL.pthread_sigmask(signal.SIG_BLOCK, _signums(self.pending))
                    break
                except BaseException as exc:
                    raised = raised or exc
            raised = self._hand_over() or raised
        finally:
            if mask is not None:
                _C_SIGNAL.pthread_sigmask(signal.SIG_SETMASK, mask)
        if raised is not None:
            raise raised

    def _hand_over(self) -> BaseException | None:
        """Raise again, for the OS to keep (blocked here), each signal held back;
        returns what a handler Python ran meanwhile raised (one for a signal
        sent to the process, taken by another thread's C handler, still runs
        here). Each one leaves the line once it was raised, whatever came of it."""
        raised = None
        while self.pending:
            try:
                _C_SIGNAL.raise_signal(self.pending[0][1])
            except BaseException as exc:  # (a handler Python ran: raised after)
                raised = raised or exc
            finally:  # (raised once at most: not blocked, a raising handler ran each time)
                del self.pending[0]
        return raised

    def _exit(self, was: bool) -> None:
        # (Never below 0: a child forked inside fn starts at 0, see
        # after_fork_in_child, and leaves the plans it was forked in: its
        # outermost leave puts its handlers back.)
        self.depth = max(0, self.depth - 1)
        # Open (or as it was) before the handlers are put back: put back, a
        # handler of yours runs at once wherever it lands, and one raising
        # before the gate opened left it closed for good.
        self.closed = was
        if self.depth == 0:
            self.raised = []
            self.uninstall()

    def deliver(self) -> None:
        """Run the handlers held back (while open). Raises what one raised: an
        interruption (``KeyboardInterrupt``, ``SystemExit``) before an error."""
        first: BaseException | None = None
        while not self.closed and self.pending:
            handler, signum, frame = self.pending.pop(0)
            try:
                self.run(handler, signum, frame)
            except BaseException as exc:  # the others still run
                if first is None or (isinstance(first, Exception)
                                     and not isinstance(exc, Exception)):
                    first = exc
        if first is not None:
            raise first

    def run(self, handler: Callable[[int, Any], Any], signum: int, frame: Any) -> Any:
        """Run a handler through the gate (counted; what it raises remembered:
        the driver tells it from what a step made of it, see ``perform_open``)."""
        self.ran += 1
        mine = self.ran
        try:
            result = handler(signum, frame)
        except BaseException as exc:
            self.raised = [*self.raised[-(_REMEMBERED - 1):], (mine, exc)]
            self.raised_at = self.ran
            raise
        if self.raised and self.raised[-1][0] > mine:
            # What a handler run inside this one raised, this one caught (a
            # cleanup cut by its own alarm): no step's business.
            self.raised = [kept for kept in self.raised if kept[0] <= mine]
        return result

    def made_of(self, exc: BaseException, since: int) -> BaseException | None:
        """What a handler that raised (after the ``since``-th handler run: the
        count when the step or the store's call began) raised, when ``exc`` is
        it or was made of it (a link of its chain of causes and contexts:
        redis-py turns a ``TimeoutError`` raised in its socket read into its
        own); else ``None``."""
        mine = [raised for ran, raised in self.raised if ran > since]
        if not mine:
            return None
        seen: BaseException | None = exc
        for _ in range(8):  # (a few links deep)
            if seen is None:
                return None
            if any(seen is raised for raised in mine):
                return seen
            seen = seen.__cause__ or seen.__context__
        return None

    def swallowed(self, since: int) -> Exception | None:
        """The last ``Exception`` a handler run after the ``since``-th raised, on
        this thread (the main one: another's calls are none of its business):
        one that a step's code below may have caught (redis-py's Cluster client
        asks the next node for the slot map when one fails)."""
        if _get_ident() != self.main:
            return None
        for ran, raised in reversed(self.raised):
            if ran > since and isinstance(raised, Exception):
                return raised
        return None

    def raise_swallowed(self, since: int) -> None:
        """After an open step outside ``fn`` that returned: a handler's
        ``Exception`` that code below caught (redis-py's Cluster client asks
        the next node for the slot map when one fails) interrupts the step all
        the same, as if it had come out (:class:`HandlerRaised`)."""
        swallowed = self.swallowed(since)
        if swallowed is not None:
            raise HandlerRaised(swallowed)

    def handler_error(self, exc: Exception, ran: int, in_fn_step: bool) -> Exception | None:
        """What a signal handler raised that ``exc``, escaping an unshielded
        step that began at the ``ran``-th handler run, stands for (``None``:
        the step's own failure, or a bug below the plan):

        - a handler run during the step raised an ``Exception`` and ``exc`` is
          it, or was made of it (redis-py turns a ``TimeoutError`` raised in its
          socket read into its own, which the store maps to
          ``StorageUnavailable``): the handler's own exception;
        - else, in ``fn``'s step (``fn``'s own exceptions are its outcome,
          caught below it): only the step's bookkeeping around ``fn`` is left,
          where only a handler can raise (one ``fn`` installed itself
          included): ``exc``;
        - else a handler ran and ``exc`` is no ``DurabilisError`` (the step's
          own failure): ``exc``.
        """
        handler = self.made_of(exc, ran)
        if isinstance(handler, Exception):
            return handler
        if in_fn_step:
            return exc
        if self.ran != ran and not isinstance(exc, DurabilisError):
            return exc
        return None

    def raise_as(self, exc: Exception, ran: int, in_fn_step: bool) -> NoReturn:
        """``exc`` out of an open step (begun at the ``ran``-th handler run) as
        what it stands for (:meth:`handler_error`): a handler's
        (:class:`HandlerRaised`), or its own failure or a bug below the plan."""
        raised = self.handler_error(exc, ran, in_fn_step)
        if raised is None:
            raise exc
        raise HandlerRaised(raised) from None

    def uninstall(self) -> None:
        """Put the handlers back (not one replaced meanwhile: that one stays).
        One raising as they are put back (yours, or one wrapped, the gate open)
        does not stop the others going back: what it raised is raised after."""
        raised: BaseException | None = None
        while self.installed:
            signum, wrapper = next(iter(self.installed.items()))
            try:
                if _C_SIGNAL.getsignal(signum) is wrapper:
                    _C_SIGNAL.signal(signum, wrapper.__wrapped__)
                del self.installed[signum]
            except BaseException as exc:  # a handler put back raising: the rest go back too
                raised = raised or exc
        if raised is not None:
            raise raised

    def after_fork_in_child(self) -> None:
        """A fork from another thread while the main thread ran a plan: the
        child's only thread runs no plan."""
        self.closed = self.holding = self.lending = False
        self.depth = 0
        self.pending.clear()
        self.lent.clear()
        self.raised = []
        if threading.current_thread() is threading.main_thread():
            self.uninstall()


class HeldBack:
    """A signal handler that waits while the gate is closed."""

    __slots__ = ("__wrapped__", "_gate")

    def __init__(self, handler: Callable[[int, Any], Any], gate: SignalGate) -> None:
        self.__wrapped__ = handler
        self._gate = gate

    def __call__(self, signum: int, frame: Any) -> Any:
        if self._gate.closed:
            self._gate.pending.append((self.__wrapped__, signum, frame))
            return None
        return self._gate.run(self.__wrapped__, signum, frame)


class HandlerRaised(BaseException):
    """An ``Exception`` a signal handler raised during an unshielded step of the
    sync driver (a SIGALRM timeout's ``TimeoutError``), carried into the plan
    as an interruption: the plan compensates (a claim step's claim given back,
    a claim whose ``fn`` had started given back touched) and re-raises, and the
    driver raises ``error``, the handler's own exception, in its place.

    Without it such an exception would leave the driver as a bug below the plan
    does, nothing compensated: a claim written just before the handler ran
    (its reply being decoded) stayed in progress for its whole lease."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__(error)
        self.error: Exception = (
            error if error is not None else RuntimeError("a signal handler raised")
        )


GATE = SignalGate()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=GATE.after_fork_in_child)
