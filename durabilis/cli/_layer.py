"""``recover`` and ``stats``: the layer's orphans and fleet-wide totals."""

from __future__ import annotations

from collections.abc import Callable

from durabilis.cli._base import EXIT_OK, EXIT_USAGE, CliError
from durabilis.cli._output import jsonable, print_fields, print_json, printable
from durabilis.cli._session import Session


def _recover(s: Session) -> int:
    if s.args.limit < 1:
        raise CliError(EXIT_USAGE, "--limit must be >= 1")
    ids = s.layer().recover_orphans(s.args.limit)
    if s.json:
        print_json({"recovered": len(ids), "dlq_ids": ids})
    else:
        print(f"recovered {len(ids)} orphaned operation(s) into the DLQ")
        for dlq_id in ids:
            print(printable(dlq_id))
    return EXIT_OK


def _stats(s: Session) -> int:
    totals = s.layer().stats()
    if not any(jsonable(totals).values()):
        s.check_namespace()
    if s.json:
        print_json(totals)
    else:
        print_fields(jsonable(totals).items())
    return EXIT_OK


COMMANDS: dict[tuple[str, str | None], Callable[[Session], int]] = {
    ("recover", None): _recover,
    ("stats", None): _stats,
}
