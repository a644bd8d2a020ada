"""One step vocabulary for every plan, and one driver per mode.

A *plan* is a generator that never does I/O itself: it yields steps and is
sent their replies. The layer's execute, replay and recovery, the DLQ's
replays and the checkpoint task runs are all plans, driven by:

- :func:`drive` (sync), :func:`adrive` (asyncio): the same loop, with and
  without ``await``;
- the deterministic fault simulator of the test suite, which steps many plans
  at once and injects a fault at every step boundary.

Steps and what the plan is sent back:

========================  =====================================================
``IO(calls, gates)``      :class:`~durabilis._scripts.Replies` (one step; see
                          ``Store.run_step``)
``ScriptCall``            its one reply (shorthand for a single script)
``Batch(calls)``          the list of their replies (independent calls at once:
                          ``Store.run_many``; the first failure is raised)
``Command(args)``         the reply of a plain read command
``Run(fn, arg)``          ``(True, value)`` or ``(False, exception)``
``Sleep(seconds)``        ``None``
``Hold(key, nonce, m)``   ``None``; the claim's lease is renewed until the plan ends
``Defer(...)``            ``None``; the keep-alive goes on sending an unrecorded
                          outcome after the plan ended
========================  =====================================================

A step that fails with a :class:`~durabilis.DurabilisError` is thrown into the
plan (``exc.partial`` tells which calls of an IO step ran), so the plan can
compensate. So are interruptions: ``asyncio.CancelledError`` (async) and
``KeyboardInterrupt``/``SystemExit``. A *shielded* step (``IO(shield=True)``,
``Sleep(shield=True)``, and an async driver's plain function running in a
thread) is never interrupted: a cancellation that arrives meanwhile is
delivered at the next step boundary (or when the plan ends), after the step's
reply was handed to the plan.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from durabilis._cancel import HeldThrough
from durabilis._cancel import cancel_requested as _cancel_requested
from durabilis._cancel import cancels as _cancels
from durabilis._fork import reset_in_child
from durabilis._retry_core import TESTING
from durabilis._scripts import ScriptCall
from durabilis._signal_gate import GATE, HandlerRaised
from durabilis.core.steps import IO as IO  # noqa: PLC0414  (the vocabulary is the core's)
from durabilis.core.steps import MAX_SLEEP_SECONDS as MAX_SLEEP_SECONDS  # noqa: PLC0414
from durabilis.core.steps import Batch as Batch  # noqa: PLC0414
from durabilis.core.steps import Command as Command  # noqa: PLC0414
from durabilis.core.steps import Defer as Defer  # noqa: PLC0414
from durabilis.core.steps import Hold as Hold  # noqa: PLC0414
from durabilis.core.steps import Plan as Plan  # noqa: PLC0414
from durabilis.core.steps import Run as Run  # noqa: PLC0414
from durabilis.core.steps import Sleep as Sleep  # noqa: PLC0414
from durabilis.core.steps import is_async_callable as is_async_callable  # noqa: PLC0414
from durabilis.core.steps import shielded as shielded  # noqa: PLC0414
from durabilis.errors import CorruptData, DurabilisError, StorageUnavailable

if TYPE_CHECKING:
    from durabilis._store import AsyncStore, Store

T = TypeVar("T")

INTERRUPTS: tuple[type[BaseException], ...] = (
    asyncio.CancelledError,
    KeyboardInterrupt,
    SystemExit,
    HandlerRaised,
)
"""What a plan treats as "stop now": compensate (shielded), then re-raise.

``GeneratorExit`` is deliberately absent: an abandoned plan (its process died,
in the simulator) must not run anything more.
"""


CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "durabilis_current_operation", default=None
)
"""The context of the durable operation running now (``current_operation()``)."""


# --- leases held by a process -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deferred:
    """An outcome waiting in a process's keep-alive (see :class:`Defer`)."""

    step: Defer
    until: float  # monotonic
    item: tuple[str, str, str]


