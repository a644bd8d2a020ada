"""The sync layer's lean path without a plan: the steps of
:meth:`~durabilis.core.layer.lean._LeanPath._lean_plan`, performed in place.

The common case (standalone, a new key, ``fn`` succeeds) is most of a gateway's
calls; driving it as a plan (generators four deep, the driver's loop and
``Stepper``) cost about 4 us of its ~64 us of Python (benchmarks/README.md, "The
lean durable call"). Here the very same pieces (``lean_*``: the calls, their checks, ``fn``'s
context, the record) are performed one after another with the sync driver's
own step functions (:func:`~durabilis._steps.perform`, and on the main thread
the signal gate's :func:`~durabilis._steps.perform_open`), so each step is sent,
gated, shielded and interrupted exactly as :func:`~durabilis._steps.drive`
does. At the first reply that is not the common case, or an error, or an
interruption, the plan the lean plan hands over to there is driven from that
point (:func:`~durabilis._steps.drive_rest`): the same plan, the same point.

Every step goes through a :class:`Port`, so the fault simulator runs this very
function (tests/sim/threaded.py: in a thread whose port yields each step to
the simulator), with its faults at each step boundary; the async layer drives
the plan twin (``_lean_plan``). tests/integration/test_layer_lean.py checks that
both send the steps the general plans send.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from durabilis import _fork, _steps
from durabilis._signal_gate import GATE, HandlerRaised
from durabilis._steps import INTERRUPTS, LeaseBook, drive, drive_rest
from durabilis._store import Store
from durabilis.core.layer import CLAIM_AGAIN, ClaimAgain, LayerCore, Request
from durabilis.core.layer.lean import lean_child
from durabilis.core.retry import RetryPolicy
from durabilis.core.steps import Plan, Run
from durabilis.errors import DurabilisError, StorageUnavailable
from durabilis.layer._config import OperationContext

T = TypeVar("T")


class Port(Protocol):
    """How :func:`lean_call` performs its steps and hands over to a plan.

    :class:`_Driver` is the sync driver's (what ``drive`` does, step by step);
    the fault simulator's runs the same function as a plan, each call here a
    step boundary it may inject a fault at (tests/sim/engine.py).
    """

    def open(self, step: Any) -> Any:
        """An unshielded step (the claim step, ``fn``): interruptions land in it."""

    def shielded(self, step: Any) -> Any:
        """A shielded step (the hold, the record step)."""

    def rest(self, plan: Plan[T]) -> T:
        """The plan taking over from here, to its end."""

    def rest_after(self, plan: Plan[T], interruption: BaseException) -> T:
        """The same, with an interruption that came during a shielded step
        delivered at its first unshielded step (or at its end)."""


class _Driver:
    """The sync driver's port: the steps as :func:`~durabilis._steps.drive` performs them."""

    __slots__ = ("held", "leases", "open_step", "store")

    def __init__(
        self, store: Store, leases: LeaseBook, held: list[Any], open_step: Callable[..., Any]
    ) -> None:
        self.store = store
        self.leases = leases
        self.held = held
        self.open_step = open_step

    def open(self, step: Any) -> Any:
        return self.open_step(self.store, step, self.leases, self.held)

    def shielded(self, step: Any) -> Any:
        return _steps.perform(self.store, step, self.leases, self.held)

    def rest(self, plan: Plan[T]) -> T:
        return drive_rest(plan, self.store, leases=self.leases)

    def rest_after(self, plan: Plan[T], interruption: BaseException) -> T:
        return drive(plan, self.store, leases=self.leases, deferred=interruption)


def run_lean(  # noqa: PLR0917  (the call, and where it runs)
    core: LayerCore, req: Request, fn: Callable[[OperationContext], Any],
    policy: RetryPolicy | None, wait_until: float | None, store: Store, leases: LeaseBook,
) -> Any:
    """Run one lean operation to its end (what ``drive(core.execute_plan(req, fn))``
    does for it: :meth:`~durabilis.core.layer.lean._LeanPath.lean_entry`)."""
    held: list[Any] = []
    entered: bool | None = None
    try:
        entered = GATE.enter()
        # (looked up here, as drive's: the steps go through the driver's own functions)
        step = _steps.perform if entered is None else _steps.perform_open
        return lean_call(core, req, fn, policy, wait_until, _Driver(store, leases, held, step))
    except HandlerRaised as raised:
        raise raised.error from None  # (compensated: the handler's own exception, as drive)
    finally:
        try:
            for item in held:
                leases.drop(item)
        finally:
            GATE.leave(entered)  # a signal held back is raised now, after the call's end


def lean_call(  # noqa: PLR0917  (the call, and its port)
    core: LayerCore, req: Request, fn: Callable[[OperationContext], Any],
    policy: RetryPolicy | None, wait_until: float | None, port: Port,
) -> Any:
    """One lean operation through ``port``: what ``_execute_plan`` does for it."""
    try:
        outcome = _lean(core, req, fn, policy, wait_until, port)
    except ClaimAgain:
        outcome = CLAIM_AGAIN
    if outcome is CLAIM_AGAIN:  # (a parking its guard dropped, see _Parking._park)
        outcome = port.rest(core.claim_loop(req, fn, wait_until))
    return outcome


def _lean(  # noqa: PLR0912, PLR0917  (the lean plan, step by step; lean_call's arguments)
    core: LayerCore, req: Request, fn: Callable[[OperationContext], Any],
    policy: RetryPolicy | None, wait_until: float | None, port: Port,
) -> Any:
    """The steps of ``_lean_plan``, in its order (see there for each one's why)."""
    begin = core.lean_begin(req)
    port.shielded(begin.hold)  # (the lease book holds it; no I/O)
    try:
        replies = port.open(begin.step)
    except DurabilisError as exc:
        port.rest(core.lean_undo(req, begin, exc.partial))
        raise
    except Exception:
        raise  # a bug below the plan (as drive: nothing undone)
    except INTERRUPTS:
        port.rest(core.lean_undo(req, begin, None))
        raise
    cl = core.lean_claimed(req, begin, replies)
    if cl is None:
        return port.rest(core.lean_other(req, fn, policy, wait_until, begin, replies))
    permit = None
    if req.dependency is not None:
        permit = port.rest(core.lean_admission(req, cl, replies, begin))
    start = core.clock()
    ctx = core.lean_context(req, cl)
    try:
        ok, value = port.open(Run(fn, ctx, ctx))
    except GeneratorExit:
        raise  # (the simulator's process died here: nothing more runs)
    except BaseException:
        if cl.pid != _fork.pid():
            raise
        port.rest(core.lean_interrupted(req, cl, permit))
        raise
    if cl.pid != _fork.pid():
        return lean_child(ok, value)
    took_ms = (core.clock() - start) * 1000.0
    if not ok:
        return port.rest(core.lean_failed(req, fn, policy, cl, permit, (value, start, took_ms)))
    record = core.lean_record(req, cl, permit, value, took_ms)
    try:
        done = port.shielded(record.step)
    except DurabilisError as exc:
        return port.rest(core.lean_unrecorded(req, record, exc))
    except Exception:
        raise
    except INTERRUPTS as exc:
        # As drive does for a shielded step: its fate unknown, as after a lost
        # reply; the interruption delivered after it (at the next unshielded
        # step of what follows, or at its end).
        lost = StorageUnavailable(
            f"interrupted by {type(exc).__name__} while the step was in flight"
        )
        return port.rest_after(core.lean_unrecorded(req, record, lost), exc)
    if not core.lean_recorded(req, record, done):
        return port.rest(core.lean_unrecorded(req, record, done))
    return value
