"""An interruption (as Ctrl-C's) delivered to the test's own process at a set time,
and the idempotency claims the interrupted-read tests send."""

from __future__ import annotations

import os
import signal
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


@contextmanager
def interrupted_after(seconds: float) -> Iterator[None]:
    """SIGUSR1 to this process after ``seconds``; its handler raises Interrupted
    (only while armed: a late signal after the block raises nothing)."""
    armed = threading.Event()
    armed.set()

    def handler(signum: int, frame: Any) -> None:
        if armed.is_set():
            armed.clear()
            raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        yield
    finally:
        armed.clear()
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, previous)


def claim(store: durabilis.Store | AsyncStore, name: str) -> ScriptCall:
    """An idempotency claim of ``name`` (the call: sent by the test)."""
    ops = IdempotencyGuard(store)._ops  # type: ignore[arg-type]
    return ops.claim(ops.validate_key(name), None)


def state(raw: Any, store: durabilis.Store | AsyncStore, name: str) -> bytes | None:
    value = raw.hget(store.keys.idem(name), "s")
    return value if isinstance(value, bytes) else None
