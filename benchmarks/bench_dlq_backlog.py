"""How long DLQ reads block Redis when a large expired backlog awaits cleanup.

Run: ``python -m benchmarks.bench_dlq_backlog`` (``--expired N``, default
200000; ``--live N``, default 100; ``--rounds R``, default 3; ``--out FILE``
for the figures as JSON). It starts a private redis-server, then:

- parks N records with a 2 s TTL (``purge_per_enqueue=0``, so nothing is
  purged on the way) and, after them, ``--live`` pending records of five
  operation types that stay live; waits until the N records have expired and
  Redis has dropped their record hashes (the rest stays: stream entries,
  index entries, counts, as when no cleanup job runs);
- runs each operator read (``dlq stats``; ``dlq ls``: ``list_pending(limit=50)``
  plus ``pending_count()``, what the CLI runs; ``dlq ls --status all``:
  ``list_all(limit=500)``; a Prometheus scrape of ``DurabilisCollector``, a
  fresh one and the same one again) while a separate process sends PING every
  millisecond on its own connection, and reports the **longest PING** seen
  during the read (how long Redis was blocked), the read's wall time, and
  redis-server's CPU time for the read (measured in a separate pass, without
  the PINGs);
- finally ``cleanup_expired()`` of the whole backlog, the same way.

The longest PING of an idle window is the floor. Absolute figures vary by
machine; compare a run before and after a change on the same machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import redis
import structlog

import durabilis
from durabilis.dlq import DeadLetterQueue, DlqConfig
from durabilis.layer import DurabilityLayer
from durabilis.metrics import DurabilisCollector
from durabilis.testing import start_redis_server

_BATCH = 1000  # enqueues per pipeline while filling


def _pinger(url: str, conn: Connection) -> None:
    """Child process: between "begin" and "end", PING every ms; report the longest."""
    client = redis.Redis.from_url(url, socket_timeout=60)
    client.ping()
    while True:
        msg = conn.recv()
        if msg == "stop":
            return
        worst, count = 0.0, 0
        conn.send("ready")
        while not conn.poll():
            began = time.perf_counter()
            client.ping()
            worst = max(worst, time.perf_counter() - began)
            count += 1
            time.sleep(0.001)
        conn.recv()  # "end"
        conn.send((worst, count))


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def fill(store: durabilis.Store, dlq: DeadLetterQueue, expired: int, live: int) -> None:
    ops = dlq._ops
    for start in range(0, expired, _BATCH):
        calls = [
            ops.enqueue("agent-1", f"op-{i % 5}", {"n": i}, 3, "NETWORK_TIMEOUT", ttl_seconds=2)
            for i in range(start, min(expired, start + _BATCH))
        ]
        store.run_many(calls)
    store.run_many([
        ops.enqueue("agent-1", f"op-{i % 5}", {"live": i}, 3, "NETWORK_TIMEOUT",
                    ttl_seconds=3600)
        for i in range(live)
    ])


def settle(client: redis.Redis, live: int, timeout: float = 300.0) -> None:
    """Wait until the backlog has expired and Redis has dropped its record hashes."""
    deadline = time.monotonic() + timeout
    time.sleep(2.5)
    while int(client.dbsize()) > live + 20 and time.monotonic() < deadline:
        time.sleep(0.5)


def measure(
    fn: Callable[[], Any], client: redis.Redis, pinger: Connection, *, cpu: bool
) -> dict[str, float]:
    """One run of ``fn``: with the pinger (longest PING, wall time) or without (CPU)."""
    if cpu:
        before = _redis_cpu(client)
        began = time.perf_counter()
        fn()
        wall = time.perf_counter() - began
        return {"wall_ms": wall * 1e3, "redis_cpu_ms": (_redis_cpu(client) - before) * 1e3}
    pinger.send("begin")
    assert pinger.recv() == "ready"
    began = time.perf_counter()
    fn()
    wall = time.perf_counter() - began
    pinger.send("end")
    worst, count = pinger.recv()
    return {"wall_ms": wall * 1e3, "max_ping_ms": worst * 1e3, "pings": count}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--expired", type=int, default=200_000)
    parser.add_argument("--live", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    with tempfile.TemporaryDirectory(prefix="durabilis-bench-") as tmp:
        server = start_redis_server(tmp)
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_pinger, args=(server.url, child), daemon=True)
        proc.start()
        try:
            client = redis.Redis.from_url(server.url, socket_timeout=120)
            store = durabilis.connect(server.url, namespace="bench", socket_timeout=120)
            dlq = DeadLetterQueue(store, DlqConfig(purge_per_enqueue=0))
            layer = DurabilityLayer(store)
            began = time.perf_counter()
            fill(store, dlq, args.expired, args.live)
            settle(client, args.live)
            filled = time.perf_counter() - began
            st = dlq.stats()
            answer = {
                "total": st.total, "pending": st.pending,
                "expired_awaiting_cleanup": st.expired_awaiting_cleanup,
                "exact": getattr(st, "exact", None),  # None: before DlqStats.exact existed
                "oldest_pending_age_seconds": st.oldest_pending_age_seconds,
            }
            print(f"DLQ with {args.expired} expired records awaiting cleanup and {args.live} "
                  f"live pending (filled and expired in {filled:.0f} s); redis keys: "
                  f"{client.dbsize()}; stats: "
                  + ", ".join(f"{k} {v}" for k, v in answer.items()))

            scraped = DurabilisCollector(layer)

            def scrape_again() -> None:
                list(scraped.collect())

            reads: dict[str, Callable[[], Any]] = {
                "idle (0.3 s)": lambda: time.sleep(0.3),
                "dlq stats": dlq.stats,
                "dlq ls (pending, limit 50)": lambda: (
                    dlq.list_pending(limit=50), dlq.pending_count()
                ),
                "dlq ls --status all (limit 500)": lambda: dlq.list_all(limit=500),
                "scrape (fresh collector)": lambda: list(DurabilisCollector(layer).collect()),
                "scrape (same collector again)": scrape_again,
            }
            scrape_again()  # the "again" rows follow a first scrape
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in reads}
            for _ in range(args.rounds):
                for name, fn in reads.items():
                    if name.startswith("scrape (same"):
                        scrape_again()
                    pinged = measure(fn, client, parent, cpu=False)
                    if name.startswith("scrape (same"):
                        scrape_again()
                    pinged.update(measure(fn, client, parent, cpu=True))
                    runs[name].append(pinged)
            cleanup = measure(dlq.cleanup_expired, client, parent, cpu=False)
            runs["cleanup_expired (whole backlog)"] = [cleanup]

            print(f"\n{'read':<34}{'max PING ms':>12}{'wall ms':>10}{'redis CPU ms':>14}"
                  "   (median of rounds; max PING: worst round)")
            result: dict[str, Any] = {"expired": args.expired, "live": args.live,
                                      "stats": answer, "reads": {}}
            for name, samples in runs.items():
                worst = max(s["max_ping_ms"] for s in samples)
                wall = statistics.median(s["wall_ms"] for s in samples)
                cpus = [s["redis_cpu_ms"] for s in samples if "redis_cpu_ms" in s]
                cpu = statistics.median(cpus) if cpus else float("nan")
                print(f"{name:<34}{worst:>12.1f}{wall:>10.1f}{cpu:>14.1f}")
                result["reads"][name] = {"max_ping_ms": worst, "wall_ms": wall,
                                         "redis_cpu_ms": cpu, "runs": samples}
            if args.out:
                with open(args.out, "w", encoding="utf-8") as f:
                    json.dump(result, f, indent=1)
            layer.close()
            store.close()
            client.close()
        finally:
            parent.send("stop")
            proc.join(5)
            server.stop()


if __name__ == "__main__":
    main()
