"""What Redis Cluster costs durabilis: one script, and several in ``Store.run_many``.

Run: ``python -m benchmarks.bench_cluster`` (``--rounds N``, default 2000). It starts
a private standalone redis-server and a local 3+3 Redis Cluster (loopback), then
times, interleaved call by call, on fresh idempotency keys:

- one claim (``Store.run``: one EVALSHA);
- two and four claims through ``Store.run_many``: one pipeline on a standalone
  server; on Cluster redis-py refuses EVALSHA in pipelines, so they run one
  after another (one round trip each).

Absolute figures vary by machine; the ratios are the result.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import durabilis
from durabilis import IdempotencyGuard
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
        finally:
            cluster.stop()
            server.stop()


if __name__ == "__main__":
    main()
