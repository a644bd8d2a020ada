"""``dlq replay``: one record or ``--all``, with a progress line."""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from durabilis.cli._base import EXIT_DEFERRED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError
from durabilis.cli._output import (
    Progress,
    describe_error,
    describe_error_text,
    jsonable,
    print_json,
    printable,
    replay_progress_text,
)
from durabilis.cli._session import Session


def load_handler(spec: str) -> Callable[..., Any]:
    """``module:function`` (attributes may be dotted) -> the callable.

    The current directory is importable, as for ``python -m``.

    Raises:
        CliError: Usage error (exit 2): bad form, import error, not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(EXIT_USAGE, f"--handler must be MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as exc:
        raise CliError(
            EXIT_USAGE, f"cannot load handler {spec!r}: {describe_error(exc, redacted=False)}"
        ) from exc
    if not callable(target):
        raise CliError(EXIT_USAGE, f"handler {spec!r} is not callable")
    handler: Callable[..., Any] = target
    return handler


_REPLAY_PAGE = 100


class _ReplayPass:
    """``dlq replay --all``: ``DurabilityLayer.replay_pending`` with a progress line
    and the error texts of the records that failed or lost their claim."""

    def __init__(self, layer: Any, handler: Callable[..., Any], progress: Progress,
                 wait: float | None = None) -> None:
        self.layer = layer
        self.handler = handler
        self.progress = progress
        self.wait = wait
        self.total = self.done = 0
        self.failed: dict[str, str | None] = {}
        self.lost: dict[str, str | None] = {}
        self.config_errors: dict[str, str | None] = {}
        self.counts = _Counts()

    def _seen(self, result: Any) -> None:
        from durabilis.dlq import ReplayOutcome  # noqa: PLC0415

        self.done += 1
        outcome = result.outcome
        if outcome is ReplayOutcome.FAILED:
            self.failed[result.dlq_id] = result.error
        elif outcome is ReplayOutcome.CLAIM_LOST:
            self.lost[result.dlq_id] = result.error
        elif outcome is ReplayOutcome.CONFIG_ERROR:  # our own text: in clear
            self.config_errors[result.dlq_id] = result.error
        self.counts.add(outcome)
        self.progress.update(replay_progress_text(self.done, self.total, self.counts))

    def run(self, operation_type: str | None, limit: int | None,
            max_per_second: float | None) -> Any:
        """Replay; returns the pass's ``ReplaySummary``."""
        self.total = int(self.layer.dlq.pending_count(operation_type))
        if limit is not None:
            self.total = min(self.total, limit)
        return self.layer.replay_pending(
            self.handler, operation_type, limit, max_per_second, wait=self.wait,
            on_result=self._seen,
        )

    def errors(self) -> dict[str, str | None]:
        """Failed and lost records' error texts, as printed (type kept, text redacted)."""
        return {i: describe_error_text(e) for i, e in {**self.failed, **self.lost}.items()}


class _Counts:
    """What the progress line shows of a pass under way."""

    def __init__(self) -> None:
        self.replayed = self.failed = self.lost = self.skipped = self.deferred = 0

    def add(self, outcome: Any) -> None:
        name = {"replayed": "replayed", "failed": "failed", "claim_lost": "lost",
                "deferred": "deferred", "config_error": "deferred"}.get(outcome.value, "skipped")
        setattr(self, name, getattr(self, name) + 1)


def _dlq_replay(s: Session) -> int:
    a = s.args
    if (a.id is None) == (not a.all):
        raise CliError(EXIT_USAGE, "give a DLQ id or --all (not both)")
    if a.id is not None and (a.operation_type or a.limit is not None):
        raise CliError(EXIT_USAGE, "--operation-type and --limit go with --all")
    if a.limit is not None and a.limit < 0:
        raise CliError(EXIT_USAGE, "--limit must be >= 0")
    if a.max_per_second is not None and not (
        math.isfinite(a.max_per_second) and a.max_per_second > 0
    ):
        raise CliError(EXIT_USAGE, "--max-per-second must be > 0")
    handler = load_handler(a.handler)
    layer = s.layer()
    if a.id is not None:
        return _replay_one(s, layer, handler)
    with Progress(enabled=not a.quiet) as progress:
        replay = _ReplayPass(layer, handler, progress, a.wait)
        summary = replay.run(a.operation_type, a.limit, a.max_per_second)
    if replay.total == 0 and replay.done == 0:
        s.check_namespace()
    _print_replay_summary(s, replay, summary)
    if summary.failed or summary.lost:
        return EXIT_NOT_FOUND
    if getattr(summary, "config_errors", 0):
        _config_error_hint()
        return EXIT_USAGE
    return EXIT_DEFERRED if summary.deferred else EXIT_OK


def _print_replay_summary(s: Session, replay: _ReplayPass, summary: Any) -> None:
    if s.json:
        print_json({**jsonable(summary), "errors": replay.errors()})
    else:
        print(f"replayed {summary.replayed}, failed {summary.failed}, "
              f"skipped {summary.skipped}, claim lost {summary.lost}, "
              f"deferred {summary.deferred}")
        if summary.breakers_open:
            print("paused: breaker open for " + ", ".join(map(printable, summary.breakers_open))
                  + " (no attempt counted; replay again once it closes)")
        if not s.args.quiet:
            errors = replay.errors()
            for dlq_id in summary.failed_ids:
                print(f"failed: {printable(dlq_id)}: {printable(errors[dlq_id])}")
            for dlq_id in summary.lost_ids:
                print(f"claim lost: {printable(dlq_id)}"
                      + (f": {printable(errors[dlq_id])}" if errors[dlq_id] else ""))
        for dlq_id in getattr(summary, "config_error_ids", ()):
            print(f"config error: {printable(dlq_id)}: "
                  f"{printable(replay.config_errors.get(dlq_id))}")


def _replay_one(s: Session, layer: Any, handler: Callable[..., Any]) -> int:
    from durabilis.dlq import ReplayOutcome  # noqa: PLC0415

    result = layer.replay(s.args.id, handler, wait=s.args.wait)
    if result.outcome is ReplayOutcome.NOT_FOUND:
        s.check_namespace()
    error = result.error  # CLAIMED_ELSEWHERE: who holds the claim, not an error
    if result.outcome in (ReplayOutcome.FAILED, ReplayOutcome.CLAIM_LOST):
        error = describe_error_text(error)
    if s.json:
        print_json({**jsonable(result), "error": error})
    else:
        print(f"{printable(result.dlq_id)}: {result.outcome.value}"
              + (f": {printable(error)}" if error else ""))
    if result.outcome is ReplayOutcome.DEFERRED:
        return EXIT_DEFERRED
    if result.outcome is ReplayOutcome.CONFIG_ERROR:
        _config_error_hint()
        return EXIT_USAGE
    return EXIT_OK if result.replayed else EXIT_NOT_FOUND


def _config_error_hint() -> None:
    print("durabilis: this process lacks config the record needs (no attempt counted, "
          "last_error kept): pass the fleet's --config, or `durabilis dlq requeue ID` to have "
          "the replicas that run the application replay it", file=sys.stderr)


COMMANDS: dict[tuple[str, str | None], Callable[[Session], int]] = {
    ("dlq", "replay"): _dlq_replay,
}
