"""Redis memory per checkpoint, beside the bare minimum of storing the same state.

Run: ``python -m benchmarks.bench_checkpoint_memory`` (``--count`` checkpoints,
default 1000; ``--state-bytes``, default 1024: the msgpack-encoded size of each
state). It starts its own redis-server (no persistence) and, per layout, saves
``--count`` checkpoints into a fresh namespace, then reports:

- ``MEMORY USAGE``: the sum of ``MEMORY USAGE <key> SAMPLES 0`` over every key
  of the namespace (records, task indexes, the global indexes), per checkpoint;
- ``used_memory delta``: ``INFO memory`` ``used_memory`` after minus before,
  per checkpoint (includes allocator and dict-growth effects);
- the ratio to ``raw hash``: the same state stored the cheapest sensible way by
  hand (one hash per checkpoint with the state and a TTL, nothing else).

Layouts:

- ``distinct tasks``: one checkpoint per task (the worst case for the per-task index);
- ``5-phase tasks``: count/5 tasks of 5 phases each (the resume helper's shape);
- ``replaced (lineage)``: one task and phase saved ``--count`` times: one current
  checkpoint plus ``count - 1`` replaced records kept for lineage until their TTL.

Absolute figures depend on the Redis version and allocator; ratios are the result.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from typing import Any

import durabilis
from durabilis.checkpoint import CheckpointConfig, CheckpointManager
from durabilis.testing import RedisServer


def _state(size: int) -> bytes:
    # msgpack bin8/bin16 header: 2 or 3 bytes; the encoded state is exactly `size`.
    return b"s" * (size - (2 if size - 2 < 256 else 3))


def _used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def _memory_usage(client: Any, pattern: str) -> tuple[int, int]:
    total, keys = 0, 0
    for key in client.scan_iter(match=pattern, count=1000):
        total += int(client.memory_usage(key, samples=0) or 0)
        keys += 1
    return total, keys


def _measure(client: Any, pattern: str, n: int, fill: Callable[[], None]) -> dict[str, float]:
    client.execute_command("MEMORY", "PURGE")
    before = _used_memory(client)
    fill()
    after = _used_memory(client)
    usage, keys = _memory_usage(client, pattern)
    return {"usage": usage / n, "delta": (after - before) / n, "keys": keys}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--state-bytes", type=int, default=1024)
    args = parser.parse_args(argv)
    n, state = args.count, _state(args.state_bytes)
    assert n % 5 == 0, "--count must be a multiple of 5"

    with tempfile.TemporaryDirectory(prefix="durabilis-bench-") as tmp:
        server = RedisServer(tmp).start()
        try:
            store = durabilis.connect(server.url, namespace="bench")
            client = store.client
            version = client.info("server")["redis_version"]
            rows: list[tuple[str, dict[str, float]]] = []

            def raw_fill() -> None:
                pipe = client.pipeline(transaction=False)
                for i in range(n):
                    key = f"raw:{{ckpt}}:rec:{i:032x}"
                    pipe.hset(key, mapping={"s": state})
                    pipe.pexpire(key, 86_400_000)
                pipe.execute()

            rows.append(("raw hash", _measure(client, "raw:*", n, raw_fill)))

            def layout(name: str, ns: str, fill: Callable[[CheckpointManager], None]) -> None:
                with durabilis.connect(server.url, namespace=ns) as s:
                    mgr = CheckpointManager(s, CheckpointConfig(max_checkpoints=10 * n))
                    rows.append((name, _measure(client, f"{ns}:*", n, lambda: fill(mgr))))

            layout(
                "distinct tasks", "distinct",
                lambda m: [m.save(f"task-{i}", "agent-1", "phase-1", state) for i in range(n)],
            )
            layout(
                "5-phase tasks", "phases",
                lambda m: [
                    m.save(f"task-{i // 5}", "agent-1", f"phase-{i % 5 + 1}", state)
                    for i in range(n)
                ],
            )
            layout(
                "replaced (lineage)", "lineage",
                lambda m: [m.save("task", "agent-1", "phase-1", state) for _ in range(n)],
            )
        finally:
            server.stop()

    base = rows[0][1]["usage"]
    print(
        f"Redis {version}: memory per checkpoint, {n} checkpoints, "
        f"state {args.state_bytes} B (msgpack)"
    )
    print(f"{'layout':<22}{'MEMORY USAGE':>14}{'used_memory d':>15}{'keys':>8}{'vs raw':>9}")
    for name, r in rows:
        print(
            f"{name:<22}{r['usage']:>12.0f} B{r['delta']:>13.0f} B"
            f"{int(r['keys']):>8}{r['usage'] / base:>8.2f}x"
        )


if __name__ == "__main__":
    main()
