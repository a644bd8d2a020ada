"""Client CPU per async durable call, many in flight (issue 34's async row, alone).

``python -m benchmarks.bench_async`` (about 15 s; ``--in-flight N``, ``--rounds
N``, ``--seconds S``, ``--json``): ``N`` tasks (default 64) each run
``AsyncDurabilityLayer.execute`` (default config, a new key per call, an async
``fn`` that succeeds) one after another against a local ``redis-server`` for
``S`` seconds per round; each round gives the client's CPU time per call
(``time.process_time``: this process only, not Redis's) and calls/s, and a
one-connection asyncio PING loop after it gives the floor of the suite's
ratio. Medians of the rounds, with their spread.

The suite's ``--quick`` rows of the same kind move by about 10 % from run to
run; to compare two trees, run this alternately on each (benchmarks/README.md,
"Sixth cut", did so on a worktree of the base commit).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from typing import Any

import redis.asyncio

import durabilis.aio
from benchmarks._harness import quiet, redis_server
from benchmarks.bench_layer import NAMESPACE

PAYLOAD_TEXT = "x" * 200


async def _fn(ctx: durabilis.OperationContext) -> dict[str, Any]:
    return {"ok": ctx.idempotency_key[:8]}


async def _rounds(url: str, in_flight: int, rounds: int, seconds: float) -> dict[str, Any]:
    store = durabilis.aio.connect(url, namespace=NAMESPACE)
    layer = durabilis.aio.DurabilityLayer(store)
    ping = redis.asyncio.Redis.from_url(url)
    counter = itertools.count()

    async def worker(until: float) -> None:
        while time.perf_counter() < until:
            i = next(counter)
            await layer.execute("agent-1", "memory_write", {"i": i, "text": PAYLOAD_TEXT}, _fn)

    cpu: list[float] = []
    rates: list[float] = []
    pings: list[float] = []
    try:
        await asyncio.gather(*[worker(time.perf_counter() + 0.5) for _ in range(in_flight)])
        for _ in range(rounds):
            first = next(counter)
            began, used = time.perf_counter(), time.process_time()
            await asyncio.gather(*[worker(began + seconds) for _ in range(in_flight)])
            calls = next(counter) - first
            took = time.perf_counter() - began
            cpu.append((time.process_time() - used) / calls * 1e6)
            rates.append(calls / took)
            sent, began = 0, time.perf_counter()
            while time.perf_counter() - began < seconds / 2:
                await ping.ping()
                sent += 1
            pings.append(sent / (time.perf_counter() - began))
    finally:
        await ping.aclose()
        await layer.close()
        await store.close()
    return {
        "in_flight": in_flight,
        "client_cpu_us": round(statistics.median(cpu), 1),
        "client_cpu_us_rounds": [round(c, 1) for c in cpu],
        "calls_per_s": round(statistics.median(rates)),
        "ping_per_s": round(statistics.median(pings)),
        "ratio_to_ping": round(
            statistics.median(r / p for r, p in zip(rates, pings, strict=True)), 3
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_async", description=__doc__)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    quiet()
    with redis_server() as (url, _admin):
        out = asyncio.run(_rounds(url, args.in_flight, args.rounds, args.seconds))
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"async durable calls, {out['in_flight']} in flight: "
              f"client CPU {out['client_cpu_us']} us per call "
              f"(rounds {min(out['client_cpu_us_rounds'])}-{max(out['client_cpu_us_rounds'])}), "
              f"{out['calls_per_s']:,} calls/s; one-connection asyncio PING "
              f"{out['ping_per_s']:,}/s; ratio {out['ratio_to_ping']}")
    return out


if __name__ == "__main__":
    main()
