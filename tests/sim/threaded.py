"""The sync layer's lean path (:func:`durabilis.layer._direct.lean_call`), which
performs its steps in place rather than yielding them, run as a plan the
simulator steps like any other.

``lean_call`` performs each step through a port (``open``, ``shielded``,
``rest``, ``rest_after``). Here it runs in a thread of its own whose port hands
each step to the plan below and waits: the plan yields the step (or yields from
the plan handed over to) and passes back its reply, or what was thrown into it
(a fault, or the plan closed: ``GeneratorExit``). Only one of the two runs at
any moment, so a seed stays deterministic, and the faults the simulator injects
at step boundaries (a lost reply, a timeout, a step that did or did not land,
the process dying between steps or inside ``fn``) meet the real function: the
guarantees it checks cover the sync layer's lean path itself, not only its
plan twin (``_lean_plan``, which the async actors still drive). The simulator
interrupts sync actors inside ``fn`` only (``SystemExit``,
``KeyboardInterrupt``): ``lean_call``'s other interruption branches (a signal
in the claim or record step) are the integration tests' (the signal tests of
tests/integration/test_layer_promise.py, run through the sync layer).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from typing import Any

from durabilis._steps import Stepper, shielded
from durabilis.core.steps import Plan


class Threads:
    """The threads of one simulation's calls. A call whose simulated process
    died is never stepped again: its thread waits for a step's answer for
    good, holding the simulation. :meth:`end` has each such thread leave at
    the point it waits (``GeneratorExit`` there, which ``lean_call`` does not
    compensate: nothing more runs, as for a plan left unstepped)."""

    def __init__(self) -> None:
        self._waiting: list[tuple[threading.Thread, queue.SimpleQueue[tuple[str, Any]]]] = []

    def add(self, thread: threading.Thread, to_body: queue.SimpleQueue[tuple[str, Any]]) -> None:
        self._waiting.append((thread, to_body))

    def end(self) -> None:
        for thread, to_body in self._waiting:
            if thread.is_alive():
                to_body.put(("raise", GeneratorExit()))
                thread.join(5)
        self._waiting.clear()


def threaded_plan(body: Callable[[Any], Any], threads: Threads | None = None) -> Plan[Any]:
    """``body(port)`` as a plan (see the module docstring); its thread joins
    ``threads`` (see :class:`Threads`)."""
    to_plan: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    to_body: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

    class _Port:
        def _ask(self, *message: Any) -> Any:
            to_plan.put(message)
            kind, value = to_body.get()
            if kind == "raise":
                raise value
            return value

        def open(self, step: Any) -> Any:
            return self._ask("step", step)

        def shielded(self, step: Any) -> Any:
            return self._ask("step", step)

        def rest(self, plan: Plan[Any]) -> Any:
            return self._ask("rest", plan)

        def rest_after(self, plan: Plan[Any], interruption: BaseException) -> Any:
            return self._ask("rest_after", plan, interruption)

    def main() -> None:
        try:
            value = body(_Port())
        except BaseException as exc:  # (what the call raised: the plan raises it)
            to_plan.put(("error", exc))
        else:
            to_plan.put(("done", value))

    def plan() -> Generator[Any, Any, Any]:
        thread = threading.Thread(target=main, name="sim-lean-call", daemon=True)
        if threads is not None:
            threads.add(thread, to_body)
        thread.start()
        while True:
            message = to_plan.get()
            kind = message[0]
            if kind == "done":
                return message[1]
            if kind == "error":
                raise message[1]
            try:
                if kind == "step":
                    reply = yield message[1]
                elif kind == "rest":
                    reply = yield from message[1]
                else:
                    reply = yield from _deferred(message[1], message[2])
            except GeneratorExit:  # the process died here: the call stops at this point
                to_body.put(("raise", GeneratorExit()))
                while to_plan.get()[0] not in ("done", "error"):
                    to_body.put(("raise", GeneratorExit()))
                raise
            except BaseException as exc:  # a fault or an interruption at this step
                to_body.put(("raise", exc))
                continue
            to_body.put(("value", reply))

    return plan()


def _deferred(plan: Plan[Any], interruption: BaseException) -> Generator[Any, Any, Any]:
    """``plan`` with ``interruption`` delivered at its first unshielded step, or
    raised at its end: the sync driver's own ``Stepper(deferred=...)``, stepped
    by the simulator."""
    run = Stepper(plan, shielded, deferred=interruption)
    while not run.done:
        try:
            reply = yield run.step
        except BaseException as exc:  # a fault at this step (GeneratorExit: closed)
            if isinstance(exc, GeneratorExit):
                raise
            run.throw(exc)
            continue
        run.send(reply)
    return run.value
