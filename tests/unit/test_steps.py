"""The step drivers' handling of interruptions around shielded steps."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Generator
from typing import Any

import pytest

from durabilis._steps import (
    _GATE,
    IO,
    Defer,
    Run,
    Sleep,
    Stepper,
    _shielded,
    async_shielded,
    perform_open,
)
from durabilis.errors import StorageUnavailable
from tests.support.interrupts import signal_as_it_starts


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

        waiter = asyncio.ensure_future(_shielded(run, IO([]), step()))  # type: ignore[arg-type]
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

        waiter = asyncio.ensure_future(_shielded(run, IO([]), step()))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0)
        assert not waiter.done()
        gate.set()
        return await waiter, run.deferred

    reply, deferred = asyncio.run(main())
    assert reply == "committed" and isinstance(deferred, asyncio.CancelledError)


def _sweep_the_step(
    step: object, *, the_plan_s_too: bool = False
) -> tuple[object, BaseException | None]:
    """The step's own task is cancelled (a sweep of every task but the caller;
    ``the_plan_s_too``: the task that drives the plan as well)."""

    async def main() -> tuple[object, BaseException | None]:
        run = _Run()
        me = asyncio.current_task()

        async def work() -> str:
            await asyncio.sleep(10)
            return "committed"

        waiter = asyncio.ensure_future(_shielded(run, step, work()))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        for task in asyncio.all_tasks():
            if task is not me and (the_plan_s_too or task is not waiter):
                task.cancel()
        try:
            reply: object = await waiter
        except BaseException as exc:  # what the plan would be thrown
            reply = exc
        return reply, run.deferred

    return asyncio.run(main())


def test_a_shielded_io_step_whose_own_task_is_cancelled_fails_like_a_lost_reply() -> None:
    reply, deferred = _sweep_the_step(IO([]))
    assert isinstance(reply, StorageUnavailable)  # its fate unknown: the plan resends it
    _nothing_to_deliver(deferred)


def _nothing_to_deliver(deferred: BaseException | None) -> None:
    assert deferred is None  # the plan's own task was not cancelled: nothing to deliver


def test_a_shielded_sleep_whose_own_task_is_cancelled_counts_as_slept() -> None:
    reply, deferred = _sweep_the_step(Sleep(10, shield=True))
    assert reply is None
    _nothing_to_deliver(deferred)


def test_a_coroutine_of_fn_whose_task_is_cancelled_was_interrupted() -> None:
    reply, _ = _sweep_the_step(Run(print, None))
    assert isinstance(reply, asyncio.CancelledError)  # the plan gives the claim back


def test_a_sweep_of_both_tasks_delivers_the_plan_s_cancellation_after_the_step() -> None:
    reply, deferred = _sweep_the_step(IO([]), the_plan_s_too=True)
    assert isinstance(reply, StorageUnavailable)
    assert isinstance(deferred, asyncio.CancelledError)


def test_a_cancellation_deferred_by_a_record_waits_until_its_outcome_is_handed_over() -> None:
    """Cancelled while the record was out (deferred), the record then failed:
    the plan hands the outcome to the keep-alive (Defer) before the
    cancellation is thrown into it, else the outcome of fn would be lost."""
    seen: list[str] = []

    def plan() -> Generator[Any, Any, str]:
        try:
            yield IO([], shield=True)  # the record
        except StorageUnavailable:
            seen.append("record failed")
        yield Defer("k", "nonce", "member", [], None, 1.0)
        seen.append("handed over")
        try:
            yield IO([])  # the next unshielded step
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "unreached"

    run = Stepper(plan(), async_shielded)
    run.defer(asyncio.CancelledError())
    run.throw(StorageUnavailable("the record's reply was lost"))
    assert type(run.step) is Defer
    with pytest.raises(asyncio.CancelledError):
        run.send(None)
    assert seen == ["record failed", "handed over", "cancelled"]


def _failing_after_a_shielded_step(error: BaseException) -> Generator[Any, Any, str]:
    yield IO([], shield=True)  # e.g. parking the failed operation
    raise error


def test_a_deferred_cancellation_wins_over_the_error_the_plan_ends_with() -> None:
    """Cancelled while a failed operation was parked: the task ends cancelled
    (as a TaskGroup or a timeout expects), the operation's error its cause."""
    failure = ValueError("fn failed")
    run = Stepper(_failing_after_a_shielded_step(failure), async_shielded)
    cancel = asyncio.CancelledError()
    run.defer(cancel)
    with pytest.raises(asyncio.CancelledError) as raised:
        run.send("parked")
    assert raised.value is cancel and raised.value.__cause__ is failure
    assert run.done and run.deferred is None


