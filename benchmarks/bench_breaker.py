"""Breaker-guarded no-op calls per second through Redis, beside pybreaker.

Run: ``python -m benchmarks.bench_breaker`` (``--quick`` for a smoke run of a
few seconds). It starts its own redis-server on a free loopback port and
measures, in the same run and interleaved round by round:

- ``ping``: one raw PING round trip per operation (the floor of any remote call);
- ``ping x2``: two PINGs per operation (the floor of before + after);
- ``evalsha x2``: two EMPTY Lua scripts with the breaker's keys and arguments
  (the floor of any design running one script before and one after);
- ``durabilis``: ``registry.call(name, noop)``: the report script, the admission
  cached while Redis confirms the breaker CLOSED (cold: two Lua scripts, admission, then
  the report into a rate window with a fleet-wide probe cap), closed breaker;
- ``pybreaker``: ``CircuitBreaker(state_storage=CircuitRedisStorage(...)).call(noop)``
  (a GET of the state and a SET of the failure counter per call; a consecutive
  failure counter, no rate window, no probe cap).

Each figure is the median of several timed runs, with the spread (min-max);
runs with 4 processes sum the calls of 4 worker processes started together.
Absolute figures vary by machine: the ratios are the result.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from durabilis._store import DEFAULT_SOCKET_OPTIONS as CLIENT_OPTIONS

KINDS = ("ping", "ping x2", "evalsha x2", "durabilis", "pybreaker")
FAILING_KINDS = ("durabilis 5%", "pybreaker 5%")
"""With ``--with-failures``: every 20th call raises (the window is never all successes)."""


def _noop() -> None:
    return None


class _Flaky:
    """A no-op that raises on every 20th call."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        if self.n % 20 == 0:
            raise RuntimeError("flaky")


def _swallow(fn: Callable[[], Any], errors: tuple[type[BaseException], ...]) -> Callable[[], None]:
    def op() -> None:
        try:  # noqa: SIM105  (contextlib.suppress costs a context manager per call)
            fn()
        except errors:
            pass

    return op


def _make_op(kind: str, url: str, namespace: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """An operation of ``kind`` and its cleanup (built inside the worker process)."""
    import redis  # noqa: PLC0415

    if kind in ("ping", "ping x2"):
        client = redis.Redis.from_url(url, **CLIENT_OPTIONS)
        if kind == "ping":
            return client.ping, client.close

        def two_pings() -> None:
            client.ping()
            client.ping()

        return two_pings, client.close
    if kind == "evalsha x2":
        # The floor of any design with two Lua scripts per call: empty scripts
        # sent with the same keys and arguments as the breaker's.
        from durabilis._keys import KeySpace  # noqa: PLC0415
        from durabilis.breaker import CircuitBreakerConfig, _BreakerOps  # noqa: PLC0415

        client = redis.Redis.from_url(url, **CLIENT_OPTIONS)
        ops = _BreakerOps(KeySpace(namespace), "bench-replica", 1000)
        ops.upsert(CircuitBreakerConfig("evalsha"))
        first = ops.before_call("evalsha")
        second = ops.after_call("evalsha", True, None, 0.01)
        empty_a = client.register_script("return 0")
        empty_b = client.register_script("return 1")

        def two_scripts() -> None:
            empty_a(keys=first.keys, args=first.args)
            empty_b(keys=second.keys, args=second.args)

        return two_scripts, client.close
    if kind.startswith("durabilis"):
        import durabilis  # noqa: PLC0415
        from durabilis.breaker import CircuitBreakerConfig, CircuitBreakerRegistry  # noqa: PLC0415

        store = durabilis.connect(url, namespace=namespace)
        name = kind.replace(" ", "-")
        registry = CircuitBreakerRegistry(store, [CircuitBreakerConfig(name)])
        call = registry.call
        target = _Flaky() if kind.endswith("%") else _noop

        def guarded() -> None:
            call(name, target)

        return _swallow(guarded, (RuntimeError,)), store.close
    if kind.startswith("pybreaker"):
        import pybreaker  # noqa: PLC0415

        client = redis.Redis.from_url(url, **CLIENT_OPTIONS)
        storage = pybreaker.CircuitRedisStorage(
            pybreaker.STATE_CLOSED, client, namespace=f"{namespace}-{kind.replace(' ', '-')}"
        )
        breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=30, state_storage=storage)
        py_target = _Flaky() if kind.endswith("%") else _noop

        def py_guarded() -> None:
            breaker.call(py_target)

        return _swallow(py_guarded, (RuntimeError,)), client.close
    raise ValueError(f"unknown kind {kind!r}")


def _worker(url: str, namespace: str, conn: Any) -> None:
    """Serve ("run", kind, start_at, seconds) requests: answer the op count."""
    ops: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {}
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            _, kind, start_at, seconds = msg
            if kind not in ops:
                ops[kind] = _make_op(kind, url, namespace)
                ops[kind][0]()  # warm: connect, load scripts
            op = ops[kind][0]
            while time.time() < start_at:
                time.sleep(0.001)
            end = start_at + seconds
            n = 0
            cpu = time.process_time()
            while True:
                for _ in range(50):
                    op()
                n += 50
                if time.time() >= end:
                    break
            conn.send((n, time.time() - start_at, time.process_time() - cpu))
    finally:
        for _, close in ops.values():
            close()
        conn.close()


