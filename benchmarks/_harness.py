"""The machinery every benchmark of the suite shares.

- :class:`Settings`: how long and how often to measure (``full``, ``quick``, ``smoke``);
- :class:`Workload`: one logical operation (a durable call, a claim+record, a
  peer's call), built from a URL by a factory so that worker processes can
  build their own;
- :func:`measure_single`: several workloads in THIS process, interleaved round
  by round (drift and noisy neighbours hit every kind alike), calls/s per round;
- :class:`Pool`: N worker processes (spawned, each with its own connections)
  that run one workload together for a fixed time, started at the same instant;
- :func:`figures`: the median of the runs and their spread (min-max);
- :func:`machine`: what the numbers were measured on.

Absolute figures vary from machine to machine; the suite reports ratios
measured in the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis

from durabilis._store import DEFAULT_SOCKET_OPTIONS

CLIENT_OPTIONS: dict[str, Any] = dict(DEFAULT_SOCKET_OPTIONS)
"""Raw redis-py clients (the floor, the peers) get durabilis.connect's socket
settings: a socket timeout costs a poll() per read (~10% of a PING here), so
every contender pays it alike."""

# --- settings -------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """How much to measure.

    Attributes:
        mode: ``full`` (the README's table, a few minutes), ``quick`` (about twenty
            seconds) or ``smoke`` (the test suite's: seconds, numbers meaningless).
        rounds: Timed rounds per in-process figure (each kind once per round).
        seconds: Target length of one in-process round of one kind.
        processes: Process counts of the multi-process figures.
        pool_seconds: Length of one multi-process run.
        pool_repeats: Multi-process runs per figure.
        breaker_processes: Process counts given to ``bench_breaker.run``.
        breaker_seconds: ``bench_breaker``'s run length.
        breaker_repeats: ``bench_breaker``'s runs per figure.
        retry_rounds: ``bench_retry``'s rounds.
        retry_calls: ``bench_retry``'s calls per round.
        cost_ops: Operations per Redis command-count measurement.
        memory_records: Records written per Redis memory measurement.
    """

    mode: str
    rounds: int
    seconds: float
    processes: tuple[int, ...]
    pool_seconds: float
    pool_repeats: int
    breaker_processes: tuple[int, ...]
    breaker_seconds: float
    breaker_repeats: int
    retry_rounds: int
    retry_calls: int
    cost_ops: int
    memory_records: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


MODES: Mapping[str, Settings] = {
    "full": Settings(
        mode="full", rounds=5, seconds=0.4, processes=(1, 2, 4, 8), pool_seconds=0.6,
        pool_repeats=3, breaker_processes=(1, 2, 4, 8), breaker_seconds=0.5,
        breaker_repeats=3, retry_rounds=7, retry_calls=5000, cost_ops=500, memory_records=1000,
    ),
    "quick": Settings(
        mode="quick", rounds=3, seconds=0.08, processes=(1, 2), pool_seconds=0.2,
        pool_repeats=2, breaker_processes=(1,), breaker_seconds=0.2, breaker_repeats=2,
        retry_rounds=3, retry_calls=1000, cost_ops=100, memory_records=100,
    ),
    "smoke": Settings(
        mode="smoke", rounds=2, seconds=0.02, processes=(1, 2), pool_seconds=0.05,
        pool_repeats=1, breaker_processes=(1,), breaker_seconds=0.05, breaker_repeats=1,
        retry_rounds=2, retry_calls=200, cost_ops=20, memory_records=20,
    ),
}


def quiet() -> None:
    """Silence what would time the console instead of the code (info events, warnings)."""
    import structlog  # noqa: PLC0415

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    # powertools' Redis layer is marked deprecated (renamed CachePersistenceLayer),
    # and outside AWS Lambda it warns that it has no Lambda context, on every call.
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")


# --- figures ----------------------------------------------------------------------


def figures(runs: Sequence[float], unit: str = "calls/s", **extra: Any) -> dict[str, Any]:
    """The median of ``runs`` with its spread (min-max) and the runs themselves."""
    return {
        "median": statistics.median(runs),
        "min": min(runs),
        "max": max(runs),
        "runs": [round(r, 3) for r in runs],
        "unit": unit,
        **extra,
    }


def skipped(reason: str) -> dict[str, Any]:
    """A figure that could not be measured (a missing bench-only extra, an error)."""
    return {"skipped": reason}


def ratio(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None) -> float | None:
    """``ours.median / theirs.median``, or ``None`` if either is missing."""
    if not ours or not theirs or "median" not in ours or "median" not in theirs:
        return None
    return float(ours["median"]) / float(theirs["median"]) if theirs["median"] else None


# --- workloads ----------------------------------------------------------------------


class Workload:
    """One logical operation, repeated. Subclasses set ``call`` or ``acall``.

    A workload is built by a factory ``make(url, index) -> Workload`` named by a
    ``"module:function"`` path, so worker processes build their own. ``start(tag)``
    is called before every timed run: operations of one run use keys under that
    tag, so every run sees fresh keys (no run hits the records of the last one).
    """

    is_async = False
    concurrency = 1  # async workloads: operations in flight at once (in-process runs)

    def start(self, tag: str) -> None:
        """Use a fresh key space named by ``tag`` from now on."""

    def prepare(self, n: int) -> None:
        """Untimed set-up for the next ``n`` calls (e.g. records to replay)."""

    def call(self) -> object:
        """One operation; may return an outcome label ("new", "duplicate", ...)."""
        raise NotImplementedError

    async def acall(self) -> object:
        """One operation (async workloads)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (sync workloads)."""

    async def aclose(self) -> None:
        """Release connections (async workloads)."""


def load(path: str) -> Callable[[str, int], Workload]:
    """The factory named ``"module:function"``."""
    module, _, name = path.partition(":")
    factory: Callable[[str, int], Workload] = getattr(importlib.import_module(module), name)
    return factory


def _server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# --- in-process measurement -------------------------------------------------------


class _Runner:
    """Times a workload in this process (one event loop for the async ones)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def timed(self, w: Workload, n: int) -> tuple[float, float]:
        """Run ``n`` calls; return (wall seconds, client CPU seconds)."""
        w.prepare(n)
        gc.collect()
        gc.disable()
        try:
            cpu = time.process_time()
            start = time.perf_counter()
            if w.is_async:
                self.loop.run_until_complete(_async_calls(w, n))
            else:
                call = w.call
                for _ in range(n):
                    call()
            return time.perf_counter() - start, time.process_time() - cpu
        finally:
            gc.enable()

    def close(self, w: Workload) -> None:
        if w.is_async:
            self.loop.run_until_complete(w.aclose())
        else:
            w.close()


async def _async_calls(w: Workload, n: int) -> None:
    async def worker(count: int) -> None:
        acall = w.acall
        for _ in range(count):
            await acall()

    c = max(1, w.concurrency)
    await asyncio.gather(*(worker(n // c + (1 if i < n % c else 0)) for i in range(c)))


def measure_single(
    url: str,
    factories: Mapping[str, str],
    settings: Settings,
    *,
    admin: redis.Redis,
    errors: list[str],
) -> dict[str, dict[str, Any]]:
    """Measure each workload in this process, interleaved round by round.

    Each round runs every kind for about ``settings.seconds`` (a call count
    calibrated once from a warm-up), on fresh keys. Returns per kind the
    calls/s figures plus the median client and Redis-server CPU time per call
    (microseconds); a kind that cannot be built or fails is reported skipped.
    """
    runner = _Runner()
    built: dict[str, Workload] = {}
    counts: dict[str, int] = {}
    results: dict[str, dict[str, Any]] = {}
    try:
        for kind, path in factories.items():
            try:
                w = load(path)(url, 0)
                built[kind] = w
                w.start(f"warm-{kind}")
                warm_n = 20
                elapsed, _ = runner.timed(w, warm_n)  # connect, load scripts, calibrate
                elapsed, _ = runner.timed(w, warm_n)
                per_call = max(elapsed / warm_n, 1e-6)
                counts[kind] = max(10, int(settings.seconds / per_call))
            except Exception as exc:  # a peer's failure must not sink the run
                errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                results[kind] = skipped(f"{type(exc).__name__}: {exc}")
        runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in counts}
        for r in range(settings.rounds):
            for kind, n in counts.items():
                if kind in results:
                    continue
                w = built[kind]
                try:
                    w.start(f"r{r}-{kind}")
                    server = _server_cpu(admin)
                    wall, cpu = runner.timed(w, n)
                    server = _server_cpu(admin) - server
                except Exception as exc:
                    errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                    results[kind] = skipped(f"{type(exc).__name__}: {exc}")
                    continue
                runs[kind].append((n / wall, cpu / n * 1e6, server / n * 1e6))
        for kind, measured in runs.items():
            if kind in results or not measured:
                continue
            results[kind] = figures(
                [m[0] for m in measured],
                calls=counts[kind],
                client_cpu_us=round(statistics.median(m[1] for m in measured), 1),
                server_cpu_us=round(statistics.median(m[2] for m in measured), 1),
            )
    finally:
        for w in built.values():
            with contextlib.suppress(Exception):
                runner.close(w)
        runner.loop.close()
    return results


# --- multi-process measurement --------------------------------------------------------


def _worker(url: str, index: int, conn: Any) -> None:
    """Serve the parent's requests until ("stop",).

    ("prepare", path, tag): build the workload (once: imports, connections,
    scripts, a warm-up) and point it at ``tag``'s keys; answer ("ready",).
    ("run", start_at, seconds): run it from ``start_at`` for ``seconds``;
    answer ("ok", calls, elapsed, cpu, outcomes). Failures answer ("error", text).
    """
    quiet()
    loop = asyncio.new_event_loop()
    built: dict[str, Workload] = {}
    current: Workload | None = None
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            try:
                if msg[0] == "prepare":
                    _, path, tag = msg
                    current = built.get(path)
                    if current is None:
                        current = built[path] = load(path)(url, index)
                        current.start(f"warm-{uuid.uuid4().hex}")  # never another run's keys
                        _timed_run(loop, current, time.time(), 0.0)
                    current.start(tag)
                    conn.send(("ready",))
                else:
                    _, start_at, seconds = msg
                    assert current is not None, "run before prepare"
                    conn.send(("ok", *_timed_run(loop, current, start_at, seconds)))
            except Exception as exc:  # reported to the parent, which records it
                current = None
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        for w in built.values():
            with contextlib.suppress(Exception):
                if w.is_async:
                    loop.run_until_complete(w.aclose())
                else:
                    w.close()
        loop.close()
        conn.close()


def _timed_run(
    loop: asyncio.AbstractEventLoop, w: Workload, start_at: float, seconds: float
) -> tuple[int, float, float, dict[str, int]]:
    while time.time() < start_at:
        time.sleep(0.0005)
    end = start_at + seconds
    outcomes: dict[str, int] = {}
    cpu = time.process_time()
    if w.is_async:
        n = loop.run_until_complete(_async_until(w, end, outcomes))
    else:
        call = w.call
        n = 0
        while True:
            for _ in range(10):
                label = call()
                if label is not None:
                    outcomes[str(label)] = outcomes.get(str(label), 0) + 1
            n += 10
            if time.time() >= end:
                break
    return n, time.time() - start_at, time.process_time() - cpu, outcomes


async def _async_until(w: Workload, end: float, outcomes: dict[str, int]) -> int:
    acall = w.acall
    n = 0
    while True:
        for _ in range(10):
            label = await acall()
            if label is not None:
                outcomes[str(label)] = outcomes.get(str(label), 0) + 1
        n += 10
        if time.time() >= end:
            return n


class Pool:
    """``size`` spawned worker processes, each with its own connections."""

    def __init__(self, size: int, url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        for index in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(url, index, child), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(
        self, path: str, tag: str, seconds: float, admin: redis.Redis
    ) -> tuple[float, float, float, dict[str, int]]:
        """Run ``path`` on every worker at once for ``seconds``.

        Returns:
            (calls/s summed over the workers, client CPU us per call, Redis
            server CPU us per call, outcome counts summed over the workers).

        Raises:
            RuntimeError: A worker failed (its message), or did not answer.
        """
        for conn in self.conns:
            conn.send(("prepare", path, tag))
        self._answers(120.0)  # the first prepare imports and connects
        start_at = time.time() + 0.02
        for conn in self.conns:
            conn.send(("run", start_at, seconds))
        server = _server_cpu(admin)
        rate = cpu = 0.0
        calls = 0
        outcomes: dict[str, int] = {}
        for n, elapsed, used, seen in self._answers(seconds + 60.0):
            rate += n / elapsed
            calls += n
            cpu += used
            for k, v in seen.items():
                outcomes[k] = outcomes.get(k, 0) + v
        server = _server_cpu(admin) - server
        return rate, cpu / calls * 1e6, server / calls * 1e6, outcomes

    def _answers(self, timeout: float) -> list[Any]:
        """Every worker's answer (its payload); RuntimeError if one failed or is silent."""
        answers, failure = [], None
        for conn in self.conns:
            try:
                if not conn.poll(timeout):
                    raise RuntimeError("a benchmark worker did not answer")
                reply = conn.recv()
            except (EOFError, OSError) as exc:
                raise RuntimeError(f"a benchmark worker died: {exc!r}") from exc
            if reply[0] == "error":
                failure = reply[1]
            answers.append(reply[1:])
        if failure is not None:
            raise RuntimeError(failure)
        return answers

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(("stop",))
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()


def measure_processes(
    url: str,
    factories: Mapping[str, str],
    settings: Settings,
    *,
    admin: redis.Redis,
    errors: list[str],
) -> dict[str, dict[str, dict[str, Any]]]:
    """Each workload with each process count of ``settings.processes``.

    Returns ``{kind: {str(n): figure}}``: calls/s summed over the n processes,
    median of ``pool_repeats`` runs (kinds interleaved run by run), with the
    median client and server CPU time per call and the outcome mix.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in factories}
    for n in settings.processes:
        pool = Pool(n, url)
        try:
            runs: dict[str, list[tuple[float, float, float, dict[str, int]]]] = {
                k: [] for k in factories
            }
            failed: dict[str, str] = {}
            for r in range(settings.pool_repeats):
                for kind, path in factories.items():
                    if kind in failed:
                        continue
                    try:
                        runs[kind].append(
                            pool.run(path, f"p{n}-r{r}", settings.pool_seconds, admin)
                        )
                    except RuntimeError as exc:
                        failed[kind] = str(exc)
                        errors.append(f"{kind} x{n}: {exc}")
        finally:
            pool.close()
        for kind, measured in runs.items():
            if kind in failed or not measured:
                out[kind][str(n)] = skipped(failed.get(kind, "not measured"))
                continue
            total: dict[str, int] = {}
            for m in measured:
                for k, v in m[3].items():
                    total[k] = total.get(k, 0) + v
            extra: dict[str, Any] = {}
            if total:
                seen = sum(total.values())
                extra["outcomes"] = {k: round(v / seen, 4) for k, v in sorted(total.items())}
            out[kind][str(n)] = figures(
                [m[0] for m in measured],
                processes=n,
                client_cpu_us=round(statistics.median(m[1] for m in measured), 1),
                server_cpu_us=round(statistics.median(m[2] for m in measured), 1),
                **extra,
            )
    return out


# --- the server and the machine -------------------------------------------------------


@contextlib.contextmanager
def redis_server() -> Iterator[tuple[str, redis.Redis]]:
    """A private redis-server on a free loopback port (no persistence); (url, admin client)."""
    from durabilis.testing import RedisServer  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="durabilis-bench-") as tmp:
        server = RedisServer(tmp).start()
        admin = redis.Redis.from_url(server.url)
        try:
            yield server.url, admin
        finally:
            admin.close()
            server.stop()


def _cpu_model() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5, check=False)
        for line in out.stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine(admin: redis.Redis) -> dict[str, Any]:
    """What the numbers were measured on."""
    info = admin.info("server")
    versions: dict[str, str] = {}
    for dist in ("redis", "hiredis", "tenacity", "stamina", "pybreaker", "aws-lambda-powertools"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version  # noqa: PLC0415

            versions[dist] = version(dist)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "redis_server": str(info.get("redis_version")),
        "redis_server_path": shutil.which("redis-server"),
        "packages": versions,
        "argv": sys.argv,
    }
