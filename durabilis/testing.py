"""Helpers for users' own tests.

- :func:`isolated_namespace` gives every test its own key namespace, so tests
  sharing one Redis never see each other's data.
- :func:`start_redis_server` starts a private ``redis-server`` on a free
  loopback port (the helper durabilis's own suite uses).
"""

from __future__ import annotations

import uuid

from durabilis._server import INSTALL_HINT, RedisServer, find_redis_server, free_port

__all__ = [
    "INSTALL_HINT",
    "RedisServer",
    "find_redis_server",
    "free_port",
    "isolated_namespace",
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