def test_an_interruption_the_plan_ends_with_is_not_replaced() -> None:
    """A plan that ends interrupted itself (fn's KeyboardInterrupt) keeps it."""
    interrupted = KeyboardInterrupt()
    run = Stepper(_failing_after_a_shielded_step(interrupted), async_shielded)
    run.defer(asyncio.CancelledError())
    with pytest.raises(KeyboardInterrupt) as raised:
        run.send("parked")
    assert raised.value is interrupted


def _held_back(step: object, *handlers: Any) -> tuple[object, bool]:
    """Signals held back in the plan's own code, handled as ``step`` starts."""
    _GATE.closed = True
    _GATE.pending.extend((handler, signal.SIGALRM, None) for handler in handlers)
    try:
        try:
            reply: object = perform_open(None, step, None, [])  # type: ignore[arg-type]
        except BaseException as exc:  # what the driver would throw into the plan
            reply = exc
        return reply, _GATE.closed
    finally:
        _GATE.closed = False
        _GATE.pending.clear()
        _GATE.uninstall()  # (what the outermost plan's end does)


def test_a_held_back_handler_s_exception_at_the_start_of_fn_is_fn_s() -> None:
    calls: list[object] = []

    def alarm(signum: int, frame: Any) -> None:
        raise TimeoutError("alarm")

    (ok, error), closed_again = _held_back(Run(calls.append, 1), alarm)  # type: ignore[misc]
    assert not ok and isinstance(error, TimeoutError)  # fn's failure: the plan decides
    assert calls == []  # fn did not start
    assert closed_again


def test_a_held_back_interrupt_before_a_step_leaves_the_gate_closed_for_the_plan() -> None:
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    reply, closed_again = _held_back(IO([]), interrupt)
    assert isinstance(reply, KeyboardInterrupt)  # before the step was sent
    assert closed_again  # the plan's compensation runs with signals held back again


def test_an_interruption_held_back_with_an_error_is_the_one_raised() -> None:
    """A timeout's error and a SIGTERM handler's SystemExit both held back: the
    interruption is raised (not dropped for the error fn would have got)."""
    ran: list[str] = []

    def alarm(signum: int, frame: Any) -> None:
        ran.append("alarm")
        raise TimeoutError("alarm")

    def exit_now(signum: int, frame: Any) -> None:
        ran.append("exit")
        raise SystemExit(0)

    reply, _ = _held_back(Run(ran.append, "fn"), alarm, exit_now)
    assert isinstance(reply, SystemExit)
    assert ran == ["alarm", "exit"]  # both handlers ran; fn did not start


class _SignalsThatRaise:
    """The C signal module, but ``signal()`` raises ``KeyboardInterrupt`` on its
    ``nth`` call: Ctrl-C landing while the gate puts a handler in or back."""

    def __init__(self, nth: int, after: bool = False) -> None:
        self.calls, self.nth, self.after = 0, nth, after
        self.handlers: dict[int, Any] = {  # two Python handlers; the others SIG_DFL
            signal.SIGINT: signal.default_int_handler,
            signal.SIGTERM: lambda signum, frame: None,
        }

    def getsignal(self, signum: int) -> Any:
        return self.handlers.get(signum)

    def signal(self, signum: int, handler: Any) -> None:
        """``after``: the Ctrl-C lands as the call returns (the handler set)."""
        self.calls += 1
        if self.calls == self.nth and not self.after:
            raise KeyboardInterrupt
        self.handlers[signum] = handler
        if self.calls == self.nth:
            raise KeyboardInterrupt


def test_an_interrupt_while_the_handlers_are_wrapped_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _SignalsThatRaise(nth=2)  # SIGINT's wrapped, then SIGTERM's raises
    monkeypatch.setattr("durabilis._signal_gate._C_SIGNAL", fake)
    with pytest.raises(KeyboardInterrupt):
        _GATE.enter()
    assert (_GATE.depth, _GATE.closed, _GATE.installed) == (0, False, {})
    assert fake.handlers[signal.SIGINT] is signal.default_int_handler  # put back


