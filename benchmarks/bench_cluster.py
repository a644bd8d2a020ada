"""What Redis Cluster costs durabilis: one script, several in ``Store.run_many``, and
the durable call.

Run: ``python -m benchmarks.bench_cluster`` (``--rounds N``, default 2000). It starts
a private standalone redis-server and a local 3+3 Redis Cluster (loopback), then
times, interleaved call by call, on fresh idempotency keys:

- one claim (``Store.run``: one EVALSHA);
- two and four claims through ``Store.run_many``: one pipeline on a standalone
  server; on Cluster redis-py refuses EVALSHA in pipelines, so they are sent
  concurrently, each to its node (``Store._wave``);
- the durable call (``benchmarks.bench_layer``'s ``durable_sync`` and
  ``durable_async``, one call in flight): 2 round trips one after another on
  both (on Cluster the claim goes with its birth entry, beside the in-flight
  entry: docs/layer.md, "Steps and round trips"; 3 before).

Absolute figures vary by machine; the ratios are the result. The Targets block
compares the durable call's rate on Cluster with the standalone one.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable

import durabilis
from benchmarks.bench_layer import DurableAsync, DurableSync
from durabilis.idempotency import IdempotencyGuard
from durabilis.testing import start_redis_server
from tests.support.cluster import LocalCluster


def timer(store: durabilis.Store, batch: int) -> Callable[[int], float]:
    ops = IdempotencyGuard(store)._ops
    def one(i: int) -> float:
        calls = [ops.claim(ops.validate_key(f"bench-{batch}-{i}-{j}"), None) for j in range(batch)]
        began = time.perf_counter()
        if batch == 1:
            store.run(calls[0])
        else:
            store.run_many(calls)
        return time.perf_counter() - began
    return one


def durable(url: str, kind: str) -> tuple[Callable[[int], float], Callable[[], None]]:
    """A timer of one durable call (sync, or async on a loop of its own), and its close."""
    if kind == "sync":
        work = DurableSync(url, 0)
        work.start("c")

        def one(_: int) -> float:
            began = time.perf_counter()
            work.call()
            return time.perf_counter() - began
        return one, work.close

    loop = asyncio.new_event_loop()
    awork = DurableAsync(url, 0)
    awork.start("c")

    async def timed() -> float:
        began = time.perf_counter()
        await awork.acall()
        return time.perf_counter() - began

    def aone(_: int) -> float:
        return loop.run_until_complete(timed())

    def aclose() -> None:
        loop.run_until_complete(awork.aclose())
        loop.close()
    return aone, aclose


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="durabilis-bench-") as tmp:
        server = start_redis_server(tmp + "/standalone")
        cluster = LocalCluster(tmp + "/cluster").start()
        try:
            stores = {
                "standalone": durabilis.connect(server.url, namespace="bench"),
                "cluster": durabilis.connect(cluster.url, namespace="bench"),
            }
            cases = {(name, batch): timer(store, batch)
                     for name, store in stores.items() for batch in (1, 2, 4)}
            samples: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
            for fn in cases.values():  # warm-up: scripts loaded, connections open
                fn(-1)
            for i in range(args.rounds):
                for case, fn in cases.items():
                    samples[case].append(fn(i))
            med = {case: statistics.median(v) * 1e6 for case, v in samples.items()}
            one = med[("standalone", 1)]
            print(f"{'backend':<11} {'scripts':>7} {'median us':>10} {'x 1 standalone':>15} "
                  f"{'x 1 same backend':>17}")
            for (name, batch), us in med.items():
                print(f"{name:<11} {batch:>7} {us:>10.0f} {us / one:>15.2f} "
                      f"{us / med[(name, 1)]:>17.2f}")
            for store in stores.values():
                store.close()
            durable_calls(args.rounds, {"standalone": server.url, "cluster": cluster.url})
        finally:
            cluster.stop()
            server.stop()


def durable_calls(rounds: int, urls: dict[str, str]) -> None:
    """The durable call on both backends, interleaved; the Targets block."""
    timers = {(name, kind): durable(url, kind) for name, url in urls.items()
              for kind in ("sync", "async")}
    samples: dict[tuple[str, str], list[float]] = {case: [] for case in timers}
    try:
        for fn, _ in timers.values():  # warm-up: scripts loaded, connections open
            for i in range(20):
                fn(i)
        for i in range(rounds):
            for case, (fn, _) in timers.items():
                samples[case].append(fn(i))
    finally:
        for _, close in timers.values():
            close()
    med = {case: statistics.median(v) * 1e6 for case, v in samples.items()}
    print(f"\n{'durable call':<13} {'standalone us':>14} {'cluster us':>11} "
          f"{'cluster rate / standalone':>26}")
    for kind in ("sync", "async"):
        alone, cl = med[("standalone", kind)], med[("cluster", kind)]
        print(f"{kind:<13} {alone:>14.0f} {cl:>11.0f} {alone / cl:>26.2f}")
    print("\nTargets")
    for kind in ("sync", "async"):
        ratio = med[("standalone", kind)] / med[("cluster", kind)]
        print(f"  durable call ({kind}), Cluster / standalone (calls/s): {ratio:.2f} "
              f"(target >= 0.8: {'met' if ratio >= 0.8 else 'not met'})")


if __name__ == "__main__":
    main()
