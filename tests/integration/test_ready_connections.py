"""A standalone store's pool keeps the connections given back ready in front of
its queue (no pool round per script, ``durabilis._store._sync._ReadyPool``), and that
changes nothing a caller can see: a reply left unread is never paired with the
next command, a connection the server closed is replaced before use, a forked
child never uses its parent's socket, ``max_connections`` still bounds the
connections (and a caller waiting for one gets it), and ``close()`` closes them
all. Real server, real processes."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

import durabilis
from durabilis._store import _ReadyPool
from durabilis.layer import DurabilityLayer


def _ready(store: durabilis.Store) -> list[Any]:
    pool = store.client.connection_pool
    if not isinstance(pool, _ReadyPool):
        pytest.skip("connections are kept ready on a standalone server only")
    return pool._ready


def test_a_reply_not_read_is_never_paired_with_the_next_command(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """A command that times out leaves its reply unread: that connection is
    dropped (the server unblocks its command), and the next command gets its
    own reply, not the late one."""
    key = f"{namespace}:test:list"
    with durabilis.connect(redis_url, namespace=namespace, socket_timeout=0.3) as store:
        _ready(store)
        assert store._send("ECHO", "warm") == b"warm"
        with pytest.raises(Exception, match=r"(?i)timeout|timed out"):
            store._send("BLPOP", key, 5)
        raw.lpush(key, "late")
        assert store._send("ECHO", "mine") == b"mine"
        # The dropped connection's BLPOP is gone with it: it took nothing.
        assert raw.lrange(key, 0, -1) == [b"late"]


def test_a_connection_the_server_closed_is_replaced_before_use(
    store: durabilis.Store, raw: Any
) -> None:
    _ready(store)
    layer = DurabilityLayer(store)
    assert layer.execute("a", "op", {"n": 1}, lambda ctx: "one") == "one"
    mine = store._send("CLIENT", "ID")
    raw.client_kill_filter(_id=mine)
    assert layer.execute("a", "op", {"n": 2}, lambda ctx: "two") == "two"
    assert store._send("CLIENT", "ID") != mine
    layer.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform")
def test_a_forked_child_never_uses_its_parent_s_ready_connection(store: durabilis.Store) -> None:
    ready = _ready(store)
    parent = store._send("CLIENT", "ID")
    assert ready
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own connection, the parent's left alone
        code = 1
        try:
            child = store._send("CLIENT", "ID")
            empty = store.client.connection_pool._ready == [] or all(
                c.pid == os.getpid() for c in store.client.connection_pool._ready
            )
            os.write(write, f"{int(empty)} {child}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    empty, child = seen.split()
    assert empty == "1" and int(child) != parent
    assert store._send("CLIENT", "ID") == parent  # still the parent's, still in step


def test_close_closes_the_ready_connections(redis_url: str, namespace: str, raw: Any) -> None:
    store = durabilis.connect(redis_url, namespace=namespace)
    _ready(store)
    mine = store._send("CLIENT", "ID")
    assert any(int(c["id"]) == mine for c in raw.client_list())
    store.close()
    assert not any(int(c["id"]) == mine for c in raw.client_list())


def test_threads_share_the_ready_connections(store: durabilis.Store) -> None:
    """Concurrent durable calls each get a connection of their own (one ready
    connection is never used by two commands at once), and each its own result."""
    ready = _ready(store)
    layer = DurabilityLayer(store)
    results: dict[int, list[Any]] = {}

    def work(t: int) -> None:
        results[t] = [
            layer.execute("a", "op", {"t": t, "i": i}, lambda ctx, t=t, i=i: (t, i))
            for i in range(50)
        ]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == {t: [(t, i) for i in range(50)] for t in range(8)}
    assert 1 <= len(ready) <= 8
    layer.close()


@pytest.mark.parametrize("connections", [1, 2])
def test_max_connections_still_bounds_them_and_waiters_get_one(
    redis_url: str, namespace: str, connections: int
) -> None:
    """With a pool of one or two connections, durable calls from six threads,
    pipelines (``stats``) and plain commands all get a connection: one kept
    ready is never out of reach of a caller waiting in the pool's queue."""
    with durabilis.connect(
        redis_url, namespace=namespace, max_connections=connections
    ) as store:
        _ready(store)
        layer = DurabilityLayer(store)
        failures: list[BaseException] = []

        def work(t: int) -> None:
            try:
                for i in range(30):
                    assert layer.execute("a", "op", {"t": t, "i": i}, lambda ctx, i=i: i) == i
                    if i % 10 == 0:
                        layer.stats()
                        assert store.command("PING")
            except BaseException as exc:  # (reported below)
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert failures == []
        assert len(store.client.connection_pool._connections) <= connections
        layer.close()


