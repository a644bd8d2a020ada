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
from tests.support.interrupts import (
    INTERRUPT_AFTER,
    PAUSE_MS,
    Interrupted,
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
