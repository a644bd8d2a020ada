"""``checkpoint ls`` / ``show`` / ``history``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durabilis.cli._base import EXIT_OK, EXIT_USAGE, CliError
from durabilis.cli._output import print_fields, print_json, print_table, print_value
from durabilis.cli._session import Session


def _checkpoint_row(cp: Any, *, state: bool) -> dict[str, Any]:
    out = {
        "checkpoint_id": cp.checkpoint_id, "task_id": cp.task_id, "agent_id": cp.agent_id,
        "phase": cp.phase, "created_at": cp.created_at, "expires_at": cp.expires_at,
        "parent_checkpoint_id": cp.parent_checkpoint_id,
    }
    if state:
        out["state"] = cp.state
    return out


def _checkpoint_list(s: Session, checkpoints: list[Any], empty: str) -> int:
    if not checkpoints:
        s.check_namespace()
    rows = [_checkpoint_row(cp, state=False) for cp in checkpoints]
    if s.json:
        print_json({"checkpoints": rows, "count": len(rows)})
        return EXIT_OK
    print_table(
        ("CHECKPOINT_ID", "PHASE", "AGENT", "CREATED_AT", "EXPIRES_AT", "PARENT"),
        [(r["checkpoint_id"], r["phase"], r["agent_id"], r["created_at"], r["expires_at"],
          r["parent_checkpoint_id"]) for r in rows],
        empty,
    )
    return EXIT_OK


def _checkpoint_ls(s: Session) -> int:
    found = s.layer().checkpoints.list_current(s.args.task, s.args.agent)
    return _checkpoint_list(s, found, f"no live checkpoint of {s.args.agent!r} in "
                            f"task {s.args.task!r}")


def _checkpoint_history(s: Session) -> int:
    if s.args.limit is not None and s.args.limit < 1:
        raise CliError(EXIT_USAGE, "--limit must be >= 1")
    chain = s.layer().checkpoints.history(s.args.task, s.args.agent, limit=s.args.limit)
    return _checkpoint_list(s, chain, f"no live checkpoint of {s.args.agent!r} in "
                            f"task {s.args.task!r}")


def _checkpoint_show(s: Session) -> int:
    from durabilis.errors import CheckpointNotFound  # noqa: PLC0415

    try:
        cp = s.layer().checkpoints.get_by_id(s.args.id)
    except CheckpointNotFound:
        s.check_namespace()
        raise  # exit 1
    row = _checkpoint_row(cp, state=True)
    if s.json:
        print_json(row)
        return EXIT_OK
    state = row.pop("state")
    print_fields(row.items())
    print_value("state", state)
    return EXIT_OK


COMMANDS: dict[tuple[str, str | None], Callable[[Session], int]] = {
    ("checkpoint", "ls"): _checkpoint_ls,
    ("checkpoint", "show"): _checkpoint_show,
    ("checkpoint", "history"): _checkpoint_history,
}
