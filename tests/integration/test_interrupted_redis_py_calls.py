"""A signal handler that raises in the middle of a call redis-py makes itself
(a plan's command step, or ``fn``'s own calls through ``store.client``) never
leaves a reply for the next user of the connection, and runs when it lands,
not after ``fn`` (the review of 2026-12-06, ``/tmp/adv1_s11``: F1, F2, F3).

A reply still on its way when the connection went back was read by its next
user as its own: a plain command returned another key's value, a durable
call's claim read it and failed. The connection is now dropped when a handler
raised while redis-py had it. Each test puts a real ``SIGUSR1`` at the exact
point, against a real server; the late reply is made late by a ``BLPOP``
that waits one second."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
import redis

import durabilis
from durabilis._steps import Command, drive
from durabilis._store import _sync
from durabilis.layer import DurabilityLayer, OperationContext
from tests.integration._layer_support import fast_config
from tests.support.interrupts import Interrupted, raising_handler

pytestmark = pytest.mark.topologies("sentinel")


@pytest.fixture
def signal_after_send(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """SIGUSR1 raised once (armed) right after redis-py sent a command, before
    it reads the reply (at ``parse_response``'s entry)."""
    armed = [False]
    parse = redis.Redis.parse_response

    def parse_after_signal(self: Any, connection: Any, command_name: Any, **options: Any) -> Any:
        if armed[0]:
            armed[0] = False
            signal.raise_signal(signal.SIGUSR1)
        return parse(self, connection, command_name, **options)

    monkeypatch.setattr(redis.Redis, "parse_response", parse_after_signal)
    return armed


def _echo(store: durabilis.Store, call: str, kept: list[Any]) -> None:
    """``fn``'s own ECHO through redis-py: a plain command, or a pipeline's
    (kept in ``kept``, as a traceback would keep it)."""
    if call == "command":
        store.client.execute_command("ECHO", "x")
        return
    pipe = store.client.pipeline(transaction=False)
    kept.append(pipe)
    pipe.execute_command("ECHO", "x")
    pipe.execute()


def test_a_command_step_cut_between_its_send_and_its_read_leaves_no_reply_behind(
    store: durabilis.Store, namespace: str, signal_after_send: list[bool]
) -> None:
    key = f"{namespace}:test:nothing"

    def plan() -> Any:
        reply = yield Command(("BLPOP", key, "1"))
        return reply

    assert store.command("ECHO", "warm") == b"warm"
    signal_after_send[0] = True
    with raising_handler(), pytest.raises(Interrupted):
        drive(plan(), store)
    assert not signal_after_send[0], "the signal was never raised"
    assert store.command("ECHO", "mine") == b"mine"  # (not the BLPOP's late nil)


def test_fn_s_own_call_cut_between_its_send_and_its_read_leaves_no_reply_behind(
    store: durabilis.Store, namespace: str, signal_after_send: list[bool]
) -> None:
    key = f"{namespace}:test:nothing"
    layer = DurabilityLayer(store, fast_config(dependencies={}))

    def fn(ctx: OperationContext) -> Any:
        signal_after_send[0] = True
        return store.client.execute_command("BLPOP", key, 1)

    with raising_handler(), pytest.raises(Interrupted):
        layer.execute("a", "op", {"n": 1}, fn)
    assert not signal_after_send[0], "the signal was never raised"
    # The claim was given back (touched) on a connection of its own: its reply
    # was its own, not the BLPOP's, so the next delivery runs fn (recovered)
    # instead of finding the claim still in progress for its whole lease.
    again = layer.execute("a", "op", {"n": 1}, lambda ctx: ("ran", ctx.recovered))
    assert again == ("ran", True)
    assert store.command("ECHO", "mine") == b"mine"
    layer.close()


@pytest.mark.topologies()  # (connections are kept ready on a standalone server only)
@pytest.mark.parametrize("call", ["command", "pipeline"])
def test_a_handler_held_as_fn_s_call_gives_its_connection_back_runs_before_fn_goes_on(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """The signal lands while the pool takes the connection back (handlers
    held for its bookkeeping): the handler runs as ``release`` returns, inside
    ``fn``, which it interrupts; not after ``fn``, which a deadline is meant to
    cut (a pipeline gives its connection back from its ``reset``, which
    forgets it just after: it is forgotten first, never given back twice)."""
    pool = store.client.connection_pool
    if not isinstance(pool, _sync._ReadyPool):
        pytest.skip("connections are kept ready on a standalone server only")
    layer = DurabilityLayer(store, fast_config(dependencies={}))
    armed = [False]
    give = _sync._ReadyPool.give

    def give_after_signal(pool: Any, connection: Any) -> None:
        if armed[0]:
            armed[0] = False
            signal.raise_signal(signal.SIGUSR1)  # held: the pool is taking it back
        give(pool, connection)

    went_on: list[str] = []
    kept: list[Any] = []

    def fn(ctx: OperationContext) -> str:
        armed[0] = True
        _echo(store, call, kept)
        went_on.append("fn went on")
        return "done"

    monkeypatch.setattr(_sync._ReadyPool, "give", give_after_signal)
    with raising_handler(), pytest.raises(Interrupted):
        layer.execute("a", "op", {"n": 1}, fn)
    assert not armed[0], "the signal was never raised"
    assert went_on == []
    for pipe in kept:
        pipe.reset()  # (as its collection would)
    idle = [id(c) for c in pool._ready] + [id(c) for c in pool.pool.queue if c]
    assert len(idle) == len(set(idle)), "a connection is in the pool twice"
    layer.close()


_BUSY = """
local t = redis.call('TIME')
local began = t[1] * 1000000 + t[2]
repeat
  t = redis.call('TIME')
until t[1] * 1000000 + t[2] - began > 400000
return 1
"""


def test_a_connection_fn_s_pipeline_gives_back_after_the_plan_still_goes_if_a_handler_cut_it(
    store: durabilis.Store, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fn``'s WATCH pipeline is cut between a command's send and its read,
    and outlives the plan (as in the traceback of the exception). When it is
    reset later, it reads the late reply as its UNWATCH's and gives the
    connection back with UNWATCH's own reply still on its way (the server is
    busy a moment). That connection is dropped, not handed to the next user:
    the plan that knew a handler had raised is over, but the note is kept."""
    layer = DurabilityLayer(store, fast_config(dependencies={}))
    key = f"{namespace}:test:watched"
    armed = [False]
    parse = redis.client.Pipeline.parse_response

    def parse_after_signal(self: Any, connection: Any, command_name: Any, **options: Any) -> Any:
        if armed[0] and command_name == "GET":
            armed[0] = False
            signal.raise_signal(signal.SIGUSR1)  # the GET sent, its reply not read
        return parse(self, connection, command_name, **options)

    kept: list[Any] = []

    def fn(ctx: OperationContext) -> str:
        pipe = store.client.pipeline()
        kept.append(pipe)
        pipe.watch(key)
        armed[0] = True
        pipe.get(key)
        return "never"

    monkeypatch.setattr(redis.client.Pipeline, "parse_response", parse_after_signal)
    with raising_handler(), pytest.raises(Interrupted):
        layer.execute("a", "op", {"n": 1}, fn)
    assert not armed[0], "the signal was never raised"
    monkeypatch.undo()
    ran: list[Any] = []
    busy = threading.Thread(target=lambda: ran.append(store.client.eval(_BUSY, 0)))
    busy.start()
    try:
        time.sleep(0.1)  # (the server is in the busy script now)
        kept.pop().reset()  # UNWATCH: reads the GET's reply, its own still to come
        assert store.command("ECHO", "mine") == b"mine"
    finally:
        busy.join()
    assert ran == [1], "the server was never kept busy"
    layer.close()


@pytest.mark.parametrize("keeps", ["watch", "pubsub"])
def test_a_connection_fn_keeps_out_holds_no_handler_back(
    store: durabilis.Store, keeps: str
) -> None:
    """``fn`` keeps a connection out of the pool (a WATCH, a pub/sub); a signal
    that lands meanwhile runs at once, not when that connection is next used
    or given back."""
    layer = DurabilityLayer(store, fast_config(dependencies={}))
    went_on: list[str] = []

    def fn(ctx: OperationContext) -> str:
        if keeps == "watch":
            kept: Any = store.client.pipeline()
            kept.watch("{w}:k")
        else:
            kept = store.client.pubsub()
            kept.subscribe("nobody-publishes")
        try:
            signal.raise_signal(signal.SIGUSR1)
            went_on.append("fn went on")
        finally:
            kept.reset()
        return "done"

    with raising_handler(), pytest.raises(Interrupted):
        layer.execute("a", "op", {"keeps": keeps}, fn)
    assert went_on == []
    layer.close()


@pytest.mark.parametrize("call", ["command", "pipeline"])
def test_fn_s_own_call_interrupted_as_redis_py_took_its_connection_loses_none(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """Inside ``fn``, redis-py takes the connection before its ``try``; a
    handler raising right there lost it for good (three retried deadlines
    emptied a pool of three: every later call waited, then failed; the review
    ``/tmp/adv3_s11`` F1, also on 5d34f23). A call that gives its connection
    back before it returns is lent with the handlers held: the handler runs
    in its ``try`` (before anything is sent), the connection goes back, and
    ``fn`` does not go on."""
    layer = DurabilityLayer(store, fast_config(dependencies={}))
    pool = store.client.connection_pool
    armed = [False]
    monotonic = time.monotonic

    class _Time:  # redis-py reads the clock just after it took the connection
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def monotonic(self) -> float:
            if armed[0]:
                armed[0] = False
                signal.raise_signal(signal.SIGUSR1)
            return monotonic()

    went_on: list[str] = []

    def fn(ctx: OperationContext) -> str:
        armed[0] = True
        _echo(store, call, [])
        went_on.append("fn went on")
        return "done"

    monkeypatch.setattr(redis.client, "time", _Time())
    with raising_handler(), pytest.raises(Interrupted):
        layer.execute("a", "op", {"n": 1}, fn)
    monkeypatch.undo()
    assert not armed[0], "the signal was never raised"
    assert went_on == []
    if isinstance(pool, _sync._ReadyPool) or hasattr(pool, "pool"):
        idle = {id(c) for c in getattr(pool, "_ready", ())} | {
            id(c) for c in pool.pool.queue if c}
        assert {id(c) for c in pool._connections} <= idle, "a connection is out of the pool"
    assert layer.execute("a", "op", {"n": 1}, lambda ctx: "again") == "again"
    layer.close()
