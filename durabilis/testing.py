"""Helpers for users' own tests.

- :func:`isolated_namespace` gives every test its own key namespace, so tests
  sharing one Redis never see each other's data.
- :func:`start_redis_server` starts a private ``redis-server`` on a free
  loopback port (the helper durabilis's own suite uses).
- :func:`instant_retries` makes retries instant (and optionally fewer) in
  your own tests, like stamina's ``set_testing``.
- :func:`offset_server_clock` moves the clock every script of one store
  reads, for simulators that make leases and windows expire without waiting.
"""

from __future__ import annotations

import uuid
from types import TracebackType
from typing import Any

from durabilis._retry_core import TESTING
from durabilis._scripts import ScriptRegistry
from durabilis._server import INSTALL_HINT, RedisServer, find_redis_server, free_port
from durabilis.errors import ConfigError

__all__ = [
    "INSTALL_HINT",
    "RedisServer",
    "find_redis_server",
    "free_port",
    "instant_retries",
    "isolated_namespace",
    "offset_server_clock",
    "start_redis_server",
]


def isolated_namespace(prefix: str = "test") -> str:
    """A fresh namespace (``<prefix>-<12 hex>``) for one test."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def start_redis_server(data_dir: str, **options: object) -> RedisServer:
    """Start a ``redis-server`` on a free 127.0.0.1 port; call ``.stop()`` after.

    Raises:
        FileNotFoundError: No redis-server on PATH (the message says how to install it).
    """
    return RedisServer(data_dir, **options).start()  # type: ignore[arg-type]


def offset_server_clock(store: Any, clock_key: str) -> None:
    """Test hook: every script run through ``store`` reads the Redis server
    clock plus an offset, in microseconds, stored as a string at ``clock_key``.

    ``raw.set(clock_key, 30_000_000)`` then moves that store's view of time 30 s
    ahead: leases, dedup windows, breaker timeouts and DLQ TTLs expire without
    waiting. Only for a standalone test server (the key is read without being
    declared, which Redis Cluster refuses), and only for stores that all share
    the same hook: one store's "now" is then consistent for every pillar.
    """
    if getattr(store, "is_cluster", False):
        raise ConfigError("store", "offset_server_clock needs a standalone Redis server")
    store.scripts = ScriptRegistry(store.client, clock_key=clock_key)


class instant_retries:
    """Make every retry engine of this process skip its sleeps (for users' tests).

    Takes effect at once and lasts until :meth:`restore` or the end of the
    ``with`` block, which put back the previous setting (so it nests)::

        with instant_retries():            # as a context manager
            outcome = engine.execute("mcp_call", flaky)

        instant_retries(max_attempts=1)    # or for the whole session (e.g. in conftest.py)

    Delays are still computed, logged and counted as elapsed, so deadlines and
    events behave as in real time; only the waiting is skipped. Retry budgets
    (Redis) still apply.

    Args:
        enabled: ``False`` turns instant retries off (inside an enclosing block).
        max_attempts: Also cap every policy's ``max_attempts`` at this (>= 1).

    Raises:
        ConfigError: ``max_attempts`` below 1.
    """

    def __init__(self, enabled: bool = True, *, max_attempts: int | None = None) -> None:
        if max_attempts is not None and (
            isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
        ):
            raise ConfigError("max_attempts", f"must be an integer >= 1, got {max_attempts!r}")
        self._previous = (TESTING.instant, TESTING.max_attempts)
        TESTING.instant = bool(enabled)
        TESTING.max_attempts = max_attempts if enabled else None

    def restore(self) -> None:
        """Put back the setting in force before this one."""
        TESTING.instant, TESTING.max_attempts = self._previous

    def __enter__(self) -> instant_retries:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()