class LeaseBook:
    """The claims a process holds now, and the outcomes it still has to record,
    for its keep-alive.

    A forked child starts with an empty book (:mod:`durabilis._fork`): the
    claims and deferred outcomes copied from the parent are the parent's, and
    a child's keep-alive never renews or sends them (a parent that dies has
    its claims age out and recovered, whatever its children do).

    Args:
        on_hold: Called when a claim is held (starts the keep-alive if needed).
    """

    def __init__(self, on_hold: Callable[[], None] | None = None) -> None:
        self._held: dict[tuple[str, str, str], int] = {}
        self._deferred: list[Deferred] = []
        self._lock = threading.Lock()
        self._on_hold = on_hold
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """The parent's claims and outcomes are not the child's (a fresh lock too:
        the parent's keep-alive may have held it at fork)."""
        self._lock = threading.Lock()
        self._held = {}
        self._deferred = []

    def hold(self, step: Hold | Defer) -> tuple[str, str, str]:
        item = (step.key, step.nonce, step.member)
        with self._lock:
            self._held[item] = self._held.get(item, 0) + 1
        if self._on_hold is not None:
            self._on_hold()
        return item

    def drop(self, item: tuple[str, str, str]) -> None:
        with self._lock:
            left = self._held.get(item, 0) - 1
            if left > 0:
                self._held[item] = left
            else:
                self._held.pop(item, None)

    def defer(self, step: Defer) -> None:
        """Keep the claim and send ``step.calls`` from the keep-alive until they land."""
        item = self.hold(step)
        with self._lock:
            self._deferred.append(Deferred(step, time.monotonic() + step.seconds, item))

    def deferred(self) -> list[Deferred]:
        with self._lock:
            return list(self._deferred)

    def rest(self, deferred: Deferred, done: int) -> Deferred:
        """The first ``done`` calls of a deferred outcome landed: it is the rest of
        its calls from now on (its gates renumbered; its time and claim kept; a
        guard that landed without its call stays in front of it).
        Returns what stands for it now (``deferred`` itself if nothing changed,
        or it is not waiting any more)."""
        step = deferred.step
        if done <= 0 or (step.guarded and done == 1):  # (a guard goes with its call)
            return deferred
        gates = None if step.gates is None else {
            i - done: gate for i, gate in step.gates.items() if i >= done
        }
        rest = Deferred(
            Defer(step.key, step.nonce, step.member, list(step.calls[done:]), gates,
                  step.seconds),
            deferred.until, deferred.item,
        )
        with self._lock:
            for i, waiting in enumerate(self._deferred):
                if waiting is deferred:
                    self._deferred[i] = rest
                    return rest
        return deferred

    def settle(self, deferred: Deferred) -> None:
        """The deferred outcome landed (or its time ran out): forget it."""
        with self._lock:
            if deferred not in self._deferred:
                return
            self._deferred.remove(deferred)
        self.drop(deferred.item)

    def busy(self) -> bool:
        """Claims held or outcomes deferred: the keep-alive has work."""
        with self._lock:
            return bool(self._held or self._deferred)

    def held(self) -> list[tuple[str, str, str]]:
        with self._lock:
            return list(self._held)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


# --- the sync driver ----------------------------------------------------------------


def _command(store: Store | AsyncStore, step: Command) -> Any:
    return store.command(*step.args)


def _rekey(exc: DurabilisError, step: Any) -> DurabilisError:
    # Plain commands are mapped without knowing their key ("?"): name it.
    if isinstance(exc, CorruptData) and exc.key == "?" and isinstance(step, Command):
        return CorruptData(step.key, "a key holds a value of the wrong type")
    return exc


def _call(step: Run) -> tuple[bool, Any]:
    reset = CURRENT.set(step.context)
    try:
        return True, step.fn(step.arg)
    except Exception as exc:  # the user's failure is data for the plan
        return False, exc
    finally:
        CURRENT.reset(reset)


def _book(step: Any, leases: LeaseBook | None, held: list[Any]) -> None:
    """The last steps of :func:`perform` and :func:`aperform`: ``Hold`` and
    ``Defer`` go to the lease book (no I/O); anything else is no step."""
    kind = type(step)
    if kind is Hold:
        if leases is not None:
            held.append(leases.hold(step))
        return
    if kind is Defer:
        if leases is not None:
            leases.defer(step)
        return
    raise TypeError(f"unknown plan step {step!r}")


