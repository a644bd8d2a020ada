"""Redis memory per DLQ record, and the cost of an enqueue beside a bare XADD.

Run: ``python -m benchmarks.bench_dlq`` (``--records N``, default 2000;
``--payload-bytes B``, default 1024). It starts a private redis-server, then:

- enqueues N records whose ``original_operation`` is a JSON object of about B
  bytes (plus an idempotency key as metadata) and reports, per record, the
  exact ``MEMORY USAGE ... SAMPLES 0`` of its hash, the growth of the stream,
  of the indexes, and of the server's ``used_memory``;
- marks them replayed and reports the same (replayed records leave the
  pending indexes);
- times, interleaved round by round, one enqueue (one EVALSHA) against one
  bare ``XADD`` of the same fields (the floor: one round trip, one append).

Absolute figures vary by machine and Redis version; the ratios are the result.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from typing import Any

import redis
import structlog

import durabilis
from durabilis.dlq import DeadLetterQueue
from durabilis.testing import start_redis_server


def usage(client: redis.Redis, key: str) -> int:
    return int(client.execute_command("MEMORY", "USAGE", key, "SAMPLES", 0) or 0)


def snapshot(client: redis.Redis, store: durabilis.Store) -> dict[str, int]:
    k = store.keys
    return {
        "stream": usage(client, k.dlq("stream")),
        "expiry index": usage(client, k.dlq("expiry")),
        "pending index": usage(client, k.dlq("pending")),
        "pending-by-op index": usage(client, k.dlq("pending-by-op")),
        "counts hash": usage(client, k.dlq("counts")),
        "used_memory": int(client.info("memory")["used_memory"]),
    }


def operation(i: int, size: int) -> dict[str, Any]:
    body = "x" * max(0, size - 80)
    return {"page": f"Page-{i}", "revision": i, "author": "agent-1", "text": body}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    n = args.records
    # The per-enqueue info event would time the console, not the DLQ.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    with tempfile.TemporaryDirectory(prefix="durabilis-bench-") as tmp:
        server = start_redis_server(tmp)
        try:
            client = redis.Redis.from_url(server.url)
            store = durabilis.connect(server.url, namespace="bench")
            dlq = DeadLetterQueue(store)
            # One record first, so every key exists and the deltas are per record.
            dlq.enqueue("agent-1", "wiki_write", operation(-1, args.payload_bytes), 3, "TIMEOUT")
            before = snapshot(client, store)
            ids = []
            for i in range(n):
                ids.append(
                    dlq.enqueue(
                        "agent-1",
                        "wiki_write",
                        operation(i, args.payload_bytes),
                        3,
                        "NETWORK_TIMEOUT: upstream did not answer in 30 s",
                        metadata={"idempotency_key": f"agent-1:wiki_write:{i:032x}"},
                    )
                )
            after = snapshot(client, store)
            stream_entry = client.xrange(store.keys.dlq("stream"), count=2)[1][1]
            op_bytes = len(stream_entry[b"original_operation"])
            hashes = [usage(client, store.keys.dlq("rec", i)) for i in ids[:200]]
            for i in ids:
                dlq.mark_replayed(i)
            replayed = snapshot(client, store)
            replayed_hashes = [usage(client, store.keys.dlq("rec", i)) for i in ids[:200]]

            print(f"DLQ memory per record: {n} records, original_operation = {op_bytes} B JSON")
            print(f"{'structure':<24}{'pending B/rec':>16}{'replayed B/rec':>16}")
            print(f"{'record hash':<24}{statistics.mean(hashes):>16.0f}"
                  f"{statistics.mean(replayed_hashes):>16.0f}")
            for name in ("stream", "expiry index", "pending index", "pending-by-op index"):
                grow = (after[name] - before[name]) / n
                grow_r = (replayed[name] - before[name]) / n
                print(f"{name:<24}{grow:>16.0f}{grow_r:>16.0f}")
            total = statistics.mean(hashes) + sum(
                (after[k] - before[k]) / n
                for k in ("stream", "expiry index", "pending index", "pending-by-op index")
            )
            used = (after["used_memory"] - before["used_memory"]) / n
            print(f"{'sum of the above':<24}{total:>16.0f}")
            print(f"{'INFO used_memory delta':<24}{used:>16.0f}")
            print(f"overhead beyond the operation's own bytes: {total - op_bytes:.0f} B/record "
                  f"({total / op_bytes:.2f}x the payload)")

            # Enqueue vs a bare XADD of the same fields, interleaved per round.
            fields = dict(stream_entry)
            raw_stream = "bench:raw-stream"
            per_round = max(200, n // 4)
            enq, xadd = [], []
            payload = operation(0, args.payload_bytes)
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                for _ in range(per_round):
                    client.xadd(raw_stream, fields)
                xadd.append((time.perf_counter() - t0) / per_round)
                t0 = time.perf_counter()
                for _ in range(per_round):
                    dlq.enqueue("agent-1", "wiki_write", payload, 3, "TIMEOUT")
                enq.append((time.perf_counter() - t0) / per_round)
            e, x = statistics.median(enq), statistics.median(xadd)
            print()
            print(f"{'per call':<24}{'median us':>12}{'ratio':>8}")
            print(f"{'bare XADD':<24}{x * 1e6:>12.1f}{1.0:>8.2f}")
            print(f"{'DeadLetterQueue.enqueue':<24}{e * 1e6:>12.1f}{e / x:>8.2f}")
            store.close()
            client.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
