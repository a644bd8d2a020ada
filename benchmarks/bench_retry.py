"""Per-call overhead of a successful call through a retry wrapper, beside tenacity and stamina.

Run: ``python -m benchmarks.bench_retry`` (``--quick`` for a smoke run of a
second or two; ``--budget`` adds a fleet-wide retry budget row, which starts a
private redis-server). In the same run, interleaved round by round so drift
hits every kind alike, it times a no-op function returning a value:

- ``bare``: the function called directly (the floor);
- ``durabilis execute``: ``RetryEngine().execute("mcp_call", fn)`` (seed policy:
  3 attempts, exponential backoff with jitter; no budget, so no Redis I/O);
- ``durabilis @retry``: the same through the decorator;
- ``tenacity Retrying``: a prebuilt ``tenacity.Retrying(stop=3 attempts,
  wait=exponential jitter, retry=on TimeoutError/ConnectionError)`` called with fn;
- ``tenacity @retry``: the same policy as a decorator;
- ``stamina @retry``: ``stamina.retry(on=(TimeoutError, ConnectionError), attempts=3)``;
- ``stamina retry_context``: the ``for attempt in retry_context(...): with attempt:`` loop;
- async twins of the execute / decorator rows (``await``, one event loop).

Each call goes through a zero-argument lambda (``bare`` too), so the lambda's
own cost is in the floor and cancels out. The overhead of a kind is its
per-call time minus ``bare``'s in the same round; a figure is the median over
the rounds, with the spread (min-max). Absolute figures vary by machine: the
ratios are the result. Target: durabilis's overhead at most 1/3 of tenacity's.
"""

# Every timed row calls through one zero-argument lambda, even where the callee
# would do, so the lambda's cost is the same in every row and cancels out.
# ruff: noqa: PLW0108

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

TARGET = 1 / 3
"""durabilis overhead / tenacity overhead must not exceed this."""

SYNC_KINDS = (
    "bare",
    "durabilis execute",
    "durabilis @retry",
    "tenacity Retrying",
    "tenacity @retry",
    "stamina @retry",
    "stamina retry_context",
)
ASYNC_KINDS = (
    "async bare",
    "async durabilis execute",
    "async durabilis @retry",
    "async tenacity AsyncRetrying",
    "async stamina @retry",
)


def _value() -> int:
    return 42


async def _avalue() -> int:
    return 42


def _sync_ops() -> dict[str, Callable[[], Any]]:
    import stamina  # noqa: PLC0415
    import tenacity  # noqa: PLC0415

    from durabilis.retry import RetryEngine, retry  # noqa: PLC0415

    stamina.set_testing(False)
    engine = RetryEngine()
    execute = engine.execute

    @retry("mcp_call", engine=engine)
    def ours() -> int:
        return 42

    policy: dict[str, Any] = {
        "stop": tenacity.stop_after_attempt(3),
        "wait": tenacity.wait_exponential(multiplier=0.5, max=10) + tenacity.wait_random(0, 0.15),
        "retry": tenacity.retry_if_exception_type((TimeoutError, ConnectionError)),
    }
    retrying = tenacity.Retrying(**policy)

    @tenacity.retry(**policy)
    def theirs() -> int:
        return 42

    @stamina.retry(on=(TimeoutError, ConnectionError), attempts=3, wait_initial=0.5, wait_max=10)
    def staminas() -> int:
        return 42

    def context() -> int:
        for attempt in stamina.retry_context(
            on=(TimeoutError, ConnectionError), attempts=3, wait_initial=0.5, wait_max=10
        ):
            with attempt:
                return _value()
        raise AssertionError("unreachable")

    return {
        "bare": lambda: _value(),
        "durabilis execute": lambda: execute("mcp_call", _value),
        "durabilis @retry": lambda: ours(),
        "tenacity Retrying": lambda: retrying(_value),
        "tenacity @retry": lambda: theirs(),
        "stamina @retry": lambda: staminas(),
        "stamina retry_context": lambda: context(),
    }


