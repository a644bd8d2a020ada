"""Wait for a condition with a deadline, never for "long enough" (a loaded machine
makes any fixed sleep too short).

``wait_until(lambda: ..., timeout=10, what="...")`` polls until the condition
returns something truthy and returns it; past the deadline it fails the test,
naming what it waited for and the condition's last value. The deadline is
generous on purpose: a passing test returns as soon as the condition holds, so
only a failing one ever waits it out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.01,
    what: str = "the condition",
) -> T:
    """Poll ``condition`` until it returns something truthy; return that value.

    Raises:
        AssertionError: Still falsy after ``timeout`` seconds (with its last value).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not so after {timeout}s (last: {value!r})")
        time.sleep(interval)


async def await_until(
    condition: Callable[[], T | Awaitable[T]], *, timeout: float = 10.0,
    interval: float = 0.01, what: str = "the condition",
) -> T:
    """:func:`wait_until` for a coroutine: ``condition`` may be sync or async."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not so after {timeout}s (last: {value!r})")
        await asyncio.sleep(interval)