def test_numbers_reach_the_c_packer_as_bytes_never_as_numbers(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hiredis' C packer does not check the conversion of a number to text: a
    signal handler raising during it (Ctrl-C, a SIGTERM handler calling
    sys.exit) crashed the process (SIGSEGV). The store turns every number into
    the bytes redis-py's encoder makes before packing: the packer only ever
    sees str and bytes, and the server gets the same command."""
    import durabilis._store._sync as store_module

    _ready(store)
    packer = store_module._PACK
    if packer is None:
        pytest.fail("hiredis is part of the test extras: its packer must be in use")
    seen: list[tuple[type, ...]] = []

    def recording(args: tuple[Any, ...]) -> bytes:
        seen.append(tuple(type(a) for a in args))
        return packer(args)  # type: ignore[no-any-return]

    monkeypatch.setattr(store_module, "_PACK", recording)
    layer = DurabilityLayer(store)
    assert layer.execute("a", "op", {"n": 1}, lambda ctx: 7) == 7
    assert store._send("ECHO", 12) == b"12"
    assert store._send("ECHO", 1.5) == b"1.5"
    layer.close()
    assert seen and all(t in (str, bytes) for types in seen for t in types), seen


def test_health_check_interval_is_honoured_on_a_ready_connection(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """``?health_check_interval=N``: a connection idle longer than N seconds is
    checked with a PING before its next command, as redis-py does."""
    import time

    def pings() -> int:
        return int(raw.info("commandstats").get("cmdstat_ping", {}).get("calls", 0))

    with durabilis.connect(f"{redis_url}?health_check_interval=1", namespace=namespace) as store:
        _ready(store)
        assert store._send("ECHO", "warm") == b"warm"
        before = pings()
        time.sleep(1.3)  # idle past the interval (the behaviour under test is time itself)
        assert store._send("ECHO", "again") == b"again"
        assert pings() > before


def test_an_error_reply_keeps_the_connection_and_a_push_is_not_a_reply(
    store: durabilis.Store, namespace: str
) -> None:
    """The store reads a reply from the parser itself: an error reply is raised
    and leaves the connection in step (the next command on it gets its own
    reply), and a push message (RESP3) that comes before a reply is handed to
    the parser's handler, never taken for the reply."""
    _ready(store)
    mine = store._send("CLIENT", "ID")
    with pytest.raises(Exception, match=r"(?i)unknown command"):
        store._send("NOSUCHCOMMAND", "x")
    assert store._send("CLIENT", "ID") == mine  # the same connection, in step
    conn = store.client.connection_pool._ready[-1]
    if str(conn.protocol) != "3":
        pytest.skip("push messages need RESP3")
    key = f"{namespace}:test:tracked"
    assert store._send("CLIENT", "TRACKING", "ON") == b"OK"
    store._send("GET", key)  # tracked by this connection
    # Our own write invalidates what we read: Redis sends the invalidation (a
    # push) on this connection, next to the SET's reply. Each command still
    # gets its own reply (a connection left with a push unread is replaced).
    assert store._send("SET", key, "v") == b"OK"
    assert store._send("ECHO", "mine") == b"mine"
    assert store._send("GET", key) == b"v"