def _async_ops() -> dict[str, Callable[[], Awaitable[Any]]]:
    import stamina  # noqa: PLC0415
    import tenacity  # noqa: PLC0415

    from durabilis.retry import AsyncRetryEngine, retry  # noqa: PLC0415

    engine = AsyncRetryEngine()
    execute = engine.execute

    @retry("mcp_call", engine=engine)
    async def ours() -> int:
        return 42

    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_exponential(multiplier=0.5, max=10) + tenacity.wait_random(0, 0.15),
        retry=tenacity.retry_if_exception_type((TimeoutError, ConnectionError)),
    )

    @stamina.retry(on=(TimeoutError, ConnectionError), attempts=3, wait_initial=0.5, wait_max=10)
    async def staminas() -> int:
        return 42

    return {
        "async bare": lambda: _avalue(),
        "async durabilis execute": lambda: execute("mcp_call", _avalue),
        "async durabilis @retry": lambda: ours(),
        "async tenacity AsyncRetrying": lambda: retrying(_avalue),
        "async stamina @retry": lambda: staminas(),
    }


def _budget_ops(url: str) -> dict[str, Callable[[], Any]]:
    import redis  # noqa: PLC0415

    import durabilis  # noqa: PLC0415
    from durabilis.retry import RetryBudget, RetryEngine, RetryPolicy  # noqa: PLC0415

    client = redis.Redis.from_url(url)
    store = durabilis.connect(url, namespace="bench-retry")
    engine = RetryEngine(
        store, policies=[RetryPolicy("budgeted", 3, 500, 10_000, budget=RetryBudget())]
    )
    execute = engine.execute
    ping = client.ping
    return {
        "redis PING": lambda: ping(),
        "durabilis execute + budget": lambda: execute("budgeted", _value),
    }


def _time_sync(op: Callable[[], Any], calls: int) -> float:
    rng = range(calls)
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in rng:
            op()
        return (time.perf_counter() - start) / calls
    finally:
        gc.enable()


def _time_async(loop: asyncio.AbstractEventLoop, op: Callable[[], Awaitable[Any]], calls: int
                ) -> float:
    async def body() -> float:
        rng = range(calls)
        start = time.perf_counter()
        for _ in rng:
            await op()
        return (time.perf_counter() - start) / calls

    gc.disable()
    try:
        return loop.run_until_complete(body())
    finally:
        gc.enable()


def _figures(samples: list[float]) -> dict[str, Any]:
    us = [s * 1e6 for s in samples]
    return {"median": statistics.median(us), "min": min(us), "max": max(us), "runs": us}


