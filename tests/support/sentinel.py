"""A local Redis Sentinel topology (1 primary, 2 replicas, 3 sentinels by default) on loopback.

The data nodes are plain ``redis-server`` processes (:class:`durabilis.testing.RedisServer`),
the replicas started with ``--replicaof`` the primary. The sentinels are ``redis-server
<conf> --sentinel`` (there is no separate ``redis-sentinel`` binary here); each gets a config
file of its own, which it rewrites as it learns the topology. Start-up is bounded;
:meth:`LocalSentinel.stop` kills every process. Also the faults the suites inject: kill,
restart, pause and resume a data node, and waiting for the failover that follows.

Timing, with the defaults (``down-after-milliseconds 1000`` and ``SENTINEL_TIMING``): start-up
takes about 0.5 s and a killed primary is replaced in about 2 s (subjective down after 1 s,
then objective down, election and promotion). A sentinel learns replicas only from the
primary's ``INFO``, so the sentinels are started after the replicas have synced.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from durabilis.testing import INSTALL_HINT, RedisServer, find_redis_server
from tests.support.ports import free_port

HOST = "127.0.0.1"

#: ``SENTINEL DEBUG`` timings (milliseconds) sent to every sentinel once it is up (Redis >= 7.0;
#: an older sentinel refuses them and keeps its defaults). With the defaults (ping 1 s, ask 1 s,
#: hello 2 s, INFO 10 s) and ``down-after-milliseconds`` near the 1 s ping period, a sentinel
#: can find the new primary subjectively down right after a failover (its fresh link is only
#: connected one ping period later) and the other sentinels' stale "down" votes turn that into a
#: second, spurious failover. The ping period must not go much lower, though: a failover only
#: promotes a replica whose INFO (polled every 1 s then, whatever ``info-period`` says) is less
#: than 5 ping periods old, else it aborts with ``-failover-abort-no-good-slave``.
SENTINEL_TIMING: dict[str, int] = {
    "ping-period": 300,
    "ask-period": 200,
    "publish-period": 200,
    "info-period": 1000,
}


def _plain(port: int, timeout: float = 1.0) -> redis.Redis:
    return redis.Redis(
        host=HOST, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0), decode_responses=True,
    )


def _pairs(reply: Any) -> dict[str, str]:
    """A flat ``[k, v, k, v, ...]`` reply (RESP2) or a map (RESP3) as a dict of strings."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    items = list(reply)
    return {str(items[i]): str(items[i + 1]) for i in range(0, len(items) - 1, 2)}


def _without_replicaof(extra: list[str]) -> list[str]:
    out: list[str] = []
    skip = 0
    for arg in extra:
        if skip:
            skip -= 1
            continue
        if arg == "--replicaof":
            skip = 2
            continue
        out.append(arg)
    return out


class SentinelNotReady(RuntimeError):
    """The sentinel topology did not reach the expected state in time."""


