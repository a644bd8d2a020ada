"""The lean durable call: the client's own Python per call, and Redis commands per call.

``python -m benchmarks.bench_lean`` (about 20 s; ``--quick`` / ``--smoke`` shorter)
and the ``lean`` section of ``python -m benchmarks``.

- **Python per call with canned replies.** The durable call (sync, default
  config, a new key each call, ``fn`` succeeds) is first run against a real
  redis-server, its one pooled connection's socket recorded: the bytes of each
  reply, request by request. The same calls are then replayed with that
  connection's socket replaced by a tape that hands back those bytes (no
  system call, no server): redis-py's pool, connection, command packing and
  hiredis parser all run as they do for real, only the I/O is gone. The figure
  is CPU time (``time.process_time``) per call, median of several rounds: the
  client's own cost, immune to what other processes do on a shared machine.
  The layer's keep-alive thread is not started in this measurement (it wakes
  once a second, not once per call, and would take the taped connection): the
  counts and index removals it would send once a second wait in the process.
- **Redis commands per call**, default config and with a breaker: ``INFO
  commandstats`` on the real server over many calls (commands that scripts
  run included: they are what the server does), and the round trips per call
  (requests the client wrote).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import socket
import statistics
import time
from collections.abc import Iterator
from typing import Any

import redis

import durabilis
from benchmarks._harness import quiet, redis_server
from durabilis import CircuitBreakerConfig, DurabilityConfig, DurabilityLayer

NAMESPACE = "bench-lean"
OPERATION = "memory_write"
BREAKER = "memory_service"
TEXT = "x" * 100

SETTINGS: dict[str, dict[str, int]] = {
    # rounds of `calls` replayed calls each; `ops`: calls per command count
    "full": {"rounds": 7, "calls": 6000, "ops": 500},
    "quick": {"rounds": 5, "calls": 1500, "ops": 100},
    "smoke": {"rounds": 2, "calls": 200, "ops": 20},
}


def _payload(tag: str, i: int) -> dict[str, Any]:
    return {"page": f"Page-{i}", "text": TEXT, "tag": tag, "i": i}


def _fn(ctx: durabilis.OperationContext) -> dict[str, Any]:
    return {"ok": True, "attempt": ctx.attempt}


def breaker_config() -> DurabilityConfig:
    """The default config plus one breaker guarding the benchmark's operation."""
    return DurabilityConfig(
        breakers=(CircuitBreakerConfig(BREAKER),), dependencies={OPERATION: BREAKER}
    )


# --- the tape -------------------------------------------------------------------------


class _Recorder:
    """A socket proxy that records the bytes of each reply, request by request."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.requests: list[list[bytes]] = []  # per request, the chunks read
        self._sending = False

    def sendall(self, data: Any, *args: Any) -> None:
        if not self._sending:
            self.requests.append([])
            self._sending = True
        self._sock.sendall(data, *args)

    def recv_into(self, buffer: Any, *args: Any) -> int:
        n: int = self._sock.recv_into(buffer, *args)
        self._sending = False
        if n and self.requests:
            self.requests[-1].append(bytes(memoryview(buffer)[:n]))
        return n

    def recv(self, size: int, *args: Any) -> bytes:
        data: bytes = self._sock.recv(size, *args)
        self._sending = False
        if data and self.requests:
            self.requests[-1].append(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _Tape:
    """A socket that answers each request with the recorded reply bytes, in a loop.

    A read with nothing due raises ``socket.timeout`` (what a real socket does
    when the server has nothing to say). Its ``fileno`` is an idle socket's, so
    the pool's "anything unread?" probe (a ``poll``) runs as it does for real."""

    def __init__(self, requests: list[list[bytes]]) -> None:
        self._replies = [b"".join(chunks) for chunks in requests]
        self._next = itertools.cycle(range(len(self._replies)))
        self._due = b""
        self._sending = False
        self.sent = 0
        self._idle = socket.socketpair()  # never written: never readable

    def sendall(self, data: Any, *args: Any) -> None:
        if not self._sending:
            self._due += self._replies[next(self._next)]
            self._sending = True
            self.sent += 1

    def recv_into(self, buffer: Any, nbytes: int = 0, *args: Any) -> int:
        self._sending = False
        if not self._due:
            raise TimeoutError("timed out")
        room = len(buffer) if not nbytes else min(nbytes, len(buffer))
        chunk, self._due = self._due[:room], self._due[room:]
        memoryview(buffer)[: len(chunk)] = chunk
        return len(chunk)

    def recv(self, size: int, *args: Any) -> bytes:
        self._sending = False
        if not self._due:
            raise TimeoutError("timed out")
        chunk, self._due = self._due[:size], self._due[size:]
        return chunk

    def settimeout(self, *args: Any) -> None:
        return None

    def gettimeout(self) -> float | None:
        return None

    def setsockopt(self, *args: Any) -> None:
        return None

    def shutdown(self, *args: Any) -> None:
        return None

    def close(self) -> None:
        for end in self._idle:
            end.close()

    def fileno(self) -> int:
        return self._idle[0].fileno()


