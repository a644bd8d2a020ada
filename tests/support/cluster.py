"""A local Redis Cluster (3 primaries + 3 replicas by default) on loopback ports.

Built from plain ``redis-server`` processes (:class:`durabilis.testing.RedisServer`)
joined with ``redis-cli --cluster create``. Start-up is bounded; :meth:`LocalCluster.stop`
kills every node. Also the two cluster faults the suites inject: a slot migration
done by hand (so a test can hold the slot half-migrated, answering ASK) and a
coordinated replica failover (``CLUSTER FAILOVER``).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from durabilis.testing import INSTALL_HINT, RedisServer, find_redis_server
from tests.support import ports

CLI_HINT = (
    "redis-cli was not found on PATH (needed to create the test cluster). On Debian/Ubuntu: "
    "`sudo apt-get install -y redis-tools` (it comes with redis-server)"
)


def free_cluster_port() -> int:
    """A port ``p`` with ``p`` and its cluster-bus port ``p + 10000`` both free
    (from this xdist worker's own block: ``tests/support/ports.py``)."""
    return ports.free_port(with_bus=True)


def _plain(port: int, timeout: float = 2.0) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0), decode_responses=True,
    )


class ClusterNotReady(RuntimeError):
    """The cluster did not reach a healthy state in time."""