def _server_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class _Pool:
    def __init__(self, size: int, url: str, namespace: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns = []
        self.procs = []
        for _ in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(url, namespace, child), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def measure(self, kind: str, seconds: float, server: Any) -> tuple[float, float, float]:
        """Calls/s summed over the workers, client and server CPU µs per call."""
        start_at = time.time() + 0.15
        for conn in self.conns:
            conn.send(("run", kind, start_at, seconds))
        server_before = _server_cpu(server)
        rate = calls = client_cpu = 0.0
        for conn in self.conns:
            if not conn.poll(seconds + 120):
                raise TimeoutError("a benchmark worker did not answer")
            n, elapsed, cpu = conn.recv()
            rate += n / elapsed
            calls += n
            client_cpu += cpu
        server_cpu = _server_cpu(server) - server_before
        return rate, client_cpu / calls * 1e6, server_cpu / calls * 1e6

    def close(self) -> None:
        for conn in self.conns:
            conn.send(("stop",))
        for proc in self.procs:
            proc.join(timeout=10)


def run(
    *,
    quick: bool = False,
    processes: Sequence[int] = (1, 4),
    seconds: float | None = None,
    repeats: int | None = None,
    kinds: Sequence[str] = KINDS,
) -> dict[str, Any]:
    """Measure every kind with each process count; return the figures.

    Returns:
        ``{"seconds", "repeats", "processes": {n: {kind: {"median", "min", "max",
        "runs", "client_cpu_us", "server_cpu_us"}}}, "ratios": {n: {...}}}``:
        calls per second (summed over the processes), and the median CPU time
        per call of the calling processes and of redis-server, in microseconds.
    """
    import redis  # noqa: PLC0415

    from durabilis.testing import RedisServer  # noqa: PLC0415

    seconds = seconds if seconds is not None else (0.2 if quick else 2.0)
    repeats = repeats if repeats is not None else (2 if quick else 5)
    results: dict[str, Any] = {
        "seconds": seconds,
        "repeats": repeats,
        "processes": {},
        "ratios": {},
    }
    with tempfile.TemporaryDirectory(prefix="durabilis-bench-") as tmp:
        server = RedisServer(tmp).start()
        admin = redis.Redis.from_url(server.url)
        try:
            for n in processes:
                pool = _Pool(n, server.url, f"bench-{n}")
                try:
                    runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in kinds}
                    for _ in range(repeats):
                        for kind in kinds:  # interleaved: drift hits every kind alike
                            runs[kind].append(pool.measure(kind, seconds, admin))
                finally:
                    pool.close()
                figures = {}
                for kind, measured in runs.items():
                    rates = [m[0] for m in measured]
                    figures[kind] = {
                        "median": statistics.median(rates),
                        "min": min(rates),
                        "max": max(rates),
                        "runs": rates,
                        "client_cpu_us": statistics.median(m[1] for m in measured),
                        "server_cpu_us": statistics.median(m[2] for m in measured),
                    }
                results["processes"][n] = figures
                results["ratios"][n] = _ratios(figures)
        finally:
            admin.close()
            server.stop()
    return results


def _ratios(figures: dict[str, dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    pairs = [("durabilis", p) for p in ("pybreaker", "ping x2", "evalsha x2")]
    pairs.append(("durabilis 5%", "pybreaker 5%"))
    for ours, peer in pairs:
        a = figures.get(ours, {}).get("median")
        b = figures.get(peer, {}).get("median")
        if a and b:
            out[f"{ours}/{peer}"] = a / b
    return out


def report(results: dict[str, Any]) -> str:
    """The results as a text table."""
    lines = [
        f"breaker-guarded no-op calls/s: median of {results['repeats']} runs of "
        f"{results['seconds']:g} s (spread min-max); CPU us per call (median)",
        f"{'processes':>9}  {'kind':<12} {'calls/s':>9} {'spread':>13}  "
        f"{'client CPU':>10} {'server CPU':>10}",
    ]
    for n, figures in results["processes"].items():
        for kind, f in figures.items():
            spread = f"{f['min']:.0f}-{f['max']:.0f}"
            lines.append(
                f"{n:>9}  {kind:<12} {f['median']:>9.0f} {spread:>13}  "
                f"{f['client_cpu_us']:>10.1f} {f['server_cpu_us']:>10.1f}"
            )
        ratios = ", ".join(f"{k} = {v:.2f}" for k, v in results["ratios"][n].items())
        lines.append(f"{'':>9}  ratios: {ratios}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--seconds", type=float, default=None, help="length of one timed run")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per figure")
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[1, 4], help="process counts to measure"
    )
    parser.add_argument(
        "--with-failures",
        action="store_true",
        help="also measure both breakers when every 20th call fails",
    )
    args = parser.parse_args(argv)
    results = run(
        quick=args.quick,
        processes=args.processes,
        seconds=args.seconds,
        repeats=args.repeats,
        kinds=KINDS + FAILING_KINDS if args.with_failures else KINDS,
    )
    print(report(results))
    return results


if __name__ == "__main__":
    main()