def _connections(store: durabilis.Store) -> list[Any]:
    """The connections the store's pool made (its hot path takes one of them)."""
    pool = store.client.connection_pool
    conns = list(getattr(pool, "_connections", []))
    return [c for c in conns if c is not None and getattr(c, "_sock", None) is not None]


@contextlib.contextmanager
def _socket_of(conn: Any, sock: Any) -> Iterator[None]:
    real = conn._sock
    conn._sock = sock
    conn._parser._sock = sock
    try:
        yield
    finally:
        conn._sock = real
        conn._parser._sock = real


def canned(url: str, settings: dict[str, int], config: DurabilityConfig | None = None,
           tag: str = "canned") -> dict[str, Any]:
    """The client's CPU per durable call with canned replies (see the module's doc)."""
    store = durabilis.connect(url, namespace=NAMESPACE)
    layer = DurabilityLayer(store, config)
    # No keep-alive thread (see the module's doc): it would share the taped connection.
    layer._leases._on_hold = None
    layer._core.on_wait = None
    counter = itertools.count()

    def call() -> None:
        layer.execute("agent-1", OPERATION, _payload(tag, next(counter)), _fn)

    try:
        for _ in range(50):  # scripts loaded, connection made, caches warm
            call()
        conns = _connections(store)
        if len(conns) != 1:
            raise RuntimeError(f"expected one connection, found {len(conns)}")
        conn = conns[0]
        recorder = _Recorder(conn._sock)
        recorded = 20
        with _socket_of(conn, recorder):
            for _ in range(recorded):
                call()
        per_call = len(recorder.requests) / recorded
        if per_call != int(per_call) or not per_call:
            raise RuntimeError(f"round trips per call not constant: {len(recorder.requests)}")
        tape = _Tape(recorder.requests)
        rounds: list[float] = []
        n = settings["calls"]
        with _socket_of(conn, tape):
            for _ in range(settings["rounds"]):
                began = time.process_time()
                for _ in range(n):
                    call()
                rounds.append((time.process_time() - began) / n * 1e6)
        tape.close()
        if tape.sent != settings["rounds"] * n * per_call:
            raise RuntimeError(f"replayed {tape.sent} requests, expected {n * per_call:g}/round")
        return {
            "us_per_call": round(statistics.median(rounds), 2),
            "rounds_us": [round(r, 2) for r in rounds],
            "round_trips": per_call,
            "reply_bytes": sum(len(b) for r in recorder.requests for b in r) // recorded,
        }
    finally:
        layer.close()
        store.close()


def commands(url: str, admin: redis.Redis, ops: int, config: DurabilityConfig | None,
             tag: str) -> dict[str, Any]:
    """Redis commands per durable call (``INFO commandstats``), scripts' own included."""
    store = durabilis.connect(url, namespace=NAMESPACE)
    layer = DurabilityLayer(store, config)
    counter = itertools.count()
    try:
        for _ in range(10):
            layer.execute("agent-1", OPERATION, _payload(f"{tag}-warm", next(counter)), _fn)
        admin.config_resetstat()
        for _ in range(ops):
            layer.execute("agent-1", OPERATION, _payload(tag, next(counter)), _fn)
        stats = admin.info("commandstats")
    finally:
        layer.close()
        store.close()
    counts = {
        name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    }
    scripts = counts.get("evalsha", 0) + counts.get("eval", 0)
    return {
        "commands": round(sum(counts.values()) / ops, 2),
        "scripts": round(scripts / ops, 2),
        "by_command": {k: round(c / ops, 2) for k, c in sorted(counts.items())},
    }


def measure(url: str, admin: redis.Redis, mode: str = "full") -> dict[str, Any]:
    """Every figure of this module against the server at ``url``."""
    settings = SETTINGS[mode]
    return {
        "canned": canned(url, settings),
        "canned_breaker": canned(url, settings, breaker_config(), tag="canned-cb"),
        "commands": commands(url, admin, settings["ops"], None, "cmd"),
        "commands_breaker": commands(url, admin, settings["ops"], breaker_config(), "cmd-cb"),
    }


def report_lines(lean: dict[str, Any]) -> list[str]:
    """The figures as lines of text (the suite's table and the standalone run)."""
    out = ["The lean durable call (sync, new key, fn succeeds)"]
    for name, label in (("canned", "default config"), ("canned_breaker", "with a breaker")):
        f = lean.get(name) or {}
        if "us_per_call" in f:
            out.append(
                f"  Python per call, canned replies, {label:<15} {f['us_per_call']:>7.1f} us"
                f"  (rounds {min(f['rounds_us']):.1f}-{max(f['rounds_us']):.1f};"
                f" {f['round_trips']:g} round trips)"
            )
    for name, label in (("commands", "default config"), ("commands_breaker", "with a breaker")):
        f = lean.get(name) or {}
        if "commands" in f:
            out.append(
                f"  Redis commands per call, {label:<21} {f['commands']:>7.2f}"
                f"  ({f['scripts']:g} scripts: {f['by_command']})"
            )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_lean", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true")
    group.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "smoke" if args.smoke else "full"
    quiet()
    with redis_server() as (url, admin):
        lean = measure(url, admin, mode)
    print(json.dumps(lean, indent=1) if args.json else "\n".join(report_lines(lean)))
    return lean


if __name__ == "__main__":
    main()

