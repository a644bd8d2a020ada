"""The doctor's verdicts: pure classification of the facts gathered (tested without Redis)."""

from __future__ import annotations

import hashlib
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from durabilis._mask import mask_url
from durabilis._scripts import sources

__all__ = [  # what durabilis.doctor re-exports (one star import)
    "FAIL",
    "INFO",
    "NAMESPACE_SCAN_LIMIT",
    "OK",
    "WARN",
    "Check",
    "DoctorReport",
    "NamespaceSurvey",
    "check_eviction",
    "check_latency",
    "check_memory",
    "check_mode",
    "check_namespace",
    "check_persistence",
    "check_scripts",
    "check_version",
    "count_keys",
    "namespace_of",
]

OK: Final = "ok"
INFO: Final = "info"
WARN: Final = "warn"
FAIL: Final = "fail"

MIN_VERSION: Final = (6, 2)
SLOW_MEDIAN_MS: Final = 10.0
"""A median PING above this (ms) is flagged: every durable operation costs >= 2 round trips."""

MEMORY_HIGH: Final = 0.9

PILLARS: Final = {
    "idem": "idempotency",
    "cb": "circuit_breaker",
    "cb-names": "circuit_breaker",
    "retry": "retry",
    "ckpt": "checkpoint",
    "dlq": "dlq",
    "layer": "layer",
    "config": "config",
}
"""Second part of a key name -> pillar, for the key counts."""

NAMESPACE_SCAN_LIMIT: Final = 10_000
"""Keys a namespace survey looks at, at most (the namespaces it names are then "at least")."""

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_MARKER = re.compile(
    r"(?:layer:\{layer\}:|dlq:\{dlq\}|cb-names$|cb:\{|idem:\{|ckpt:\{ckpt\}"
    r"|config:\{config\}:|retry:\{)"
)
"""What follows ``<namespace>:`` in the name of a key durabilis wrote (``durabilis._keys``)."""


@dataclass(frozen=True, slots=True)
class Check:
    """One check's verdict.

    Attributes:
        name: ``version``, ``persistence``, ...
        status: ``ok``, ``info``, ``warn`` or ``fail``.
        summary: One line for humans.
        details: The facts behind it (machine-readable).
    """

    name: str
    status: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """Every check of one run.

    Attributes:
        url: The Redis URL (password hidden).
        namespace: The namespace whose keys were counted.
        checks: In the order run.
    """

    url: str
    namespace: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        """No check warned or failed."""
        return all(c.status in (OK, INFO) for c in self.checks)

    @property
    def failed(self) -> bool:
        """Some check failed (worse than a warning)."""
        return any(c.status == FAIL for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "url": self.url,
            "namespace": self.namespace,
            "checks": [
                {"name": c.name, "status": c.status, "summary": c.summary, "details": c.details}
                for c in self.checks
            ],
        }


