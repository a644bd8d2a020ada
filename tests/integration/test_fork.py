"""A forked child never acts for its parent (issue 35, hole 1): it does not
renew the parent's claims (a parent that dies has them recovered) and does not
send the parent's waiting counts a second time. Real processes, ``fork``
start method (Linux's default for ``multiprocessing``)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
import warnings
from typing import Any

import pytest

import durabilis
from durabilis import IdempotencyKey
from durabilis.layer import DurabilityLayer
from durabilis.layer._config import WORKER_LOST
from tests.integration._interrupt_workers import (
    async_store_in_child,
    flush_in_child,
    parent_that_forks_inside_fn,
)
from tests.integration._layer_support import Counter, fast_config

# On Cluster the counts wait with the index removals, and recovery reads the
# birth index too.
pytestmark = [
    pytest.mark.topologies("cluster"),
    pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform"),
]

LEASE = 1.0


def _wait_for(what: str, ready: Any, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := ready()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return found


def test_a_forked_child_never_renews_its_dead_parent_s_claim(
    store: durabilis.Store, redis_url: str, namespace: str, raw: Any
) -> None:
    """The parent holds a claim (its keep-alive running) and forks a child that
    makes a durable call of its own; the parent is SIGKILLed. Its claim ages
    out while the child lives on, and recovery parks it."""
    marks = f"{namespace}:test:marks"
    parent = multiprocessing.get_context("spawn").Process(
        target=parent_that_forks_inside_fn, args=(redis_url, namespace, LEASE, marks)
    )
    parent.start()
    child_pid = 0

    def seen(who: str) -> str:
        for m in raw.lrange(marks, 0, -1):
            if m.decode().startswith(who + "|"):
                return str(m.decode().split("|", 1)[1])
        return ""

    try:
        parent_key = _wait_for("the parent never entered fn", lambda: seen("parent"))
        child_pid = int(_wait_for("the forked child never entered its fn", lambda: seen("child")))
        os.kill(parent.pid, signal.SIGKILL)  # type: ignore[arg-type]
        # (no timeout: with one, join waits on a pipe the forked child holds open too)
        parent.join()
        assert parent.exitcode == -signal.SIGKILL

        layer = DurabilityLayer(store, fast_config(lease=LEASE, dependencies={}))
        key = IdempotencyKey.new("a1", "job", {"who": "parent"})
        assert key.value == parent_key

        def aged_out() -> bool:
            dup = layer.idempotency.check(key)
            return dup is not None and dup.in_progress and dup.lease_expired

        _wait_for("the dead parent's claim is still renewed (by its forked child)", aged_out,
                  seconds=30 * LEASE)
        os.kill(child_pid, 0)  # the child still lives (inside its fn, its keep-alive running)

        # Recovery parks it within a few passes, as a cron does: the in-flight
        # index's entry is renewed with the claim but lands on its own node, a
        # few ms after it (under load, later), so the claim may be seen ended
        # a pass before its entry is due. A child renewing the claim would keep
        # it "alive" to every pass.
        def parked() -> list[durabilis.dlq.DlqRecord]:
            records = [layer.dlq.get(i) for i in layer.recover_orphans()]
            return [r for r in records
                    if r is not None and r.metadata.get("idempotency_key") == parent_key]

        (record,) = _wait_for("recovery never parked the dead parent's claim", parked,
                              seconds=10 * LEASE)
        assert record.last_error == WORKER_LOST
        os.kill(child_pid, 0)  # (and the child lived on meanwhile)
    finally:
        if parent.is_alive():
            parent.kill()
        if child_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)


def test_a_forked_child_never_sends_its_parent_s_waiting_counts(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, fast_config(dependencies={}))
    layer._core.waits_clock = lambda: 0.0  # frozen: the keep-alive's tick never sends them
    assert layer.execute("a1", "job", "p", Counter()) == "done"
    assert layer.execute("a1", "job", "p", Counter()) == "done"  # a duplicate, counted here
    assert layer._core.waiting()
    child = multiprocessing.get_context("fork").Process(target=flush_in_child, args=(layer,))
    with warnings.catch_warnings():  # (3.12+ warns of fork() with threads running: the point)
        warnings.simplefilter("ignore", DeprecationWarning)
        child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    stats = layer.stats()  # this process's counts go now: once
    assert (stats.started, stats.succeeded, stats.duplicates) == (1, 1, 1)


def test_an_async_store_used_before_fork_is_refused_in_the_child(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """redis-py's asyncio pools do not check the pid: the parent's connections
    (their sockets) are never used by the child, which makes its own store."""
    import asyncio

    store = durabilis.aio.connect(redis_url, namespace=namespace)
    assert asyncio.run(store.ping())
    marks = f"{namespace}:test:marks"
    child = multiprocessing.get_context("fork").Process(
        target=async_store_in_child, args=(store, redis_url, namespace, marks)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    said = [m.decode() for m in raw.lrange(marks, 0, -1)]
    assert len(said) == 2 and said[1] == "own|True"
    assert said[0].startswith("refused|") and "before fork()" in said[0]


@pytest.mark.parametrize("leaves", ["sys.exit", "return", "raise"])
def test_a_child_forked_inside_fn_never_releases_or_records_its_parent_s_claim(
    store: durabilis.Store, raw: Any, leaves: str
) -> None:
    """A child forked inside ``fn`` that leaves through the layer (``sys.exit``,
    a return, an error) sends nothing for the claim: the parent, still in
    ``fn``, keeps it, and another replica's delivery meanwhile is refused."""
    layer = DurabilityLayer(store, fast_config())
    key = IdempotencyKey.from_raw(f"fork-in-fn-{leaves}")
    seen: dict[str, Any] = {}

    def fn(ctx: Any) -> str:
        before = raw.hgetall(store.keys.idem(ctx.idempotency_key))
        pid = os.fork()
        if pid == 0:  # the child: leaves through the layer's plan
            if leaves == "sys.exit":
                raise SystemExit(0)
            if leaves == "raise":
                raise durabilis.OperationError("PERMISSION_DENIED", "child")
            return "child"
        _, status = os.waitpid(pid, 0)
        seen["child_status"] = status
        seen["unchanged"] = raw.hgetall(store.keys.idem(ctx.idempotency_key)) == before
        other = Counter(result="other")
        try:
            DurabilityLayer(store, fast_config()).execute("a1", "job", {"x": 1}, other,
                                                          idempotency_key=key)
        except durabilis.OperationInProgress:
            seen["other"] = "in progress"
        seen["other_runs"] = len(other.calls)
        return "parent"

    parent = os.getpid()
    try:
        result = layer.execute("a1", "job", {"x": 1}, fn, idempotency_key=key)
    except BaseException:
        if os.getpid() != parent:
            os._exit(0)  # the child, leaving by an exception: done
        raise
    if os.getpid() != parent:
        os._exit(0)  # the child, leaving by a return: done
    assert result == "parent"
    assert seen["unchanged"], "the child changed its parent's claim"
    assert seen["other"] == "in progress" and seen["other_runs"] == 0
    layer.close()