def perform(store: Store, step: Any, leases: LeaseBook | None, held: list[Any]) -> Any:
    """Do one step synchronously (raises what the step raised)."""
    kind = type(step)
    if kind is IO:
        return store.run_step(step.calls, step.gates, step.waves)
    if kind is ScriptCall:
        return store.run(step)
    if kind is Batch:
        return store.run_many(step.calls)
    if kind is Run:
        return _call(step)
    if kind is Command:
        return _command(store, step)
    if kind is Sleep:
        if not TESTING.instant and step.seconds > 0:
            time.sleep(min(step.seconds, MAX_SLEEP_SECONDS))
        return None
    return _book(step, leases, held)


class Stepper:
    """Advances a plan one step at a time: the part every driver shares.

    ``step`` is the step to perform next; hand its outcome back with
    :meth:`send` (its reply) or :meth:`throw` (its error, or an interruption).
    A cancellation that arrives during a shielded step is :meth:`defer`-red:
    it is thrown into the plan at the next unshielded step, or raised when
    the plan ends (in place of the plan's error, if it raises one: that
    error is the interruption's ``__cause__``). When ``done``, ``value`` is
    what the plan returned; an error the plan raises propagates out of
    :meth:`send` / :meth:`throw`.

    ``step``: the plan was started already, and this is the step it yielded.
    ``deferred``: an interruption that came before the plan started (during a
    shielded step of the code that hands over to it), delivered as above.
    """

    __slots__ = ("_plan", "_shielded", "deferred", "done", "step", "value")

    def __init__(
        self, plan: Plan[Any], shielded: Callable[[Any], bool] = shielded, *,
        step: Any = None, deferred: BaseException | None = None,
    ) -> None:
        self._plan = plan
        self._shielded = shielded
        self.deferred = deferred
        self.done = False
        self.step: Any = step
        self.value: Any = None
        if step is None:
            self._advance(None, None)

    def _advance(self, send: Any, error: BaseException | None) -> None:
        while True:
            try:
                step = self._plan.send(send) if error is None else self._plan.throw(error)
            except StopIteration as stop:
                self.done, self.step = True, None
                if self.deferred is not None:
                    deferred, self.deferred = self.deferred, None
                    raise deferred from None
                self.value = stop.value
                return
            except Exception as exc:
                # The plan ended with an error (the operation failed, parked,
                # lost its claim...) while an interruption waited: the
                # interruption wins, as it would have without the shield (a
                # cancelled task ends cancelled), the error as its cause.
                if self.deferred is None:
                    raise
                self.done, self.step = True, None
                deferred, self.deferred = self.deferred, None
                raise deferred from exc
            if self.deferred is not None and not self._shielded(step):
                send, error, self.deferred = None, self.deferred, None  # deliver it here
                continue
            self.step = step
            return

    def send(self, reply: Any) -> None:
        """The step's reply."""
        self._advance(reply, None)

    def throw(self, error: BaseException) -> None:
        """The step failed with ``error`` (or was interrupted by it)."""
        self._advance(None, error)

    def defer(self, interruption: BaseException) -> None:
        """An interruption during a shielded step: delivered after it."""
        self.deferred = interruption


_GATE = GATE
"""The process's signal gate (:mod:`durabilis._signal_gate`)."""


def perform_open(store: Store, step: Any, leases: LeaseBook | None, held: list[Any]) -> Any:
    """An unshielded step on the main thread: signal handlers may run during it.
    One held back runs first: it interrupts the step before it is sent, and at
    the start of ``fn`` what it raises is ``fn``'s (as one a moment later)."""
    ran = _GATE.ran
    lending = _GATE.lending
    try:
        try:
            _GATE.lending = type(step) is not Run  # (pools lend in the plan's own steps only)
            _GATE.closed = False
            if type(step) is Run:
                try:
                    _GATE.deliver()
                except Exception as exc:  # a SIGALRM timeout's TimeoutError...
                    return False, exc
            else:
                _GATE.deliver()
            reply = perform(store, step, leases, held)
            if type(step) is not Run:
                _GATE.after_step(ran)
            return reply
        except Exception as exc:
            _GATE.raise_as(exc, ran, type(step) is Run)
        finally:
            _GATE.closed = True
            _GATE.end_step(lending)
            # A handler fn (or one run meanwhile) installed: held back from now on
            # (nothing else runs user code on the main thread).
            if type(step) is Run or _GATE.ran != ran:
                _GATE.wrap()
    except Exception as exc:  # raised as the one above was told apart (a second deadline)
        _GATE.raise_as(exc, ran, type(step) is Run)  # (else a bug below the plan: nothing undone)