def test_an_interrupt_as_a_handler_is_wrapped_leaves_no_wrapper_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C landing just as a wrapper is set (the signal module's call
    returned): that wrapper is put back too (noted before it was set; noted
    after, it stayed for good, holding its handler's signals)."""
    fake = _SignalsThatRaise(nth=2, after=True)  # SIGTERM's wrapper set, then the raise
    monkeypatch.setattr("durabilis._signal_gate._C_SIGNAL", fake)
    with pytest.raises(KeyboardInterrupt):
        _GATE.enter()
    assert (_GATE.depth, _GATE.closed, _GATE.installed) == (0, False, {})
    assert not any(type(h).__name__ == "HeldBack" for h in fake.handlers.values())


def test_an_interrupt_while_the_handlers_are_put_back_leaves_the_gate_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _SignalsThatRaise(nth=3)  # both wrapped; the first put back raises
    monkeypatch.setattr("durabilis._signal_gate._C_SIGNAL", fake)
    entered = _GATE.enter()
    with pytest.raises(KeyboardInterrupt):
        _GATE.leave(entered)
    assert not _GATE.closed and _GATE.depth == 0
    _GATE.leave(_GATE.enter())  # the next plan's end puts the rest back
    assert _GATE.installed == {}
    assert fake.handlers[signal.SIGINT] is signal.default_int_handler
    assert not any(callable(h) and type(h).__name__ == "_HeldBack"
                   for h in fake.handlers.values())


def test_the_gate_tells_each_of_the_last_handlers_exceptions_from_the_step_s_own() -> None:
    """What the store and the driver ask of the gate: whether an error is, or
    was made of, what a handler raised since a step (or a store's call) began.
    A second handler's exception (one swallowed where it landed: redis-py's
    disconnect drops an OSError) must not hide the first's; one raised before
    the step began is not the step's."""
    from durabilis._signal_gate import SignalGate

    gate = SignalGate()
    before = TimeoutError("an earlier step's deadline")
    first, second = TimeoutError("the deadline"), OSError("a second alarm")

    def raising(error: BaseException) -> Any:
        def handler(signum: int, frame: Any) -> None:
            raise error
        return handler

    with pytest.raises(TimeoutError):
        gate.run(raising(before), signal.SIGALRM, None)
    since = gate.ran  # the step begins
    for error in (first, second):
        with pytest.raises(type(error)):
            gate.run(raising(error), signal.SIGALRM, None)
    try:  # what redis-py and the store make of the first
        try:
            raise first
        except TimeoutError as inner:
            raise ConnectionError("Timeout reading from socket") from inner
    except ConnectionError as made:
        mapped = StorageUnavailable("Redis unavailable")
        mapped.__cause__ = made
    assert gate.made_of(mapped, since) is first
    assert gate.made_of(mapped, gate.ran) is None  # (a later step's own failure)
    assert gate.made_of(StorageUnavailable("its own"), since) is None
    stale = StorageUnavailable("made in the except block of an earlier deadline")
    stale.__context__ = before
    assert gate.made_of(stale, since) is None


class _SecondSignal(BaseException):
    """What the test's second signal handler raises (as a Ctrl-C would)."""


def _leave_with_a_signal_at(was: Any, code: Any, signum: int) -> None:
    """A plan's end (``leave(was)``) with ``signum`` raised as ``code`` starts:
    what its handler raises (the test's) comes out."""
    with pytest.raises(_SecondSignal), signal_as_it_starts(code, signum) as armed:
        _GATE.leave(was)
    _ = [0]  # (a signal handed to Python runs by this line at the latest)
    assert not armed[0]  # (it landed there)


def _reset_gate() -> None:
    """The gate as no plan left it (after a test whose plan's end failed)."""
    _GATE.closed, _GATE.depth = False, 0
    _GATE.pending.clear()
    _GATE.uninstall()


def _gate_after(ran: list[str]) -> dict[str, Any]:
    """The gate's state once a plan ended (and whose handlers are installed)."""
    return {
        "pending": list(_GATE.pending), "closed": _GATE.closed, "depth": _GATE.depth,
        "installed": dict(_GATE.installed),
        "usr1": signal.getsignal(signal.SIGUSR1), "usr2": signal.getsignal(signal.SIGUSR2),
        "ran": list(ran),
        "blocked": signal.pthread_sigmask(signal.SIG_BLOCK, ()) & {signal.SIGUSR1, signal.SIGUSR2},
    }


def _end_with_a_signal_at_line(
    nth: int, usr1: Any, usr2: Any, ran: list[str], landing: int = signal.SIGUSR2,
) -> tuple[dict[str, Any], bool, BaseException | None]:
    """A plan's end on the main thread with SIGUSR1 held back, and SIGUSR2
    landing at the ``nth`` line the gate runs as the plan ends. Returns the
    gate's state after, whether SIGUSR2 was raised (``nth`` within the end),
    and what came out of the end (or of the next line: a signal Python runs
    at its next check)."""
    gate_file = _GATE.leave.__code__.co_filename
    lines = [0]

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != gate_file:
            return None
        if event == "line":
            lines[0] += 1
            if lines[0] == nth:
                sys.settrace(None)
                frame.f_trace = None
                signal.raise_signal(landing)
        return tracer

    previous = [signal.signal(signal.SIGUSR1, usr1), signal.signal(signal.SIGUSR2, usr2)]
    winch = signal.signal(signal.SIGWINCH, usr2 if landing == signal.SIGWINCH else signal.SIG_DFL)
    came_out: BaseException | None = None
    try:
        entered = _GATE.enter()
        assert entered is False
        signal.raise_signal(signal.SIGUSR1)  # (the plan's own code: held back)
        assert ran == [] and len(_GATE.pending) == 1
        sys.settrace(tracer)
        try:
            try:
                _GATE.leave(entered)
            finally:
                sys.settrace(None)
            _ = [0]  # (a signal handed to Python runs by this line at the latest)
        except BaseException as exc:
            came_out = exc
        return _gate_after(ran), lines[0] >= nth, came_out
    finally:
        _reset_gate()  # (what a failed end left behind, gone for the next landing)
        signal.signal(signal.SIGUSR1, previous[0])
        signal.signal(signal.SIGUSR2, previous[1])
        signal.signal(signal.SIGWINCH, winch)


def _noting(ran: list[str], reinstalls: bool) -> tuple[Any, Any, Any]:
    """SIGUSR1's handler (noted; ``reinstalls``: it installs a fresh raising
    handler for SIGUSR2, as "Ctrl-C again to force quit" does), SIGUSR2's
    (noted, raising), and SIGUSR2's handler once SIGUSR1's ran."""

    def usr2(signum: int, frame: Any) -> None:
        ran.append("usr2")
        raise _SecondSignal

    def fresh(signum: int, frame: Any) -> None:
        ran.append("usr2")
        raise _SecondSignal

    def usr1(signum: int, frame: Any) -> None:
        ran.append("usr1")
        if reinstalls:
            signal.signal(signal.SIGUSR2, fresh)

    return usr1, usr2, fresh if reinstalls else usr2


@pytest.mark.parametrize("reinstalls", [False, True])
def test_a_signal_landing_anywhere_in_a_plan_s_end_leaves_none_held_back(
    reinstalls: bool,
) -> None:
    """The handlers held back in a plan are done with at its end even when
    another signal's handler raises there, wherever it lands: one left in line
    ran at the start of a later, unrelated plan (a Ctrl-C held back
    interrupting it). The gate ends open, counted out, the user's handlers put
    back (a gate left closed held every later signal until a durable call).
    Each line the gate runs at the end is tried in turn: the held one runs
    there, once, but where the second one lands between taking it from the
    line and calling it (a few bytecodes, as before this test)."""
    nth = lost = 0
    while True:
        nth += 1
        assert nth < 500, "the plan's end never ended"
        ran: list[str] = []
        usr1, usr2, then = _noting(ran, reinstalls)
        after, landed, came_out = _end_with_a_signal_at_line(nth, usr1, usr2, ran)
        if not landed:
            break  # past the end: every line was tried
        assert after["ran"].count("usr1") <= 1, (nth, after)  # never twice
        lost += after["ran"].count("usr1") == 0
        assert after["ran"].count("usr2") == 1 and isinstance(came_out, _SecondSignal), (nth, after)
        assert (after["pending"], after["closed"], after["depth"], after["installed"]) == (
            [], False, 0, {}), (nth, after)
        installed_by_usr1 = then if "usr1" in after["ran"] else usr2
        assert after["usr1"] is usr1 and after["usr2"] is installed_by_usr1, (nth, after)
        assert not after["blocked"], (nth, after)  # (the main thread's mask as it was)
    assert nth > 10  # (the end has that many lines: the loop tried them)
    assert lost <= 8, lost  # (the lines between taking the handler and calling it)


def test_a_held_back_handler_runs_at_a_plan_s_end_as_any_handler_does() -> None:
    """Run at the plan's end, a handler held back is interrupted by another
    signal as any handler is (its own alarm cutting a slow cleanup, a second
    Ctrl-C): not held back in turn while it runs."""
    ran: list[str] = []

    def usr2(signum: int, frame: Any) -> None:
        ran.append("usr2")
        raise _SecondSignal

    def usr1(signum: int, frame: Any) -> None:
        ran.append("usr1")
        signal.raise_signal(signal.SIGUSR2)  # interrupts this handler here
        ran.append("usr1 went on")

    after, landed, came_out = _end_with_a_signal_at_line(10_000, usr1, usr2, ran)
    assert not landed
    assert after["ran"] == ["usr1", "usr2"] and isinstance(came_out, _SecondSignal), after
    assert (after["pending"], after["closed"], after["depth"], after["installed"]) == (
        [], False, 0, {}), after


def test_an_exception_a_handler_caught_from_another_does_not_interrupt_the_step() -> None:
    """A handler held back (a SIGTERM cleanup) catching what another raised in
    it (its own alarm's TimeoutError) leaves the step it ran at alone: that
    exception was nobody's but the handler's."""
    ran: list[str] = []

    def alarm(signum: int, frame: Any) -> None:
        raise TimeoutError("the cleanup's own deadline")

    def cleanup(signum: int, frame: Any) -> None:
        try:
            signal.raise_signal(signal.SIGUSR2)
        except TimeoutError:
            ran.append("cut by its alarm")

    previous = [signal.signal(signal.SIGUSR1, cleanup), signal.signal(signal.SIGUSR2, alarm)]
    try:
        entered = _GATE.enter()
        try:
            signal.raise_signal(signal.SIGUSR1)  # (the plan's own code: held back)
            reply = perform_open(None, Sleep(0), None, [])  # type: ignore[arg-type]
        finally:
            _GATE.leave(entered)
    finally:
        signal.signal(signal.SIGUSR1, previous[0])
        signal.signal(signal.SIGUSR2, previous[1])
    assert reply is None and ran == ["cut by its alarm"]


def test_a_handler_the_gate_does_not_hold_raising_as_a_plan_is_counted_out() -> None:
    """A handler the gate never holds (SIGWINCH's, a CPU limit's) raising as
    the plan's end begins to count it out (``_exit``'s first line) leaves the
    gate open and counted out, the handlers put back, and what it held run
    (cut short there, the gate stayed closed for good: every later signal
    held until a durable call; the third review of 2026-12-06, F2)."""
    ran: list[str] = []
    usr1, _, _ = _noting(ran, reinstalls=False)

    def winch(signum: int, frame: Any) -> None:
        ran.append("winch")
        raise _SecondSignal

    previous = [signal.signal(signal.SIGUSR1, usr1), signal.signal(signal.SIGWINCH, winch)]
    try:
        entered = _GATE.enter()
        signal.raise_signal(signal.SIGUSR1)  # (held back)
        _leave_with_a_signal_at(entered, type(_GATE)._exit.__code__, signal.SIGWINCH)
        after = _gate_after(ran)
    finally:
        _reset_gate()
        signal.signal(signal.SIGUSR1, previous[0])
        signal.signal(signal.SIGWINCH, previous[1])
    assert (after["pending"], after["closed"], after["depth"], after["installed"]) == (
        [], False, 0, {}), after
    assert after["ran"] == ["winch", "usr1"] and after["usr1"] is usr1, after


def test_a_plan_inside_fn_whose_end_is_cut_short_leaves_nothing_held_for_fn() -> None:
    """A plan run inside another's ``fn``, its end cut short by a raising
    signal with others held: those run then, not when the outer plan takes its
    next step (``fn`` running on meanwhile, a SIGTERM's exit waiting on it: the
    third review of 2026-12-06, F5)."""
    ran: list[str] = []
    usr1, usr2, _ = _noting(ran, reinstalls=False)
    previous = [signal.signal(signal.SIGUSR1, usr1), signal.signal(signal.SIGUSR2, usr2)]
    outer = _GATE.enter()
    try:
        _GATE.closed = False  # (the outer plan's fn runs: the gate open, as perform_open leaves it)
        inner = _GATE.enter()
        signal.raise_signal(signal.SIGUSR1)  # (held back by the inner plan)
        _leave_with_a_signal_at(inner, type(_GATE).deliver.__code__, signal.SIGUSR2)
        in_fn = (list(ran), list(_GATE.pending), _GATE.closed, _GATE.depth)
        _GATE.closed = True  # (fn returned: the outer plan's own code)
    finally:
        _GATE.leave(outer)
        signal.signal(signal.SIGUSR1, previous[0])
        signal.signal(signal.SIGUSR2, previous[1])
    assert in_fn == (["usr2", "usr1"], [], False, 1), in_fn


def test_a_second_deadline_as_the_first_is_told_apart_is_still_a_handler_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two deadlines (a SIGALRM handler raising TimeoutError) in one open step:
    the first cuts the step, the second lands as the first is told apart from
    a bug below the plan (the gate still open). Both are the handler's: the
    plan compensates (a claim given back). Left as it came out, the second
    went out as such a bug, nothing undone: the claim stayed in progress for
    its lease (the third review of 2026-12-06, F0)."""
    from durabilis import _steps
    from durabilis._signal_gate import HandlerRaised

    def alarm(signum: int, frame: Any) -> None:
        raise TimeoutError("deadline")

    def cut(store: Any, step: Any, leases: Any, held: Any) -> None:
        signal.raise_signal(signal.SIGALRM)  # the first deadline, as the step's reply is read

    previous = signal.signal(signal.SIGALRM, alarm)
    monkeypatch.setattr(_steps, "perform", cut)
    entered = _GATE.enter()
    try:
        with pytest.raises(HandlerRaised) as raised, signal_as_it_starts(
            HandlerRaised.__init__.__code__, signal.SIGALRM
        ) as armed:
            perform_open(None, IO([]), None, [])  # type: ignore[arg-type]
        assert not armed[0]  # (the second one landed there)
        assert isinstance(raised.value.error, TimeoutError)
    finally:
        _GATE.leave(entered)
        signal.signal(signal.SIGALRM, previous)


def test_a_hand_over_not_blocked_raises_each_held_signal_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Should the hand-over's blocking be skipped (a handler raising as it was
    asked for), each held signal is still raised once: its handler runs there
    and then, and one that always raises (Ctrl-C's default handler, a
    SIGTERM's exit) does not make it raise that one for ever, the process
    spinning (the fourth review of 2026-12-06, N2)."""
    from durabilis import _signal_gate

    real = _signal_gate._C_SIGNAL

    class _Counted:
        """The C signal module, counting ``raise_signal`` (a loop fails, not hangs)."""

        def __init__(self) -> None:
            self.raised = 0

        def raise_signal(self, signum: int) -> None:
            self.raised += 1
            if self.raised > 50:
                raise RuntimeError("raised again and again")
            signal.raise_signal(signum)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    def blocking_refused(pending: Any) -> set[int]:
        raise KeyboardInterrupt  # (a handler raising as the set was made)

    counted = _Counted()
    ran: list[str] = []
    _, usr2, _ = _noting(ran, reinstalls=False)
    previous = signal.signal(signal.SIGUSR2, usr2)
    monkeypatch.setattr(_signal_gate, "_C_SIGNAL", counted)
    monkeypatch.setattr(_signal_gate, "_signums", blocking_refused)
    try:
        _GATE.pending.append((usr2, signal.SIGUSR2, None))
        with pytest.raises((_SecondSignal, KeyboardInterrupt)):
            _GATE._hand_over_rest()
    finally:
        _reset_gate()
        signal.signal(signal.SIGUSR2, previous)
    assert (counted.raised, ran, _GATE.pending) == (1, ["usr2"], [])
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, ()) & {signal.SIGUSR2}