# --- pure classification ---------------------------------------------------------------


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` -> ``(7, 0, 15)`` (non-numeric parts end it)."""
    out: list[int] = []
    for part in str(text).split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def check_version(versions: Mapping[str, str]) -> Check:
    """Redis >= 6.2 on every node (``{node: redis_version}``)."""
    old = {n: v for n, v in versions.items() if parse_version(v)[:2] < MIN_VERSION}
    shown = ", ".join(sorted(set(versions.values())))
    if old:
        return Check(
            "version", WARN,
            f"Redis {shown}: durabilis needs >= 6.2 (its scripts use 6.2 commands)",
            {"versions": dict(versions), "below_6_2": sorted(old)},
        )
    return Check("version", OK, f"Redis {shown}", {"versions": dict(versions)})


def check_mode(mode: str, nodes: int, cluster_state: str | None) -> Check:
    """Standalone or Cluster; a Cluster whose state is not ``ok`` fails."""
    details: dict[str, Any] = {"mode": mode, "primaries": nodes}
    if mode == "sentinel":
        return Check("mode", INFO, "the primary Redis Sentinel names (see sentinel)", details)
    if mode != "cluster":
        return Check("mode", INFO, f"{mode} server", details)
    details["cluster_state"] = cluster_state
    if cluster_state != "ok":
        return Check("mode", FAIL, f"Redis Cluster in state {cluster_state!r}", details)
    return Check("mode", INFO, f"Redis Cluster, {nodes} primaries, state ok", details)


def check_replication(
    replicas: Mapping[str, Mapping[str, Any]], acks_replicas: int, *, failover: bool
) -> Check:
    """The replicas of each primary (``{primary: {replica: {state, offset, lag_bytes,
    lag_s}}}``), against the replicas ``acks="replicas:N"`` asks for.

    Replication is asynchronous: a primary lost in a failover takes with it what
    its replicas did not have yet (``lag_bytes``), unless writes wait for them
    (``acks="replicas:N"``, docs/operations.md). Fails when fewer replicas are
    online than ``acks`` asks for (every write would fail); warns when a primary
    has no replica online where failovers happen (``failover``: Sentinel, Cluster).
    """
    online = {p: sum(1 for r in rs.values() if r.get("state") == "online")
              for p, rs in replicas.items()}
    details: dict[str, Any] = {"replicas": {p: dict(rs) for p, rs in replicas.items()},
                               "acks_replicas": acks_replicas}
    fewest = min(online.values(), default=0)
    lag = max((int(r.get("lag_bytes") or 0) for rs in replicas.values() for r in rs.values()),
              default=0)
    summary = (f"{fewest} replica(s) online per primary (fewest), replication lag up to "
               f"{lag} bytes")
    if acks_replicas and fewest < acks_replicas:
        return Check("replication", FAIL, summary + f": acks=\"replicas:{acks_replicas}\" "
                     "needs more; every write would fail (NotReplicated)", details)
    if fewest == 0:
        if not failover:
            return Check("replication", INFO, "no replica: what survives rests on this "
                         "server's AOF (see persistence)", details)
        return Check("replication", WARN, summary + ": a primary without a replica online "
                     "cannot be failed over, and its disk holds the only copy", details)
    if not acks_replicas:
        return Check("replication", INFO, summary + "; acks=\"primary\": a failover loses "
                     "what the replicas did not have yet (docs/operations.md)", details)
    return Check("replication", OK, summary, details)


def check_sentinel(facts: Mapping[str, Any]) -> Check:
    """What the Sentinels say (``{service, primary, sentinels, reachable, quorum,
    ckquorum, flags}``): a failover needs ``quorum`` Sentinels to agree it is down
    and a majority of them reachable to authorize it."""
    details = dict(facts)
    known, reachable = int(facts.get("sentinels") or 0), int(facts.get("reachable") or 0)
    quorum = int(facts.get("quorum") or 0)
    where = f"service {facts.get('service')!r}: primary {facts.get('primary')}"
    flags = str(facts.get("flags") or "")
    if not facts.get("primary") or any(f in flags for f in ("s_down", "o_down")):
        return Check("sentinel", FAIL, f"{where}, flags {flags or '?'}", details)
    ckquorum = str(facts.get("ckquorum") or "")
    summary = (f"{where}, {reachable} of {known} Sentinel(s) reachable, quorum {quorum}"
               f"{'' if ckquorum.startswith('OK') else f': {ckquorum}'}")
    if not ckquorum.startswith("OK") or reachable < known or known < 3:
        return Check("sentinel", WARN, summary + (
            " (fewer than 3 Sentinels: one lost blocks failovers)" if known < 3 else ""), details)
    return Check("sentinel", OK, summary, details)


def check_persistence(nodes: Mapping[str, Mapping[str, Any]]) -> Check:
    """AOF on every node (``{node: {aof_enabled, appendfsync, aof_last_write_status}}``)."""
    off = sorted(n for n, f in nodes.items() if str(f.get("aof_enabled")) != "1")
    fsync = {n: f.get("appendfsync") for n, f in nodes.items()}
    broken = sorted(
        n for n, f in nodes.items() if str(f.get("aof_last_write_status", "ok")) != "ok"
    )
    details: dict[str, Any] = {
        "appendonly": {n: str(f.get("aof_enabled")) == "1" for n, f in nodes.items()},
        "appendfsync": fsync,
    }
    if broken:
        details["aof_write_failing"] = broken
        return Check("persistence", FAIL, "AOF writes are failing (disk full?)", details)
    if off:
        return Check(
            "persistence", WARN,
            "appendonly is off: a restart loses every write since the last snapshot "
            "(completed operations would run again, DLQ records and checkpoints vanish)",
            details,
        )
    modes = set(fsync.values())
    if "no" in modes:
        return Check(
            "persistence", WARN,
            "appendfsync no: the OS decides when writes reach the disk (tens of seconds "
            "lost in a crash)",
            details,
        )
    if modes == {"always"}:
        return Check("persistence", OK, "AOF on, appendfsync always", details)
    known = "/".join(sorted(m for m in modes if m)) or "unknown (CONFIG GET refused)"
    return Check(
        "persistence", OK,
        f"AOF on, appendfsync {known} (everysec: up to ~1 s of acknowledged writes can be "
        "lost in a crash; use always if none may)",
        details,
    )


def check_eviction(nodes: Mapping[str, Mapping[str, Any]]) -> Check:
    """``maxmemory-policy noeviction`` on every node (``{node: {maxmemory_policy, maxmemory}}``)."""
    policies = {n: str(f.get("maxmemory_policy", "")) for n, f in nodes.items()}
    details: dict[str, Any] = {
        "maxmemory_policy": policies,
        "maxmemory": {n: int(f.get("maxmemory", 0) or 0) for n, f in nodes.items()},
    }
    bad = sorted({p for p in policies.values() if p != "noeviction"})
    if not bad:
        return Check("eviction", OK, "maxmemory-policy noeviction", details)
    what = []
    if any(p.startswith("volatile-") for p in bad):
        what.append(
            "volatile-* evicts keys that carry a TTL, and every durabilis record does"
        )
    if any(p.startswith("allkeys-") for p in bad):
        what.append("allkeys-* evicts any key")
    return Check(
        "eviction", WARN,
        f"maxmemory-policy {', '.join(bad)}: {'; '.join(what) or 'keys may be evicted'} "
        "(an evicted idempotency record runs an operation twice, an evicted DLQ record "
        "loses it): use noeviction",
        details,
    )


def check_memory(nodes: Mapping[str, Mapping[str, Any]]) -> Check:
    """Used memory below 90 % of ``maxmemory`` (``{node: {used_memory, maxmemory}}``)."""
    ratios: dict[str, float | None] = {}
    for n, f in nodes.items():
        limit = int(f.get("maxmemory", 0) or 0)
        ratios[n] = None if limit <= 0 else int(f.get("used_memory", 0) or 0) / limit
    high = sorted(n for n, r in ratios.items() if r is not None and r >= MEMORY_HIGH)
    details: dict[str, Any] = {"used_fraction_of_maxmemory": ratios}
    if high:
        return Check(
            "memory", WARN,
            f"{len(high)} node(s) above {MEMORY_HIGH:.0%} of maxmemory: writes fail (OOM) "
            "at the limit under noeviction",
            details,
        )
    if all(r is None for r in ratios.values()):
        return Check("memory", INFO, "no maxmemory limit set (watch the host's memory)", details)
    top = max(r for r in ratios.values() if r is not None)
    return Check("memory", OK, f"{top:.0%} of maxmemory used (highest node)", details)


def check_scripts(loaded: Mapping[str, str | None], errors: Mapping[str, str]) -> Check:
    """Every script loads with the expected SHA1 (``{name: sha}``, ``{name: error}``)."""
    details: dict[str, Any] = {"scripts": len(loaded) + len(errors)}
    wrong = sorted(
        n for n, sha in loaded.items()
        if sha is not None and sha != hashlib.sha1(sources()[n].encode()).hexdigest()
    )
    if errors or wrong:
        details["errors"] = dict(errors)
        details["sha_mismatch"] = wrong
        return Check(
            "scripts", FAIL, f"{len(errors) + len(wrong)} of {details['scripts']} scripts "
            "failed to load", details,
        )
    return Check("scripts", OK, f"all {len(loaded)} Lua scripts load", details)


def check_latency(samples_ms: Iterable[float]) -> Check:
    """Round-trip latency from PING timings (ms)."""
    data = sorted(samples_ms)
    if not data:
        return Check("latency", WARN, "no PING answered", {})
    median = statistics.median(data)
    details = {
        "pings": len(data),
        "median_ms": round(median, 3),
        "p90_ms": round(data[min(len(data) - 1, int(len(data) * 0.9))], 3),
        "max_ms": round(data[-1], 3),
    }
    text = f"PING median {median:.2f} ms, max {data[-1]:.2f} ms over {len(data)}"
    if median > SLOW_MEDIAN_MS:
        return Check(
            "latency", WARN,
            f"{text}: every durable operation costs at least two round trips", details,
        )
    return Check("latency", OK, text, details)


def count_keys(names: Iterable[str], namespace: str) -> dict[str, int]:
    """Keys per pillar, from key names of ``namespace``."""
    counts = dict.fromkeys(sorted(set(PILLARS.values())), 0)
    counts["other"] = 0
    prefix = namespace + ":"
    for name in names:
        if not name.startswith(prefix):
            continue
        part = name[len(prefix):].split(":", 1)[0]
        pillar = PILLARS.get(part, "other")
        counts[pillar] += 1
    return counts


def namespace_of(key: str) -> str | None:
    """The durabilis namespace a key name belongs to, or ``None`` for a foreign key.

    Judged by the marker after the first ``:`` (``<ns>:dlq:{dlq}:stream``,
    ``<ns>:cb-names``, ``<ns>:idem:{...}``...): a namespace never contains ``:``.
    """
    namespace, sep, rest = key.partition(":")
    if not sep or not _NAMESPACE.fullmatch(namespace) or not _MARKER.match(rest):
        return None
    return namespace


@dataclass(frozen=True, slots=True)
class NamespaceSurvey:
    """What a bounded SCAN found about the namespaces of one Redis.

    Attributes:
        namespace: The namespace asked about.
        empty: No key of ``namespace`` exists (as far as the survey saw).
        others: The other durabilis namespaces found, sorted.
        scanned: Keys looked at.
        truncated: The survey stopped at its bound: ``others`` is "at least".
        certain: Whether ``empty`` is known (the namespace's own keys were looked
            for through the whole keyspace); ``False`` when that search too was
            cut short (a very large keyspace).
    """

    namespace: str
    empty: bool
    others: tuple[str, ...] = ()
    scanned: int = 0
    truncated: bool = False
    certain: bool = True

    @property
    def wrong(self) -> bool:
        """The namespace is empty while others exist: probably not the one meant."""
        return self.empty and bool(self.others) and self.certain

    def found_text(self, shown: int = 20) -> str:
        """``"a, b"``, ``"at least a, b"``, cut after ``shown`` names."""
        names = list(self.others[:shown])
        if len(self.others) > shown:
            names.append(f"... ({len(self.others) - shown} more)")
        text = ", ".join(names)
        return f"at least {text} (stopped after {self.scanned} keys)" if self.truncated else text

    def to_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "empty": self.empty, "others": list(self.others),
                "scanned": self.scanned, "truncated": self.truncated}


def check_namespace(survey: NamespaceSurvey) -> Check:
    """Fail when the namespace is empty but other durabilis namespaces exist."""
    details = survey.to_dict()
    ns = survey.namespace
    if not survey.empty:
        return Check("namespace", OK, f"namespace {ns!r} holds durabilis keys", details)
    if survey.wrong:
        return Check(
            "namespace", FAIL,
            f"namespace {ns!r} is empty, but this Redis holds durabilis namespace(s) "
            f"{survey.found_text()}: wrong --namespace / DURABILIS_NAMESPACE?",
            details,
        )
    more = f" among the first {survey.scanned} keys" if survey.truncated else ""
    return Check(
        "namespace", INFO,
        f"namespace {ns!r} is empty and no other durabilis namespace was found{more} "
        "(nothing has run here yet?)",
        details,
    )


def hide_password(url: str) -> str:
    """``url`` with its password (and password-like query arguments) replaced by ``***``."""
    return mask_url(url)