def drive(
    plan: Plan[T], store: Store, *, leases: LeaseBook | None = None,
    step: Any = None, deferred: BaseException | None = None,
) -> T:
    """Run ``plan`` to its end against ``store`` (the sync driver).

    On the main thread, signal handlers run only during unshielded steps
    (:mod:`durabilis._signal_gate`): an interruption never lands in the plan's own code.
    ``step`` and ``deferred``: see :class:`Stepper`.
    """
    held: list[Any] = []
    entered: bool | None = None
    try:
        entered = _GATE.enter()
        open_step = perform if entered is None else perform_open
        run = Stepper(plan, step=step, deferred=deferred)
        while not run.done:
            step = run.step
            try:
                reply = (perform if shielded(step) else open_step)(store, step, leases, held)
            except DurabilisError as exc:
                run.throw(_rekey(exc, step))
                continue
            except Exception:
                raise  # a bug below the plan: not the plan's to handle
            except BaseException as exc:  # KeyboardInterrupt, SystemExit
                if not shielded(step) or not isinstance(exc, INTERRUPTS):
                    run.throw(exc)
                    continue
                # Interrupted inside a shielded step (a record, a compensation):
                # the step's fate is unknown, so the plan sees it fail like a lost
                # reply (and sends it again: every shielded step can be resent)
                # and the interruption is delivered after it.
                run.defer(exc)
                if type(step) is Sleep:
                    run.send(None)
                else:
                    run.throw(StorageUnavailable(
                        f"interrupted by {type(exc).__name__} while the step was in flight"
                    ))
                continue
            run.send(reply)
        result: T = run.value
        return result
    except HandlerRaised as raised:
        raise raised.error from None  # (compensated: the handler's own exception)
    finally:
        try:
            if leases is not None:
                for item in held:
                    leases.drop(item)
        finally:
            _GATE.leave(entered)  # a signal held back is raised now, after the plan's end


def drive_rest(plan: Plan[T], store: Store, *, leases: LeaseBook | None = None) -> T:
    """:func:`drive` for code that runs steps itself and hands over to ``plan``
    (the sync layer's lean path): a plan that ends before its first step is run
    here, with the signal gate as the caller keeps it."""
    try:
        step = plan.send(None)
    except StopIteration as stop:
        result: T = stop.value
        return result
    return drive(plan, store, leases=leases, step=step)


# --- the asyncio driver ---------------------------------------------------------------


async def _acall(step: Run) -> tuple[bool, Any]:
    reset = CURRENT.set(step.context)
    try:
        value = step.fn(step.arg)
        if inspect.isawaitable(value):
            value = await value
        return True, value
    except Exception as exc:
        return False, exc
    finally:
        CURRENT.reset(reset)


async def _in_thread(run: Stepper, step: Run) -> tuple[bool, Any]:
    """A plain function, in a worker thread: never on the event loop (it would
    block the loop and with it the keep-alive that renews the claim's lease).

    The thread's future is not a task, so no cancellation can cut the wait for
    it short: not the caller's, and not a sweep that cancels every task of the
    loop (a shutdown idiom, ``asyncio.run``'s end). The plan always learns how
    ``fn`` ended, and holds its claim until then.
    """
    thread = asyncio.get_running_loop().run_in_executor(
        None, contextvars.copy_context().run, _call, step
    )
    outcome: tuple[bool, Any] = await _shielded(run, step, thread)
    ok, value = outcome
    if ok and inspect.isawaitable(value):  # a plain function returning a coroutine
        outcome = await _shielded(run, step, _acall(Run(lambda _: value, None, step.context)))
    return outcome


async def aperform(store: AsyncStore, step: Any, leases: LeaseBook | None, held: list[Any]) -> Any:
    """Do one step on the event loop (raises what the step raised)."""
    kind = type(step)
    if kind is IO or kind is ScriptCall:
        return await _astep(store, step, leases, held)
    if kind is Batch:
        return await store.run_many(step.calls)
    if kind is Run:  # (a plain function runs in a thread: adrive's _in_thread)
        return await _acall(step)
    if kind is Command:
        return await _command(store, step)
    if kind is Sleep:
        if not TESTING.instant and step.seconds > 0:
            await asyncio.sleep(min(step.seconds, MAX_SLEEP_SECONDS))
        return None
    return _book(step, leases, held)


