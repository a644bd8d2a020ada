"""The step vocabulary every plan speaks (no I/O: the drivers are in ``durabilis._steps``).

A *plan* is a generator that never does I/O itself: it yields steps and is
sent their replies (see ``durabilis._steps`` for the table of steps and
replies, and for the drivers :func:`~durabilis._steps.drive` and
:func:`~durabilis._steps.adrive`). ``durabilis._steps`` re-exports every
name here, so a step built by either import is the same class.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

from durabilis._scripts import ScriptCall

T = TypeVar("T")

MAX_SLEEP_SECONDS = 2 * 3600.0
"""No plan step sleeps longer than this (retry delays are at most an hour, plus jitter)."""

Plan = Generator[Any, Any, T]
"""A generator of steps returning ``T``."""

Gates = Mapping[int, Callable[[Any], bool]]
"""Per call index, a test of its reply: ``True`` means the call refused."""

Waves = Sequence[int]
"""Per call of an unfused step, its wave (see ``Store.run_step``)."""


@dataclass(frozen=True, slots=True)
class IO:
    """Run the calls of one step (``Store.run_step``).

    Attributes:
        calls: The scripts, in order.
        gates: Call index -> "did this reply refuse?"; a gated refusal aborts
            the step (standalone: nothing written; Cluster: the calls after it
            are not sent).
        shield: Not interrupted by a cancellation (asyncio): the outcome of an
            operation that ran is recorded whatever happens to the caller.
        waves: Per call, its wave when the step is not fused (Cluster): the
            calls of a wave are sent concurrently, a wave only after the one
            before it answered. ``None``: one call after another.
    """

    calls: Sequence[ScriptCall]
    gates: Gates | None = None
    shield: bool = False
    waves: Waves | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """Run independent calls at once (``Store.run_many``): each script atomic on
    its own, together no transaction and no step (standalone: one pipeline;
    Cluster: concurrently, each to its node). Every call is tried, one failing
    stops none of the others; the reply is their replies in order, or the
    first failure is raised (thrown into the plan) once all were tried.

    For calls that must not be fused into one script (the keep-alive's
    renewals: a claim whose key holds foreign data must not stop the others').
    """

    calls: Sequence[ScriptCall]


@dataclass(frozen=True, slots=True)
class Command:
    """A plain read-only command; ``key`` names the key in errors."""

    args: tuple[Any, ...]
    key: str = "?"


@dataclass(frozen=True, slots=True)
class Run:
    """Call user code: ``fn(arg)``, with ``context`` as the current operation."""

    fn: Callable[[Any], Any]
    arg: Any
    context: Any = None


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait (retry backoff, polling); ``shield``: not interrupted by a cancellation."""

    seconds: float
    shield: bool = False


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep this claim's lease (and its in-flight index entry) alive until the plan ends.

    Sent BEFORE the claim step, so the claim is renewed from the moment it
    exists (named by its nonce: its token is not known yet).
    """

    key: str
    nonce: str
    member: str


@dataclass(frozen=True, slots=True)
class Defer:
    """Hand an outcome the plan could not record to the process's keep-alive.

    The keep-alive keeps renewing the claim (by its nonce) and sending
    ``calls`` until they land or ``seconds`` have passed, after the plan
    itself has returned (``OutcomeUnrecorded``). ``guarded``: ``calls[0]`` is
    a read-only guard of ``calls[1]`` (a parking's, see ``idem_check``): it
    goes again in front of every send of that call, even once it landed.
    """

    key: str
    nonce: str
    member: str
    calls: Sequence[ScriptCall]
    gates: Gates | None
    seconds: float
    guarded: bool = False


def shielded(step: Any) -> bool:
    """Whether an interruption waits until after ``step``: marked ``shield``, or
    a :class:`Hold` / :class:`Defer` (the process's own bookkeeping, no I/O: an
    outcome the plan hands to the keep-alive is never dropped for a cancellation
    that came while it tried to record it)."""
    kind = type(step)
    return kind is Hold or kind is Defer or bool(getattr(step, "shield", False))


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine without blocking (``async def``)."""
    while isinstance(fn, partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004  (an object with an async __call__)
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


class Log(Protocol):
    """Where the core's plans and books report events: the shells hand in the
    package's structlog logger (``durabilis._log.get_logger()``)."""

    def debug(self, event: str, **fields: Any) -> Any: ...
    def info(self, event: str, **fields: Any) -> Any: ...
    def warning(self, event: str, **fields: Any) -> Any: ...
    def error(self, event: str, **fields: Any) -> Any: ...
    def exception(self, event: str, **fields: Any) -> Any: ...


class SilentLog:
    """A :class:`Log` that drops every event (the core's default)."""

    def debug(self, event: str, **fields: Any) -> None:
        return None

    info = warning = error = exception = debug


def answered(plan: Plan[T], replies: Sequence[Any]) -> tuple[list[Any], T]:
    """Run ``plan`` against scripted ``replies`` (one per step, in order; an
    exception instance is thrown into the plan): the steps it yielded and what
    it returned. For tests and tools: the h11 way of testing a plan, no I/O.

    Raises:
        AssertionError: The plan asked for more steps than ``replies`` holds.
    """
    steps: list[Any] = []
    feed = iter(replies)
    try:
        step = next(plan)
        while True:
            steps.append(step)
            try:
                reply = next(feed)
            except StopIteration:
                plan.close()
                raise AssertionError(f"the plan asked for step {len(steps)}: {step!r}") from None
            step = plan.throw(reply) if isinstance(reply, BaseException) else plan.send(reply)
    except StopIteration as stop:
        return steps, stop.value
