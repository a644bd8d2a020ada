"""Gathering the facts from Redis, and :func:`run_doctor`."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis

from durabilis._scripts import sources
from durabilis._store import Store, map_error
from durabilis.doctor._checks import (
    INFO,
    NAMESPACE_SCAN_LIMIT,
    OK,
    WARN,
    Check,
    DoctorReport,
    NamespaceSurvey,
    check_eviction,
    check_latency,
    check_memory,
    check_mode,
    check_namespace,
    check_persistence,
    check_replication,
    check_scripts,
    check_sentinel,
    check_version,
    count_keys,
    hide_password,
    namespace_of,
)
from durabilis.errors import DurabilisError, StorageUnavailable

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