def _astep(
    store: AsyncStore, step: Any, leases: LeaseBook | None, held: list[Any]
) -> Coroutine[Any, Any, Any]:
    """:func:`aperform`'s work; a script step's is the store's own coroutine."""
    kind = type(step)
    if kind is IO:
        return store.run_step(step.calls, step.gates, step.waves)
    if kind is ScriptCall:
        return store.run(step)
    return aperform(store, step, leases, held)


def async_shielded(step: Any) -> bool:
    """Shielded under the asyncio driver: marked so, or a plain function (runs in a thread)."""
    return shielded(step) or (type(step) is Run and not is_async_callable(step.fn))


_LOST_IN_FLIGHT = partial(StorageUnavailable, "the step was cancelled while in flight")


async def _shielded(run: Stepper, step: Any, work: Awaitable[Any]) -> Any:
    """Await a shielded step to its end; a cancellation meanwhile is deferred.

    The step's own task can still be cancelled directly, by code that cancels
    every task of the loop. Then the step's fate is unknown, as after a lost
    reply, and the plan is told so (``StorageUnavailable``: a record is sent
    again or handed to the keep-alive, a compensation left to the lease and
    recovery, as after a timeout); a sleep counts as slept, and a coroutine
    that ``fn`` returned was interrupted (``CancelledError``).
    """
    task = asyncio.ensure_future(work)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.cancelled():  # the step's task itself was cancelled
                if _cancel_requested():
                    run.defer(exc)  # the plan's task too: delivered after the step
                if type(step) is Sleep:
                    return None
                if type(step) is Run:
                    raise
                raise _LOST_IN_FLIGHT() from None
            run.defer(exc)  # the step finishes first
            if task.done():  # it finished as the cancellation came
                return task.result()  # (raises what the step raised)


def _held(
    run: Stepper, store: AsyncStore, step: Any, leases: LeaseBook | None, held: list[Any],
) -> Awaitable[Any]:
    """A shielded step, in this task where the store allows it (no task of its
    own: :class:`~durabilis._cancel.HeldThrough`), else :func:`_shielded`."""
    work = _astep(store, step, leases, held)
    if (type(step) is IO or type(step) is ScriptCall) and store.holds_in_task:
        return HeldThrough(work, run.defer, _LOST_IN_FLIGHT)
    return _shielded(run, step, work)


async def adrive(plan: Plan[T], store: AsyncStore, *, leases: LeaseBook | None = None) -> T:
    """Run ``plan`` to its end against ``store`` (the asyncio driver).

    A cancellation during an unshielded step is thrown into the plan at once
    (it compensates, shielded, and re-raises). During a shielded step it is
    held back until the step's reply reached the plan (:class:`Stepper`).
    """
    held: list[Any] = []
    try:
        run = Stepper(plan, async_shielded)
        while not run.done:
            step = run.step
            try:
                kind = type(step)
                if kind is Run and not is_async_callable(step.fn):
                    reply = await _in_thread(run, step)
                elif kind is Run:  # an async fn: not shielded
                    before = _cancels()
                    reply = await aperform(store, step, leases, held)
                    if _cancels() > before:
                        # fn turned the caller's cancellation into a result or an
                        # error (a client mapping it to its own; redis-py's wait_for
                        # loses one on 3.11): the plan gets fn's outcome, then the
                        # cancellation, at its next unshielded step (never another
                        # attempt) or its end, as if it had come just after fn.
                        run.defer(asyncio.CancelledError())
                elif kind is Hold or kind is Defer or not async_shielded(step):
                    reply = await _astep(store, step, leases, held)  # (those two never wait)
                else:
                    reply = await _held(run, store, step, leases, held)
            except DurabilisError as exc:
                run.throw(_rekey(exc, step))
                continue
            except Exception:
                raise
            except BaseException as exc:  # CancelledError, KeyboardInterrupt, SystemExit
                run.throw(exc)
                continue
            run.send(reply)
        result: T = run.value
        return result
    finally:
        if leases is not None:
            for item in held:
                leases.drop(item)
