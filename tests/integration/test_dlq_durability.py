"""The DLQ survives a Redis crash, and an operator can read it with redis-cli."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import durabilis
from durabilis.dlq import DeadLetterQueue, DlqStatus
from durabilis.testing import RedisServer, find_redis_server
from tests.support.backends import redis_cli_target


def redis_cli() -> str:
    found = shutil.which("redis-cli")
    if found is None:
        server = find_redis_server()
        sibling = Path(server).with_name("redis-cli") if server else None
        found = str(sibling) if sibling and sibling.exists() else None
    if found is None:
        pytest.fail("redis-cli was not found on PATH (it ships with redis-server)", pytrace=False)
    return found


def test_records_survive_redis_killed_and_restarted_between_enqueue_and_listing(
    private_redis: RedisServer, namespace: str
) -> None:
    store = durabilis.connect(private_redis.url, namespace=namespace)
    dlq = DeadLetterQueue(store, replayer_id="before-crash")
    ids = [
        dlq.enqueue("agent-1", "wiki_write" if i % 2 else "mcp_call", {"n": i}, 3, "TIMEOUT",
                    metadata={"idempotency_key": f"key-{i}"})
        for i in range(40)
    ]
    ids.append(dlq.enqueue("agent-2", "memory_write", b"\x00binary", 5, "RATE_LIMITED"))
    dlq.mark_replayed(ids[0])
    dlq.abandon(ids[1])

    def down(record: object) -> None:
        raise ConnectionError("still down")

    dlq.replay(ids[2], down)
    before = dlq.list_all()
    store.close()

    private_redis.stop(kill=True)  # SIGKILL: no shutdown save, only the fsync'ed AOF
    private_redis.start()

    store = durabilis.connect(private_redis.url, namespace=namespace)
    try:
        dlq = DeadLetterQueue(store)
        after = dlq.list_all()
        assert [r.dlq_id for r in after.records] == ids
        assert after == before  # every field of every record, and the pending count
        assert after.pending_count == 39
        assert dlq.get(ids[0]).status is DlqStatus.REPLAYED  # type: ignore[union-attr]
        assert dlq.get(ids[1]).status is DlqStatus.ABANDONED  # type: ignore[union-attr]
        failed = dlq.get(ids[2])
        assert failed is not None and failed.replay_attempts == 1
        assert dlq.get(ids[-1]).original_operation == b"\x00binary"  # type: ignore[union-attr]
        assert dlq.replay_pending(lambda r: None).replayed == 39  # and still replayable
    finally:
        store.close()


@pytest.mark.topologies("cluster", "sentinel")  # redis-cli reached per URL scheme
def test_redis_cli_xrange_shows_each_record_as_readable_text(
    store: durabilis.Store, redis_url: str
) -> None:
    dlq = DeadLetterQueue(store)
    operation = {"page": "Home", "text": "Grüße", "tags": ["a", "b"], "rev": 7}
    dlq_id = dlq.enqueue(
        "agent-7", "wiki_write", operation, 3, "NETWORK_TIMEOUT: upstream took 30s",
        metadata={"idempotency_key": "agent-7:wiki_write:2cf24dba5fb0a30e26e83b2ac5b9e29e"},
    )
    stream = store.keys.dlq("stream")
    out = subprocess.run(
        [redis_cli(), *redis_cli_target(redis_url), "XRANGE", stream, "-", "+"],
        capture_output=True, check=True, timeout=10,
    ).stdout.decode("utf-8")
    lines = out.splitlines()
    rec = dlq.get(dlq_id)
    assert rec is not None
    assert lines[0] == rec.stream_id
    fields = dict(zip(lines[1::2], lines[2::2], strict=True))
    assert fields["dlq_id"] == dlq_id
    assert fields["agent_id"] == "agent-7"
    assert fields["operation_type"] == "wiki_write"
    assert fields["retry_count"] == "3"
    assert fields["last_error"] == "NETWORK_TIMEOUT: upstream took 30s"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields["failed_at"])
    assert fields["failed_at"] == rec.failed_at.strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{rec.failed_at.microsecond // 1000:03d}Z"
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields["expires_at"])
    assert json.loads(fields["original_operation"]) == operation
    assert "Grüße" in fields["original_operation"]  # text, not escapes or msgpack
    assert fields["meta:idempotency_key"].startswith("agent-7:wiki_write:")
