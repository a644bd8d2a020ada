"""The fleet config in Redis: one script stores an entry as readable JSON and
bumps the version; replicas apply changes on refresh, with an event."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

import durabilis
from durabilis import CircuitBreakerConfig, RetryPolicy
from durabilis.config import AsyncConfigSync, ConfigSync, Reload
from durabilis.errors import CorruptData
from durabilis.layer import AsyncDurabilityLayer, DurabilityConfig, DurabilityLayer
from durabilis.testing import RedisServer
from tests.support.acl import rules_for

pytestmark = pytest.mark.topologies("cluster")

MCP5 = RetryPolicy("mcp_call", 5, 100, 1000, jitter=False)
MEM = CircuitBreakerConfig("memory_service", 0.9, 10, 30, 2, 20, 30)


def mcp(attempts: int) -> RetryPolicy:
    return RetryPolicy("mcp_call", attempts, 100, 1000, jitter=False)


def fleet_key(namespace: str) -> str:
    return f"{namespace}:config:{{config}}:fleet"


def test_publishing_stores_readable_json_bumps_the_version_and_logs_the_change(
    store: durabilis.Store, namespace: str, raw: redis.Redis
) -> None:
    sync = ConfigSync(store, replica_id="ops-1")
    assert sync.fleet_config().version == 0
    assert sync.publish_policy(MCP5) == 1
    assert sync.publish_breaker(MEM) == 2
    assert sync.publish_policy(MCP5) == 2  # the same value again: nothing written

    stored = {k.decode(): v.decode() for k, v in raw.hgetall(fleet_key(namespace)).items()}
    assert stored["v"] == "2" and int(stored["t"]) > 0
    assert json.loads(stored["retry:mcp_call"])["max_attempts"] == 5
    assert json.loads(stored["breaker:memory_service"])["failure_rate_threshold"] == 0.9
    assert raw.ttl(fleet_key(namespace)) == -1  # the documented non-expiring key

    log = raw.xrange(f"{namespace}:config:{{config}}:log")
    assert [(e[b"version"], e[b"field"], e[b"by"]) for _, e in log] == [
        (b"1", b"retry:mcp_call", b"ops-1"), (b"2", b"breaker:memory_service", b"ops-1"),
    ]
    fleet = sync.fleet_config()
    assert fleet.version == 2 and fleet.updated_at is not None
    assert fleet.retry_policies == {"mcp_call": MCP5}
    assert fleet.breakers == {"memory_service": MEM}

    assert sync.unpublish("retry", "mcp_call") == 3
    assert sync.unpublish("retry", "mcp_call") == 3  # nothing to remove
    assert sync.fleet_config().retry_policies == {}


def test_another_replica_applies_changes_on_refresh_and_logs_durability_config_reloaded(
    store: durabilis.Store,
) -> None:
    operator = ConfigSync(store)
    operator.publish_policy(MCP5)
    replica = DurabilityLayer(store, DurabilityConfig.seed(), replica_id="replica-b")
    sync = ConfigSync(replica)
    seen: list[Reload] = []
    sync.on_reload(seen.append)
    with capture_logs() as logs:
        first = sync.refresh()
    assert first is not None and first.initial and first.retry_policies == ("mcp_call",)
    assert replica.retry.get_policy("mcp_call") == MCP5
    assert sync.refresh() is None  # the version has not moved: one HMGET, nothing applied

    operator.publish_breaker(MEM)
    with capture_logs() as more:
        second = sync.refresh()
    assert second is not None and second.breakers == ("memory_service",)
    assert replica.breakers.get_config("memory_service") == MEM
    assert seen == [first, second]
    reloads = [e for e in logs + more if e["event"] == "durability_config_reloaded"]
    assert [(e["version"], e["retry_policies"], e["breakers"], e["replica_id"])
            for e in reloads] == [(1, ["mcp_call"], [], "replica-b"),
                                  (2, [], ["memory_service"], "replica-b")]

    own = DurabilityLayer(store, DurabilityConfig.seed()).retry.get_policy("mcp_call")
    operator.unpublish("retry", "mcp_call")
    third = sync.refresh()
    assert third is not None and third.removed == ("retry:mcp_call",)
    assert replica.retry.get_policy("mcp_call") == own  # back to its own config
    replica.close()


def test_a_published_change_reaches_the_layers_behaviour(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, DurabilityConfig(dependencies={}))
    sync = ConfigSync(layer, interval_seconds=0.05)
    ConfigSync(store).publish_policy(RetryPolicy("job", 4, 1, 1, jitter=False))
    calls: list[int] = []

    def fails(ctx: Any) -> None:
        calls.append(ctx.attempt)
        raise durabilis.OperationError("NETWORK_TIMEOUT", "down")

    # start() (entering the sync) applies what is published at once.
    with sync, pytest.raises(durabilis.RetryExhausted) as info:
        layer.execute("a", "job", {"n": 1}, fails)
    assert info.value.attempts == 4 and calls == [0, 1, 2, 3]
    layer.close()


def test_a_bad_entry_is_rejected_with_an_event_and_the_others_still_apply(
    store: durabilis.Store, namespace: str, raw: redis.Redis
) -> None:
    ConfigSync(store).publish_breaker(MEM)
    raw.hset(fleet_key(namespace), mapping={"retry:mcp_call": '{"max_attempts": "many"}',
                                            "v": "7"})
    layer = DurabilityLayer(store)
    with capture_logs() as logs:
        reload = ConfigSync(layer).refresh()
    assert reload is not None and set(reload.rejected) == {"retry:mcp_call"}
    assert reload.breakers == ("memory_service",)
    assert layer.breakers.get_config("memory_service") == MEM
    rejected = [e for e in logs if e["event"] == "durability_config_entry_rejected"]
    assert rejected and rejected[0]["entry"] == "retry:mcp_call"
    assert set(ConfigSync(store).fleet_config().rejected) == {"retry:mcp_call"}
    layer.close()


def test_foreign_data_at_the_fleet_key_is_corrupt_data_naming_it(
    store: durabilis.Store, namespace: str, raw: redis.Redis
) -> None:
    raw.set(fleet_key(namespace), "not a hash")
    with pytest.raises(CorruptData) as info:
        ConfigSync(store).publish_policy(MCP5)
    assert info.value.key == fleet_key(namespace)
    raw.delete(fleet_key(namespace))
    for v in ("seven", "+3", " 3", "3_0", "\u0663", "1e3"):  # a version is ASCII digits only
        raw.hset(fleet_key(namespace), "v", v)
        with pytest.raises(CorruptData):
            ConfigSync(store).refresh()
        with pytest.raises(CorruptData):
            ConfigSync(store).publish_policy(MCP5)


def test_a_replica_applies_a_config_published_after_the_hash_was_lost_at_the_same_version(
    store: durabilis.Store, namespace: str, raw: redis.Redis
) -> None:
    operator = ConfigSync(store)
    replica = DurabilityLayer(store, DurabilityConfig.seed(), replica_id="replica-b")
    sync = ConfigSync(replica)
    assert operator.publish_policy(MCP5) == 1
    assert sync.refresh() is not None and replica.retry.get_policy("mcp_call") == MCP5
    # Redis loses the hash (a restart without persistence, a failover to a
    # replica that was behind): the next publish counts from 0 again.
    raw.delete(fleet_key(namespace))
    time.sleep(0.002)  # (a later millisecond: the change's server time differs)
    mcp9 = mcp(9)
    assert operator.publish_policy(mcp9) == 1  # the version this replica holds
    reload = sync.refresh()
    assert reload is not None and reload.retry_policies == ("mcp_call",)
    assert replica.retry.get_policy("mcp_call") == mcp9
    replica.close()


def test_a_replica_s_own_publish_does_not_hide_changes_made_after_the_hash_was_lost(
    store: durabilis.Store, namespace: str, raw: redis.Redis
) -> None:
    replica = DurabilityLayer(store, DurabilityConfig.seed(), replica_id="replica-b")
    sync = ConfigSync(replica)
    assert sync.publish_policy(mcp(7)) == 1
    assert sync.publish_policy(mcp(8)) == 2
    raw.delete(fleet_key(namespace))  # lost before this replica polled
    time.sleep(0.002)
    assert ConfigSync(store).publish_policy(MCP5) == 1  # an operator's, after the loss
    assert sync.refresh() is not None
    assert replica.retry.get_policy("mcp_call") == MCP5  # not pinned to its own v2
    replica.close()


def test_publishing_the_same_value_again_does_not_pin_a_replica_past_a_lost_hash(
    store: durabilis.Store, namespace: str, raw: redis.Redis
) -> None:
    replica = DurabilityLayer(store, DurabilityConfig.seed(), replica_id="replica-b")
    sync = ConfigSync(replica)
    for attempts in (3, 4, 3):
        sync.publish_policy(mcp(attempts))
    assert sync.refresh() is not None
    assert sync.publish_policy(mcp(3)) == 3  # the same value again (at a start): "same"
    raw.delete(fleet_key(namespace))
    time.sleep(0.002)
    assert ConfigSync(store).publish_policy(mcp(7)) == 1
    assert sync.refresh() is not None
    assert replica.retry.get_policy("mcp_call") == mcp(7)
    replica.close()


def test_removing_an_entry_someone_removed_already_still_restores_this_replicas_own(
    store: durabilis.Store,
) -> None:
    own = mcp(1)
    replica = DurabilityLayer(store, DurabilityConfig(retry_policies=(own,)))
    sync = ConfigSync(replica)
    operator = ConfigSync(store)
    operator.publish_policy(MCP5)
    assert sync.refresh() is not None and replica.retry.get_policy("mcp_call") == MCP5
    operator.unpublish("retry", "mcp_call")  # removed by another, before this replica polls
    assert sync.unpublish("retry", "mcp_call") == 2  # nothing left to remove ("same")
    assert replica.retry.get_policy("mcp_call") == own  # back to its own, as documented
    sync.refresh()
    assert replica.retry.get_policy("mcp_call") == own
    replica.close()


def test_a_poll_applying_an_older_snapshot_during_a_publish_never_wins(
    store: durabilis.Store, namespace: str, raw: redis.Redis
) -> None:
    replica = DurabilityLayer(store, DurabilityConfig.seed(), replica_id="replica-b")
    sync = ConfigSync(replica)
    sync.publish_policy(MCP5)
    ConfigSync(store).publish_policy(mcp(7))
    read_at = sync._core.applier.seq  # a poll reads the snapshot just before the publish
    older = raw.hgetall(fleet_key(namespace))
    mcp9 = mcp(9)
    upsert = replica.retry.upsert_policy
    polls: list[threading.Thread] = []

    def installing(policy: RetryPolicy) -> None:
        upsert(policy)
        if policy == mcp9 and not polls:  # installed by the publish: a poll applies now
            poll = threading.Thread(target=sync._core.reloaded, args=(older, read_at))
            polls.append(poll)
            poll.start()
            poll.join(0.5)  # (it waits, where the publish and its note are one step)

    replica.retry.upsert_policy = installing  # type: ignore[method-assign]
    sync.publish_policy(mcp9)
    polls[0].join(5)
    assert replica.retry.get_policy("mcp_call") == mcp9
    sync.refresh()
    assert replica.retry.get_policy("mcp_call") == mcp9
    replica.close()


def test_invalid_arguments_are_refused_before_any_redis_call() -> None:
    store = durabilis.connect("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    sync = ConfigSync(store)
    with pytest.raises(durabilis.ConfigError):
        sync.publish_policy("mcp_call")  # type: ignore[arg-type]
    with pytest.raises(durabilis.ConfigError):
        sync.unpublish("budget", "x")
    with pytest.raises(durabilis.ConfigError):
        ConfigSync(store, interval_seconds=0)
    store.close()


def test_the_async_twin_publishes_and_applies(redis_url: str, namespace: str) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store)
        sync = AsyncConfigSync(layer, interval_seconds=0.05)
        other = AsyncDurabilityLayer(store)
        async with AsyncConfigSync(other, interval_seconds=0.05) as watcher:
            assert await sync.publish_policy(MCP5) == 1
            assert layer.retry.get_policy("mcp_call") == MCP5  # applied here at once
            for _ in range(100):
                if other.retry.get_policy("mcp_call") == MCP5:
                    break
                await asyncio.sleep(0.02)
            assert other.retry.get_policy("mcp_call") == MCP5
            assert watcher.version == 1
            assert (await sync.fleet_config()).retry_policies == {"mcp_call": MCP5}
            assert await sync.unpublish("retry", "mcp_call") == 2
        await layer.close()
        await other.close()
        await store.close()

    asyncio.run(main())


def test_the_poller_rides_out_a_redis_outage_and_catches_up(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    try:
        store = durabilis.connect(server.url, namespace="outage", socket_timeout=0.3,
                                  socket_connect_timeout=0.3)
        layer = DurabilityLayer(store)
        with capture_logs() as logs, ConfigSync(layer, interval_seconds=0.05):
            server.stop()
            time.sleep(0.5)
            server.start()
            ConfigSync(store).publish_policy(MCP5)
            deadline = time.monotonic() + 5
            while layer.retry.get_policy("mcp_call") != MCP5 and time.monotonic() < deadline:
                time.sleep(0.02)
        assert layer.retry.get_policy("mcp_call") == MCP5
        events = [e["event"] for e in logs]
        assert events.count("durability_config_sync_failed") == 1  # once per outage
        assert "durability_config_sync_recovered" in events
        layer.close()
        store.close()
    finally:
        server.stop()


def test_the_documented_application_user_can_publish_and_follow_the_fleet_config(
    private_redis: RedisServer,
) -> None:
    admin = redis.Redis.from_url(private_redis.url)
    admin.execute_command("ACL", "SETUSER", "app", *rules_for("tenant", "pw"))
    admin.close()
    store = durabilis.connect(private_redis.url.replace("redis://", "redis://app:pw@"),
                              namespace="tenant")
    layer = DurabilityLayer(store)
    assert ConfigSync(store).publish_policy(MCP5) == 1  # no pub/sub, no extra command
    assert ConfigSync(layer).refresh() is not None
    assert layer.retry.get_policy("mcp_call") == MCP5
    layer.close()
    store.close()
