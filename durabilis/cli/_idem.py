"""``idem show``, and finding a key as its user knows it (a caller's key of
any agent, a content key or a stored form) in the idempotency records and the DLQ."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from durabilis.cli._base import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError
from durabilis.cli._output import (
    describe_error_text,
    print_fields,
    print_json,
    print_table,
    print_value,
    printable,
)
from durabilis.cli._session import Session

IDEM_DLQ_SCAN_LIMIT = 10_000
"""DLQ records ``idem show`` looks through, at most, for a key with no idempotency record."""


def _as_id(value: Any) -> list[str]:
    """The DLQ id a by-key index entry names: none for a missing entry, or for
    bytes that are not UTF-8 (not an id durabilis wrote: a miss)."""
    if isinstance(value, bytes):
        try:
            return [value.decode("utf-8")]
        except UnicodeDecodeError:
            return []
    return [str(value)] if value else []


def by_key_records(s: Session, stored: str) -> list[Any]:
    """The DLQ record of stored idempotency key ``stored`` named by the by-key
    index (one read; one record per operation), or its first record, whose id
    is derived from the key."""
    from durabilis.dlq import record_id_for  # noqa: PLC0415
    from durabilis.errors import CorruptData  # noqa: PLC0415

    dlq = s.layer().dlq
    try:
        current = s.store().command("HGET", dlq.bykey_key, stored)
    except CorruptData as exc:  # not a hash: name the key (a plain command cannot)
        raise CorruptData(dlq.bykey_key, "not the DLQ's by-key index (hash)") from exc
    for dlq_id in dict.fromkeys([*_as_id(current), record_id_for(stored)]):
        record = dlq.get(dlq_id)
        if record is not None and record.metadata.get("idempotency_key") == stored:
            return [record]
    return []


def walk_dlq(s: Session, wanted: Callable[[Any], bool], *, pending_only: bool = False,
              stop_at_pending: bool = False) -> tuple[list[Any], bool]:
    """DLQ records whose metadata idempotency key is ``wanted`` (pending ones
    first, then, unless ``pending_only`` or something pending was found with
    ``stop_at_pending``, the others), and whether the walk stopped at its bound
    (:data:`IDEM_DLQ_SCAN_LIMIT` records looked at per index)."""
    dlq = s.layer().dlq
    found: list[Any] = []
    seen = 0
    after: Any = None
    while True:  # the pending index
        page = dlq.list_pending(limit=500, after=after)
        seen += len(page)
        found += [r for r in page if wanted(r.metadata.get("idempotency_key"))]
        if len(page) < 500:
            break
        if seen >= IDEM_DLQ_SCAN_LIMIT:
            return found, True
        after = page[-1]
    if pending_only or (found and stop_at_pending):
        return found, False
    ids = {r.dlq_id for r in found}
    seen, cursor = 0, None
    while True:  # every live record (replayed and abandoned ones too)
        records, _ = dlq.list_all(limit=500, after=cursor)
        seen += len(records)
        found += [r for r in records
                  if r.dlq_id not in ids and wanted(r.metadata.get("idempotency_key"))]
        if len(records) < 500:
            return found, False
        if seen >= IDEM_DLQ_SCAN_LIMIT:
            return found, True
        cursor = records[-1]


def _parked_with_key(s: Session, key: str) -> tuple[list[Any], bool]:
    """DLQ records whose metadata carries idempotency key ``key`` exactly (pending
    ones first, then the others), and whether the walk stopped at its bound."""
    current = by_key_records(s, key)
    if current:
        return current, False
    return walk_dlq(s, lambda k: k == key, stop_at_pending=True)


KEY_SCAN_CALLS = 1000
"""SCAN / HSCAN calls (COUNT 1000 each, per primary on Cluster) at most that
``idem show KEY`` and ``dlq ls --key KEY`` make, without ``--agent``, to find
the agents whose caller key ``KEY`` is (about a million keys looked at)."""


@dataclasses.dataclass(frozen=True)
class _StoredKey:
    """One stored form of the key an operator typed: ``agent`` is the agent of a
    caller key (``%raw:<agent>:<key>``, typed so or found); ``None`` for any
    other key (a content key, a key given to ``IdempotencyGuard``)."""

    stored: str
    agent: str | None


def _scan_page(client: Any, command: tuple[Any, ...]) -> tuple[int, list[Any]]:
    from durabilis._store import map_error  # noqa: PLC0415

    try:
        cursor, items = client.execute_command(*command)
    except Exception as exc:  # a redis-py error: the CLI's typed one
        raise map_error(exc) from exc
    return int(cursor), list(items)


def _bounded_scan(s: Session, pattern: str, calls: int) -> tuple[list[str], bool]:
    """Key names matching ``pattern`` (SCAN, every primary on Cluster), at most
    ``calls`` SCAN calls in all; whether the bound stopped it."""
    store = s.store()
    clients = ([store.client.get_redis_connection(node)
                for node in store.client.get_primaries()]
               if store.is_cluster else [store.client])
    names: list[str] = []
    for client in clients:
        cursor = 0
        while True:
            if calls <= 0:
                return names, True
            calls -= 1
            cursor, keys = _scan_page(client, ("SCAN", cursor, "MATCH", pattern, "COUNT", 1000))
            names += [k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
                      for k in keys]
            if cursor == 0:
                break
    return names, False


def _bounded_hscan(s: Session, key: str, pattern: str, calls: int) -> tuple[list[str], bool]:
    """Fields of hash ``key`` matching ``pattern`` (HSCAN), at most ``calls`` calls."""
    client = s.store().client
    fields: list[str] = []
    cursor = 0
    while True:
        if calls <= 0:
            return fields, True
        calls -= 1
        cursor, items = _scan_page(client, ("HSCAN", key, cursor, "MATCH", pattern,
                                            "COUNT", 1000))
        fields += [f.decode("utf-8", "replace") if isinstance(f, bytes) else str(f)
                   for f in items[0::2]]
        if cursor == 0:
            return fields, False


def is_caller_key_of(key: str, agent: str | None) -> Callable[[Any], bool]:
    """Whether a stored key is caller key ``key`` (of ``agent``; of any agent when
    ``None``)."""
    from durabilis.idempotency import IdempotencyKey  # noqa: PLC0415

    def wanted(stored: Any) -> bool:
        parts = IdempotencyKey.split_caller(stored) if isinstance(stored, str) else None
        return parts is not None and parts[1] == key and agent in (None, parts[0])

    return wanted


def stored_forms(s: Session, key: str, agent: str | None) -> tuple[list[_StoredKey], bool]:
    """Every stored form of ``key`` as its user knows it, and whether the search
    stopped at its bound (:data:`KEY_SCAN_CALLS`).

    With ``agent``: that agent's caller key only. Without: the key as typed,
    then the caller key ``key`` of every agent that has an idempotency record
    (a bounded SCAN of the idempotency records) or a DLQ record (HSCAN of the
    DLQ's by-key index) under it.
    """
    from durabilis._keys import glob_escape  # noqa: PLC0415
    from durabilis.errors import DurabilisError, StorageUnavailable  # noqa: PLC0415
    from durabilis.idempotency import RAW_PREFIX, IdempotencyKey  # noqa: PLC0415

    if agent is not None:
        return [_StoredKey(IdempotencyKey.caller(agent, key, None).value, agent)], False
    keys = s.store().keys
    found: list[str] = []
    truncated = False
    try:
        names, truncated = _bounded_scan(
            s, keys.idem_pattern_around(RAW_PREFIX, ":" + key), KEY_SCAN_CALLS
        )
        found += [k for k in (keys.idem_key_of(n) for n in names) if k is not None]
        fields, more = _bounded_hscan(
            s, s.layer().dlq.bykey_key,
            f"{glob_escape(RAW_PREFIX)}*:{glob_escape(key)}", KEY_SCAN_CALLS,
        )
        found += fields
        truncated = truncated or more
    except StorageUnavailable:
        raise
    except DurabilisError as exc:  # SCAN refused (an ACL): the key as typed only
        print(f"warning: the agents whose caller key this is were not searched for "
              f"({type(exc).__name__}: {exc}); pass --agent AGENT", file=sys.stderr)
    typed = IdempotencyKey.split_caller(key)  # a stored form typed as such
    forms = {key: _StoredKey(key, typed[0] if typed else None)}
    is_caller = is_caller_key_of(key, None)
    for stored in found:
        if is_caller(stored):
            parts = IdempotencyKey.split_caller(stored)
            assert parts is not None
            forms.setdefault(stored, _StoredKey(stored, parts[0]))
    ordered = sorted(forms.values(), key=lambda f: (f.stored != key, f.agent or ""))
    return ordered, truncated


def key_args(s: Session) -> tuple[str, str | None]:
    key, agent = s.args.key, getattr(s.args, "agent", None)
    if not isinstance(key, str) or not key:
        raise CliError(EXIT_USAGE, "the key must not be empty")
    if agent is not None and not agent:
        raise CliError(EXIT_USAGE, "--agent must not be empty")
    return key, agent


def _idem_doc(key: str, form: _StoredKey, found: Any) -> dict[str, Any]:
    return {
        "key": key,
        "stored_key": form.stored,
        "agent": form.agent,
        "status": "in_progress" if found.in_progress else "done",
        "claimed_at": found.original_timestamp,
        "dedup_window_expires_at": found.dedup_window_expires_at,
        "lease_expired": found.lease_expired,
        "result": found.original_result,
    }


def _dlq_row(r: Any) -> dict[str, Any]:
    return {"dlq_id": r.dlq_id, "status": r.status, "operation_type": r.operation_type,
            "agent_id": r.agent_id, "idempotency_key": r.metadata.get("idempotency_key"),
            "last_error": describe_error_text(r.last_error), "failed_at": r.failed_at,
            "replay_attempts": r.replay_attempts}


def _idem_show(s: Session) -> int:
    """``idem show KEY [--agent A]``: the records of ``KEY`` as its user knows it
    (docs/cli.md): each operation found (an idempotency record, else its DLQ
    records); one operation is shown as before, several are all shown
    (``status: "ambiguous"``, with the agents: ``--agent`` picks one)."""
    from durabilis.idempotency import IdempotencyGuard, IdempotencyKey  # noqa: PLC0415

    key, agent = key_args(s)
    config = dataclasses.replace(s.config().idempotency, enabled=True)
    guard = IdempotencyGuard(s.store(), config)
    forms, truncated = stored_forms(s, key, agent)
    docs: list[dict[str, Any]] = []
    without: list[_StoredKey] = []
    for form in forms:
        found = guard.check(form.stored)
        if found is None:
            without.append(form)
        else:
            docs.append(_idem_doc(key, form, found))
    parked: list[Any] = []
    for form in without:  # no idempotency record: the operation may be parked
        parked += by_key_records(s, form.stored)
    walked = False
    if not docs and not parked:  # records parked before the by-key index
        stored = {f.stored for f in forms}
        caller = is_caller_key_of(key, agent)
        parked, walked = walk_dlq(s, lambda k: k in stored or caller(k), stop_at_pending=True)
    operations = {d["stored_key"] for d in docs} | {
        r.metadata.get("idempotency_key") for r in parked
    }
    agents = sorted({parts[0] for parts in (IdempotencyKey.split_caller(k or "")
                                             for k in operations) if parts is not None})
    if not operations:
        s.check_namespace()
        bound = (f" (looked at the first {IDEM_DLQ_SCAN_LIMIT} records)" if walked else "")
        scope = (f" (agent {agent!r})" if agent is not None
                 else " (as typed, nor as any agent's caller key)")
        raise CliError(EXIT_NOT_FOUND, f"no idempotency record for {key!r}{scope}, and no DLQ "
                       f"record carries that key{bound}")
    if len(operations) > 1:
        return _idem_show_several(s, key, agents, docs, parked, truncated=truncated or walked)
    if docs:
        (doc,) = docs
        if s.json:
            print_json(doc)
            return EXIT_OK
        result = doc.pop("result")
        print_fields(doc.items())
        print_value("placeholder" if doc["status"] == "in_progress" else "result", result)
        return EXIT_OK
    return _idem_in_dlq(s, key, parked, walked)


def _idem_show_several(s: Session, key: str, agents: list[str], docs: list[dict[str, Any]],
                       parked: list[Any], *, truncated: bool) -> int:
    rows = [_dlq_row(r) for r in parked]
    if s.json:
        print_json({"key": key, "status": "ambiguous", "agents": agents, "records": docs,
                    "dlq_records": rows, "truncated": truncated})
        return EXIT_OK
    count = len({d["stored_key"] for d in docs} | {r["idempotency_key"] for r in rows})
    print(f"{key!r} names {count} operations (agents: "
          f"{', '.join(printable(a) for a in agents) or '-'}): "
          "durabilis idem show KEY --agent AGENT shows one")
    for doc in docs:
        print()
        result = doc.pop("result")
        print_fields(doc.items())
        print_value("placeholder" if doc["status"] == "in_progress" else "result", result)
    if rows:
        print()
        print("in the DLQ (no idempotency record):")
        print_table(
            ("DLQ_ID", "STATUS", "AGENT", "STORED_KEY", "FAILED_AT", "LAST_ERROR"),
            [(r["dlq_id"], r["status"], r["agent_id"], r["idempotency_key"], r["failed_at"],
              r["last_error"]) for r in rows],
            "",
        )
    return EXIT_OK


def _idem_in_dlq(s: Session, key: str, records: list[Any], truncated: bool) -> int:
    """No idempotency record: the operation is parked (its worker died and
    ``recover`` parked it as WORKER_LOST, or it was parked after its retries)."""
    from durabilis.idempotency import IdempotencyKey  # noqa: PLC0415

    bound = f" (looked at the first {IDEM_DLQ_SCAN_LIMIT} records)" if truncated else ""
    rows = [_dlq_row(r) for r in records]
    stored = str(rows[0]["idempotency_key"])
    parts = IdempotencyKey.split_caller(stored)
    if s.json:
        print_json({"key": key, "stored_key": stored,
                    "agent": parts[0] if parts else None, "status": "in_dlq",
                    "dlq_records": rows, "truncated": truncated})
        return EXIT_OK
    where = (f" (stored as {printable(stored)}, agent {printable(parts[0])})"
             if parts and stored != key else "")
    print(f"no idempotency record for {key!r}{where}: the operation is in the DLQ{bound}")
    print_table(
        ("DLQ_ID", "STATUS", "OPERATION_TYPE", "AGENT", "FAILED_AT", "LAST_ERROR"),
        [(r["dlq_id"], r["status"], r["operation_type"], r["agent_id"], r["failed_at"],
          r["last_error"]) for r in rows],
        "",
    )
    print("(durabilis dlq show ID: the operation; durabilis dlq replay ID --handler "
          "MODULE:FUNCTION: run it again under this key)")
    return EXIT_OK


COMMANDS: dict[tuple[str, str | None], Callable[[Session], int]] = {
    ("idem", "show"): _idem_show,
}
