"""An interruption (as Ctrl-C's) delivered to the test's own process at a set time,
and the idempotency claims the interrupted-read tests send."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import durabilis
from durabilis._scripts import ScriptCall
from durabilis.aio import Store as AsyncStore
from durabilis.idempotency import IdempotencyGuard

PAUSE_MS = 1500
INTERRUPT_AFTER = 0.3  # seconds: well inside the pause


class Interrupted(BaseException):
    """What the test's signal handler raises (as KeyboardInterrupt would)."""


class InterruptedAgain(BaseException):
    """What a second signal's handler raises (as a SIGTERM handler's sys.exit)."""


@contextmanager
def interrupted_after(seconds: float, again: float | None = None) -> Iterator[None]:
    """SIGUSR1 to this process after ``seconds``, its handler raising Interrupted;
    with ``again``, SIGUSR2 after that many seconds, raising InterruptedAgain.
    Each raises only while armed: a late signal after the block raises nothing."""
    armed = {signal.SIGUSR1: Interrupted, signal.SIGUSR2: InterruptedAgain}
    timers = [threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))]
    if again is not None:
        timers.append(threading.Timer(again, os.kill, (os.getpid(), signal.SIGUSR2)))

    def handler(signum: int, frame: Any) -> None:
        raised = armed.pop(signal.Signals(signum), None)
        if raised is not None:
            raise raised

    previous = [signal.signal(s, handler) for s in (signal.SIGUSR1, signal.SIGUSR2)]
    for timer in timers:
        timer.start()
    try:
        yield
    finally:
        armed.clear()
        for timer in timers:
            timer.cancel()
            timer.join()
        signal.signal(signal.SIGUSR1, previous[0])
        signal.signal(signal.SIGUSR2, previous[1])


@contextmanager
def raising_handler(
    raised: type[BaseException] = Interrupted, signum: int = signal.SIGUSR1
) -> Iterator[None]:
    """While the block runs, ``signum``'s handler (a plain one, as a user's)
    raises ``raised``; the previous handler is put back after."""

    def handler(signum: int, frame: Any) -> None:
        raise raised

    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def claim(store: durabilis.Store | AsyncStore, name: str) -> ScriptCall:
    """An idempotency claim of ``name`` (the call: sent by the test)."""
    ops = IdempotencyGuard(store)._ops  # type: ignore[arg-type]
    return ops.claim(ops.validate_key(name), None)


def state(raw: Any, store: durabilis.Store | AsyncStore, name: str) -> bytes | None:
    value = raw.hget(store.keys.idem(name), "s")
    return value if isinstance(value, bytes) else None


@contextmanager
def signal_as_it_starts(code: Any, signum: int = signal.SIGUSR1) -> Iterator[list[bool]]:
    """While the block runs, ``signum`` is raised once as a frame of ``code``
    (a function's ``__code__``) starts, before any of its code runs: its
    handler runs there, as a real signal landing at that point. Yields
    ``[armed]``: ``[False]`` once it was raised."""
    armed = [True]

    def tracer(frame: Any, event: str, arg: Any) -> None:
        if armed[0] and event == "call" and frame.f_code is code:
            armed[0] = False
            sys.settrace(None)
            signal.raise_signal(signum)

    sys.settrace(tracer)
    try:
        yield armed
    finally:
        sys.settrace(None)


@contextmanager
def signal_in(
    code: Any, *, line: int | None = None, signum: int = signal.SIGUSR1
) -> Iterator[list[bool]]:
    """While the block runs, ``signum`` is raised once in a frame of ``code``:
    as it reaches ``line`` (an absolute line number), or, without one, as it
    returns (its work done, its value not handed back yet). Yields ``[armed]``:
    ``[False]`` once it was raised. (A handler raising inside the trace
    function also ends the tracing: one signal per block.)"""
    armed = [True]

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is not code:
            return None
        at = event == "return" if line is None else (event == "line" and frame.f_lineno == line)
        if at and armed[0]:
            armed[0] = False
            sys.settrace(None)
            frame.f_trace = None
            signal.raise_signal(signum)
        return tracer

    sys.settrace(tracer)
    try:
        yield armed
    finally:
        sys.settrace(None)
