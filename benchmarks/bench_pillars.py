"""Each pillar alone, the Redis floor, and the cost in Redis commands and memory.

Workloads (factories for :mod:`benchmarks._harness`), one logical operation each:

- ``ping`` / ``evalsha``: the floor, raw redis-py on one connection: a PING,
  and an EVALSHA of ``return 1`` (the cheapest possible script round trip);
- ``idempotency``: ``IdempotencyGuard.check_and_record(key)`` then
  ``record(key, result, token)``: two round trips, as the layer's happy path;
  ``idempotency_duplicate``: ``check_and_record`` of a completed key (one round trip);
- ``breaker``: ``CircuitBreakerRegistry.before_call`` then ``after_call(True, permit)``;
- ``checkpoint_save`` / ``checkpoint_restore``: ``CheckpointManager.save`` of a
  small state (a new task each call); ``restore`` of a task's latest checkpoint;
- ``dlq_enqueue`` / ``dlq_replay``: ``DeadLetterQueue.enqueue`` of a small
  operation; ``replay(dlq_id, handler)`` of a pending record (claim, handler,
  mark replayed), the records being enqueued before the timed run.

:func:`costs` counts, per logical operation, the round trips (client-side:
packets written by the connection), the Redis commands executed (``INFO
commandstats`` deltas, commands run inside Lua scripts included) and the
Redis server's CPU time. :func:`memory` measures ``MEMORY USAGE`` per record.
The detailed memory studies of one pillar each stay in ``bench_checkpoint_memory``
and ``bench_dlq``; their helpers are reused here.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import redis
import redis.asyncio

import durabilis
from benchmarks import bench_checkpoint_memory, bench_dlq
from benchmarks._harness import CLIENT_OPTIONS, Workload, load, skipped
from benchmarks.bench_layer import payload
from durabilis import IdempotencyKey
from durabilis.breaker import CircuitBreakerRegistry
from durabilis.checkpoint import CheckpointManager
from durabilis.dlq import DeadLetterQueue
from durabilis.idempotency import IdempotencyGuard

NAMESPACE = "bench-pillars"
RESULT = {"ok": True, "rev": 7}
STATE = {"cursor": 1234, "done": ["fetch", "parse"], "note": "x" * 100}


class _Raw(Workload):
    def __init__(self, url: str, index: int, *, script: bool) -> None:
        self.client = redis.Redis.from_url(url, **CLIENT_OPTIONS)
        if script:
            sha = self.client.script_load("return 1")
            execute = self.client.execute_command
            self.call = lambda: execute("EVALSHA", sha, 0)  # type: ignore[method-assign]
        else:
            self.call = self.client.ping  # type: ignore[method-assign]

    def close(self) -> None:
        self.client.close()


class _AsyncPing(Workload):
    """PING after PING on one asyncio connection: the floor of one coroutine."""

    is_async = True

    def __init__(self, url: str, index: int) -> None:
        self.client = redis.asyncio.Redis.from_url(
            url, single_connection_client=True, **CLIENT_OPTIONS
        )

    async def acall(self) -> object:
        return await self.client.ping()

    async def aclose(self) -> None:
        await self.client.aclose()


class _Pillar(Workload):
    def __init__(self, url: str, index: int, **options: Any) -> None:
        self.store = durabilis.connect(url, namespace=NAMESPACE, **options)
        self.index = index
        self.tag = "-"
        self.counter = itertools.count()

    def start(self, tag: str) -> None:
        self.tag = tag
        self.counter = itertools.count()

    def close(self) -> None:
        self.store.close()


class Idempotency(_Pillar):
    def __init__(self, url: str, index: int, **options: Any) -> None:
        super().__init__(url, index, **options)
        self.guard = IdempotencyGuard(self.store)

    def call(self) -> object:
        key = IdempotencyKey.new(
            "agent-1", "memory_write", payload(self.tag, self.index, next(self.counter))
        )
        claim = self.guard.check_and_record(key)
        self.guard.record(key, RESULT, claim.token)  # type: ignore[union-attr]
        return None


class IdempotencyDuplicate(Idempotency):
    """``check_and_record`` of a key whose operation completed: one round trip, a Duplicate."""

    def start(self, tag: str) -> None:
        super().start(tag)
        self.key = IdempotencyKey.new("agent-1", "memory_write", payload(tag, self.index, 0))
        claim = self.guard.check_and_record(self.key)
        self.guard.record(self.key, RESULT, claim.token)  # type: ignore[union-attr]

    def call(self) -> object:
        self.guard.check_and_record(self.key)
        return None


class Breaker(_Pillar):
    def __init__(self, url: str, index: int, **options: Any) -> None:
        super().__init__(url, index, **options)
        self.registry = CircuitBreakerRegistry(self.store)

    def call(self) -> object:
        permit = self.registry.before_call("memory_service")
        self.registry.after_call("memory_service", True, permit, 0.01)
        return None


class CheckpointSave(_Pillar):
    def __init__(self, url: str, index: int, **options: Any) -> None:
        super().__init__(url, index, **options)
        self.manager = CheckpointManager(self.store)

    def call(self) -> object:
        task = f"task-{self.tag}-{self.index}-{next(self.counter)}"
        self.manager.save(task, "agent-1", "phase-1", STATE)
        return None


class CheckpointRestore(CheckpointSave):
    def start(self, tag: str) -> None:
        super().start(tag)
        self.task = f"restore-{tag}-{self.index}"
        self.manager.save(self.task, "agent-1", "phase-1", STATE)

    def call(self) -> object:
        self.manager.restore(self.task, "agent-1")
        return None


class DlqEnqueue(_Pillar):
    def __init__(self, url: str, index: int, **options: Any) -> None:
        super().__init__(url, index, **options)
        self.dlq = DeadLetterQueue(self.store)

    def call(self) -> object:
        i = next(self.counter)
        self.dlq.enqueue(
            "agent-1", "wiki_write", payload(self.tag, self.index, i), 3,
            "NETWORK_TIMEOUT: upstream did not answer",
            metadata={"idempotency_key": f"agent-1:wiki_write:{i:032x}"},
        )
        return None


class DlqReplay(DlqEnqueue):
    def start(self, tag: str) -> None:
        super().start(tag)
        self.ids: list[str] = []

    def prepare(self, n: int) -> None:
        self.ids = [
            self.dlq.enqueue(
                "agent-1", "wiki_write", payload(self.tag, self.index, i), 3, "NETWORK_TIMEOUT"
            )
            for i in itertools.islice(self.counter, n)
        ]
        self.ids.reverse()

    def call(self) -> object:
        if not self.ids:  # a timed loop outran prepare(): replay a fresh record
            self.prepare(1)
        self.dlq.replay(self.ids.pop(), _handled)
        return None


def _handled(record: durabilis.dlq.DlqRecord) -> None:
    return None


def ping(url: str, index: int) -> Workload:
    return _Raw(url, index, script=False)


def ping_async(url: str, index: int) -> Workload:
    return _AsyncPing(url, index)


def evalsha(url: str, index: int) -> Workload:
    return _Raw(url, index, script=True)


def idempotency(url: str, index: int) -> Workload:
    return Idempotency(url, index)


def idempotency_duplicate(url: str, index: int) -> Workload:
    return IdempotencyDuplicate(url, index)


def breaker(url: str, index: int) -> Workload:
    return Breaker(url, index)


def checkpoint_save(url: str, index: int) -> Workload:
    return CheckpointSave(url, index)


def checkpoint_restore(url: str, index: int) -> Workload:
    return CheckpointRestore(url, index)


def dlq_enqueue(url: str, index: int) -> Workload:
    return DlqEnqueue(url, index)


def dlq_replay(url: str, index: int) -> Workload:
    return DlqReplay(url, index)


FLOOR = {
    "redis PING": "benchmarks.bench_pillars:ping",
    "redis PING (asyncio, 1 connection)": "benchmarks.bench_pillars:ping_async",
    "redis EVALSHA (return 1)": "benchmarks.bench_pillars:evalsha",
}
"""The floor: raw redis-py round trips on one connection."""

SINGLE = {
    "idempotency claim+record": "benchmarks.bench_pillars:idempotency",
    "idempotency duplicate (completed key)": "benchmarks.bench_pillars:idempotency_duplicate",
    "breaker admit+report": "benchmarks.bench_pillars:breaker",
    "checkpoint save": "benchmarks.bench_pillars:checkpoint_save",
    "checkpoint restore": "benchmarks.bench_pillars:checkpoint_restore",
    "DLQ enqueue": "benchmarks.bench_pillars:dlq_enqueue",
    "DLQ replay": "benchmarks.bench_pillars:dlq_replay",
}
"""Each pillar alone, in-process."""

PROCESSES = {
    "redis PING": "benchmarks.bench_pillars:ping",
    "idempotency claim+record": "benchmarks.bench_pillars:idempotency",
}
"""Multi-process figures."""


# --- cost: commands and round trips per operation ------------------------------------


_WRITES = [0]


@contextlib.contextmanager
def _counting_writes() -> Iterator[None]:
    """Count the packets every redis-py connection of this process writes (round trips)."""
    cls = redis.connection.AbstractConnection
    original = cls.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        _WRITES[0] += 1
        original(self, command, check_health)

    cls.send_packed_command = counting  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.send_packed_command = original  # type: ignore[method-assign]


def _commandstats(admin: redis.Redis) -> dict[str, tuple[int, int]]:
    """Command name -> (calls, usec) since the last CONFIG RESETSTAT (ours excluded)."""
    stats = admin.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    }


def _cpu(admin: redis.Redis) -> float:
    info = admin.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def costs(
    url: str, admin: redis.Redis, factories: Mapping[str, str], ops: int, errors: list[str]
) -> dict[str, Any]:
    """Per logical operation: round trips, Redis commands (by name) and server CPU.

    Each workload runs ``ops`` operations alone (after a warm-up that loads the
    scripts), between ``CONFIG RESETSTAT`` and ``INFO commandstats``. Commands
    executed by Lua scripts count as commands (they are what the server does);
    the round trips are the packets the client wrote.
    """
    out: dict[str, Any] = {}
    for kind, path in factories.items():
        try:
            w = load(path)(url, 0)
        except Exception as exc:  # a missing peer is reported, not fatal
            out[kind] = skipped(f"{type(exc).__name__}: {exc}")
            continue
        try:
            w.start(f"cost-warm-{kind}")
            w.prepare(5)
            for _ in range(5):
                w.call()
            w.start(f"cost-{kind}")
            w.prepare(ops)
            admin.config_resetstat()
            cpu = _cpu(admin)
            with _counting_writes():
                _WRITES[0] = 0
                for _ in range(ops):
                    w.call()
                writes = _WRITES[0]
            cpu = _cpu(admin) - cpu
            stats = _commandstats(admin)
            total = sum(calls for calls, _ in stats.values())
            scripts = [stats.get(name, (0, 0)) for name in ("evalsha", "eval")]
            out[kind] = {
                "round_trips": round(writes / ops, 2),
                "commands": round(total / ops, 2),
                "scripts": round(sum(c for c, _ in scripts) / ops, 2),
                # Time inside the scripts (their commands included), networking excluded.
                "script_us": round(sum(u for _, u in scripts) / ops, 1),
                "server_cpu_us": round(cpu / ops * 1e6, 1),
                "by_command": {k: round(c / ops, 2) for k, (c, _) in sorted(stats.items())},
            }
        except Exception as exc:
            errors.append(f"cost {kind}: {type(exc).__name__}: {exc}")
            out[kind] = skipped(f"{type(exc).__name__}: {exc}")
        finally:
            w.close()
    return out


COST = {
    "redis PING": "benchmarks.bench_pillars:ping",
    "redis EVALSHA (return 1)": "benchmarks.bench_pillars:evalsha",
    "durable call (new key)": "benchmarks.bench_layer:durable_sync",
    "durable call's 2 scripts, no layer": "benchmarks.bench_layer:durable_scripts_raw",
    "durable call (completed duplicate)": "benchmarks.bench_layer:durable_duplicate",
    "idempotency claim+record": "benchmarks.bench_pillars:idempotency",
    "idempotency duplicate (completed key)": "benchmarks.bench_pillars:idempotency_duplicate",
    "breaker admit+report": "benchmarks.bench_pillars:breaker",
    "checkpoint save": "benchmarks.bench_pillars:checkpoint_save",
    "checkpoint restore": "benchmarks.bench_pillars:checkpoint_restore",
    "DLQ enqueue": "benchmarks.bench_pillars:dlq_enqueue",
    "DLQ replay": "benchmarks.bench_pillars:dlq_replay",
}


# --- cost: memory per record ------------------------------------------------------------


def _usage(client: redis.Redis, key: Any) -> int:
    return bench_dlq.usage(client, key)


def _mean_usage(client: redis.Redis, pattern: str, limit: int = 200) -> float:
    sizes = [_usage(client, k) for k in itertools.islice(client.scan_iter(match=pattern), limit)]
    return sum(sizes) / len(sizes) if sizes else 0.0


def memory(url: str, admin: redis.Redis, n: int, errors: list[str]) -> dict[str, Any]:
    """Redis memory (``MEMORY USAGE ... SAMPLES 0``, bytes) per record of each pillar.

    Each pillar writes ``n`` records into a namespace of its own; the figure is
    the mean over the records' keys plus each shared structure's growth per
    record (indexes, streams). Values are the same small payloads as the
    throughput figures (payload ~150 B JSON, result ~20 B, state ~130 B).
    """
    out: dict[str, Any] = {}

    def section(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        try:
            out[name] = fn()
        except Exception as exc:
            errors.append(f"memory {name}: {type(exc).__name__}: {exc}")
            out[name] = skipped(f"{type(exc).__name__}: {exc}")

    def idem() -> dict[str, Any]:
        with durabilis.connect(url, namespace="mem-idem") as store:
            guard = IdempotencyGuard(store)
            for i in range(n):
                key = IdempotencyKey.new("agent-1", "memory_write", payload("mem", 0, i))
                claim = guard.check_and_record(key)
                guard.record(key, RESULT, claim.token)  # type: ignore[union-attr]
            return {"bytes": round(_mean_usage(admin, store.keys.idem_pattern())),
                    "what": "one completed record (hash: state, token, times, result)"}

    def layer() -> dict[str, Any]:
        from benchmarks.bench_layer import _result  # noqa: PLC0415

        with durabilis.connect(url, namespace="mem-layer") as store:
            lay = durabilis.DurabilityLayer(store)
            for i in range(n):
                lay.execute("agent-1", "memory_write", payload("mem", 0, i), _result)
            lay.close()
            return {"bytes": round(_mean_usage(admin, store.keys.idem_pattern())),
                    "what": "the idempotency record a completed durable call leaves"}

    def breaker_keys() -> dict[str, Any]:
        with durabilis.connect(url, namespace="mem-cb") as store:
            reg = CircuitBreakerRegistry(store)
            for _ in range(max(n, 50)):  # more than the window: the steady state
                reg.after_call("memory_service", True, reg.before_call("memory_service"), 1.0)
            keys = list(admin.scan_iter(match=f"{store.keys.breaker('memory_service')}*"))
            return {"bytes": sum(_usage(admin, k) for k in keys), "keys": len(keys),
                    "what": "one breaker, window full (state, window, config, ...)"}

    def checkpoint() -> dict[str, Any]:
        with durabilis.connect(url, namespace="mem-ckpt") as store:
            mgr = CheckpointManager(store)
            for i in range(n):
                mgr.save(f"task-{i}", "agent-1", "phase-1", STATE)
            total, keys = bench_checkpoint_memory._memory_usage(admin, store.keys.pattern())
            return {"bytes": round(total / n), "keys": keys,
                    "what": "one checkpoint of a distinct task, with its share of the indexes"}

    def dlq() -> dict[str, Any]:
        with durabilis.connect(url, namespace="mem-dlq") as store:
            queue = DeadLetterQueue(store)
            queue.enqueue("agent-1", "wiki_write", payload("mem", 0, -1), 3, "TIMEOUT")
            before = bench_dlq.snapshot(admin, store)
            ids = [
                queue.enqueue("agent-1", "wiki_write", payload("mem", 0, i), 3,
                              "NETWORK_TIMEOUT: upstream did not answer")
                for i in range(n)
            ]
            after = bench_dlq.snapshot(admin, store)
            rec = sum(_usage(admin, store.keys.dlq("rec", i)) for i in ids[:200])
            rec_mean = rec / min(len(ids), 200)
            shared = sum(
                after[k] - before[k]
                for k in ("stream", "expiry index", "pending index", "pending-by-op index")
            ) / n
            return {"bytes": round(rec_mean + shared), "record_hash": round(rec_mean),
                    "stream_and_indexes": round(shared),
                    "what": "one pending record: hash + its stream entry and index entries"}

    section("idempotency record", idem)
    section("durable call record", layer)
    section("breaker", breaker_keys)
    section("checkpoint", checkpoint)
    section("DLQ record", dlq)
    return out
