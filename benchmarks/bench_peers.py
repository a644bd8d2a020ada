"""The peers, measured in the same run: powertools idempotency, pybreaker, tenacity, stamina.

- ``powertools``: aws-lambda-powertools' ``idempotent_function`` with its Redis
  persistence layer (``RedisCachePersistenceLayer``, given a redis-py client on
  the suite's server), a no-op function returning a small dict, a new payload
  per call (the same payloads as durabilis's rows). Its happy path is two
  round trips too (``SET NX`` of the in-progress record, ``SET`` of the result).
  ``powertools_duplicate``: the same payload again once it completed (its
  stored result comes back: a failed ``SET NX`` then ``GET``s).
  Needs ``boto3`` (its idempotency package imports it unconditionally).
- ``peer_stack``: what a user would assemble instead of durabilis: tenacity
  (``Retrying``: 3 attempts, exponential backoff with jitter, on connection
  errors) around a pybreaker call (``CircuitRedisStorage``, shared through Redis)
  of the powertools idempotent function above. No dead-letter queue, no
  checkpoint, no crash recovery: the durable call does more.
- ``pybreaker``: ``CircuitBreaker(state_storage=CircuitRedisStorage(...)).call(noop)``;
  ``durabilis_breaker``: ``CircuitBreakerRegistry.call(name, noop)``. These two
  are the fallback used only when ``bench_breaker.run`` (which owns that
  comparison) cannot run; they also give the Redis cost of a pybreaker call.
- :func:`breaker_comparison` runs ``bench_breaker.run`` (its own redis-server,
  its own worker processes) and :func:`retry_overhead` runs ``bench_retry.run``.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import warnings
from typing import Any

import redis

from benchmarks._harness import CLIENT_OPTIONS, Settings, Workload, measure_processes, skipped
from benchmarks.bench_layer import payload

NAMESPACE = "bench-peers"


class Powertools(Workload):
    def __init__(self, url: str, index: int) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from aws_lambda_powertools.utilities.idempotency import (  # noqa: PLC0415
                IdempotencyConfig,
                idempotent_function,
            )
            from aws_lambda_powertools.utilities.idempotency.persistence.redis import (  # noqa: PLC0415
                RedisCachePersistenceLayer,
            )

            self.client = redis.Redis.from_url(url, **CLIENT_OPTIONS)
            layer = RedisCachePersistenceLayer(client=self.client)

        @idempotent_function(
            data_keyword_argument="op",
            persistence_store=layer,
            config=IdempotencyConfig(expires_after_seconds=3600),
        )
        def write(op: dict[str, Any]) -> dict[str, Any]:
            return {"ok": True, "attempt": 0}

        self.write = write
        self.index = index
        self.tag = "-"
        self.counter = itertools.count()

    def start(self, tag: str) -> None:
        self.tag = tag
        self.counter = itertools.count()

    def call(self) -> object:
        self.write(op=payload(self.tag, self.index, next(self.counter)))
        return None

    def close(self) -> None:
        self.client.close()


def _noop() -> None:
    return None


class PowertoolsDuplicate(Powertools):
    """The same payload again after it completed: powertools returns the stored result."""

    def start(self, tag: str) -> None:
        super().start(tag)
        self.write(op=payload(tag, self.index, 0))

    def call(self) -> object:
        self.write(op=payload(self.tag, self.index, 0))
        return None


class PyBreaker(Workload):
    def __init__(self, url: str, index: int) -> None:
        import pybreaker  # noqa: PLC0415

        self.client = redis.Redis.from_url(url, **CLIENT_OPTIONS)
        storage = pybreaker.CircuitRedisStorage(
            pybreaker.STATE_CLOSED, self.client, namespace=f"{NAMESPACE}-pybreaker"
        )
        self.breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=30, state_storage=storage)

    def call(self) -> object:
        self.breaker.call(_noop)
        return None

    def close(self) -> None:
        self.client.close()


class DurabilisBreaker(Workload):
    def __init__(self, url: str, index: int) -> None:
        import durabilis  # noqa: PLC0415

        self.store = durabilis.connect(url, namespace=NAMESPACE)
        self.registry = durabilis.breaker.CircuitBreakerRegistry(self.store)

    def call(self) -> object:
        self.registry.call("memory_service", _noop)
        return None

    def close(self) -> None:
        self.store.close()


class PeerStack(Powertools):
    """tenacity around pybreaker (Redis storage) around powertools idempotency."""

    def __init__(self, url: str, index: int) -> None:
        super().__init__(url, index)
        import pybreaker  # noqa: PLC0415
        import tenacity  # noqa: PLC0415

        storage = pybreaker.CircuitRedisStorage(
            pybreaker.STATE_CLOSED, self.client, namespace=f"{NAMESPACE}-stack"
        )
        self.breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=30, state_storage=storage)
        self.retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(3),
            wait=tenacity.wait_exponential_jitter(initial=0.1, max=2),
            retry=tenacity.retry_if_exception_type((ConnectionError, TimeoutError)),
            reraise=True,
        )

    def call(self) -> object:
        op = payload(self.tag, self.index, next(self.counter))
        self.retrying(self.breaker.call, self.write, op=op)
        return None


def peer_stack(url: str, index: int) -> Workload:
    return PeerStack(url, index)


def powertools(url: str, index: int) -> Workload:
    return Powertools(url, index)


def powertools_duplicate(url: str, index: int) -> Workload:
    return PowertoolsDuplicate(url, index)


def pybreaker_call(url: str, index: int) -> Workload:
    return PyBreaker(url, index)


def durabilis_breaker(url: str, index: int) -> Workload:
    return DurabilisBreaker(url, index)


STACK = "peer stack: tenacity + pybreaker (Redis) + powertools (Redis)"

SINGLE = {
    "powertools idempotency (Redis)": "benchmarks.bench_peers:powertools",
    "powertools duplicate (completed key)": "benchmarks.bench_peers:powertools_duplicate",
    STACK: "benchmarks.bench_peers:peer_stack",
}
PROCESSES = {
    "powertools idempotency (Redis)": "benchmarks.bench_peers:powertools",
    STACK: "benchmarks.bench_peers:peer_stack",
}
COST = {
    "powertools idempotency (Redis)": "benchmarks.bench_peers:powertools",
    "powertools duplicate (completed key)": "benchmarks.bench_peers:powertools_duplicate",
    STACK: "benchmarks.bench_peers:peer_stack",
    "pybreaker call (CircuitRedisStorage)": "benchmarks.bench_peers:pybreaker_call",
    "durabilis breaker call (registry.call)": "benchmarks.bench_peers:durabilis_breaker",
}


def memory(url: str, admin: redis.Redis, n: int, errors: list[str]) -> dict[str, Any]:
    """``MEMORY USAGE`` of a powertools record and of a pybreaker breaker (bytes)."""
    out: dict[str, Any] = {}
    try:
        w = Powertools(url, 0)
        w.start("mem")
        before = set(admin.scan_iter(match="*"))
        for _ in range(n):
            w.call()
        w.close()
        keys = [k for k in admin.scan_iter(match="*") if k not in before][:200]
        sizes = [int(admin.memory_usage(k, samples=0) or 0) for k in keys]
        out["powertools record"] = {
            "bytes": round(sum(sizes) / len(sizes)),
            "what": "one completed record (a JSON string: status, expiry, result)",
        }
    except Exception as exc:  # a missing peer is reported, not fatal
        errors.append(f"memory powertools: {type(exc).__name__}: {exc}")
        out["powertools record"] = skipped(f"{type(exc).__name__}: {exc}")
    try:
        b = PyBreaker(url, 0)
        for _ in range(50):
            b.call()
        b.close()
        keys = list(admin.scan_iter(match=f"{NAMESPACE}-pybreaker*"))
        out["pybreaker breaker"] = {
            "bytes": sum(int(admin.memory_usage(k, samples=0) or 0) for k in keys),
            "keys": len(keys),
            "what": "one breaker (state, failure and success counters)",
        }
    except Exception as exc:
        errors.append(f"memory pybreaker: {type(exc).__name__}: {exc}")
        out["pybreaker breaker"] = skipped(f"{type(exc).__name__}: {exc}")
    return out


# --- the pillar benchmarks owned elsewhere --------------------------------------------


def _call_run(run: Any, **wanted: Any) -> Any:
    """``run(**wanted)`` with only the arguments its signature takes."""
    params = inspect.signature(run).parameters
    return run(**{k: v for k, v in wanted.items() if k in params})


def breaker_comparison(
    settings: Settings, *, url: str, admin: redis.Redis, errors: list[str]
) -> dict[str, Any]:
    """Breaker-guarded no-op calls/s, durabilis vs pybreaker, by process count.

    From ``bench_breaker.run`` (its own server and worker processes). If that
    module cannot run, the same two calls are measured here on the suite's
    server and the result says so (``source``).

    Returns:
        ``{"source", "processes": {str(n): {kind: figure}}, "ratios": {str(n): {...}}}``.
    """
    if importlib.util.find_spec("pybreaker") is None:
        return skipped("pybreaker is not installed (pip install -e '.[bench]')")
    try:
        from benchmarks import bench_breaker  # noqa: PLC0415

        raw = _call_run(
            bench_breaker.run,
            quick=settings.mode != "full",
            processes=settings.breaker_processes,
            seconds=settings.breaker_seconds,
            repeats=settings.breaker_repeats,
        )
        processes = {str(n): figs for n, figs in raw["processes"].items()}
        for figs in processes.values():
            for f in figs.values():
                f.setdefault("unit", "calls/s")
        if not all("durabilis" in f and "pybreaker" in f for f in processes.values()):
            raise KeyError("bench_breaker.run returned no durabilis/pybreaker figures")
        return {
            "source": "benchmarks.bench_breaker.run",
            "seconds": raw.get("seconds"),
            "repeats": raw.get("repeats"),
            "processes": processes,
            "ratios": {str(n): r for n, r in raw.get("ratios", {}).items()},
        }
    except Exception as exc:  # bench_breaker is tuned by others: fall back
        errors.append(f"bench_breaker.run failed, measured here instead: {exc!r}")
    measured = measure_processes(
        url,
        {
            "durabilis": "benchmarks.bench_peers:durabilis_breaker",
            "pybreaker": "benchmarks.bench_peers:pybreaker_call",
        },
        settings,
        admin=admin,
        errors=errors,
    )
    processes = {
        str(n): {kind: measured[kind][str(n)] for kind in measured}
        for n in settings.processes
    }
    ratios = {}
    for n, figs in processes.items():
        ours, theirs = figs["durabilis"].get("median"), figs["pybreaker"].get("median")
        ratios[n] = {"durabilis/pybreaker": ours / theirs} if ours and theirs else {}
    return {"source": "benchmarks.bench_peers (fallback)", "processes": processes,
            "ratios": ratios}


def retry_overhead(settings: Settings, *, url: str, errors: list[str]) -> dict[str, Any]:
    """Per-call overhead of a successful call: durabilis retry vs tenacity and stamina.

    From ``bench_retry.run`` (microseconds per call; its budget rows use the
    suite's server).
    """
    try:
        from benchmarks import bench_retry  # noqa: PLC0415

        raw: dict[str, Any] = _call_run(
            bench_retry.run,
            quick=settings.mode != "full",
            rounds=settings.retry_rounds,
            calls=settings.retry_calls,
            budget=True,
            redis_url=url,
        )
        for section in ("per_call_us", "overhead_us"):
            for f in raw.get(section, {}).values():
                f["unit"] = "us/call"
        return raw
    except Exception as exc:  # a missing peer is reported, not fatal
        errors.append(f"bench_retry.run: {type(exc).__name__}: {exc}")
        return skipped(f"{type(exc).__name__}: {exc}")

