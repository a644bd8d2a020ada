"""Plain redis-py clients for a test URL: standalone, ``redis+cluster://`` or
``redis+sentinel://``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
import redis.cluster
import redis.sentinel

from durabilis._store import _cluster_nodes, sentinel_target


def is_cluster_url(url: str) -> bool:
    return url.startswith("redis+cluster://")


def is_sentinel_url(url: str) -> bool:
    return url.startswith("redis+sentinel://")


def sentinel_primary(url: str) -> tuple[str, int]:
    """``(host, port)`` of the primary the Sentinels of ``url`` name now."""
    sentinels, service, _ = sentinel_target(url)
    manager = redis.sentinel.Sentinel(sentinels, socket_timeout=2)
    try:
        host, port = manager.discover_master(service)
    finally:
        for s in manager.sentinels:
            s.close()
    return str(host), int(port)


def raw_client(url: str, **options: Any) -> Any:
    """A ``redis.Redis`` for ``url``, or a ``redis.cluster.RedisCluster`` for a cluster URL.

    For planting data and inspecting keys in tests, never for durabilis itself
    (which builds its own clients, with its own retry settings).
    """
    if is_cluster_url(url):
        nodes = [redis.cluster.ClusterNode(h, p) for h, p in _cluster_nodes(urlsplit(url).netloc)]
        return redis.cluster.RedisCluster(startup_nodes=nodes, **options)
    if is_sentinel_url(url):
        sentinels, service, db = sentinel_target(url)
        timeouts = {k: v for k, v in options.items() if k.startswith("socket_")}
        manager = redis.sentinel.Sentinel(sentinels, sentinel_kwargs=timeouts)
        return manager.master_for(service, db=db, **options)
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
    if is_sentinel_url(url):
        host, port = sentinel_primary(url)
        return ["-h", host, "-p", str(port)]
    return ["-u", url]
