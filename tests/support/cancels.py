"""A caller's cancellation that ``fn`` swallows (as a client library may: it
maps it to its own error, or redis-py's ``wait_for`` loses it on 3.11)."""

from __future__ import annotations

import asyncio


async def swallow_own_cancel(ending: str) -> str:
    """Cancel the running task (the caller's cancellation, arriving while fn
    waits), then swallow it: return ``"swallowed"``, or with ``ending ==
    "raises"`` raise a ``ConnectionError`` in its place."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    try:
        await asyncio.sleep(0)
    except asyncio.CancelledError:
        if ending == "raises":
            raise ConnectionError("connection aborted") from None
    return "swallowed"