@pytest.mark.standalone_only  # (the gate is the process's: one backend shows it)
def test_a_child_forked_inside_fn_gets_its_signal_handlers_back(store: durabilis.Store) -> None:
    """Found by an adversarial review: the child's signal gate starts at depth 0
    (a fork from another thread runs no plan in the child) and the plan the
    child was forked in then left it at -1, so the child's handlers stayed
    wrapped for good (``signal.getsignal`` answered the wrapper)."""
    layer = DurabilityLayer(store, fast_config())

    def handler(signum: int, frame: Any) -> None:
        return None

    previous = signal.signal(signal.SIGUSR1, handler)
    parent = os.getpid()
    child = 0
    try:
        def fn(ctx: Any) -> str:
            nonlocal child
            child = os.fork()
            return "child" if child == 0 else "parent"

        result = layer.execute("a1", "job", {"fork": "gate"}, fn)
        if os.getpid() != parent:  # the child, back from the plan it was forked in
            os._exit(0 if signal.getsignal(signal.SIGUSR1) is handler else 3)
        _, status = os.waitpid(child, 0)
        assert result == "parent"
        assert os.waitstatus_to_exitcode(status) == 0, "the child's handler stayed wrapped"
        assert signal.getsignal(signal.SIGUSR1) is handler
    finally:
        if os.getpid() != parent:
            os._exit(4)
        signal.signal(signal.SIGUSR1, previous)
        layer.close()
