"""A cancellation a library call swallowed, found and raised again (asyncio, Python 3.11+).

Shared by the store, the retry engine and the async driver."""

from __future__ import annotations

import asyncio


def cancels() -> int:
    """How many times the running task was asked to cancel (0 before Python 3.11)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return int(cancelling()) if cancelling is not None else 0


def resurface(before: int) -> None:
    """Raise the cancellation a redis-py call swallowed, if one did.

    redis-py sends through ``asyncio.wait_for``, which on Python 3.11 returns
    the inner result when a ``cancel()`` arrives as the send completes, and the
    cancellation is lost: a poller's ``stop()`` then waited forever (seen under
    CPU load on Cluster), and a caller's ``asyncio.timeout`` would not fire. A
    cancellation asked for during the call and not raised is raised here, as if
    it had come just after the reply (the outcome is then unknown to the caller,
    as for any cancellation in flight).
    """
    if cancels() > before:
        raise asyncio.CancelledError
