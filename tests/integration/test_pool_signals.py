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

import contextlib
import gc
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import redis

import durabilis
from durabilis import _signal_gate
from durabilis._signal_gate import GATE
from durabilis._steps import Batch, Command, drive
from durabilis._store import _sync, _wave
from durabilis._store._held import HeldPool
from durabilis.layer import DurabilityLayer, OperationContext
from tests.integration._layer_support import fast_config
from tests.support.interrupts import (
    Interrupted,
    InterruptedAgain,
    claim,
    raising_handler,
    signal_as_it_starts,
    signal_in,
)

pytestmark = pytest.mark.topologies("sentinel")


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
            with raising_handler(), pytest.raises(Interrupted):
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
        with raising_handler(), pytest.raises(Interrupted):
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
            with raising_handler(), pytest.raises(Interrupted):
                timer.start()
                layer.execute("a", "op", {"n": 1}, lambda ctx: "never")
            waited = time.monotonic() - started
        finally:
            timer.cancel()
            busy.join()
        assert waited < 1.5, f"the wait went on {waited:.1f} s after the signal"
        assert layer.execute("a", "op", {"n": 1}, lambda ctx: "ran") == "ran"
        layer.close()


def test_a_handler_raising_as_a_plan_starts_leaves_the_gate_open(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal lands inside the gate's ``enter`` before the handlers are
    wrapped (the outermost plan's start): the call is interrupted, and the
    gate is left as it was, open (once left closed, a later Ctrl-C held back
    during a record was never raised when that call ended)."""
    layer = _layer(store)
    assert layer.execute("a", "op", {"n": 0}, lambda ctx: "warm") == "warm"
    real = _signal_gate._get_ident
    armed = [True]

    def ident_then_signal() -> int:
        got = real()
        if armed[0] and sys._getframe(1).f_code.co_name == "enter":
            armed[0] = False
            signal.raise_signal(signal.SIGUSR1)  # a raw handler: runs here
        return got

    monkeypatch.setattr(_signal_gate, "_get_ident", ident_then_signal)
    with raising_handler():
        with pytest.raises(Interrupted):
            layer.execute("a", "op", {"n": 1}, lambda ctx: "never")
        assert not armed[0], "the signal was never raised in enter"
        monkeypatch.setattr(_signal_gate, "_get_ident", real)
        assert (GATE.closed, GATE.depth) == (False, 0)
        assert layer.execute("a", "op", {"n": 1}, lambda ctx: "ran") == "ran"
    layer.close()


def test_the_main_thread_waiting_for_a_connection_keeps_its_place_in_line(
    redis_url: str, namespace: str
) -> None:
    """With one connection and two worker threads making durable calls, the
    main thread's calls (inside open steps: its wait for a free connection
    lets the handlers run between short spans) get a connection as often as
    the workers', and none times out. (Polling beside the queue's waiters, it
    got 20 calls to a worker's ~3,000 in 8 s, and 5 of them failed.)"""
    # (A wait for the connection gives up after socket_timeout: 5 s, far past a
    # fair turn, so that a loaded machine starving every thread fails no call.)
    with durabilis.connect(redis_url, namespace=namespace, max_connections=1,
                           socket_timeout=5) as store:
        _pool(store)
        layer = _layer(store)
        stop = time.monotonic() + 2.0
        counts = {"main": 0, "w0": 0, "w1": 0}
        errors: list[str] = []

        def work(who: str) -> None:
            i = 0
            while time.monotonic() < stop:
                i += 1
                try:
                    layer.execute("a", "op", {"who": who, "i": i}, lambda ctx: "ok")
                    counts[who] += 1
                except Exception as exc:  # (reported below)
                    errors.append(f"{who}: {exc!r}")

        workers = [threading.Thread(target=work, args=(w,)) for w in ("w0", "w1")]
        for th in workers:
            th.start()
        with raising_handler():  # (a handler, so that the main thread's steps hold it)
            work("main")
        for th in workers:
            th.join()
        assert not [e for e in errors if e.startswith("main")], errors
        assert counts["main"] * 5 >= min(counts["w0"], counts["w1"]), counts
        layer.close()


def test_the_scripts_are_read_when_the_store_is_made_not_in_a_step(redis_url: str) -> None:
    """Reading the shipped Lua sources takes importlib's module locks; a
    handler raising inside the open claim step while one was held left it held
    (every thread then hung on its next import). They are read when the first
    store is made."""
    code = (
        "import sys, durabilis, durabilis._scripts as s\n"
        "assert s.sources.cache_info().currsize == 0, 'read at import'\n"
        "store = durabilis.connect(sys.argv[1], namespace='scripts-read')\n"
        "assert s.sources.cache_info().currsize == 1, 'not read when the store was made'\n"
        "store.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", code, redis_url], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


class CallTimeout(Exception):
    """What a ``SIGALRM`` deadline's handler raises (an ``Exception``)."""


def test_a_handler_s_exception_swallowed_below_the_store_still_interrupts_the_step(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler's ``Exception`` raised during the claim step and caught by
    code below the store (redis-py's Cluster client asks the next node for the
    slot map when one fails) interrupts the step all the same: the claim goes
    back and the caller gets its timeout, ``fn`` never runs. (Before, the call
    went on as if no alarm had fired.)"""
    layer = _layer(store)
    assert layer.execute("a", "op", {"n": 0}, lambda ctx: "warm") == "warm"
    armed = [True]
    check = durabilis.Store._check_acks

    def check_swallowing(self: durabilis.Store) -> None:
        if armed[0]:
            armed[0] = False
            with contextlib.suppress(CallTimeout):  # (code that swallows it)
                signal.raise_signal(signal.SIGUSR1)  # its handler raises here
        check(self)

    runs: list[str] = []
    monkeypatch.setattr(durabilis.Store, "_check_acks", check_swallowing)
    with raising_handler(CallTimeout), pytest.raises(CallTimeout):
        layer.execute("a", "op", {"n": 1}, lambda ctx: runs.append("ran") or "done")
    assert not armed[0], "the signal was never raised in the claim step"
    assert runs == []
    assert layer.execute("a", "op", {"n": 1}, lambda ctx: runs.append("ran") or "done") == "done"
    assert runs == ["ran"]
    layer.close()


@pytest.mark.topologies()  # (connections are kept ready on a standalone server only)
def test_a_handler_held_while_redis_py_takes_a_connection_runs_before_the_command_is_sent(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On redis-py's own path (here a plain command step of a plan: redis-py's
    ``execute_command`` takes and gives back the connection), a signal that
    lands while the pool takes a connection runs as the pool hands it over,
    and the connection goes back: nothing is sent. (Held until the
    connection's release, it waited for the whole reply: up to the socket
    timeout on a paused server.)"""
    pool = _pool(store)
    assert store.command("PING")  # (a connection kept ready)
    inside = [False]
    armed = [True]
    sent: list[str] = []
    handled: list[str] = []
    execute = redis.Redis.execute_command
    in_step = _sync._in_step
    send = redis.connection.AbstractConnection.send_packed_command

    def execute_here(self: Any, *args: Any, **kwargs: Any) -> Any:
        inside[0] = True
        try:
            return execute(self, *args, **kwargs)
        finally:
            inside[0] = False

    def in_step_then_signal(conn: Any) -> bool:
        ready = in_step(conn)
        if armed[0] and inside[0]:
            armed[0] = False
            signal.raise_signal(signal.SIGUSR1)  # held: the pool is taking a connection
        return ready

    def sending(conn: Any, *args: Any, **kwargs: Any) -> None:
        if not armed[0] and not handled:
            sent.append("sent between the signal and its handler")
        send(conn, *args, **kwargs)

    def handler(signum: int, frame: Any) -> None:
        handled.append("ran")
        raise Interrupted

    def plan() -> Any:
        reply = yield Command(("ECHO", "x"))
        return reply

    monkeypatch.setattr(redis.Redis, "execute_command", execute_here)
    monkeypatch.setattr(_sync, "_in_step", in_step_then_signal)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", sending)
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with pytest.raises(Interrupted):
            drive(plan(), store)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not armed[0], "the signal was never raised on redis-py's path"
    assert handled == ["ran"]
    assert sent == []
    idle = {id(c) for c in pool._ready} | {id(c) for c in pool.pool.queue if c}
    assert {id(c) for c in pool._connections} <= idle, "a connection is out of the pool"
    assert drive(plan(), store) == b"x"


# --- redis-py's own paths: a connection lent with the handlers held -------------------


def _all_idle(pool: Any) -> bool:
    """Whether every connection the pool made is back in it."""
    idle = {id(c) for c in getattr(pool, "_ready", ())} | {id(c) for c in pool.pool.queue if c}
    return {id(c) for c in pool._connections} <= idle


class _SignalAfterTake:
    """``redis.client``'s ``time`` module, whose ``monotonic`` raises SIGUSR1 once
    (armed): redis-py calls it just after it took its connection, before its
    ``try`` (a plain command's ``_execute_command``, a pipeline's ``execute``)."""

    def __init__(self) -> None:
        self.armed = True

    def monotonic(self) -> float:
        if self.armed:
            self.armed = False
            signal.raise_signal(signal.SIGUSR1)  # its handler runs here
        return time.monotonic()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _command_plan() -> Any:
    reply = yield Command(("ECHO", "x"))
    return reply


def test_a_handler_raising_as_redis_py_took_a_command_s_connection_loses_none(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain command step (DLQ and breaker reads): redis-py takes the
    connection before its ``try``, and a handler raising right there lost it
    for good (the fourth review of 2026-12-06, F1: two of them exhausted a pool
    of two). Lent with the handlers held, the connection is in redis-py's
    ``try`` when the handler runs (before anything is sent), and goes back."""
    pool = _pool(store)
    assert drive(_command_plan(), store) == b"x"
    shim = _SignalAfterTake()
    monkeypatch.setattr(redis.client, "time", shim)
    with raising_handler(), pytest.raises(Interrupted):
        drive(_command_plan(), store)
    assert not shim.armed, "the signal was never raised on redis-py's path"
    assert _all_idle(pool), "a connection is out of the pool"
    assert not GATE.closed and not GATE.holding and not GATE.lent
    assert drive(_command_plan(), store) == b"x"


def test_a_handler_raising_as_a_pipeline_took_its_connection_loses_none_and_sends_nothing(
    store: durabilis.Store, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a Batch step (a pipeline of scripts): the handler runs
    before the pipeline is written, so no claim is made, and the connection
    goes back."""
    pool = _pool(store)
    call = claim(store, "batch-take")
    shim = _SignalAfterTake()

    def plan() -> Any:
        replies = yield Batch([call])
        return replies

    monkeypatch.setattr(redis.client, "time", shim)
    with raising_handler(), pytest.raises(Interrupted):
        drive(plan(), store)
    assert not shim.armed, "the signal was never raised on redis-py's path"
    assert _all_idle(pool), "a connection is out of the pool"
    assert store.command("EXISTS", call.keys[0]) == 0, "the claim was sent"
    monkeypatch.undo()
    assert drive(plan(), store)[0][0] == b"new"


def test_a_handler_raising_as_redis_py_gives_a_connection_back_loses_none(
    store: durabilis.Store,
) -> None:
    """The signal lands at the very entry of the pool's ``release`` (redis-py's
    ``finally``), before any of its code runs: the connection is given back,
    and the handler runs just after (the command's reply was read)."""
    pool = _pool(store)
    assert drive(_command_plan(), store) == b"x"
    with raising_handler(), pytest.raises(Interrupted), \
            signal_as_it_starts(HeldPool.release.__code__) as armed:
        drive(_command_plan(), store)
    assert not armed[0], "the signal was never raised at release"
    assert _all_idle(pool), "a connection is out of the pool"
    assert not GATE.closed and not GATE.holding and not GATE.lent
    assert drive(_command_plan(), store) == b"x"


def test_a_handler_held_as_a_pipeline_gives_its_connection_back_never_gives_it_twice(
    store: durabilis.Store,
) -> None:
    """A Batch step's pipeline gives its connection back in its ``reset``, and
    forgets it just after. The handler held back meanwhile runs at the end of
    the step, not as the connection is given back: raised there, it skipped
    the forgetting, the pipeline's collection gave the connection back a
    second time, and two callers then shared one connection."""
    pool = _pool(store)
    call = claim(store, "batch-give")

    def plan() -> Any:
        replies = yield Batch([call])
        return replies

    assert store.run_many([claim(store, "batch-warm")])[0][0] == b"new"  # (acks checked)
    with raising_handler(), pytest.raises(Interrupted), \
            signal_as_it_starts(HeldPool.release.__code__) as armed:
        drive(plan(), store)
    assert not armed[0], "the signal was never raised at release"
    gc.collect()  # (a pipeline left holding its connection gives it back here)
    idle = [id(c) for c in getattr(pool, "_ready", ())] + [id(c) for c in pool.pool.queue if c]
    assert len(idle) == len(set(idle)), "a connection is in the pool twice"
    assert _all_idle(pool), "a connection is out of the pool"
    assert store.command("HGET", call.keys[0], "s") == b"p"  # (the claim ran: interrupted after)


def test_a_second_interruption_as_a_reply_is_waited_for_leaves_it_to_no_other_command(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """A first interruption cuts a command's read (Redis busy); the store waits
    for that reply (so that a compensation never overtakes it), and a second
    one lands there (a second Ctrl-C): the connection is dropped, not given
    back with the reply on its way, which the next command read as its own
    (the claim's release read the claim's reply: the second review of
    2026-12-06, F3)."""
    with durabilis.connect(redis_url, namespace=namespace) as store:
        _pool(store)
        assert store._send("ECHO", "warm") == b"warm"
        timer = threading.Timer(0.15, os.kill, (os.getpid(), signal.SIGUSR1))
        with (
            raising_handler(Interrupted, signal.SIGUSR1),
            raising_handler(InterruptedAgain, signal.SIGUSR2),
            signal_as_it_starts(_wave._wait_out.__code__, signal.SIGUSR2) as armed,
        ):
            raw.client_pause(1000, all=True)  # (every command waits: "first"'s reply too)
            timer.start()
            try:
                with pytest.raises(InterruptedAgain):
                    store._send("ECHO", "first")
            finally:
                timer.join()
            assert not armed[0]  # (the second one landed as the first one's reply was waited for)
        # Redis still paused: the next command's reply is the one it reads.
        assert store._send("ECHO", "second") == b"second"


@pytest.mark.standalone_only  # (the ready pool's own reply read: the tracer's point)
def test_an_interruption_just_after_a_reply_was_read_does_not_wait_for_another(
    redis_url: str, namespace: str
) -> None:
    """An interruption landing just after the reply was read whole (in the
    store's own reply check): the store waits for what is still due before it
    goes on, and nothing is: it goes on at once, not after a socket timeout
    (or never, without one) waiting for a reply that was already read (the
    third review of 2026-12-06, F1)."""
    lines, first = inspect.getsourcelines(_sync._read_reply)
    at = first + next(i for i, line in enumerate(lines) if "if isinstance(reply," in line)
    with durabilis.connect(redis_url, namespace=namespace, socket_timeout=30) as store:
        _pool(store)
        assert store._send("ECHO", "warm") == b"warm"
        with (
            raising_handler(Interrupted, signal.SIGUSR1),
            signal_in(_sync._read_reply.__code__, line=at) as armed,
        ):
            began = time.monotonic()
            with pytest.raises(Interrupted):
                store._send("ECHO", "read")
            took = time.monotonic() - began
        assert not armed[0]  # (it landed there)
        assert took < 10, took  # (not the 30 s socket timeout)
        assert store._send("ECHO", "next") == b"next"
