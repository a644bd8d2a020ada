"""Hostile entries written RAW into the fleet config hash (anyone with write
access to Redis can): each is rejected on its own, with a reason; the poller
never dies and keeps applying later valid publishes; a new replica starts; the
CLI warns on stderr and goes on; and every bad entry can be removed.

The hash is planted with a plain redis-py client (the ``raw`` fixture), on the
real redis-server (or local Cluster) of the suite: no mock anywhere.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

import durabilis
from durabilis import CircuitBreakerConfig, ConfigError, RetryPolicy
from durabilis._limits import LIMITS
from durabilis.cli import EXIT_OK
from durabilis.config import (
    MAX_ENTRY_BYTES,
    MAX_ENTRY_DEPTH,
    AsyncConfigSync,
    ConfigSync,
    breaker_to_dict,
    policy_to_dict,
    printable_entry,
)
from durabilis.layer import AsyncDurabilityLayer, DurabilityLayer
from durabilis.retry import RetryEngine
from tests.integration._cli_support import run_cli

pytestmark = pytest.mark.topologies("cluster")

MCP5 = RetryPolicy("mcp_call", 5, 100, 1000, jitter=False)
MEM = CircuitBreakerConfig("memory_service", 0.9, 10, 30, 2, 20, 30)

TEN_MB = 10 * 1024 * 1024

# field -> raw value, each hostile in its own way (bytes: written as is).
HOSTILE: dict[bytes, bytes] = {
    # 100,000-deep nesting: what made json.loads raise RecursionError (caught by the size cap)
    b"retry:deep": b"[" * 100_000 + b"]" * 100_000,
    # under the size cap, over the depth cap: the linear depth scan refuses it unparsed
    b"retry:deep_small": b"[" * 30_000 + b"]" * 30_000,
    b"breaker:deep_obj": b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
    # not UTF-8: the value, and the field name itself
    b"breaker:latin1": b'{"name": "latin1", "window_size": "\xe9\xff"}',
    b"retry:caf\xe9": b'{"operation_type": "caf\xc3\xa9"}',
    # 10 MB
    b"retry:huge": b'{"operation_type": "huge", "pad": "' + b"a" * TEN_MB + b'"}',
    # the wrong JSON types
    b"retry:list": b'["operation_type", "list"]',
    b"breaker:text": b'"memory_service"',
    b"breaker:dict_field": b'{"name": "dict_field", "window_size": {"n": 1}}',
    b"retry:nan": (b'{"operation_type": "nan", "max_attempts": NaN, '
                   b'"initial_delay_ms": 1, "max_delay_ms": 1}'),
    # a field no durabilis wrote, with a terminal escape in its name
    b"junk\x1b[2J": b"{}",
}


def fleet_key(namespace: str) -> str:
    return f"{namespace}:config:{{config}}:fleet"


def plant(raw: Any, namespace: str, entries: dict[bytes, bytes], *, bump: bool = True) -> None:
    """Write entries raw into the fleet config hash; ``bump``: move its version too
    (what makes every replica re-read it at once)."""
    raw.hset(fleet_key(namespace), mapping=entries)
    if bump:
        raw.hincrby(fleet_key(namespace), "v", 1)


def as_name(field: bytes) -> str:
    """A field as durabilis names it (bytes that are not UTF-8 kept as lone surrogates)."""
    return field.decode("utf-8", "surrogateescape")


HOSTILE_NAMES = {as_name(f) for f in HOSTILE}


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


def test_each_hostile_entry_is_rejected_and_the_running_poller_keeps_applying(
    store: durabilis.Store, namespace: str, raw: Any
) -> None:
    ConfigSync(store).publish_breaker(MEM)
    layer = DurabilityLayer(store)
    sync = ConfigSync(layer, interval_seconds=0.05)
    with capture_logs() as logs, sync:
        thread = sync._thread
        assert thread is not None and layer.breakers.get_config("memory_service") == MEM
        plant(raw, namespace, HOSTILE)  # the replica is running: it reads them at once
        assert wait_for(lambda: set(sync.rejected) == HOSTILE_NAMES)

        # The poller is alive and applies what comes next.
        assert ConfigSync(store).publish_policy(MCP5) > 0
        assert wait_for(lambda: layer.retry.get_policy("mcp_call") == MCP5)
        later = RetryPolicy("later", 2, 1, 1, jitter=False)
        plant(raw, namespace, {b"retry:deep2": b"{" * 200_000})  # more, between publishes
        ConfigSync(store).publish_policy(later)
        assert wait_for(lambda: layer.retry.get_policy("later") == later)
        assert thread.is_alive() and sync._thread is thread

    rejected = events(logs, "durability_config_entry_rejected")
    # Once each (not again on every later version), named printably.
    assert sorted(e["entry"] for e in rejected) == sorted(
        [printable_entry(n) for n in HOSTILE_NAMES] + ["retry:deep2"]
    )
    reasons = {e["entry"]: e["reason"] for e in rejected}
    assert "over the cap" in reasons["retry:deep"]
    assert f"deeper than the cap of {MAX_ENTRY_DEPTH}" in reasons["retry:deep_small"]
    assert f"deeper than the cap of {MAX_ENTRY_DEPTH}" in reasons["breaker:deep_obj"]
    assert "not UTF-8" in reasons["breaker:latin1"]
    assert reasons["retry:caf\\xe9"] and "junk\\x1b[2J" in reasons
    assert f"over the cap of {MAX_ENTRY_BYTES}" in reasons["retry:huge"]
    assert "JSON object" in reasons["retry:list"] and "JSON object" in reasons["breaker:text"]
    assert reasons["breaker:dict_field"] and reasons["retry:nan"]
    assert all(len(r) < 400 for r in reasons.values())  # never the value itself
    assert not events(logs, "durability_config_poll_failed")
    assert not events(logs, "durability_config_sync_failed")
    assert layer.breakers.get_config("memory_service") == MEM  # the good ones stay
    layer.close()


def test_a_new_replica_starts_with_the_good_entries_and_lists_the_bad(
    store: durabilis.Store, namespace: str, raw: Any
) -> None:
    operator = ConfigSync(store)
    operator.publish_policy(MCP5)
    operator.publish_breaker(MEM)
    # Planted WITHOUT moving the version, then a valid publish: the snapshot that
    # crashed the receiver held both.
    plant(raw, namespace, HOSTILE, bump=False)
    operator.publish_policy(RetryPolicy("memory_write", 7, 1, 1, jitter=False))

    layer = DurabilityLayer(store)
    with capture_logs() as logs:
        sync = ConfigSync(layer, interval_seconds=0.05).start()  # does not raise
    try:
        assert layer.retry.get_policy("mcp_call") == MCP5
        assert layer.retry.get_policy("memory_write") == RetryPolicy(
            "memory_write", 7, 1, 1, jitter=False)
        assert layer.breakers.get_config("memory_service") == MEM
        assert set(sync.rejected) == HOSTILE_NAMES
        reloaded = events(logs, "durability_config_reloaded")
        assert reloaded and reloaded[0]["initial"] is True
        assert sorted(reloaded[0]["retry_policies"]) == ["mcp_call", "memory_write"]

        fleet = operator.fleet_config()  # what `config show` reads: never raises either
        assert set(fleet.retry_policies) == {"mcp_call", "memory_write"}
        assert set(fleet.breakers) == {"memory_service"}
        assert set(fleet.rejected) == HOSTILE_NAMES
    finally:
        sync.stop()
        layer.close()


def test_a_good_entry_overwritten_with_a_bad_one_keeps_the_last_good_config(
    store: durabilis.Store, namespace: str, raw: Any
) -> None:
    ConfigSync(store).publish_policy(MCP5)
    layer = DurabilityLayer(store)
    sync = ConfigSync(layer)
    sync.refresh()
    good = raw.hget(fleet_key(namespace), "retry:mcp_call")
    plant(raw, namespace, {b"retry:mcp_call": b"\xff" + b"[" * 100})
    with capture_logs() as logs:
        assert sync.refresh() is None  # nothing applied...
    assert [e["entry"] for e in events(logs, "durability_config_entry_rejected")] == [
        "retry:mcp_call"]  # ... one rejected, logged
    assert layer.retry.get_policy("mcp_call") == MCP5  # the last good one stays
    assert set(sync.rejected) == {"retry:mcp_call"}
    plant(raw, namespace, {b"retry:mcp_call": good})  # put back as it was
    sync.refresh()
    assert sync.rejected == {} and layer.retry.get_policy("mcp_call") == MCP5
    layer.close()


run = run_cli


def test_the_cli_warns_on_stderr_and_goes_on(
    capsys: pytest.CaptureFixture[str], redis_url: str, store: durabilis.Store,
    namespace: str, raw: Any,
) -> None:
    ConfigSync(store).publish_breaker(MEM)
    ConfigSync(store).publish_policy(MCP5)
    plant(raw, namespace, HOSTILE)
    base = ["--url", redis_url, "--namespace", namespace]

    for command in (["dlq", "ls"], ["breaker", "ls"], ["stats"]):
        code, out, err = run(capsys, *command, *base)
        assert code == EXIT_OK, (command, err)
        assert "durability_config_entry_rejected" in err and "retry:deep" in err
        assert "\x1b[2J" not in err and "\x1b[2J" not in out  # a hostile name is escaped
        code, out, err = run(capsys, *command, "--json", *base)
        assert code == EXIT_OK, (command, err)
        json.loads(out)  # stdout stays one JSON document
    code, out, _ = run(capsys, "breaker", "ls", "--json", *base)
    (memory,) = [b for b in json.loads(out)["breakers"] if b["name"] == "memory_service"]
    assert memory["configured"] and memory["config"]["failure_rate_threshold"] == 0.9

    code, out, err = run(capsys, "config", "show", *base)
    assert code == EXIT_OK
    assert "mcp_call" in out and "memory_service" in out and "retry:caf\\xe9" in out
    assert "\x1b[2J" not in out and "\x1b[2J" not in err
    assert "durabilis config unpublish retry deep" in err
    assert "durabilis config unpublish entry 'junk\\x1b[2J'" in err
    code, out, err = run(capsys, "config", "show", "--json", *base)
    assert code == EXIT_OK
    doc = json.loads(out)
    assert set(doc["retry"]) == {"mcp_call"} and set(doc["circuit_breaker"]) == {"memory_service"}
    assert set(doc["rejected"]) == {printable_entry(n, None) for n in HOSTILE_NAMES}
    assert "warning" in err


def test_config_unpublish_removes_any_bad_entry(
    capsys: pytest.CaptureFixture[str], redis_url: str, store: durabilis.Store,
    namespace: str, raw: Any,
) -> None:
    ConfigSync(store).publish_policy(MCP5)
    plant(raw, namespace, HOSTILE)
    layer = DurabilityLayer(store)
    # The replica's events (from its thread, at any time) go to the capture, not
    # into the CLI's stdout under test.
    with capture_logs():
        sync = ConfigSync(layer, interval_seconds=0.05).start()
        _unpublish_every_bad_entry(capsys, redis_url, store, namespace, raw, layer, sync)


def _unpublish_every_bad_entry(
    capsys: pytest.CaptureFixture[str], redis_url: str, store: durabilis.Store,
    namespace: str, raw: Any, layer: DurabilityLayer, sync: ConfigSync,
) -> None:
    base = ["--url", redis_url, "--namespace", namespace]
    try:
        assert set(sync.rejected) == HOSTILE_NAMES
        # By the name `config show` prints...
        for kind, name in [("retry", "deep"), ("retry", "deep_small"), ("breaker", "deep_obj"),
                           ("breaker", "latin1"), ("retry", "caf\\xe9"), ("retry", "huge"),
                           ("retry", "list"), ("breaker", "text"), ("entry", "junk\\x1b[2J")]:
            code, out, err = run(capsys, "config", "unpublish", kind, name, *base)
            assert code == EXIT_OK, (kind, name, err)
            assert out.startswith("unpublished ")
        # ... or by its raw bytes (how a shell passes $'\xe9': a lone surrogate in argv).
        code, _, err = run(capsys, "config", "unpublish", "breaker", "dict_field", *base)
        assert code == EXIT_OK, err
        plant(raw, namespace, {b"retry:r\xe9sum\xe9": b"\xff"})
        code, out, err = run(capsys, "config", "unpublish", "retry", "r\udce9sum\udce9", "--json",
                             *base)
        assert code == EXIT_OK, err
        assert json.loads(out)["entry"] == "retry:r\\xe9sum\\xe9"
        # The library's way for the last one.
        assert ConfigSync(store).remove_entry("retry:nan") > 0

        left = set(raw.hkeys(fleet_key(namespace)))
        assert left == {b"v", b"t", b"retry:mcp_call"}
        assert wait_for(lambda: sync.rejected == {})  # the replicas forget them too
        assert layer.retry.get_policy("mcp_call") == MCP5
        code, _, err = run(capsys, "config", "show", *base)
        assert code == EXIT_OK and "warning" not in err
        code, _, err = run(capsys, "config", "unpublish", "retry", "deep", *base)
        assert code == 1 and "not published" in err
        code, _, err = run(capsys, "config", "unpublish", "entry", "v", *base)
        assert code == 1  # the version is not an entry
        with pytest.raises(ConfigError):
            ConfigSync(store).remove_entry("v")
    finally:
        sync.stop()
        layer.close()


class _FailsToRestore(RetryEngine):
    """A retry engine that breaks when its own policy is put back (a bug outside
    any entry: what the poller's last-resort catch is for)."""

    own: RetryPolicy | None = None

    def __init__(self) -> None:
        super().__init__()
        self.own = self.get_policy("mcp_call")

    def upsert_policy(self, policy: RetryPolicy) -> None:
        if self.own is not None and policy == self.own:
            raise RuntimeError("cannot restore")
        super().upsert_policy(policy)


def test_an_unexpected_error_is_logged_and_the_poller_goes_on(
    store: durabilis.Store,
) -> None:
    engine = _FailsToRestore()
    assert engine.own is not None
    sync = ConfigSync(store, retry=engine, interval_seconds=0.05)
    operator = ConfigSync(store)
    with capture_logs() as logs, sync:
        operator.publish_policy(MCP5)
        assert wait_for(lambda: engine.get_policy("mcp_call") == MCP5)
        operator.unpublish("retry", "mcp_call")  # restoring its own raises in the poller
        assert wait_for(lambda: bool(events(logs, "durability_config_poll_failed")))
        later = RetryPolicy("later", 2, 1, 1, jitter=False)
        operator.publish_policy(later)
        assert wait_for(lambda: engine.get_policy("later") == later)
        assert sync._thread is not None and sync._thread.is_alive()
    (failed,) = events(logs, "durability_config_poll_failed")  # once, not once per poll
    assert failed["error"] == "RuntimeError: cannot restore"


def test_publishing_an_entry_over_the_cap_is_refused_before_any_io() -> None:
    store = durabilis.connect("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    fat = RetryPolicy("fat", 3, 1, 1, retryable_errors=tuple(f"E{i:06d}" for i in range(9000)))
    with pytest.raises(ConfigError) as info:
        ConfigSync(store).publish_policy(fat)
    assert "over the cap" in str(info.value)
    store.close()


def test_the_async_twin_rides_out_hostile_entries(
    redis_url: str, namespace: str, raw: Any
) -> None:
    async def main_() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store)
        operator = AsyncConfigSync(store)
        await operator.publish_breaker(MEM)
        plant(raw, namespace, HOSTILE)
        async with AsyncConfigSync(layer, interval_seconds=0.05) as sync:
            assert set(sync.rejected) == HOSTILE_NAMES
            assert layer.breakers.get_config("memory_service") == MEM
            plant(raw, namespace, {b"retry:deep3": b"[" * 50_000})
            await operator.publish_policy(MCP5)
            for _ in range(500):
                if layer.retry.get_policy("mcp_call") == MCP5:
                    break
                await asyncio.sleep(0.02)
            assert layer.retry.get_policy("mcp_call") == MCP5
            assert "retry:deep3" in sync.rejected
            assert await operator.remove_entry("retry:deep3") > 0
            assert "retry:deep3" not in (await operator.fleet_config()).rejected
        await layer.close()
        await store.close()

    asyncio.run(main_())


def test_many_replicas_polling_hostile_entries_all_keep_running(
    store: durabilis.Store, namespace: str, raw: Any
) -> None:
    layers = [DurabilityLayer(store) for _ in range(4)]
    syncs = [ConfigSync(layer, interval_seconds=0.02).start() for layer in layers]
    try:
        stop = threading.Event()

        def vandal() -> None:  # keeps rewriting hostile entries while the fleet polls
            n = 0
            while not stop.is_set():
                n += 1
                plant(raw, namespace, {b"retry:deep": b"[" * (40_000 + n),
                                       b"breaker:latin1": b"\xff" * n})
                time.sleep(0.01)

        thread = threading.Thread(target=vandal)
        thread.start()
        try:
            for i in range(5):
                policy = RetryPolicy("mcp_call", 2 + i, 1, 1, jitter=False)
                ConfigSync(store).publish_policy(policy)
                assert all(wait_for(lambda lay=lay, p=policy: lay.retry.get_policy("mcp_call") == p)
                           for lay in layers)
        finally:
            stop.set()
            thread.join()
        assert all(s._thread is not None and s._thread.is_alive() for s in syncs)
        assert all(set(s.rejected) == {"retry:deep", "breaker:latin1"} for s in syncs)
    finally:
        for s in syncs:
            s.stop()
        for layer in layers:
            layer.close()


def test_an_unreadable_version_field_does_not_block_the_reading_commands(
    redis_url: str, namespace: str, raw: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    raw.hset(fleet_key(namespace), mapping={"v": "junk", "retry:job": "{}"})
    base = ["--url", redis_url, "--namespace", namespace]
    for args in (["dlq", "ls"], ["breaker", "ls"], ["stats"]):
        code, _, err = run(capsys, *args, *base)
        assert code == 0, (args, err)
        assert "published fleet config is unreadable" in err, args


# --- entries over a hard maximum (durabilis._limits) ----------------------------------------

def _over_the_limit_entries() -> dict[bytes, bytes]:
    """One published entry per retry/budget/breaker bound, that field at twice its maximum."""
    out: dict[bytes, bytes] = {}
    for limit in LIMITS:
        over: Any = limit.maximum * 2
        over = int(over) if float(limit.maximum).is_integer() else over
        name = f"over_{limit.owner}_{limit.field}"
        if limit.owner in ("RetryPolicy", "RetryBudget"):
            data = policy_to_dict(RetryPolicy(name, 3, 1, 10, budget=durabilis.retry.RetryBudget()))
            target = data if limit.owner == "RetryPolicy" else data["budget"]
            target[limit.field] = over
            if limit.field == "initial_delay_ms":
                data["max_delay_ms"] = over
            out[f"retry:{name}".encode()] = json.dumps(data).encode()
        elif limit.owner == "CircuitBreakerConfig":
            data = breaker_to_dict(CircuitBreakerConfig(name))
            data[limit.field] = over
            if limit.field == "min_request_count":
                data["window_size"] = over
            if limit.field == "slow_call_duration_ms":
                data["slow_call_rate_threshold"] = 0.5
            out[f"breaker:{name}".encode()] = json.dumps(data).encode()
    return out


def test_a_published_entry_over_a_hard_maximum_is_rejected_by_every_replica(
    store: durabilis.Store, namespace: str, raw: Any
) -> None:
    over = _over_the_limit_entries()
    # The issue's own example: a policy of 10**9 attempts.
    billion = policy_to_dict(RetryPolicy("forever", 3, 1, 10))
    billion["max_attempts"] = 10**9
    over[b"retry:forever"] = json.dumps(billion).encode()
    plant(raw, namespace, over)
    layers = [DurabilityLayer(store), DurabilityLayer(store)]
    syncs = [ConfigSync(layer) for layer in layers]
    try:
        for sync, layer in zip(syncs, layers, strict=True):
            sync.refresh()
            assert set(sync.rejected) == {as_name(f) for f in over}
            for entry, reason in sync.rejected.items():
                field = "max_attempts" if entry == "retry:forever" else entry.split("_", 2)[2]
                assert field in reason, (entry, reason)
            assert layer.retry.get_policy("forever").operation_type == "*"  # not applied
        rejected = ConfigSync(store).fleet_config().rejected  # what `config show` lists
        assert set(rejected) == {as_name(f) for f in over}
    finally:
        for layer in layers:
            layer.close()
