"""``dlq abandon`` / ``requeue`` / ``purge``: by ids or a filter, confirmed."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from durabilis.cli._base import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError
from durabilis.cli._dlq import record_row
from durabilis.cli._output import (
    cell,
    describe_error_text,
    is_tty,
    print_json,
    print_table,
    printable,
)
from durabilis.cli._session import Session, operator_name


def _dlq_abandon(s: Session) -> int:
    if len(s.args.id) != 1 or dlq_filtered(s.args) or s.args.dry_run or s.args.yes:
        return dlq_bulk(s, "abandon")
    s.args.id = s.args.id[0]
    done = s.layer().dlq.abandon(s.args.id, by=s.args.by or operator_name())
    if not done:
        s.check_namespace()
    if s.json:
        print_json({"dlq_id": s.args.id, "abandoned": done})
    else:
        print(f"{printable(s.args.id)}: abandoned" if done else
              f"{printable(s.args.id)}: not abandoned (unknown, expired, already final, "
              "or held by a running replay: try again when it ends)")
    return EXIT_OK if done else EXIT_NOT_FOUND


_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_AGE_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def dlq_filtered(a: argparse.Namespace) -> bool:
    """A selection by filter (``--all``, ``--type``, ``--reason``, ``--older-than``,
    ``--status`` other than the default) rather than by ids alone."""
    status = getattr(a, "status", None)
    return bool(a.all or a.operation_type or a.reason or a.older_than
                or status != getattr(a, "status_default", None))


def _parse_age(text: str) -> float:
    match = _AGE.match(text.strip())
    if match is None:
        raise CliError(EXIT_USAGE, f"--older-than must be a number with s, m, h or d, got "
                       f"{text!r}")
    return float(match[1]) * _AGE_UNIT[match[2]]


def _error_code(text: str | None) -> str:
    return (text or "").split(":", 1)[0].strip()


def _dlq_select(s: Session, verb: str) -> list[Any]:
    """The records a bulk command acts on: the ids given, or every record the
    filters let through (read page by page; the scripts check each again)."""
    a = s.args
    dlq = s.layer().dlq
    status = getattr(a, "status", None)
    if a.id and (a.all or a.operation_type or a.reason or a.older_than):
        raise CliError(EXIT_USAGE, "give DLQ ids or a filter (--all, --type, --reason, "
                       "--older-than), not both")
    if not a.id and not dlq_filtered(a):
        raise CliError(EXIT_USAGE, f"give DLQ ids, or --all / a filter to {verb} every record "
                       "it lets through")
    cutoff = None if not a.older_than else time.time() - _parse_age(a.older_than)
    if a.id:
        records = []
        for dlq_id in a.id:
            record = dlq.get(dlq_id)
            if record is None:
                print(f"{printable(dlq_id)}: not found (unknown or expired)", file=sys.stderr)
            else:
                records.append(record)
    elif status in (None, "pending"):
        records = dlq.list_pending(a.operation_type)
    elif status == "requeued":
        records = dlq.list_requeued(a.operation_type)
    else:
        records, cursor = [], None
        while True:
            page, _ = dlq.list_all(a.operation_type, limit=500, after=cursor)
            records += page
            if len(page) < 500:
                break
            cursor = page[-1]

    def wanted(r: Any) -> bool:
        shown = "requeued" if (r.status.value == "pending" and r.requeued_at) else r.status.value
        if status not in (None, "all") and status not in (shown, r.status.value):
            return False
        if a.reason and a.reason not in (_error_code(r.original_error),
                                         _error_code(r.last_error)):
            return False
        return cutoff is None or r.failed_at.timestamp() < cutoff

    return [r for r in records if wanted(r)]


def _confirm(s: Session, verb: str, count: int) -> None:
    """Ask before a bulk change; without a terminal, ``--yes`` is required (exit 2)."""
    if getattr(s.args, "yes", False) or count == 0:
        return
    if not is_tty(sys.stdin):
        raise CliError(EXIT_USAGE, f"refusing to {verb} {count} DLQ record(s) without "
                       "confirmation: stdin is not a terminal; pass --yes (see --dry-run)")
    sys.stderr.write(f"{verb} {count} DLQ record(s) in namespace {s.namespace!r}? [y/N] ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise CliError(EXIT_NOT_FOUND, "nothing done (not confirmed)")


def _print_selection(s: Session, verb: str, records: list[Any]) -> int:
    """``--dry-run``: what would be done."""
    if s.json:
        print_json({"dry_run": True, "action": verb, "count": len(records),
                    "records": [record_row(r, payload=False) for r in records]})
        return EXIT_OK
    print_table(
        ("DLQ_ID", "STATUS", "OPERATION_TYPE", "REPLAYS", "REQUEUED", "FAILED_AT",
         "LAST_ERROR"),
        [(r.dlq_id, r.status, r.operation_type, r.replay_attempts, r.requeued_at, r.failed_at,
          describe_error_text(r.last_error)) for r in records],
        "no DLQ records match",
    )
    print(f"dry run: would {verb} {len(records)} record(s)")
    return EXIT_OK


def dlq_bulk(s: Session, verb: str) -> int:
    """``dlq abandon`` / ``dlq purge`` over ids or a filter (confirmed)."""
    records = _dlq_select(s, verb)
    if s.args.dry_run:
        return _print_selection(s, verb, records)
    if not records:
        s.check_namespace()
    if verb == "purge" or dlq_filtered(s.args):  # (abandoning ids named one by one: no)
        _confirm(s, verb, len(records))
    dlq = s.layer().dlq
    ids = [r.dlq_id for r in records]
    by = s.args.by or operator_name()
    if verb == "abandon":
        done = dlq.abandon_many(ids, by=by)
        outcome = {i: "abandoned" if ok
                   else "not abandoned (already final, gone, or held by a running replay)"
                   for i, ok in done.items()}
        count = sum(done.values())
    else:
        status = s.args.status if s.args.status != "all" else None
        purged = dlq.purge(ids, by=by, status=status)
        outcome = {i: {"purged": "purged", "busy": "kept: a replay holds it",
                       "not_found": "gone meanwhile"}.get(o, "kept: now " + o[6:])
                   for i, o in purged.items()}
        count = sum(o == "purged" for o in purged.values())
    if s.json:
        print_json({"action": verb, "count": count, "selected": len(ids),
                    "results": outcome})
    else:
        for dlq_id, text in outcome.items():
            print(f"{printable(dlq_id)}: {text}")
        print(f"{'purged' if verb == 'purge' else 'abandoned'} {count} of {len(ids)} "
              "record(s)")
    missing = len(s.args.id) - len(records) if s.args.id else 0
    return EXIT_OK if count == len(ids) and not missing and ids else EXIT_NOT_FOUND


def _dlq_requeue(s: Session) -> int:
    """Mark records for redelivery by the fleet: no handler, no application code here."""
    records = _dlq_select(s, "requeue")
    if s.args.dry_run:
        return _print_selection(s, "requeue", records)
    ids = [r.dlq_id for r in records]
    if not ids:
        s.check_namespace()
    results = s.layer().dlq.requeue(ids, by=s.args.by or operator_name()) if ids else []
    missing = len(s.args.id) - len(records) if s.args.id else 0
    counts = {k: sum(r.outcome == k for r in results)
              for k in ("requeued", "already", "final", "not_found")}
    counts["not_found"] += missing
    if s.json:
        print_json({"results": results, **counts})
    else:
        for r in results:
            if r.outcome == "requeued":
                text = "requeued"
            elif r.outcome == "already":
                text = (f"already requeued (by {printable(r.requeued_by or '?')} at "
                        f"{cell(r.requeued_at)}): unchanged")
            elif r.outcome == "final":
                text = (f"refused: {r.status.value if r.status else 'final'} (final; only a "
                        "pending record can be requeued)")
            else:
                text = "not found (unknown or expired)"
            print(f"{printable(r.dlq_id)}: {text}")
        print(f"requeued {counts['requeued']}, already {counts['already']}, refused "
              f"{counts['final']}, not found {counts['not_found']} (the replicas with the "
              "handlers replay them: durabilis dlq ls --status requeued)")
    return EXIT_OK if not counts["final"] and not counts["not_found"] and results else (
        EXIT_NOT_FOUND)


def _dlq_purge(s: Session) -> int:
    return dlq_bulk(s, "purge")


COMMANDS: dict[tuple[str, str | None], Callable[[Session], int]] = {
    ("dlq", "abandon"): _dlq_abandon,
    ("dlq", "requeue"): _dlq_requeue,
    ("dlq", "purge"): _dlq_purge,
}
