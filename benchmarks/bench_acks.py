"""What an acknowledgement level costs: the durable call with ``acks="primary"`` and
``acks="replicas:N"``, through ``redis://``, ``redis+sentinel://`` and on Cluster.

Run: ``python -m benchmarks.bench_acks`` (``--rounds N``, default 1000). It starts,
on loopback, a primary with 2 replicas behind 3 Sentinels
(``tests/support/sentinel.py``) and a 3+3 Redis Cluster (``tests/support/cluster.py``),
then times one sync durable call (new key: the claim step and the record step)
per case, interleaved call by call so every case sees the same machine:

- the primary by its own ``redis://`` URL, ``acks="primary"``: the baseline;
- the same primary through ``redis+sentinel://``, ``acks="primary"``: what
  Sentinel discovery costs once connected (nothing per call is expected);
- through ``redis+sentinel://`` with ``acks="replicas:1"`` and ``"replicas:2"``:
  each step's scripts are followed by ``WAIT`` in the same round trip, which
  returns once the replicas have confirmed (a replica acknowledges what it
  applied at once when the primary asks, by ``REPLCONF GETACK``);
- Cluster, ``acks="primary"`` and ``"replicas:1"`` (one replica per primary).

Absolute figures vary by machine; the ratios (median latency over the
baseline's, and over Cluster's ``primary`` for Cluster) are the result.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import durabilis
from durabilis import DurabilityConfig, DurabilityLayer
from tests.support.cluster import LocalCluster
from tests.support.sentinel import LocalSentinel


def durable(url: str, acks: str, tag: str) -> tuple[Callable[[], float], Callable[[], None]]:
    """A timer of one sync durable call on a new key, and its close."""
    store = durabilis.connect(url, namespace="bench-acks")
    layer = DurabilityLayer(store, DurabilityConfig(acks=acks))
    keys = itertools.count()

    def one() -> float:
        payload = {"case": tag, "i": next(keys)}
        began = time.perf_counter()
        layer.execute("agent-1", "memory_write", payload, lambda ctx: "ok")
        return time.perf_counter() - began

    def close() -> None:
        layer.close()
        store.close()

    return one, close


def ping(url: str) -> tuple[Callable[[], float], Callable[[], None]]:
    store = durabilis.connect(url)

    def one() -> float:
        began = time.perf_counter()
        store.ping()
        return time.perf_counter() - began

    return one, store.close


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="durabilis-bench-acks-") as tmp:
        sentinel = LocalSentinel(Path(tmp) / "sentinel").start()
        cluster = LocalCluster(Path(tmp) / "cluster").start()
        try:
            host, port = sentinel.primary()
            direct = f"redis://{host}:{port}/0"
            cases = {
                "PING, the primary (redis://)": ping(direct),
                "primary by redis://, acks=primary": durable(direct, "primary", "d"),
                "redis+sentinel://, acks=primary": durable(sentinel.url, "primary", "s0"),
                "redis+sentinel://, acks=replicas:1": durable(sentinel.url, "replicas:1", "s1"),
                "redis+sentinel://, acks=replicas:2": durable(sentinel.url, "replicas:2", "s2"),
                "Cluster, acks=primary": durable(cluster.url, "primary", "c0"),
                "Cluster, acks=replicas:1": durable(cluster.url, "replicas:1", "c1"),
            }
            samples: dict[str, list[float]] = {case: [] for case in cases}
            try:
                for one, _ in cases.values():  # warm-up: scripts loaded, connections open
                    for _ in range(30):
                        one()
                for _ in range(args.rounds):
                    for case, (one, _) in cases.items():
                        samples[case].append(one())
            finally:
                for _, close in cases.values():
                    close()
        finally:
            cluster.stop()
            sentinel.stop()
    med = {case: statistics.median(v) * 1e6 for case, v in samples.items()}
    p99 = {case: sorted(v)[int(len(v) * 0.99) - 1] * 1e6 for case, v in samples.items()}
    base, cbase = med["primary by redis://, acks=primary"], med["Cluster, acks=primary"]
    print(f"durable call (sync, new key), {args.rounds} rounds interleaved; "
          "a primary + 2 replicas behind 3 Sentinels, and a 3+3 Cluster, on loopback")
    print(f"{'case':<38} {'median us':>10} {'p99 us':>8} {'x baseline':>11}")
    for case in cases:
        over = cbase if case.startswith("Cluster") else base
        print(f"{case:<38} {med[case]:>10.0f} {p99[case]:>8.0f} {med[case] / over:>11.2f}")
    print("(x baseline: median over the redis:// acks=primary call's; Cluster rows over "
          "Cluster's acks=primary)")


if __name__ == "__main__":
    main()
