"""Plain redis-py clients for a test URL, standalone or ``redis+cluster://``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
import redis.cluster

from durabilis._store import _cluster_nodes


def is_cluster_url(url: str) -> bool:
    return url.startswith("redis+cluster://")


def raw_client(url: str, **options: Any) -> Any:
    """A ``redis.Redis`` for ``url``, or a ``redis.cluster.RedisCluster`` for a cluster URL.

    For planting data and inspecting keys in tests, never for durabilis itself
    (which builds its own clients, with its own retry settings).
    """
    if is_cluster_url(url):
        nodes = [redis.cluster.ClusterNode(h, p) for h, p in _cluster_nodes(urlsplit(url).netloc)]
        return redis.cluster.RedisCluster(startup_nodes=nodes, **options)
    return redis.Redis.from_url(url, **options)


def keys_matching(raw: Any, pattern: str) -> list[bytes]:
    """Every key matching ``pattern``: SCAN (on every primary on Cluster), never KEYS.

    ``KEYS`` on a cluster client asks ONE node; ``scan_iter`` walks them all.
    """
    return sorted(raw.scan_iter(match=pattern, count=1000))


def redis_cli_target(url: str) -> list[str]:
    """``redis-cli`` arguments that reach ``url`` (``-c`` follows MOVED/ASK on Cluster)."""
    if is_cluster_url(url):
        host, port = _cluster_nodes(urlsplit(url).netloc)[0]
        return ["-c", "-h", host, "-p", str(port)]
    return ["-u", url]