class SentinelProcess:
    """One ``redis-server <conf> --sentinel`` child process on 127.0.0.1.

    Args:
        data_dir: Working directory: ``sentinel.conf`` (rewritten by the sentinel) and
            ``sentinel.log`` (its stdout and stderr).
        port: TCP port on 127.0.0.1.
        config: The ``sentinel ...`` lines to write after the basic settings.
        timing: ``SENTINEL DEBUG`` settings to send once it answers (see ``SENTINEL_TIMING``).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int,
        config: list[str],
        timing: dict[str, int] | None = None,
        executable: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        self.config = list(config)
        self.timing = dict(SENTINEL_TIMING if timing is None else timing)
        self.executable = executable or find_redis_server()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def conf_path(self) -> Path:
        return self.data_dir / "sentinel.conf"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "sentinel.log"

    def write_config(self) -> None:
        lines = [
            f"port {self.port}",
            f"bind {HOST}",
            f"dir {self.data_dir}",
            "daemonize no",
            "protected-mode no",
            'logfile ""',
            "sentinel resolve-hostnames no",
            "sentinel announce-hostnames no",
            *self.config,
        ]
        self.conf_path.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 10.0) -> SentinelProcess:
        """Write a fresh config, start the process and wait until it answers PING."""
        if self.executable is None:
            raise FileNotFoundError(INSTALL_HINT)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.write_config()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [self.executable, str(self.conf_path), "--sentinel"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.data_dir,
            )
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"sentinel exited with {self.process.returncode}: {tail}")
            try:
                with _plain(self.port) as c:
                    c.ping()
                    self._apply_timing(c)
                return self
            except redis.RedisError as exc:
                last = exc
                time.sleep(0.02)
        raise TimeoutError(f"sentinel on port {self.port} not ready after {timeout}s: {last}")

    def _apply_timing(self, c: Any) -> None:
        if not self.timing:
            return
        args = [str(x) for kv in self.timing.items() for x in kv]
        # Before Redis 7.0 there is no SENTINEL DEBUG: keep the default timings.
        with contextlib.suppress(redis.ResponseError):
            c.execute_command("SENTINEL", "DEBUG", *args)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGKILL the process and reap it (idempotent)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


class LocalSentinel:
    """A throw-away Redis Sentinel topology on 127.0.0.1.

    Args:
        base_dir: Data nodes get ``base_dir/node-<port>``, sentinels ``base_dir/sentinel-<port>``.
        service: The monitored master's name (``sentinel monitor <service> ...``).
        replicas: Number of replicas of the primary.
        sentinels: Number of sentinel processes.
        quorum: Sentinels that must agree the primary is down before a failover.
        down_after_ms: ``down-after-milliseconds``: silence before a node is deemed down.
        failover_timeout_ms: ``failover-timeout`` (also: a failed failover is retried after
            twice this).
        appendonly: Data nodes keep an AOF with ``appendfsync always``: a killed node
            comes back by :meth:`restart` with everything it had confirmed (a replica
            confirms to WAIT only what it wrote and fsynced; with ``everysec`` a
            confirmed write may still be in its memory only, and die with it).
    """

    def __init__(
        self,
        base_dir: str | Path,
        *,
        service: str = "mymaster",
        replicas: int = 2,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 4000,
        appendonly: bool = False,
    ) -> None:
        if replicas < 0 or sentinels < 1 or not 1 <= quorum <= sentinels:
            raise ValueError("need replicas >= 0, sentinels >= 1 and 1 <= quorum <= sentinels")
        self.base_dir = Path(base_dir).resolve()
        self.service = service
        self.replicas = replicas
        self.sentinels = sentinels
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.appendonly = appendonly
        self.nodes: dict[int, RedisServer] = {}
        self.sentinel_processes: list[SentinelProcess] = []
        self._paused: set[int] = set()
        self._ports: set[int] = set()

    # --- lifecycle -----------------------------------------------------------

    def _free_port(self) -> int:
        for _ in range(100):
            port = free_port()
            if port not in self._ports:
                self._ports.add(port)
                return port
        raise RuntimeError("no free port on 127.0.0.1")

    def _node_extra(self, primary_port: int | None) -> list[str]:
        extra = [
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
        ]
        if primary_port is not None:
            extra += ["--replicaof", HOST, str(primary_port)]
        return extra

    def start(self, timeout: float = 30.0) -> LocalSentinel:
        """Start the primary, the replicas and the sentinels; wait until all are linked.

        Raises:
            FileNotFoundError: No redis-server (the message says how to install it).
            SentinelNotReady: Not ready within ``timeout`` seconds (everything is stopped).
        """
        if find_redis_server() is None:
            raise FileNotFoundError(INSTALL_HINT)
        deadline = time.monotonic() + timeout
        try:
            primary_port = self._free_port()
            self._start_node(primary_port, None, deadline)
            for _ in range(self.replicas):
                self._start_node(self._free_port(), primary_port, deadline)
            # Sentinels learn the replicas from the primary's INFO, polled every 10 s once
            # known: start them only when the replicas are attached.
            self._wait(self._link_problems, deadline, "replicas not linked")
            monitor = [
                f"sentinel monitor {self.service} {HOST} {primary_port} {self.quorum}",
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {self.service} 1",
            ]
            for _ in range(self.sentinels):
                port = self._free_port()
                proc = SentinelProcess(self.base_dir / f"sentinel-{port}", port=port,
                                       config=monitor)
                self.sentinel_processes.append(proc)
                proc.start(max(1.0, deadline - time.monotonic()))
            self._wait(self._start_problems, deadline, "sentinels not ready")
        except (TimeoutError, RuntimeError) as exc:
            self.stop()
            if isinstance(exc, SentinelNotReady):
                raise
            raise SentinelNotReady(f"start failed: {exc}") from exc
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, port: int, primary_port: int | None, deadline: float) -> RedisServer:
        node = RedisServer(
            self.base_dir / f"node-{port}", port=port, extra=self._node_extra(primary_port),
            appendonly=self.appendonly, appendfsync="always",
        )
        self.nodes[port] = node
        node.start(max(1.0, deadline - time.monotonic()))
        return node

    def stop(self) -> None:
        """Kill every process (paused ones too); idempotent."""
        for proc in self.sentinel_processes:
            proc.stop()
        for port, node in self.nodes.items():
            if port in self._paused and node.process is not None and node.process.poll() is None:
                node.signal(signal.SIGCONT)
            node.stop(kill=True)
        self._paused.clear()

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- addresses and clients ----------------------------------------------

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [(HOST, p.port) for p in self.sentinel_processes]

    @property
    def url(self) -> str:
        """``redis+sentinel://`` URL naming every sentinel and the service."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self.service}"

    @property
    def ports(self) -> list[int]:
        """Every data node's port (alive or not)."""
        return list(self.nodes)

    def sentinel_client(self, **options: Any) -> redis.sentinel.Sentinel:
        """A redis-py :class:`~redis.sentinel.Sentinel` over every sentinel."""
        options.setdefault("socket_timeout", 2.0)
        return redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            self.sentinel_addresses, **options
        )

    def client(self, port: int) -> redis.Redis:
        """A plain client on one node or sentinel (``decode_responses=True``); close it."""
        return _plain(port)

    def node(self, port: int) -> RedisServer:
        """The data node on ``port`` (holds the process)."""
        try:
            return self.nodes[port]
        except KeyError:
            raise KeyError(f"no data node on port {port}") from None

    def alive(self, port: int) -> bool:
        """Whether the data node's process is running (a paused one counts as running)."""
        proc = self.node(port).process
        return proc is not None and proc.poll() is None

    # --- topology ------------------------------------------------------------

    def _ask_sentinels(self) -> dict[int, tuple[str, int] | None]:
        """Each reachable sentinel's answer to GET-MASTER-ADDR-BY-NAME."""
        answers: dict[int, tuple[str, int] | None] = {}
        for proc in self.sentinel_processes:
            if not proc.alive():
                continue
            try:
                with _plain(proc.port) as c:
                    reply = c.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
                    )
            except redis.RedisError:
                continue
            answers[proc.port] = (str(reply[0]), int(reply[1])) if reply else None
        return answers

    def primary(self) -> tuple[str, int]:
        """The primary's address according to the first sentinel that answers.

        Raises:
            SentinelNotReady: No sentinel answered.
        """
        for answer in self._ask_sentinels().values():
            if answer is not None:
                return answer
        raise SentinelNotReady(f"no sentinel knows the primary of {self.service!r}")

    def primary_port(self) -> int:
        return self.primary()[1]

    def replica_ports(self) -> list[int]:
        """Alive data nodes other than the current primary (per the sentinels)."""
        primary = self.primary_port()
        return [p for p in self.nodes if p != primary and self.alive(p)]

    def _role(self, port: int) -> str | None:
        try:
            with _plain(port) as c:
                return str(c.execute_command("ROLE")[0])
        except redis.RedisError:
            return None

    # --- faults --------------------------------------------------------------

    def kill(self, port: int) -> None:
        """SIGKILL the data node on ``port`` (no save) and reap it."""
        node = self.node(port)
        if port in self._paused and self.alive(port):
            node.signal(signal.SIGCONT)
        self._paused.discard(port)
        node.stop(kill=True)

    def restart(self, port: int, timeout: float = 10.0) -> None:
        """Start a killed data node again, on the same port and data dir.

        It comes back with ``--replicaof`` the current primary, so it never serves writes
        as a second primary; the sentinels already list it as a replica. If the sentinels
        still name this very node as the primary (no failover happened), it comes back as
        the primary (empty, unless ``appendonly``).
        """
        node = self.node(port)
        if self.alive(port):
            raise RuntimeError(f"data node {port} is running; kill it first")
        try:
            primary: int | None = self.primary_port()
        except SentinelNotReady:
            primary = None
        node.extra = _without_replicaof(node.extra)
        if primary is not None and primary != port:
            node.extra += ["--replicaof", HOST, str(primary)]
        node.start(timeout)

    def pause(self, port: int) -> None:
        """SIGSTOP the data node's process (it stops answering, keeps its sockets)."""
        if not self.alive(port):
            raise RuntimeError(f"data node {port} is not running")
        self.node(port).signal(signal.SIGSTOP)
        self._paused.add(port)

    def resume(self, port: int) -> None:
        """SIGCONT a paused data node."""
        if self.alive(port):
            self.node(port).signal(signal.SIGCONT)
        self._paused.discard(port)

    # --- waiting -------------------------------------------------------------

    def _wait(self, check: Callable[[], list[str]], deadline: float, what: str) -> None:
        while True:
            problems = check()
            if not problems:
                return
            if time.monotonic() >= deadline:
                raise SentinelNotReady(f"{what}: {problems}")
            time.sleep(0.1)

    def _link_problems(self, primary: int | None = None) -> list[str]:
        """Every alive data node other than ``primary`` is a replica of it, link up."""
        if primary is None:
            primary = next(iter(self.nodes))
        problems: list[str] = []
        for port in self.nodes:
            if not self.alive(port):
                continue
            if port in self._paused:
                problems.append(f"{port}: paused")
                continue
            try:
                with _plain(port) as c:
                    info = c.info("replication")
            except redis.RedisError as exc:
                problems.append(f"{port}: {exc}")
                continue
            role = info.get("role")
            if port == primary:
                if role != "master":
                    problems.append(f"{port}: primary has role {role}")
                continue
            if role != "slave":
                problems.append(f"{port}: role {role}, expected a replica")
            elif int(info.get("master_port", 0)) != primary:
                problems.append(f"{port}: replica of {info.get('master_port')}, not {primary}")
            elif info.get("master_link_status") != "up":
                problems.append(f"{port}: master_link_status {info.get('master_link_status')}")
        return problems

    def _sentinel_problems(self, primary: int, *, exact: bool) -> list[str]:
        """Each sentinel's view of the service: healthy primary, other sentinels, replicas.

        ``exact``: ``num-slaves`` must equal the configured replica count (at start-up);
        otherwise every alive replica must be listed and not down (killed ones stay listed).
        """
        problems: list[str] = []
        for proc in self.sentinel_processes:
            try:
                with _plain(proc.port) as c:
                    master = _pairs(c.execute_command("SENTINEL", "MASTER", self.service))
                    replicas = [
                        _pairs(r)
                        for r in c.execute_command("SENTINEL", "REPLICAS", self.service)
                    ]
            except redis.RedisError as exc:
                problems.append(f"sentinel {proc.port}: {exc}")
                continue
            where = f"sentinel {proc.port}"
            if int(master.get("port", 0)) != primary:
                problems.append(f"{where}: primary {master.get('port')}, not {primary}")
            if master.get("flags") != "master":
                problems.append(f"{where}: primary flags {master.get('flags')}")
            others = int(master.get("num-other-sentinels", -1))
            if others != self.sentinels - 1:
                problems.append(f"{where}: num-other-sentinels={others}")
            if exact:
                slaves = int(master.get("num-slaves", -1))
                if slaves != self.replicas:
                    problems.append(f"{where}: num-slaves={slaves}")
                continue
            flags = {int(r.get("port", 0)): r.get("flags", "") for r in replicas}
            for port in self.nodes:
                if port == primary or not self.alive(port):
                    continue
                if port not in flags:
                    problems.append(f"{where}: replica {port} unknown")
                elif flags[port] != "slave":
                    problems.append(f"{where}: replica {port} flags {flags[port]}")
        return problems

    def _start_problems(self) -> list[str]:
        primary = next(iter(self.nodes))
        return self._link_problems(primary) + self._sentinel_problems(primary, exact=True)

    def _healthy_problems(self) -> list[str]:
        answers = self._ask_sentinels()
        if len(answers) < len(self.sentinel_processes):
            return [f"only {len(answers)} of {len(self.sentinel_processes)} sentinels answer"]
        named = set(answers.values())
        if len(named) != 1 or None in named:
            return [f"sentinels disagree on the primary: {answers}"]
        primary = next(iter(named))
        assert primary is not None
        if primary[1] not in self.nodes or not self.alive(primary[1]):
            return [f"primary {primary} is not running"]
        return self._link_problems(primary[1]) + self._sentinel_problems(primary[1], exact=False)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until all sentinels name the same running primary, every other running data
        node replicates from it with its link up, and every sentinel sees the primary as
        healthy, the other sentinels, and every running replica as up.

        A paused node counts as a problem: resume it first.

        Raises:
            SentinelNotReady: Still not so after ``timeout`` seconds (names the problems).
        """
        deadline = time.monotonic() + timeout
        self._wait(self._healthy_problems, deadline, f"not healthy after {timeout}s")

    def wait_for_failover(
        self, old: tuple[str, int], timeout: float = 30.0
    ) -> tuple[str, int]:
        """Wait until every reachable sentinel (at least a majority of them) names the same
        new primary, other than ``old``, and that node answers ``ROLE`` as master.

        Returns:
            The new primary's address.

        Raises:
            SentinelNotReady: No such failover within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        majority = len(self.sentinel_processes) // 2 + 1
        last: dict[int, tuple[str, int] | None] = {}
        while True:
            last = self._ask_sentinels()
            named = set(last.values())
            if len(last) >= majority and len(named) == 1:
                new = next(iter(named))
                if new is not None and tuple(new) != tuple(old) and self._role(new[1]) == "master":
                    return new
            if time.monotonic() >= deadline:
                roles = {p: self._role(p) for p in self.nodes if self.alive(p)}
                raise SentinelNotReady(
                    f"no failover away from {old} after {timeout}s: sentinels say {last}, "
                    f"roles {roles}"
                )
            time.sleep(0.05)

    def iter_sentinel_logs(self) -> Iterator[tuple[int, str]]:
        """``(port, log text)`` of each sentinel, for failure messages."""
        for proc in self.sentinel_processes:
            text = proc.log_path.read_text(errors="replace") if proc.log_path.exists() else ""
            yield proc.port, text