def run(
    *,
    quick: bool = False,
    rounds: int | None = None,
    calls: int | None = None,
    budget: bool = False,
    redis_url: str | None = None,
) -> dict[str, Any]:
    """Measure every kind; return the figures (microseconds per call).

    Args:
        quick: A smoke run (about a second).
        rounds: Timed rounds per kind (each kind once per round, interleaved).
        calls: Calls per kind per round.
        budget: Also time ``execute`` with a retry budget (1 Redis round trip)
            beside a raw PING; starts a private redis-server unless ``redis_url``.
        redis_url: The Redis to use for the budget rows.

    Returns:
        ``{"per_call_us": {kind: {"median", "min", "max", "runs"}},
        "overhead_us": {kind: {...}}, "ratios": {...}, "target": 1/3,
        "target_met": bool, "rounds": ..., "calls": ...}``.
    """
    rounds = rounds if rounds is not None else (3 if quick else 9)
    calls = calls if calls is not None else (1_000 if quick else 10_000)
    sync_ops = _sync_ops()
    async_ops = _async_ops()
    per_call: dict[str, list[float]] = {k: [] for k in (*sync_ops, *async_ops)}
    overhead: dict[str, list[float]] = {k: [] for k in per_call if not k.endswith("bare")}
    loop = asyncio.new_event_loop()
    try:
        for op in sync_ops.values():  # warm up: imports, caches, specialisation
            _time_sync(op, max(100, calls // 10))
        for aop in async_ops.values():
            _time_async(loop, aop, max(100, calls // 10))
        for _ in range(rounds):
            this: dict[str, float] = {}
            for kind, op in sync_ops.items():
                this[kind] = _time_sync(op, calls)
            for kind, aop in async_ops.items():
                this[kind] = _time_async(loop, aop, calls)
            for kind, t in this.items():
                per_call[kind].append(t)
                if kind in overhead:
                    floor = this["async bare" if kind.startswith("async") else "bare"]
                    overhead[kind].append(t - floor)
    finally:
        loop.close()

    results: dict[str, Any] = {
        "rounds": rounds,
        "calls": calls,
        "per_call_us": {k: _figures(v) for k, v in per_call.items()},
        "overhead_us": {k: _figures(v) for k, v in overhead.items()},
    }
    if budget:
        results["budget"] = _run_budget(redis_url, rounds, max(200, calls // 20))
    results["ratios"] = _ratios(results["overhead_us"])
    results["target"] = TARGET
    results["target_met"] = (
        results["ratios"]["durabilis execute / tenacity Retrying"] <= TARGET
        and results["ratios"]["async durabilis execute / async tenacity AsyncRetrying"] <= TARGET
    )
    return results


def _run_budget(redis_url: str | None, rounds: int, calls: int) -> dict[str, Any]:
    from durabilis.testing import RedisServer  # noqa: PLC0415

    def measure(url: str) -> dict[str, Any]:
        ops = _budget_ops(url)
        for op in ops.values():
            _time_sync(op, 100)
        runs: dict[str, list[float]] = {k: [] for k in ops}
        for _ in range(rounds):
            for kind, op in ops.items():
                runs[kind].append(_time_sync(op, calls))
        figures = {k: _figures(v) for k, v in runs.items()}
        figures["ratio"] = (
            figures["durabilis execute + budget"]["median"] / figures["redis PING"]["median"]
        )
        return figures

    if redis_url is not None:
        return measure(redis_url)
    with tempfile.TemporaryDirectory(prefix="durabilis-bench-") as tmp:
        server = RedisServer(tmp).start()
        try:
            return measure(server.url)
        finally:
            server.stop()


def _ratios(overhead: dict[str, dict[str, Any]]) -> dict[str, float]:
    pairs = [
        ("durabilis execute", "tenacity Retrying"),
        ("durabilis @retry", "tenacity @retry"),
        ("durabilis execute", "stamina retry_context"),
        ("durabilis @retry", "stamina @retry"),
        ("async durabilis execute", "async tenacity AsyncRetrying"),
        ("async durabilis @retry", "async stamina @retry"),
    ]
    return {
        f"{ours} / {theirs}": overhead[ours]["median"] / overhead[theirs]["median"]
        for ours, theirs in pairs
    }


def report(results: dict[str, Any]) -> str:
    """The results as a text table."""
    lines = [
        f"successful-call overhead, microseconds (median of {results['rounds']} rounds of "
        f"{results['calls']} calls, spread min-max)",
        f"{'kind':<30} {'per call':>9} {'overhead':>9}  {'overhead spread':>17}",
    ]
    for kind, f in results["per_call_us"].items():
        o = results["overhead_us"].get(kind)
        over = f"{o['median']:>9.3f}  {o['min']:>7.3f}-{o['max']:<9.3f}" if o else f"{'-':>9}"
        lines.append(f"{kind:<30} {f['median']:>9.3f} {over}")
    lines.append("")
    lines.append("overhead ratios (lower is better for durabilis):")
    for name, ratio in results["ratios"].items():
        lines.append(f"  {name:<60} {ratio:6.3f}")
    verdict = "met" if results["target_met"] else "NOT met"
    lines.append(f"target: durabilis/tenacity <= {results['target']:.3f}: {verdict}")
    if "budget" in results:
        b = results["budget"]
        lines.append("")
        lines.append("with a retry budget (one retry_budget script per call):")
        for kind in ("redis PING", "durabilis execute + budget"):
            f = b[kind]
            lines.append(
                f"  {kind:<28} {f['median']:>9.1f} us  ({f['min']:.1f}-{f['max']:.1f})"
            )
        lines.append(f"  ratio execute+budget / PING: {b['ratio']:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a second or two")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per kind")
    parser.add_argument("--calls", type=int, default=None, help="calls per kind per round")
    parser.add_argument(
        "--budget", action="store_true", help="add the retry-budget rows (starts redis-server)"
    )
    parser.add_argument("--redis-url", default=None, help="Redis for --budget (default: private)")
    args = parser.parse_args(argv)
    results = run(
        quick=args.quick,
        rounds=args.rounds,
        calls=args.calls,
        budget=args.budget,
        redis_url=args.redis_url,
    )
    print(report(results))
    return results


if __name__ == "__main__":
    main()
