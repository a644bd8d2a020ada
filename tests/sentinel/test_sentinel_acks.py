"""``acks="replicas:N"`` against a replica that is alive but stalled (SIGSTOP): its
link stays up, it only stops confirming. Uses the session's Sentinel topology and
leaves every replica running."""

from __future__ import annotations

import pytest

import durabilis
from durabilis.dlq import DeadLetterQueue
from durabilis.errors import NotReplicated
from tests.support.sentinel import LocalSentinel


def test_a_write_sent_again_is_not_confirmed_by_a_wait_that_measures_nothing(
    redis_url: str, namespace: str, redis_sentinel: LocalSentinel
) -> None:
    """A step sent again (its first send's reply lost, on another connection) finds
    its work done and writes nothing (here: a DLQ record that exists). ``WAIT``
    must still wait for that record to reach a replica. It does because, from
    Redis 7.0, every command moves its connection's replication offset to the
    server's (before 7.0 only the connection's own writes did, and this WAIT,
    on a connection whose last write the replicas had confirmed, answered at
    once): durabilis refuses ``acks="replicas:N"`` on an older Redis
    (``WAIT_SINCE``), and this test holds the assumption to account."""
    confirming = durabilis.connect(redis_url, namespace=namespace, acks="replicas:1",
                                   acks_timeout=0.2, max_connections=1)  # one connection
    primary_only = durabilis.connect(redis_url, namespace=namespace)
    dlq = DeadLetterQueue(confirming)
    try:
        redis_sentinel.wait_healthy(30)
        # a write the replicas confirm, on the one connection (a fresh topology's
        # first confirmation can take longer than 0.2 s)
        DeadLetterQueue(confirming.with_acks("replicas:1", 3.0)).enqueue(
            "a1", "job", {"x": 0}, 3, "boom", dlq_id="earlier")
        ports = redis_sentinel.replica_ports()
        for port in ports:
            redis_sentinel.pause(port)
        try:
            # the first send: written, replicated to nobody (its reply "lost")
            DeadLetterQueue(primary_only).enqueue("a1", "job", {"x": 1}, 3, "boom",
                                                 dlq_id="the-one")
            with pytest.raises(NotReplicated) as info:  # the send again finds it done
                dlq.enqueue("a1", "job", {"x": 1}, 3, "boom", dlq_id="the-one")
            assert info.value.acked == 0
        finally:
            for port in ports:
                redis_sentinel.resume(port)
        redis_sentinel.wait_healthy(30)
        assert dlq.enqueue("a1", "job", {"x": 1}, 3, "boom", dlq_id="the-one") == "the-one"
    finally:
        confirming.close()
        primary_only.close()
