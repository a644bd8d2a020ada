"""The happy path of a durable call costs two round trips to Redis (standalone and Cluster).

On Redis Cluster the scripts of one step go in waves (their keys live in
different slots; docs/layer.md, "Round trips"): the test asserts the
documented cluster figures there, round trips one after another and requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.connection

import durabilis
import durabilis._store._sync
from durabilis import IdempotencyConfig
from durabilis.core.layer import DUPLICATES_FLUSH_SECONDS
from durabilis.layer import DurabilityLayer
from tests.integration._layer_support import Counter, fast_config

pytestmark = pytest.mark.topologies("cluster")

# (Round trips one after another, requests sent) per call. Standalone: the scripts
# of a step fused, one round trip each. Cluster (docs/layer.md, "Steps and round
# trips"), in waves whose calls go at once: the index entry (beside it, the
# removal of the previous call's) and the claim with its birth entry; the
# breaker admits from its cache (confirmed by the previous call); the record,
# the report and the birth entry's removal (the checkpoint first); a duplicate:
# the index entry and the claim; a retry adds the failure report with the
# retry's count, and the next admission.
EXPECTED: dict[str, dict[str, tuple[int, int]]] = {
    "standalone": {"happy": (2, 2), "checkpoint": (2, 2), "duplicate": (1, 1),
                   "one_retry": (4, 4)},
    # one_retry: its count waits in the process's batch (no note beside the report)
    "cluster": {"happy": (2, 6), "checkpoint": (3, 7), "duplicate": (1, 3),
                "one_retry": (4, 8)},
}
EXPECTED["sentinel"] = EXPECTED["standalone"]  # (the primary the Sentinels name)


class Sends:
    """Every write of a request (a command or a whole pipeline) to a socket, any
    client, by the test's thread (the keep-alive's own sends, which may fall
    inside a call, are not the call's); ``sequential``: the writes that follow a
    read (on Cluster, the calls of a wave are all written before any reply is
    read: one round trip)."""

    count = 0
    sequential = 0
    reading = True
    thread = threading.get_ident()


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Sends]]:
    # Patched on the class: a cluster client builds one pool per node itself
    # (it takes no ``connection_class``), every one of them on this class.
    original = redis.connection.Connection.send_packed_command
    read = redis.connection.Connection.read_response

    Sends.thread = threading.get_ident()

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        if threading.get_ident() == Sends.thread:
            Sends.count += 1
            Sends.sequential += Sends.reading
            Sends.reading = False
        original(self, command, check_health)

    def reading(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == Sends.thread:
            Sends.reading = True
        return read(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counting)
    monkeypatch.setattr(redis.connection.Connection, "read_response", reading)
    # The sync store reads its script replies from the parser itself
    # (durabilis._store._sync._read_reply): a read all the same.
    read_reply = durabilis._store._sync._read_reply

    def reading_reply(conn: Any) -> Any:
        if threading.get_ident() == Sends.thread:
            Sends.reading = True
        return read_reply(conn)

    monkeypatch.setattr(durabilis._store._sync, "_read_reply", reading_reply)
    yield Sends


def round_trips(sends: type[Sends], layer: DurabilityLayer, payload: str, op: Counter,
                **kw: Any) -> tuple[int, int]:
    """(round trips one after another, requests sent) by one durable call."""
    before, seq = sends.count, sends.sequential
    layer.execute("a1", "job", payload, op, **kw)
    return sends.sequential - seq, sends.count - before


def test_happy_path_is_two_round_trips(
    redis_url: str, namespace: str, backend: str, sends: type[Sends]
) -> None:
    want = EXPECTED[backend]
    store = durabilis.connect(redis_url, namespace=namespace)
    try:
        layer = DurabilityLayer(store, fast_config())
        rt = lambda *a, **kw: round_trips(sends, layer, *a, **kw)  # noqa: E731
        rt("warm-up", Counter())  # loads the scripts (SCRIPT LOAD on NOSCRIPT)
        rt("warm-up", Counter())
        rt("warm-up-2", Counter(), task_id="t", phase="p")
        rt("warm-up-3", Counter(["NETWORK_TIMEOUT"]))
        if store.is_cluster:  # steady state: every script loaded on every primary (a
            # node's first use is NOSCRIPT), and two connections open to each (a wave
            # may send the record and the birth entry's removal to one node at once; a
            # new connection's handshake is 4 round trips of its own)
            for name in list(store.scripts._scripts):
                source = store.scripts.get(name).script
                for node in store.client.get_primaries():
                    store.client.execute_command("SCRIPT", "LOAD", source, target_nodes=node)
            for node in store.client.get_primaries():
                pool = store.client.get_redis_connection(node).connection_pool
                taken = [pool.get_connection() for _ in range(2)]
                for conn in taken:
                    conn.connect()
                    pool.release(conn)
        seen = {
            "happy": rt("op-1", Counter()),  # claim+admit, record+report
            "checkpoint": rt("op-2", Counter(), task_id="t", phase="p2"),
            # A duplicate: the claim; its count waits for a later note on
            # standalone; on Cluster the claim step's index entry is removed.
            "duplicate": rt("op-1", Counter()),
            # A retry adds: the failure report, the next admission.
            "one_retry": rt("op-3", Counter(["NETWORK_TIMEOUT"])),
        }
        assert seen == want
        assert layer.stats().duplicates == 2  # warm-up's and op-1's, sent by stats()
    finally:
        store.close()


def sent_by_the_keep_alive(counted: Any, seconds: float) -> int:
    """The counter once it is no longer 0, or 0 after ``seconds``."""
    deadline = time.monotonic() + seconds
    while counted() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(counted())


def test_a_duplicate_s_count_waits_at_most_a_second_in_its_process(
    redis_url: str, namespace: str, raw: Any
) -> None:
    store = durabilis.connect(redis_url, namespace=namespace)
    layer = DurabilityLayer(store, fast_config())
    counted = lambda: int(raw.hget(store.keys.layer("stats"), "duplicates") or 0)  # noqa: E731
    # The clock of what waits in the process, moved by hand. The keep-alive's
    # thread sees it stand still, so its tick cannot send the count first (on
    # CI it once did, between a real 1.05 s sleep and the next call).
    start, me, later = time.monotonic(), threading.get_ident(), [0.0]
    layer._core.waits_clock = lambda: start + (later[0] if threading.get_ident() == me else 0)
    try:
        layer.execute("a1", "job", "p", Counter())
        layer.execute("a1", "job", "p", Counter())
        if store.fuses:
            later[0] = DUPLICATES_FLUSH_SECONDS - 0.01
            layer.execute("a1", "job", "p", Counter())
            assert counted() == 0  # both waiting in this process
            later[0] = DUPLICATES_FLUSH_SECONDS
            layer.execute("a1", "job", "p", Counter())  # the oldest count is a second old
            assert counted() == 3
            layer.execute("a1", "job", "p", Counter())
            layer.execute("a1", "job", "p-2", Counter())  # a record step carries no count
            assert counted() == 3
            layer.execute("a1", "job", "p", Counter())
        else:
            assert counted() == 0  # Cluster: waits with its index entry's removal
            layer.execute("a1", "job", "p", Counter())  # the next claim step carries it
            assert counted() == 1
    finally:
        layer.close()  # sends what waits
        fused = store.fuses
        store.close()
    assert counted() == (5 if fused else 2)  # every duplicate counted once


def test_an_idle_process_s_waiting_duplicate_count_goes_with_the_keep_alive(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """Found by an adversarial review: with no later operation, stats() or
    close(), the count waited in its process for good."""
    store = durabilis.connect(redis_url, namespace=namespace)
    layer = DurabilityLayer(store, fast_config(renew_every_seconds=0.3))
    counted = lambda: int(raw.hget(store.keys.layer("stats"), "duplicates") or 0)  # noqa: E731
    try:
        layer.execute("a1", "job", "p", Counter())
        layer.execute("a1", "job", "p", Counter())
        assert counted() == 0  # waiting in this process
        # The process does nothing: its keep-alive sends it.
        assert sent_by_the_keep_alive(counted, DUPLICATES_FLUSH_SECONDS + 3) == 1
    finally:
        layer.close()
        store.close()


def test_cluster_removes_a_settled_claim_s_index_entry_later_never_before_its_record(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """Cluster (and the unfused path on standalone): the entry goes with the
    process's next claim step, or its keep-alive tick; an entry whose removal
    died with its process is dropped by recover_orphans, nothing parked."""
    store = durabilis.connect(redis_url, namespace=namespace)
    store._fuse = False  # the Cluster code path (a no-op on Cluster)
    layer = DurabilityLayer(store, fast_config(lease=1, renew_every_seconds=0.3))
    index = store.keys.layer("inflight")
    try:
        layer.execute("a1", "job", "p-1", Counter())
        assert raw.zcard(index) == 1 and layer._core._gone  # its removal waits in the process
        key = raw.zrange(index, 0, -1)[0].decode().rpartition("|")[0]
        assert raw.hget(store.keys.idem(key), "s") == b"d"  # after its record, never before
        layer.execute("a1", "job", "p-2", Counter())  # carries p-1's removal
        assert [m.decode().split("|")[0] for m in raw.zrange(index, 0, -1)] == [
            layer._core._gone[0].split("|")[0]]
        deadline = time.monotonic() + DUPLICATES_FLUSH_SECONDS + 3
        while raw.zcard(index) and time.monotonic() < deadline:
            time.sleep(0.05)  # idle: the keep-alive's tick sends it
        assert raw.zcard(index) == 0 and not layer._core._gone
        assert layer.stats().succeeded == 2  # the counts went with the removals

        layer.execute("a1", "job", "p-3", Counter())
        layer._core._take_gone()  # its process is killed: what waited in it is lost
        assert raw.zcard(index) == 1
        time.sleep(1.1)  # the entry's lease passes
        assert layer.recover_orphans() == []  # nothing parked: the claim is recorded
        assert raw.zcard(index) == 0
        assert layer.dlq.stats().total == 0
    finally:
        layer.close()
        store.close()


def test_counts_go_by_themselves_with_idempotency_off(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """Found by a review: with no claim held, no keep-alive ran, and a
    completed call's counts waited in its process until stats() or close()."""
    store = durabilis.connect(redis_url, namespace=namespace)
    config = fast_config(idempotency=IdempotencyConfig(enabled=False))
    layer = DurabilityLayer(store, config)
    counted = lambda: int(raw.hget(store.keys.layer("stats"), "succeeded") or 0)  # noqa: E731
    try:
        assert layer.execute("a1", "job", "p", Counter()) == "done"
        # No stats(), no close(): the keep-alive sends it.
        assert sent_by_the_keep_alive(counted, DUPLICATES_FLUSH_SECONDS + 5) == 1
    finally:
        layer.close()
        store.close()


def test_an_index_a_removal_emptied_gets_its_expiry_back(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """Found by a review: a claim's entry that recreated an index emptied by a
    batch of removals left an index without expiry when claims pushed the
    expiry back only once a minute; every claim pushes it back again."""
    store = durabilis.connect(redis_url, namespace=namespace)
    layer = DurabilityLayer(store, fast_config(lease=1))
    index = store.keys.layer("inflight")
    release = threading.Event()

    def slow(_ctx: Any) -> str:
        release.wait(10)
        return "done"

    try:
        layer.execute("a1", "job", "p1", Counter())  # "add": the index's expiry set
        layer.stats()  # its removal sent: the index emptied (deleted)
        assert raw.exists(index) == 0
        worker = threading.Thread(target=layer.execute, args=("a1", "job", "p2", slow))
        worker.start()
        try:
            deadline = time.monotonic() + 5
            while raw.pttl(index) < 0 and time.monotonic() < deadline:
                time.sleep(0.02)  # recreated by the claim: its expiry with it
            assert raw.zcard(index) == 1 and raw.pttl(index) > 0
        finally:
            release.set()
            worker.join(10)
    finally:
        layer.close()
        store.close()