def test_two_handlers_the_gate_does_not_hold_raising_as_a_plan_s_end_is_put_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two raises by a handler the gate never holds: one at ``_exit``'s first
    line, one as the cut-short end is being put right (at ``_cut_short``'s
    entry, before any of its code: stood for by a ``_cut_short`` that raises
    at once): the gate still ends open and counted out (the fifth review of
    2026-12-06, R1: closed for good)."""
    ran: list[str] = []

    def winch(signum: int, frame: Any) -> None:
        ran.append("winch")
        raise _SecondSignal

    def cut_short_at_entry(self: Any, was: bool, count: int) -> None:
        winch(signal.SIGWINCH, None)

    monkeypatch.setattr(type(_GATE), "_cut_short", cut_short_at_entry)
    previous = signal.signal(signal.SIGWINCH, winch)
    try:
        entered = _GATE.enter()
        with pytest.raises(_SecondSignal), signal_as_it_starts(
            type(_GATE)._exit.__code__, signal.SIGWINCH
        ) as armed:
            _GATE.leave(entered)
        state = (_GATE.closed, _GATE.depth, ran, armed[0])
    finally:
        monkeypatch.undo()
        _reset_gate()
        signal.signal(signal.SIGWINCH, previous)
    assert state == (False, 0, ["winch", "winch"], False), state
