"""A signal handler that raises while the pool takes or gives back a connection
leaves the pool as it was (the third review of 2026-12-05, F3).

The sync driver lets the main thread's handlers run during an open step (a
Ctrl-C cuts a blocked read), and a pool's bookkeeping is not safe against an
exception raised between two bytecodes: one raised just after ``Queue.get``
took its lock left the lock held, and every later call waited on it forever;
one raised just after a ready connection was taken lost it. Each test puts
the signal at that very bytecode (a real ``SIGUSR1``, raised there) in a durable
call on the main thread, against a real server."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import durabilis
from durabilis._store import _sync
from durabilis._store._held import HeldPool
from durabilis.layer import DurabilityLayer, OperationContext
from tests.integration._layer_support import fast_config

pytestmark = pytest.mark.topologies("sentinel")


class Interrupted(BaseException):
    """What the test's handler raises (as KeyboardInterrupt would)."""


@contextmanager
def _raising_handler() -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _pool(store: durabilis.Store) -> Any:
    pool = store.client.connection_pool
    if not isinstance(pool, HeldPool):
        pytest.skip("a Cluster store's nodes have pools of redis-py's own")
    return pool


def _layer(store: durabilis.Store) -> DurabilityLayer:
    return DurabilityLayer(store, fast_config(dependencies={}))


def test_a_handler_raising_as_the_queue_takes_its_lock_leaves_the_queue_usable(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal lands just after the pool's queue acquired its lock (inside
    ``Condition.__enter__``, before the ``with`` block holds it): the durable
    call is interrupted, the lock is free, and the next call runs ``fn`` once."""
    with durabilis.connect(redis_url, namespace=namespace) as store:
        queue = _pool(store).pool  # (a fresh pool: its first connection comes from the queue)
        layer = _layer(store)
        armed = [True]
        enter = threading.Condition.__enter__

        def enter_then_signal(cond: threading.Condition) -> bool:
            taken = enter(cond)
            if armed[0] and cond is queue.not_empty:
                armed[0] = False
                signal.raise_signal(signal.SIGUSR1)  # its handler runs here, lock held
            return taken

        runs: list[str] = []

        def fn(ctx: OperationContext) -> str:
            runs.append(ctx.idempotency_key)
            return "done"

        monkeypatch.setattr(threading.Condition, "__enter__", enter_then_signal)
        try:
            with _raising_handler(), pytest.raises(Interrupted):
                layer.execute("a", "op", {"n": 1}, fn)
            assert not armed[0], "the signal was never raised inside the queue"
            assert not queue.mutex.locked(), "the queue's lock was left held"
        finally:
            if queue.mutex.locked():  # (else every later test on this pool hangs)
                queue.mutex.release()
        assert layer.execute("a", "op", {"n": 1}, fn) == "done"
        assert layer.execute("a", "op", {"n": 1}, fn) == "done"  # (a duplicate)
        assert len(runs) == 1
        layer.close()


@pytest.mark.topologies()  # (connections are kept ready on a standalone server only)
def test_a_handler_raising_just_after_a_connection_is_taken_loses_no_connection(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal lands just after a ready connection was taken (while the
    pool checks it): the call is interrupted and the connection is back."""
    with durabilis.connect(redis_url, namespace=namespace) as store:
        pool = _pool(store)
        if not isinstance(pool, _sync._ReadyPool):
            pytest.skip("connections are kept ready on a standalone server only")
        layer = _layer(store)
        assert layer.execute("a", "op", {"n": 0}, lambda ctx: "warm") == "warm"
        assert pool._ready, "a connection is kept ready after a call"
        armed = [True]
        in_step = _sync._in_step

        def in_step_then_signal(conn: Any) -> bool:
            ready = in_step(conn)
            if armed[0]:
                armed[0] = False
                signal.raise_signal(signal.SIGUSR1)  # the connection is out of the list
            return ready

        monkeypatch.setattr(_sync, "_in_step", in_step_then_signal)
        with _raising_handler(), pytest.raises(Interrupted):
            layer.execute("a", "op", {"n": 1}, lambda ctx: "never")
        assert not armed[0], "the signal was never raised in the pool"
        idle = {id(c) for c in pool._ready} | {id(c) for c in pool.pool.queue if c}
        assert {id(c) for c in pool._connections} <= idle, "a connection is out of the pool"
        assert layer.execute("a", "op", {"n": 1}, lambda ctx: "ran") == "ran"
        layer.close()


def test_a_ctrl_c_while_waiting_for_a_free_connection_cuts_the_wait(
    redis_url: str, namespace: str
) -> None:
    """With the pool's one connection busy, a durable call on the main thread
    waits for it (up to the socket timeout); a signal meanwhile interrupts the
    wait at once, and the pool is whole afterwards."""
    with durabilis.connect(redis_url, namespace=namespace, max_connections=1,
                           socket_timeout=5) as store:
        _pool(store)
        layer = _layer(store)
        assert layer.execute("a", "op", {"n": 0}, lambda ctx: "warm") == "warm"
        busy = threading.Thread(  # holds the one connection for 2 s
            target=store._send, args=("BLPOP", f"{namespace}:nothing", 2)
        )
        busy.start()
        time.sleep(0.2)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
        started = time.monotonic()
        try:
            with _raising_handler(), pytest.raises(Interrupted):
                timer.start()
                layer.execute("a", "op", {"n": 1}, lambda ctx: "never")
            waited = time.monotonic() - started
        finally:
            timer.cancel()
            busy.join()
        assert waited < 1.5, f"the wait went on {waited:.1f} s after the signal"
        assert layer.execute("a", "op", {"n": 1}, lambda ctx: "ran") == "ran"
        layer.close()