class LocalCluster:
    """A throw-away Redis Cluster on 127.0.0.1.

    Args:
        base_dir: Each node gets ``base_dir/node-<port>`` (nodes.conf, log).
        primaries: Number of primaries (>= 3, what ``redis-cli --cluster create`` needs).
        replicas: Replicas per primary.
        node_timeout_ms: ``cluster-node-timeout``. Generous by default: on a busy
            2-core machine a short one makes nodes declare each other failed.
        appendonly: Nodes keep an AOF with ``appendfsync always``: a node
            :meth:`kill` ed comes back by :meth:`restart` with everything it had
            confirmed.
        extra: More ``--option value`` pairs for every node.
    """

    def __init__(
        self,
        base_dir: str | Path,
        *,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 5000,
        appendonly: bool = False,
        extra: list[str] | None = None,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.primaries = primaries
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.appendonly = appendonly
        self.extra = list(extra or [])
        self.nodes: list[RedisServer] = []

    # --- lifecycle -----------------------------------------------------------

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Start every node, create the cluster, wait until it is healthy.

        Raises:
            FileNotFoundError: No redis-server / redis-cli (the message says how to install).
            ClusterNotReady: Not healthy within ``timeout`` seconds (nodes are stopped).
        """
        if find_redis_server() is None:
            raise FileNotFoundError(INSTALL_HINT)
        cli = shutil.which("redis-cli")
        if cli is None:
            raise FileNotFoundError(CLI_HINT)
        deadline = time.monotonic() + timeout
        try:
            for _ in range(self.primaries * (1 + self.replicas)):
                port = free_cluster_port()
                node_dir = self.base_dir / f"node-{port}"
                node = RedisServer(
                    node_dir,
                    port=port,
                    extra=[
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", str(node_dir / "nodes.conf"),
                        "--cluster-node-timeout", str(self.node_timeout_ms),
                        "--repl-diskless-sync-delay", "0",
                        *self.extra,
                    ],
                    appendonly=self.appendonly, appendfsync="always",
                )
                self.nodes.append(node.start())
            subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, capture_output=True, text=True,
                timeout=max(1.0, deadline - time.monotonic()),
            )
            self.wait_healthy(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every node (test data only: nothing to flush)."""
        for node in self.nodes:
            node.stop(kill=True)
        self.nodes = []

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- addresses and clients ----------------------------------------------

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://`` URL naming every node (any one of them would do)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def client(self, **options: Any) -> redis.cluster.RedisCluster:
        """A cluster-aware redis-py client (follows MOVED/ASK), for planting and inspection."""
        nodes = [redis.cluster.ClusterNode("127.0.0.1", p) for p in self.ports]
        return redis.cluster.RedisCluster(startup_nodes=nodes, **options)

    def node(self, port: int) -> redis.Redis:
        """A plain client on one node (``decode_responses=True``); close it after use."""
        return _plain(port)

    # --- topology ------------------------------------------------------------

    def topology(self, port: int | None = None) -> dict[str, Any]:
        """One node's view of who serves what.

        Returns:
            ``{"primaries": {port: [(lo, hi), ...]}, "replicas": {port: primary port}}``.
        """
        with self.node(port or self.ports[0]) as c:
            text = c.execute_command("CLUSTER", "NODES")
        if isinstance(text, dict):  # redis-py may parse CLUSTER NODES itself
            text = "\n".join(str(v) for v in text.values())
        ids: dict[str, int] = {}
        lines = [ln.split() for ln in str(text).splitlines() if ln.strip()]
        for parts in lines:
            ids[parts[0]] = int(parts[1].split("@")[0].rsplit(":", 1)[1])
        primaries: dict[int, list[tuple[int, int]]] = {}
        replicas: dict[int, int] = {}
        for parts in lines:
            port, flags = ids[parts[0]], parts[2].split(",")
            if "master" in flags:
                ranges = []
                for spec in parts[8:]:
                    if spec.startswith("["):
                        continue  # an importing/migrating marker, not an owned range
                    lo, _, hi = spec.partition("-")
                    ranges.append((int(lo), int(hi or lo)))
                primaries[port] = sorted(ranges)
            elif "slave" in flags and parts[3] in ids:
                replicas[port] = ids[parts[3]]
        return {"primaries": primaries, "replicas": replicas}

    def primary_of_slot(self, slot: int) -> int:
        for port, ranges in self.topology()["primaries"].items():
            if any(lo <= slot <= hi for lo, hi in ranges):
                return int(port)
        raise ClusterNotReady(f"slot {slot} is not served")

    def replica_of(self, primary: int) -> int:
        for replica, owner in self.topology()["replicas"].items():
            if owner == primary:
                return int(replica)
        raise ClusterNotReady(f"primary {primary} has no replica")

    def keyslot(self, key: str) -> int:
        with self.node(self.ports[0]) as c:
            return int(c.execute_command("CLUSTER", "KEYSLOT", key))

    def _problems(self) -> list[str]:
        problems: list[str] = []
        views = []
        for port in self.ports:
            try:
                with self.node(port) as c:
                    info = c.execute_command("CLUSTER", "INFO")
                    if isinstance(info, str):
                        info = dict(
                            ln.split(":", 1) for ln in info.splitlines() if ":" in ln
                        )
                    if info.get("cluster_state") != "ok":
                        problems.append(f"{port}: cluster_state={info.get('cluster_state')}")
                    if int(info.get("cluster_slots_ok", 0)) != 16384:
                        problems.append(f"{port}: slots_ok={info.get('cluster_slots_ok')}")
                    if int(info.get("cluster_known_nodes", 0)) != len(self.nodes):
                        problems.append(f"{port}: known_nodes={info.get('cluster_known_nodes')}")
                    repl = c.info("replication")
                    if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                        problems.append(f"{port}: replica link {repl.get('master_link_status')}")
            except redis.RedisError as exc:
                problems.append(f"{port}: {exc}")
                continue
            views.append(self.topology(port))
        if views and any(v != views[0] for v in views[1:]):
            problems.append("nodes disagree on the topology")
        if views:
            if len(views[0]["primaries"]) != self.primaries:
                problems.append(f"{len(views[0]['primaries'])} primaries")
            if len(views[0]["replicas"]) != self.primaries * self.replicas:
                problems.append(f"{len(views[0]['replicas'])} replicas")
        return problems

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until every node says ``cluster_state:ok``, every slot is served,
        every replica's link is up and all nodes agree on who serves what.

        Raises:
            ClusterNotReady: Still not so after ``timeout`` seconds (names the problems).
        """
        deadline = time.monotonic() + timeout
        problems = ["not checked yet"]
        while time.monotonic() < deadline:
            problems = self._problems()
            if not problems:
                return
            time.sleep(0.1)
        raise ClusterNotReady(f"cluster not healthy after {timeout}s: {problems}")

    # --- faults --------------------------------------------------------------

    def _server(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no node on port {port}")

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (its AOF, if any, keeps what it had applied)."""
        self._server(port).stop(kill=True)

    def restart(self, port: int, timeout: float = 20.0) -> None:
        """Start a killed node again: same port, data dir and nodes.conf."""
        self._server(port).start(timeout)

    def failover(self, replica: int, timeout: float = 20.0) -> int:
        """Promote ``replica`` with a coordinated ``CLUSTER FAILOVER``; return the old primary.

        Raises:
            ClusterNotReady: The promotion or the cluster's convergence timed out.
        """
        old = self.topology()["replicas"][replica]
        with self.node(replica) as c:
            c.execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.node(replica) as c:
                if c.info("replication").get("role") == "master":
                    break
            time.sleep(0.05)
        else:
            raise ClusterNotReady(f"replica {replica} was not promoted within {timeout}s")
        self.wait_healthy(max(1.0, deadline - time.monotonic()))
        return int(old)

    def migrate_slot(
        self,
        slot: int,
        target: int,
        *,
        while_migrating: Callable[[], None] | None = None,
        batch: int = 10,
    ) -> int:
        """Move ``slot`` to primary ``target`` by hand; return the source primary.

        The steps of ``redis-cli --cluster reshard``: IMPORTING on the target,
        MIGRATING on the source, MIGRATE the keys in batches, then SETSLOT NODE on
        every primary. ``while_migrating`` is called after the first batch, while
        the slot is split between two nodes (clients get ASK for moved keys).
        """
        source = self.primary_of_slot(slot)
        if source == target:
            raise ValueError(f"slot {slot} is already served by {target}")
        with self.node(source) as src, self.node(target) as dst:
            src_id = src.execute_command("CLUSTER", "MYID")
            dst_id = dst.execute_command("CLUSTER", "MYID")
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            hook = while_migrating
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if keys:
                    src.execute_command(
                        "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys
                    )
                if hook is not None:
                    hook()
                    hook = None
                    continue  # keys written meanwhile are migrated by the next rounds
                if not keys:
                    break
            # The target first, then the source, then everyone (as redis-cli does).
            dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        for port in self.topology()["primaries"]:
            if port not in (source, target):
                with self.node(port) as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        self.wait_healthy()
        return source
