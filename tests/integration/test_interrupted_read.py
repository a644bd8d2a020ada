"""An interruption while a script's reply is awaited waits for that script.

A script written to Redis runs whether or not its reply is read. When Ctrl-C
(or a ``SystemExit`` from a signal handler) lands while the store waits for
the reply of a claim, the plan gives the claim back on another connection.
If the interruption came out at once, that release could reach Redis before
the claim ran (a busy or paused server) and the claim would then be held by
nobody for a whole lease. So the store waits for the reply (one socket
timeout at most) before the interruption goes on: when the caller sees it,
the claim has run. Found by the fifth review (Cluster waves); the standalone
send had the same gap.

The server is paused for writes (``CLIENT PAUSE ... WRITE``) for longer than
the interruption takes to arrive; reads go on meanwhile, so the test can look.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

import durabilis
from durabilis._server import RedisServer
from durabilis.errors import NotReplicated
from tests.support.interrupts import (
    INTERRUPT_AFTER,
    PAUSE_MS,
    Interrupted,
    InterruptedAgain,
    claim,
    interrupted_after,
    state,
)


@pytest.mark.standalone_only  # its own server (paused for writes)
def test_an_interrupted_script_reply_is_waited_for_before_the_interruption_goes_on(
    private_redis: RedisServer, namespace: str
) -> None:
    store = durabilis.connect(private_redis.url, namespace=namespace, socket_timeout=5)
    raw: Any = redis.Redis.from_url(private_redis.url)
    try:
        store.run(claim(store, "warm"))  # connected, scripts loaded
        raw.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        with interrupted_after(INTERRUPT_AFTER), pytest.raises(Interrupted):
            store.run(claim(store, "paused"))
        # The claim ran before the interruption came out (before: still queued).
        assert state(raw, store, "paused") == b"p"
        assert store.run(claim(store, "after"))[0] == b"new"  # the store goes on
    finally:
        raw.execute_command("CLIENT", "UNPAUSE")
        raw.close()
        store.close()


@pytest.mark.standalone_only
def test_a_second_interruption_stops_the_wait_and_goes_on(
    private_redis: RedisServer, namespace: str
) -> None:
    """Found by the review of the wait: the first version swallowed an
    interruption that came during it (a SIGTERM's sys.exit after a Ctrl-C
    was lost). Now it stops the wait and goes on, the first as its context."""
    store = durabilis.connect(private_redis.url, namespace=namespace, socket_timeout=5)
    raw: Any = redis.Redis.from_url(private_redis.url)
    try:
        store.run(claim(store, "warm"))
        raw.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        with interrupted_after(INTERRUPT_AFTER, again=2 * INTERRUPT_AFTER), pytest.raises(
            InterruptedAgain
        ) as again:
            store.run(claim(store, "paused"))
        assert isinstance(again.value.__context__, Interrupted)
        assert state(raw, store, "paused") is None  # (not waited for: still paused)
    finally:
        raw.execute_command("CLIENT", "UNPAUSE")
        raw.close()
        store.close()
    # ...and the store goes on: its next call gets its own reply.
    store = durabilis.connect(private_redis.url, namespace=namespace, socket_timeout=5)
    try:
        assert store.run(claim(store, "after"))[0] == b"new"
    finally:
        store.close()


@pytest.mark.standalone_only
def test_an_interrupted_acked_script_is_waited_for_with_its_wait(
    private_redis: RedisServer, namespace: str
) -> None:
    """Under ``acks="replicas:N"`` a script goes with its ``WAIT`` on one
    connection: interrupted while their replies are awaited, both are read
    before the interruption goes on (found by the review of the wait: this
    path dropped the connection at once). No replica here: WAIT answers 0
    after its timeout (the claim then counts as unconfirmed, not undone)."""
    store = durabilis.connect(
        private_redis.url, namespace=namespace, socket_timeout=5, acks="replicas:1",
        acks_timeout=0.2,
    )
    raw: Any = redis.Redis.from_url(private_redis.url)
    try:
        with pytest.raises(NotReplicated):
            store.run(claim(store, "warm"))  # (connected, scripts loaded)
        raw.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        with interrupted_after(INTERRUPT_AFTER), pytest.raises(Interrupted):
            store.run(claim(store, "paused"))
        assert state(raw, store, "paused") == b"p"  # (before: still queued)
    finally:
        raw.execute_command("CLIENT", "UNPAUSE")
        raw.close()
        store.close()
