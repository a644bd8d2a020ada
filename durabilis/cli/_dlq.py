"""``dlq ls`` (by status or by key), ``dlq show``, ``dlq stats``, ``dlq cleanup``."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any

from durabilis.cli._base import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError
from durabilis.cli._idem import (
    IDEM_DLQ_SCAN_LIMIT,
    KEY_SCAN_CALLS,
    by_key_records,
    is_caller_key_of,
    key_args,
    stored_forms,
    walk_dlq,
)
from durabilis.cli._output import (
    cell,
    describe_error_text,
    print_fields,
    print_json,
    print_table,
    print_value,
)
from durabilis.cli._session import Session

_STREAM_ID = re.compile(r"^\d+-\d+$")


def record_row(r: Any, *, payload: bool) -> dict[str, Any]:
    out = {
        "dlq_id": r.dlq_id, "status": r.status, "operation_type": r.operation_type,
        "agent_id": r.agent_id, "retry_count": r.retry_count,
        "replay_attempts": r.replay_attempts, "parkings": r.parkings,
        "last_error": describe_error_text(r.last_error),
        "original_error": describe_error_text(r.original_error), "failed_at": r.failed_at,
        "last_parked_at": r.last_parked_at,
        "expires_at": r.expires_at, "last_replay_at": r.last_replay_at,
        "replayed_at": r.replayed_at, "replayed_by": r.replayed_by,
        "abandoned_at": r.abandoned_at, "abandoned_by": r.abandoned_by,
        "claimed_by": r.claimed_by, "claim_expires_at": r.claim_expires_at,
        "metadata": dict(r.metadata), "stream_id": r.stream_id,
        "requeued_at": r.requeued_at, "requeued_by": r.requeued_by,
        # (only ever a durabilis ConfigError / DependencyNotFound: our own text, in clear)
        "last_replay_error": r.last_replay_error,
        "last_replay_error_at": r.last_replay_error_at,
    }
    if payload:
        out["original_operation"] = r.original_operation
    return out


def _dlq_ls(s: Session) -> int:
    a = s.args
    if getattr(a, "key", None) is not None:
        return _dlq_ls_by_key(s)
    if getattr(a, "agent", None) is not None:
        raise CliError(EXIT_USAGE, "--agent goes with --key")
    if a.limit < 0:
        raise CliError(EXIT_USAGE, "--limit must be >= 0")
    limit = a.limit or None
    dlq = s.layer().dlq
    after = a.after
    if after and not _STREAM_ID.fullmatch(after):  # a dlq_id: continue after its stream entry
        found = dlq.get(after)
        if found is None:
            s.check_namespace()
            raise CliError(EXIT_NOT_FOUND, f"no DLQ record {after!r}")
        after = found.stream_id
    if a.status in ("pending", "requeued"):
        records = _ls_pending(dlq, a, limit, after)
        pending = dlq.pending_count(a.operation_type)
    else:
        # Other statuses are filtered from the log, page by page, until enough.
        records, pending, cursor = [], None, after
        while True:
            page, count = dlq.list_all(a.operation_type, limit=500, after=cursor)
            pending = count if pending is None else pending
            records += [r for r in page if a.status in ("all", r.status.value)]
            if len(page) < 500 or (limit is not None and len(records) >= limit):
                break
            cursor = page[-1]
        records = records[:limit] if limit is not None else records
    if not records:
        s.check_namespace()
    rows = [record_row(r, payload=False) for r in records]
    if s.json:
        print_json({"records": rows, "count": len(rows), "pending_count": pending})
        return EXIT_OK
    print_table(
        ("DLQ_ID", "STATUS", "OPERATION_TYPE", "AGENT", "RETRIES", "REPLAYS", "REQUEUED",
         "FAILED_AT", "LAST_ERROR"),
        [(r.dlq_id, r.status, r.operation_type, r.agent_id, r.retry_count, r.replay_attempts,
          r.requeued_at, r.failed_at, describe_error_text(r.last_error)) for r in records],
        "no DLQ records",
    )
    return EXIT_OK


def _ls_pending(dlq: Any, a: argparse.Namespace, limit: int | None, after: str | None
                ) -> list[Any]:
    """``dlq ls --status pending|requeued``."""
    if a.status == "pending":
        return list(dlq.list_pending(a.operation_type, limit=limit, after=after))
    if after:
        raise CliError(EXIT_USAGE, "--after does not go with --status requeued")
    return list(dlq.list_requeued(a.operation_type, limit=limit))


def _dlq_show(s: Session) -> int:
    record = s.layer().dlq.get(s.args.id)
    if record is None:
        s.check_namespace()
        raise CliError(EXIT_NOT_FOUND, f"no live DLQ record {s.args.id!r}")
    row = record_row(record, payload=True)
    if s.json:
        print_json(row)
        return EXIT_OK
    operation = row.pop("original_operation")
    metadata = row.pop("metadata")
    if record.trace_context is not None:  # one line (durabilis.otel): the parked call's trace
        parent, state = record.trace_context
        metadata.pop("traceparent", None)
        metadata.pop("tracestate", None)
        row["trace"] = parent if state is None else f"{parent} (tracestate {state})"
    print_fields(row.items())
    print_value("metadata", metadata)
    print_value("original_operation", operation)
    return EXIT_OK


def _dlq_stats(s: Session) -> int:
    st = s.layer().dlq.stats()
    if st.total == 0:
        s.check_namespace()
    doc = {
        "total": st.total,
        "by_status": {k.value: v for k, v in st.by_status.items()},
        "by_operation_type": {
            op: {k.value: v for k, v in counts.items()}
            for op, counts in sorted(st.by_operation_type.items())
        },
        "oldest_pending_at": st.oldest_pending_at,
        "oldest_pending_age_seconds": st.oldest_pending_age_seconds,
        "max_pending": st.max_pending,
        "over_max_pending": st.over_max_pending,
        "expired_awaiting_cleanup": st.expired_awaiting_cleanup,
        "exact": st.exact,
        "expired": st.expired,
        "expired_by_operation_type": st.expired_by_operation_type,
    }
    if s.json:
        print_json(doc)
        return EXIT_OK
    by = doc["by_status"]
    print(f"total {st.total}: pending {by.get('pending', 0)}, replayed "
          f"{by.get('replayed', 0)}, abandoned {by.get('abandoned', 0)}; "
          f"expired unreplayed {st.expired}")
    age = st.oldest_pending_age_seconds
    print(f"oldest pending: {cell(st.oldest_pending_at)}"
          + (f" ({age:.0f} s ago)" if age is not None else ""))
    flag = " (OVER max_pending)" if st.over_max_pending else ""
    print(f"max_pending {st.max_pending}{flag}; expired awaiting cleanup "
          f"{st.expired_awaiting_cleanup}")
    if not st.exact:
        print("counts per status and type are upper bounds: the expired backlog is over "
              "stats_scan_limit (run `durabilis dlq cleanup`)")
    gone = st.expired_by_operation_type
    print_table(
        ("OPERATION_TYPE", "PENDING", "REPLAYED", "ABANDONED", "EXPIRED"),
        [(op, c.get("pending", 0), c.get("replayed", 0), c.get("abandoned", 0), gone.get(op, 0))
         for op, c in sorted({**{op: {} for op in gone}, **doc["by_operation_type"]}.items())],
        "no records",
    )
    return EXIT_OK


def _dlq_cleanup(s: Session) -> int:
    removed = s.layer().dlq.cleanup_expired()
    if s.json:
        print_json({"removed": removed})
    else:
        print(f"removed {removed} expired record(s)")
    return EXIT_OK


def _dlq_ls_by_key(s: Session) -> int:
    """``dlq ls --key KEY [--agent A]``: the records of ``KEY`` as its user knows
    it (every agent's caller key ``KEY`` without ``--agent``), oldest first."""
    a = s.args
    key, agent = key_args(s)
    if a.after:
        raise CliError(EXIT_USAGE, "--after does not go with --key")
    forms, truncated = stored_forms(s, key, agent)
    stored = {f.stored for f in forms}
    caller = is_caller_key_of(key, agent)
    found: dict[str, Any] = {}
    for form in forms:  # each operation's current record, however long the DLQ
        for r in by_key_records(s, form.stored):
            found[r.dlq_id] = r
    walked, walked_out = walk_dlq(s, lambda k: k in stored or caller(k),
                                  pending_only=a.status == "pending")
    for r in walked:
        found.setdefault(r.dlq_id, r)
    records = sorted(
        (r for r in found.values()
         if a.status in ("all", r.status.value)
         and a.operation_type in (None, r.operation_type)),
        key=lambda r: tuple(int(p) for p in r.stream_id.split("-")),
    )
    if a.limit:
        records = records[:a.limit]
    if not records:
        s.check_namespace()
    rows = [record_row(r, payload=False) for r in records]
    if s.json:
        print_json({"key": key, "agent": agent, "records": rows, "count": len(rows),
                    "pending_count": s.layer().dlq.pending_count(a.operation_type),
                    "truncated": truncated or walked_out})
        return EXIT_OK
    print_table(
        ("DLQ_ID", "STATUS", "OPERATION_TYPE", "AGENT", "STORED_KEY", "RETRIES", "FAILED_AT",
         "LAST_ERROR"),
        [(r.dlq_id, r.status, r.operation_type, r.agent_id,
          r.metadata.get("idempotency_key"), r.retry_count, r.failed_at,
          describe_error_text(r.last_error)) for r in records],
        f"no DLQ records carry {key!r}" + (f" (agent {agent!r})" if agent else ""),
    )
    if truncated or walked_out:
        print(f"(stopped at a bound: {KEY_SCAN_CALLS} SCAN calls, {IDEM_DLQ_SCAN_LIMIT} "
              "records per index)", file=sys.stderr)
    return EXIT_OK


COMMANDS: dict[tuple[str, str | None], Callable[[Session], int]] = {
    ("dlq", "ls"): _dlq_ls,
    ("dlq", "show"): _dlq_show,
    ("dlq", "stats"): _dlq_stats,
    ("dlq", "cleanup"): _dlq_cleanup,
}
