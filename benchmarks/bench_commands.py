"""Redis commands per checkpoint save and per DLQ park, by command (issue 34).

Runs alone in a few seconds against its own redis-server::

    python -m benchmarks.bench_commands [--ops N] [--json PATH]

Each scenario runs ``ops`` operations between ``CONFIG RESETSTAT`` and ``INFO
commandstats`` (after a warm-up that loads the scripts); the figure is the
commands the server executed per operation, the ``EVALSHA`` and every command
its Lua script ran included, and the same split by command name (the table in
benchmarks/README.md justifies each one). Scenarios:

- ``checkpoint save, new task``: ``CheckpointManager.save`` of a task never
  saved before (the suite's "checkpoint save" cost row);
- ``checkpoint save, same phase again``: one task saved in a loop (each save
  replaces the task's current checkpoint of that phase: the lineage path);
- ``DLQ enqueue (public API)``: ``DeadLetterQueue.enqueue`` (the suite's "DLQ
  enqueue" cost row: no merge key);
- ``DLQ park, new record``: the layer's parking (a prepared record merged by
  its idempotency key), of a key with no record yet;
- ``DLQ park, merged``: the same key parked again while its record is pending.

No speed is measured here; the counts do not depend on the machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import uuid
from collections.abc import Callable
from typing import Any

import redis

import durabilis
from benchmarks._harness import redis_server
from benchmarks.bench_layer import payload
from durabilis.checkpoint import CheckpointManager
from durabilis.dlq import DeadLetterQueue

STATE = {"cursor": 1234, "done": ["fetch", "parse"], "note": "x" * 100}
ERROR = "NETWORK_TIMEOUT: upstream did not answer"


def _commandstats(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    }


def per_operation(admin: redis.Redis, op: Callable[[int], object], ops: int) -> dict[str, Any]:
    """Commands per call of ``op(i)`` over ``ops`` calls, in total and by command."""
    for i in range(3):  # warm-up: the scripts loaded, the keys made
        op(-1 - i)
    admin.config_resetstat()
    for i in range(ops):
        op(i)
    stats = _commandstats(admin)
    return {
        "commands": round(sum(stats.values()) / ops, 2),
        "by_command": {k: round(c / ops, 2) for k, c in sorted(stats.items())},
    }


def measure(url: str, admin: redis.Redis, ops: int) -> dict[str, Any]:
    """The four scenarios of the module docstring."""
    out: dict[str, Any] = {}
    with durabilis.connect(url, namespace="bench-commands") as store:
        ckpt = CheckpointManager(store)
        dlq = DeadLetterQueue(store)
        out["checkpoint save, new task"] = per_operation(
            admin, lambda i: ckpt.save(f"task-{i}", "agent-1", "phase-1", STATE), ops)
        out["checkpoint save, same phase again"] = per_operation(
            admin, lambda i: ckpt.save("task-loop", "agent-1", "phase-1", STATE), ops)
        keys = itertools.count()
        out["DLQ enqueue (public API)"] = per_operation(
            admin, lambda i: dlq.enqueue(
                "agent-1", "wiki_write", payload("pub", 0, next(keys)), 3, ERROR,
                metadata={"idempotency_key": f"agent-1:wiki_write:{i:032x}"}), ops)

        def park(i: int, *, again: bool) -> object:
            # The layer's parking: a prepared record, merged by its idempotency key.
            n = 0 if again else next(keys)
            key = f"agent-1:wiki_write:{n:032x}"
            prepared = dlq._ops.prepare(  # the layer's own calls
                "agent-1", "wiki_write", payload("cmd", 0, n),
                {"idempotency_key": key, "fingerprint": f"{n:016x}"})
            return store.run(dlq._ops.enqueue_prepared(
                prepared, 3, ERROR, dlq_id=uuid.uuid4().hex, merge_key=key))

        out["DLQ park, new record"] = per_operation(admin, lambda i: park(i, again=False), ops)
        out["DLQ park, merged"] = per_operation(admin, lambda i: park(i, again=True), ops)
    return out


def table(results: dict[str, Any]) -> str:
    lines = ["Redis commands per operation (INFO commandstats; the EVALSHA and Lua's commands)"]
    for name, f in results.items():
        lines.append(f"  {name:<36} {f['commands']:>7.2f}")
        lines.append("      " + ", ".join(f"{k} {v:g}" for k, v in f["by_command"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    with redis_server() as (url, admin):
        results = measure(url, admin, args.ops)
    print(table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
