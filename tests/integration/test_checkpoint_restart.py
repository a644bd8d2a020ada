"""Expired, cleared, evicted and replaced-then-cleared checkpoints stay gone across a restart."""

from __future__ import annotations

import time

import pytest
import redis

import durabilis
from durabilis.checkpoint import CheckpointConfig, CheckpointManager
from durabilis.errors import CheckpointNotFound
from durabilis.testing import RedisServer


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_expired_cleared_and_evicted_checkpoints_stay_gone_after_a_restart_with_appendonly(
    private_redis: RedisServer, namespace: str, kill: bool
) -> None:
    store = durabilis.connect(private_redis.url, namespace=namespace)
    manager = CheckpointManager(store, CheckpointConfig(max_checkpoints=4))
    evicted = manager.save("evicted", "a", "p", "first out")
    replaced = manager.save("cleared", "a", "p", "old")
    cleared = manager.save("cleared", "a", "p", "new")
    assert manager.clear_task("cleared") == 1
    kept = manager.save("kept", "a", "p1", "kept")
    expired = manager.save("kept", "a", "p2", "expires", ttl_seconds=1.0)
    for i in range(2):
        manager.save(f"filler-{i}", "a", "p", i)  # the cap of 4 evicts `evicted`
    assert manager.count() == 4  # kept, expired (still live) and the 2 fillers
    with pytest.raises(CheckpointNotFound):
        manager.get_by_id(evicted.checkpoint_id)
    time.sleep(1.1)
    store.close()

    private_redis.stop(kill=kill)
    private_redis.start()

    store = durabilis.connect(private_redis.url, namespace=namespace)
    try:
        manager = CheckpointManager(store, CheckpointConfig(max_checkpoints=4))
        assert manager.restore("kept", "a") == kept
        for gone in (expired, replaced, cleared, evicted):
            with pytest.raises(CheckpointNotFound):
                manager.get_by_id(gone.checkpoint_id)
        with pytest.raises(CheckpointNotFound):
            manager.restore("kept", "a", "p2")
        with pytest.raises(CheckpointNotFound):
            manager.restore("cleared", "a")
        with pytest.raises(CheckpointNotFound):
            manager.restore("evicted", "a")
        assert manager.count() == 3
        assert manager.history("kept", "a") == [kept]
        raw = redis.Redis.from_url(private_redis.url)
        try:
            records = list(raw.scan_iter(match=f"{namespace}:ckpt:{{ckpt}}:rec:*"))
            assert len(records) == 3
        finally:
            raw.close()
    finally:
        store.close()
