"""``breaker ls`` / ``show`` / ``open`` / ``close`` / ``events``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from durabilis.cli._base import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError
from durabilis.cli._output import (
    jsonable,
    print_fields,
    print_json,
    print_table,
    print_value,
    printable,
)
from durabilis.cli._session import Session


def _breakers(
    s: Session, limit: int | None = None, only: str | None = None,
) -> tuple[Any, set[str], set[str]]:
    """The registry, the configured names and the names found in Redis: at most
    ``limit`` of them (a bounded ``SSCAN``), or with ``only``, that name if it
    is there (one ``SISMEMBER``: never the whole set).

    A name found only in Redis is read with a default config (``configured``
    false in the output: rates and timeouts may differ from the fleet's).
    """
    from durabilis.breaker import CircuitBreakerConfig  # noqa: PLC0415
    from durabilis.errors import ConfigError  # noqa: PLC0415

    registry = s.layer().breakers
    configured = set(registry.names())
    if only is not None:
        stored = {only} if registry.is_stored(only) else set()
    else:
        stored = registry.stored_names(limit)
    for name in sorted(stored - configured):
        try:
            registry.upsert_config(CircuitBreakerConfig(name))
        except ConfigError as exc:  # a member no durabilis process wrote
            print(f"durabilis: warning: skipping {name!r} found among the breaker names in "
                  f"Redis: {exc}", file=sys.stderr)
            stored = stored - {name}
    return registry, configured, stored


def _known_breaker(s: Session, name: str, *, read: bool = False) -> tuple[Any, bool]:
    """The registry and whether ``name`` is configured; exit 1 if unknown. ``read``:
    a breaker with no state in Redis first checks the namespace (exit 5 if wrong)."""
    registry, configured, stored = _breakers(s, only=name)
    if read and name not in stored:
        s.check_namespace()
    if name not in configured and name not in stored:
        raise CliError(
            EXIT_NOT_FOUND,
            f"unknown breaker {name!r}: not among the breaker names in Redis (configured"
            f" here: {', '.join(sorted(configured)) or 'none'})",
        )
    return registry, name in configured


def _breaker_doc(registry: Any, name: str, configured: bool, stored: bool) -> dict[str, Any]:
    from durabilis.config import breaker_to_dict  # noqa: PLC0415

    info = registry.state_info(name)
    doc = {"name": name, "configured": configured, "in_redis": stored}
    doc.update(jsonable(info))
    doc.pop("dependency", None)
    doc["config"] = breaker_to_dict(registry.get_config(name))
    return doc


def _breaker_ls(s: Session) -> int:
    limit = s.args.limit
    if limit < 1:
        raise CliError(EXIT_USAGE, "--limit must be >= 1")
    # One name more than shown: whether the list is cut.
    registry, configured, stored = _breakers(s, limit + 1)
    truncated = len(stored) > limit
    stored = set(sorted(stored)[:limit])
    if not stored:
        s.check_namespace()
    docs = [_breaker_doc(registry, n, n in configured, n in stored)
            for n in sorted(configured | stored)]
    if truncated:
        print(f"durabilis: showing {limit} of the breaker names found in Redis (more are "
              "there): --limit for more", file=sys.stderr)
    if s.json:
        print_json({"breakers": docs, "count": len(docs), "truncated": truncated})
        return EXIT_OK
    print_table(
        ("NAME", "STATE", "FAILURE_RATE", "REQUESTS", "FAILURES", "PROBES", "RETRY_AFTER_S",
         "CONFIGURED"),
        [(d["name"], d["state"], d["failure_rate"], d["request_count"], d["failure_count"],
          d["probes_in_flight"], d["retry_after"], "yes" if d["configured"] else "no (defaults)")
         for d in docs],
        "no breakers",
    )
    return EXIT_OK


def _breaker_show(s: Session) -> int:
    registry, configured = _known_breaker(s, s.args.name, read=True)
    doc = _breaker_doc(registry, s.args.name, configured, registry.is_stored(s.args.name))
    if s.json:
        print_json(doc)
        return EXIT_OK
    config = doc.pop("config")
    print_fields(doc.items())
    print_value("config" if configured else "config (defaults: not configured here)", config)
    return EXIT_OK


def _breaker_force(s: Session) -> int:
    registry, _ = _known_breaker(s, s.args.name)
    if s.args.action == "open":
        registry.force_open(s.args.name)
    else:
        registry.force_close(s.args.name)
    state = registry.state(s.args.name)
    if s.json:
        print_json({"name": s.args.name, "state": state})
    else:
        print(f"{printable(s.args.name)}: {state.value}")
    return EXIT_OK


def _breaker_events(s: Session) -> int:
    if s.args.limit < 1:
        raise CliError(EXIT_USAGE, "--limit must be >= 1")
    registry, _ = _known_breaker(s, s.args.name, read=True)
    events = registry.transitions(s.args.name, s.args.limit)
    if s.json:
        print_json({"name": s.args.name, "events": events, "count": len(events)})
        return EXIT_OK
    print_table(
        ("AT", "FROM", "TO", "REASON", "FAILURE_RATE", "REQUESTS", "REPLICA"),
        [(e.at, e.from_state, e.to_state, e.reason, e.failure_rate, e.request_count,
          e.replica_id) for e in events],
        f"no transitions of {s.args.name!r}",
    )
    return EXIT_OK


COMMANDS: dict[tuple[str, str | None], Callable[[Session], int]] = {
    ("breaker", "ls"): _breaker_ls,
    ("breaker", "show"): _breaker_show,
    ("breaker", "open"): _breaker_force,
    ("breaker", "close"): _breaker_force,
    ("breaker", "events"): _breaker_events,
}
