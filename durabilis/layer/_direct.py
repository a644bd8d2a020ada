"""The sync layer's lean path without a plan: the steps of
:meth:`~durabilis.layer._plans.lean._LeanPath._lean_plan`, performed in place.

The common case (standalone, a new key, ``fn`` succeeds) is most of a gateway's
calls, and driving it as a plan (a generator in four, the driver's loop, a
step object per yield) cost about as much Python as everything else a call
does. Here the very same pieces (``lean_*``: the calls, their checks, ``fn``'s
context, the record) are performed one after another with the sync driver's
own step functions (:func:`~durabilis._steps.perform`, and on the main thread
the signal gate's :func:`~durabilis._steps.perform_open`), so each step is sent,
gated, shielded and interrupted exactly as :func:`~durabilis._steps.drive`
does. At the first reply that is not the common case, or an error, or an
interruption, the plan the lean plan hands over to there is driven from that
point (:func:`~durabilis._steps.drive_rest`): the same plan, the same point.
The simulator steps the plan twin (``_lean_plan``); the two are the same
pieces in the same order (tests/unit/test_layer_direct.py checks that they
send the same steps for every hand-over point).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durabilis import _fork, _steps
from durabilis._signal_gate import GATE
from durabilis._steps import INTERRUPTS, LeaseBook, drive, drive_rest
from durabilis._store import Store
from durabilis.core.retry import RetryPolicy
from durabilis.core.steps import Run
from durabilis.errors import DurabilisError, StorageUnavailable
from durabilis.layer._config import OperationContext
from durabilis.layer._plans import CLAIM_AGAIN, ClaimAgain, Request, _LayerCore


def run_lean(  # noqa: PLR0917  (the call, and where it runs)
    core: _LayerCore, req: Request, fn: Callable[[OperationContext], Any],
    policy: RetryPolicy | None, wait_until: float | None, store: Store, leases: LeaseBook,
) -> Any:
    """Run one lean operation to its end (what ``drive(core.execute_plan(req, fn))``
    does for it: :meth:`~durabilis.layer._plans.lean._LeanPath.lean_entry`)."""
    held: list[Any] = []
    entered: bool | None = None
    try:
        entered = GATE.enter()
        # (looked up here, as drive's: the steps go through the driver's own functions)
        step = _steps.perform if entered is None else _steps.perform_open
        try:
            outcome = _lean(core, req, fn, policy, wait_until, store, leases, held, step)
        except ClaimAgain:
            outcome = CLAIM_AGAIN
        if outcome is CLAIM_AGAIN:  # (a parking its guard dropped, see _Parking._park)
            outcome = drive_rest(core.claim_loop(req, fn, wait_until), store, leases=leases)
        return outcome
    finally:
        try:
            for item in held:
                leases.drop(item)
        finally:
            GATE.leave(entered)  # a signal held back is raised now, after the call's end


def _lean(  # noqa: PLR0912, PLR0917  (the lean plan, step by step; run_lean's arguments)
    core: _LayerCore, req: Request, fn: Callable[[OperationContext], Any],
    policy: RetryPolicy | None, wait_until: float | None, store: Store, leases: LeaseBook,
    held: list[Any], open_step: Callable[..., Any],
) -> Any:
    """The steps of ``_lean_plan``, in its order (see there for each one's why)."""
    begin = core.lean_begin(req)
    perform = _steps.perform
    perform(store, begin.hold, leases, held)  # (the lease book holds it; no I/O)
    try:
        replies = open_step(store, begin.step, leases, held)
    except DurabilisError as exc:
        drive_rest(core.lean_undo(req, begin, exc.partial), store, leases=leases)
        raise
    except Exception:
        raise  # a bug below the plan (as drive: nothing undone)
    except INTERRUPTS:
        drive_rest(core.lean_undo(req, begin, None), store, leases=leases)
        raise
    cl = core.lean_claimed(req, begin, replies)
    if cl is None:
        return drive_rest(
            core.lean_other(req, fn, policy, wait_until, begin, replies), store, leases=leases
        )
    permit = None
    if req.dependency is not None:
        permit = drive_rest(core.lean_admission(req, cl, replies, begin), store, leases=leases)
    start = core.clock()
    ctx = core.lean_context(req, cl)
    try:
        ok, value = open_step(store, Run(fn, ctx, ctx), leases, held)
    except BaseException:
        if cl.pid != _fork.pid():
            raise
        drive_rest(core.lean_interrupted(req, cl, permit), store, leases=leases)
        raise
    if cl.pid != _fork.pid():
        if ok:
            return value
        raise value
    took_ms = (core.clock() - start) * 1000.0
    if not ok:
        return drive_rest(
            core.lean_failed(req, fn, policy, cl, permit, (value, start, took_ms)), store,
            leases=leases,
        )
    record = core.lean_record(req, cl, permit, value, took_ms)
    try:
        done = perform(store, record.step, leases, held)  # (shielded: the gate stays closed)
    except DurabilisError as exc:
        return drive_rest(core.lean_unrecorded(req, record, exc), store, leases=leases)
    except Exception:
        raise
    except INTERRUPTS as exc:
        # As drive does for a shielded step: its fate unknown, as after a lost
        # reply; the interruption delivered after it (at the next unshielded
        # step of what follows, or at its end).
        lost = StorageUnavailable(
            f"interrupted by {type(exc).__name__} while the step was in flight"
        )
        return drive(core.lean_unrecorded(req, record, lost), store, leases=leases, deferred=exc)
    if not core.lean_recorded(req, record, done):
        return drive_rest(core.lean_unrecorded(req, record, done), store, leases=leases)
    return value
