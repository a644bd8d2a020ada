"""Loopback ports for the servers the suites start, one disjoint block per xdist worker.

``durabilis.testing.free_port`` asks the kernel for an ephemeral port, binds it and
lets it go: between that and ``redis-server`` binding it, anything may take it (a
client connection's own port, or another pytest worker asking the same). Under
pytest-xdist several workers start servers at once, so the suites take their
ports here instead:

- every port comes from ``[10000, 20000)``, below Linux's ephemeral range
  (``ip_local_port_range``, 32768-60999 by default): no outgoing connection is
  ever given one;
- that range is cut into one block per worker (``PYTEST_XDIST_WORKER``, ``gwN``
  of ``PYTEST_XDIST_WORKER_COUNT``): two workers never pick the same port;
- a worker walks its block from a random offset and never hands out a port
  twice, and a port is handed out only if it binds (with ``+10000``, a Cluster
  node's bus port, when asked): another pytest session on the same machine
  (not a worker of this one) is skipped over;
- Cluster bus ports (``p + 10000``) fall in ``[20000, 30000)``, which nothing
  else here uses.

:func:`install` makes ``durabilis.testing.free_port`` (and so every
``RedisServer(port=None)`` in the test processes) use :func:`free_port`.
"""

from __future__ import annotations

import os
import random
import socket
import threading

import durabilis._server
import durabilis.testing

LOW, HIGH = 10000, 20000
BUS_OFFSET = 10000

_lock = threading.Lock()
_given: set[int] = set()
_cursor: int | None = None


def worker_block() -> tuple[int, int]:
    """``[lo, hi)``: this process's block of ports (all of them without xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (HIGH - LOW) // max(1, count)
    lo = LOW + (index % max(1, count)) * size
    return lo, lo + size


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, with_bus: bool = False) -> int:
    """A port of this worker's block that binds now and was never handed out before.

    Args:
        with_bus: Also require ``port + 10000`` to bind (a Cluster node's bus port).

    Raises:
        RuntimeError: The block is exhausted.
    """
    global _cursor  # noqa: PLW0603  (one cursor per process)
    lo, hi = worker_block()
    with _lock:
        if _cursor is None:
            _cursor = random.randrange(lo, hi)
        for _ in range(hi - lo):
            port = _cursor
            _cursor = lo + (_cursor + 1 - lo) % (hi - lo)
            if port in _given:
                continue
            if _binds(port) and (not with_bus or _binds(port + BUS_OFFSET)):
                _given.add(port)
                return port
    raise RuntimeError(f"no free port left in [{lo}, {hi}) on 127.0.0.1")


def install() -> None:
    """Route ``durabilis.testing.free_port`` (and ``RedisServer``'s default) here."""
    durabilis._server.free_port = free_port  # type: ignore[assignment]
    durabilis.testing.free_port = free_port  # type: ignore[assignment]
