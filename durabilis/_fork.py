"""What a process inherits at ``fork()`` and must not act on: reset in the child.

A forked child starts with a copy of its parent's memory: the claims the
parent holds (its lease book), its keep-alive's thread or task, the counts
waiting to be sent, the asyncio store's queued commands, a config poller's
state, breaker caches, and locks another thread of the parent held at that
moment (locked for good in the child). Acting on any of them acts for the
parent: a child's keep-alive renewed the parent's claims forever, so a parent
that died mid-operation was never recovered; a child's flush sent the
parent's counts a second time.

Every object holding such state registers itself here (:func:`reset_in_child`,
a weak reference: registering keeps nothing alive); module-level state
registers a function (:func:`on_fork_in_child`). In the child, right after
``fork()`` (``os.register_at_fork``), each is reset as if made there, empty:
the child never acts for its parent, and the parent's claims age out normally
if the parent dies. No I/O here (nothing is sent or closed: the parent's
connections are the parent's).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Protocol, TypeVar


class ForkAware(Protocol):
    """An object whose per-process state is reset in a forked child."""

    def after_fork_in_child(self) -> None: ...


F = TypeVar("F", bound=ForkAware)

_LIVE: weakref.WeakSet[ForkAware] = weakref.WeakSet()
_HOOKS: list[Callable[[], None]] = []


def reset_in_child(obj: F) -> F:
    """Register ``obj``: its ``after_fork_in_child()`` runs in every forked child
    (while it lives: a weak reference). Returns ``obj``."""
    _LIVE.add(obj)
    return obj


def on_fork_in_child(hook: Callable[[], None]) -> Callable[[], None]:
    """Register a module's reset (its locks, caches), run in every forked child."""
    _HOOKS.append(hook)
    return hook


_PID = [os.getpid()]


def pid() -> int:
    """This process's id, without a system call (``os.getpid`` is one): kept
    here, and read again in every forked child before any reset runs."""
    return _PID[0]


def _after_fork_in_child() -> None:
    _PID[0] = os.getpid()
    # The child has one thread: nothing else iterates or adds meanwhile. One
    # reset failing never skips the others (the child must start whatever).
    for hook in list(_HOOKS):
        try:
            hook()
        except Exception:  # a reset that fails leaves that object as it was
            continue
    for obj in list(_LIVE):
        try:
            obj.after_fork_in_child()
        except Exception:  # (the same)
            continue


if hasattr(os, "register_at_fork"):  # (not on Windows: no fork there)
    os.register_at_fork(after_in_child=_after_fork_in_child)
