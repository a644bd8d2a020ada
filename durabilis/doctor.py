"""``durabilis doctor``: is this Redis fit to hold the durable state of a fleet?

Checks, each ``ok``, ``info``, ``warn`` or ``fail``:

- ``connection``: PING answers.
- ``version``: Redis >= 6.2 on every primary (durabilis uses no newer command).
- ``mode``: standalone, Sentinel or Cluster (and the cluster's state).
- ``persistence``: AOF on (``appendonly yes``); ``appendfsync always`` or
  ``everysec`` (up to a second of acknowledged writes lost in a crash).
- ``eviction``: ``maxmemory-policy noeviction``. Every durabilis record carries
  a TTL, so a ``volatile-*`` policy evicts exactly those records (an evicted
  idempotency record runs an operation twice; an evicted DLQ record is a lost
  operation), and an ``allkeys-*`` policy evicts them too.
- ``memory``: used memory under 90 % of ``maxmemory`` (writes fail above it under noeviction).
- ``replication``: each primary's replicas, their offsets and lag (bytes behind
  the primary); fails when fewer are online than ``acks="replicas:N"`` needs.
- ``sentinel`` (``redis+sentinel://`` only): the primary the Sentinels name,
  its flags, how many Sentinels answer, the quorum and ``SENTINEL CKQUORUM``.
- ``scripts``: every Lua script loads (``SCRIPT LOAD`` each, SHA1 checked).
- ``latency``: median and worst of N PINGs.
- ``keys``: keys of the namespace per pillar (one SCAN).
- ``namespace``: fails when the namespace holds no key while other durabilis
  namespaces exist in this Redis (a wrong ``--namespace`` / ``DURABILIS_NAMESPACE``);
  the namespaces found are named (a bounded SCAN: "at least" when it stopped early).

The classification is pure (tested without Redis); :func:`run_doctor` gathers
the facts. It needs a user allowed ``INFO`` and ``CONFIG GET`` besides what
the application's user has (``docs/production.md``); refused facts are
reported as warnings, not crashes.
"""

from __future__ import annotations

import hashlib
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import redis

from durabilis._mask import mask_url
from durabilis._scripts import sources
from durabilis._store import Store, map_error
from durabilis.errors import DurabilisError, StorageUnavailable

__all__ = [
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
    "run_doctor",
    "survey_namespaces",
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
    if not sep or not _NAMESPACE.match(namespace) or not _MARKER.match(rest):
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


# --- gathering the facts ---------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _per_node(store: Store, call: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """``call`` on every primary: ``{node: reply}`` (one entry on a standalone server)."""
    client = store.client
    if store.is_cluster:
        reply = call(*args, target_nodes=client.PRIMARIES)
        return {_text(k): v for k, v in dict(reply).items()}
    return {"server": call(*args)}


def _refused(exc: Exception) -> str:
    mapped = map_error(exc)
    if isinstance(mapped, StorageUnavailable):
        raise mapped from exc
    return f"{type(exc).__name__}: {exc}"


def _gather_info(store: Store) -> tuple[dict[str, dict[str, Any]], str | None]:
    try:
        return _per_node(store, store.client.info), None
    except (redis.RedisError, OSError) as exc:
        return {}, _refused(exc)


def _gather_config(store: Store, name: str) -> dict[str, str | None]:
    try:
        replies = _per_node(store, store.client.config_get, name)
    except (redis.RedisError, OSError) as exc:
        _refused(exc)
        return {}
    return {n: (_text(r.get(name)) if r.get(name) is not None else None)
            for n, r in replies.items()}


def _info_checks(store: Store, acks_replicas: int) -> list[Check]:
    infos, refused = _gather_info(store)
    if refused is not None:
        return [Check(
            "server", WARN,
            f"INFO refused ({refused}): give the operator's user +info (docs/production.md)",
            {"error": refused},
        )]
    fsync = _gather_config(store, "appendfsync")
    mode = str(next(iter(infos.values()), {}).get("redis_mode", "standalone"))
    state = None
    if store.is_cluster:
        try:
            state = _text(store.client.cluster_info().get("cluster_state"))
        except (redis.RedisError, OSError) as exc:
            state = f"unknown ({_refused(exc)})"
    persistence = {
        n: {**{k: i.get(k) for k in ("aof_enabled", "aof_last_write_status")},
            "appendfsync": fsync.get(n)}
        for n, i in infos.items()
    }
    checks = [
        check_version({n: str(i.get("redis_version", "?")) for n, i in infos.items()}),
        check_mode(mode if not _is_sentinel(store) else "sentinel", len(infos), state),
        check_persistence(persistence),
        check_eviction(infos),
        check_memory(infos),
        check_replication(
            {n: replicas_of(i) for n, i in infos.items()}, acks_replicas,
            failover=store.is_cluster or _is_sentinel(store),
        ),
    ]
    if _is_sentinel(store):
        checks.append(check_sentinel(_sentinel_facts(store)))
    return checks


def _is_sentinel(store: Store) -> bool:
    pool = None if store.is_cluster else getattr(store.client, "connection_pool", None)
    return hasattr(pool, "sentinel_manager")


def replicas_of(info: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A primary's replicas from its ``INFO`` (``slaveN`` fields, as redis-py parses
    them): ``{host:port: {state, offset, lag_bytes, lag_s}}``."""
    top = int(info.get("master_repl_offset") or 0)
    out: dict[str, dict[str, Any]] = {}
    for name, value in info.items():
        if not (str(name).startswith("slave") and str(name)[5:].isdigit()
                and isinstance(value, Mapping)):
            continue
        offset = int(value.get("offset") or 0)
        out[f"{value.get('ip')}:{value.get('port')}"] = {
            "state": value.get("state"), "offset": offset,
            "lag_bytes": max(0, top - offset), "lag_s": value.get("lag"),
        }
    return out


def _sentinel_facts(store: Store) -> dict[str, Any]:
    pool = store.client.connection_pool
    service = pool.service_name
    sentinels = pool.sentinel_manager.sentinels
    facts: dict[str, Any] = {"service": service, "sentinels": len(sentinels), "reachable": 0}
    for sentinel in sentinels:
        try:
            state = sentinel.sentinel_master(service)
        except (redis.RedisError, OSError) as exc:
            facts.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}")
            continue
        facts["reachable"] += 1
        if "primary" in facts:
            continue
        facts.update({
            "primary": f"{state.get('ip')}:{state.get('port')}",
            "quorum": state.get("quorum"), "flags": state.get("flags"),
            "other_sentinels": state.get("num-other-sentinels"),
            "replicas_known": state.get("num-slaves"),
        })
        try:
            facts["ckquorum"] = _text(sentinel.execute_command("SENTINEL", "CKQUORUM", service))
        except redis.RedisError as exc:
            facts["ckquorum"] = str(exc)
    if "primary" in facts:  # the Sentinels that know of others, plus itself
        facts["sentinels"] = max(len(sentinels), int(facts.get("other_sentinels") or 0) + 1)
    return facts


def _script_check(store: Store) -> Check:
    loaded: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for name, source in sources().items():
        try:
            loaded[name] = _text(store.client.script_load(source))
        except (redis.RedisError, OSError) as exc:
            errors[name] = _refused(exc)
    return check_scripts(loaded, errors)


def _latency_check(store: Store, pings: int) -> Check:
    samples: list[float] = []
    for _ in range(pings):
        began = time.perf_counter()
        store.ping()
        samples.append((time.perf_counter() - began) * 1000.0)
    return check_latency(samples)


def _keys_check(store: Store, scan_limit: int) -> Check:
    names: list[str] = []
    truncated = False
    try:
        for key in store.client.scan_iter(match=store.keys.pattern(), count=1000):
            if len(names) >= scan_limit:
                truncated = True
                break
            names.append(_text(key))
    except (redis.RedisError, OSError) as exc:
        return Check("keys", WARN, f"SCAN refused ({_refused(exc)})", {})
    counts = count_keys(names, store.namespace)
    shown = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    more = f" (stopped at {scan_limit}: at least)" if truncated else ""
    return Check(
        "keys", INFO,
        f"namespace {store.namespace!r}: {len(names)} keys{more}" + (f": {shown}" if shown
                                                                     else ""),
        {"total": len(names), "truncated": truncated, "by_pillar": counts},
    )


def _probe_keys(store: Store) -> list[str]:
    """Keys every busy namespace has one of (checked with EXISTS before any SCAN)."""
    keys = store.keys
    return [keys.layer("stats"), keys.layer("inflight"), keys.dlq("stream"), keys.dlq("counts"),
            keys.breaker_names(), keys.ckpt("live"), keys.config("fleet")]


NAMESPACE_SEARCH_SECONDS = 3.0
"""How long the survey looks for the namespace's own keys once its bound is passed."""


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _own_key_exists(store: Store, prefix: str, seconds: float) -> bool | None:
    """Whether a key starts with ``prefix`` (SCAN MATCH, page by page); ``None``:
    the keyspace was not searched through within ``seconds``."""
    pattern = _glob_escape(prefix) + "*"
    deadline = time.monotonic() + seconds
    if store.is_cluster:  # every primary, one after another
        for node in store.client.get_primaries():
            client = store.client.get_redis_connection(node)
            found = _scan_one(client, pattern, deadline)
            if found is not False:
                return found
        return False
    return _scan_one(store.client, pattern, deadline)


def _scan_one(client: Any, pattern: str, deadline: float) -> bool | None:
    cursor = 0
    while True:
        cursor, keys = client.scan(cursor=cursor, match=pattern, count=1000)
        if keys:
            return True
        if int(cursor) == 0:
            return False
        if time.monotonic() > deadline:
            return None


def survey_namespaces(
    store: Store, *, limit: int = NAMESPACE_SCAN_LIMIT, probe: bool = True
) -> NamespaceSurvey:
    """Is ``store``'s namespace empty, and which other durabilis namespaces exist?

    First ``EXISTS`` on a few keys every busy namespace has (``probe``); then one
    SCAN of the whole keyspace (every primary on Cluster), stopped at the first
    key of the namespace or after ``limit`` keys (``truncated``: the namespaces
    found are "at least", and a namespace whose only keys lie further is taken
    as empty).

    Raises:
        StorageUnavailable: Redis cannot be reached.
        DurabilisError: SCAN or EXISTS refused (an ACL), or another Redis error.
    """
    namespace = store.namespace
    prefix = namespace + ":"
    if probe:
        for key in _probe_keys(store):
            if store.command("EXISTS", key):
                return NamespaceSurvey(namespace, empty=False)
    others: set[str] = set()
    scanned = 0
    try:
        for raw in store.client.scan_iter(count=1000):
            if scanned >= limit:
                # Past the bound: look for the namespace's own keys only (SCAN
                # MATCH), for a bounded time, before calling it empty.
                found_own = _own_key_exists(store, prefix, NAMESPACE_SEARCH_SECONDS)
                if found_own is True:
                    return NamespaceSurvey(namespace, empty=False, scanned=scanned)
                return NamespaceSurvey(namespace, True, tuple(sorted(others)), scanned, True,
                                       certain=found_own is False)
            scanned += 1
            name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            if name.startswith(prefix):
                return NamespaceSurvey(namespace, empty=False, scanned=scanned)
            found = namespace_of(name)
            if found is not None:
                others.add(found)
    except (redis.RedisError, OSError) as exc:
        raise map_error(exc) from exc
    return NamespaceSurvey(namespace, True, tuple(sorted(others)), scanned, False)


def _namespace_check(store: Store, keys: Check) -> Check:
    if keys.details.get("total"):
        return check_namespace(NamespaceSurvey(store.namespace, empty=False))
    try:
        return check_namespace(survey_namespaces(store, probe=False))
    except DurabilisError as exc:
        if isinstance(exc, StorageUnavailable):
            raise
        return Check("namespace", WARN, f"cannot survey the namespaces ({exc})", {})


def check_config(config: Any) -> Check:
    """The settings the fleet runs with (``--config`` / ``$DURABILIS_CONFIG``)."""
    warnings = list(config.warnings())
    details = {"warnings": warnings,
               "in_progress_ttl_seconds": config.idempotency.in_progress_ttl_seconds}
    if warnings:
        return Check("config", WARN, "; ".join(warnings), details)
    return Check("config", OK, f"claim lease {config.idempotency.in_progress_ttl_seconds:g} s",
                 details)


def run_doctor(
    store: Store, *, pings: int = 20, scan_limit: int = 1_000_000, config: Any = None
) -> DoctorReport:
    """Check the Redis behind ``store`` (see the module docstring for the checks).

    Args:
        store: A connected store (its namespace is the one whose keys are counted).
        pings: PINGs timed for the latency check.
        scan_limit: Stop counting keys after this many.
        config: A :class:`~durabilis.DurabilityConfig` to check too (its warnings:
            a lease that makes recovery slow).

    Raises:
        StorageUnavailable: Redis cannot be reached at all.
    """
    checks = []
    began = time.perf_counter()
    store.ping()  # StorageUnavailable: nothing else can be checked
    checks.append(Check(
        "connection", OK, "PING answered",
        {"first_ping_ms": round((time.perf_counter() - began) * 1000.0, 3)},
    ))
    acks_replicas = store.acks_level.replicas
    layer_level = getattr(config, "acks_level", None)  # the layer's own level
    if layer_level is not None:
        acks_replicas = max(acks_replicas, layer_level.replicas)
    checks += _info_checks(store, acks_replicas)
    checks.append(_script_check(store))
    checks.append(_latency_check(store, max(1, pings)))
    keys = _keys_check(store, max(1, scan_limit))
    checks.append(keys)
    if keys.status != WARN:  # SCAN refused: the namespaces cannot be surveyed either
        checks.append(_namespace_check(store, keys))
    if config is not None:
        checks.append(check_config(config))
    return DoctorReport(hide_password(store.url), store.namespace, checks)
