"""The argument parser: global options, one subparser per command group."""

from __future__ import annotations

import argparse
from typing import Any

from durabilis.cli._base import (
    DEFAULT_NAMESPACE,
    DEMO_MAX_WORKERS,
    ENV_CONFIG,
    ENV_NAMESPACE,
    ENV_URL,
    EXIT_USAGE,
    RESOLUTION_HELP,
)
from durabilis.cli._output import printable


class _Parser(argparse.ArgumentParser):
    """argparse, with a malformed command line reported on ONE line (exit 2):
    what is wrong, and where the help is (instead of argparse's usage block)."""

    def error(self, message: str) -> Any:  # NoReturn (typeshed: the base's signature)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {printable(message, escape_backslash=False)}"
                  f" (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    """An argparse ``type``: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


GLOBAL_OPTIONS_HELP = (
    "global options, here or before the command: --url URL, --namespace NS, --config FILE, "
    "--json, --timeout SECONDS, --show-errors (see durabilis --help)"
)


def _common(*, brief: bool = False) -> argparse.ArgumentParser:
    """Options accepted before or after the subcommand (``default=SUPPRESS`` on both).

    ``brief``: the subcommands' copy, whose options are not described one by one
    (their help would repeat the same six entries): :data:`GLOBAL_OPTIONS_HELP`
    names them on one line instead. (argparse copies a parent's actions by
    reference, hence one parser for each face.)"""
    common = argparse.ArgumentParser(add_help=False)
    s = argparse.SUPPRESS

    def described(text: str) -> str:
        return s if brief else text

    common.add_argument("--namespace", default=s,
                        help=described(f"key namespace (default: ${ENV_NAMESPACE}, then "
                                       f"{DEFAULT_NAMESPACE})"))
    common.add_argument("--config", default=s, metavar="FILE",
                        help=described("TOML config of the fleet (breakers, policies, "
                                       f"dependencies; default: ${ENV_CONFIG})"))
    common.add_argument("--json", action="store_true", default=s,
                        help=described("print one JSON document (see docs/cli.md for the "
                                       "shapes)"))
    common.add_argument("--timeout", type=float, default=s, metavar="SECONDS",
                        help=described("Redis socket timeout (default: 5)"))
    common.add_argument("--show-errors", action="store_true", default=s,
                        help=described("print stored error texts in clear (default: redacted "
                                       "after their code and type, as durabilis's events "
                                       "are; they may quote payloads or tokens)"))
    return common


def _leaf(group: Any, common: argparse.ArgumentParser, name: str, help_text: str) -> Any:
    p = group.add_parser(name, help=help_text, parents=[common], epilog=GLOBAL_OPTIONS_HELP)
    p.add_argument("--url", default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # (the epilog)
    return p


def _version() -> str:
    """This installation's version (package metadata; the module's when not installed)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("durabilis")
    except PackageNotFoundError:
        from durabilis import __version__  # noqa: PLC0415

        return __version__


def _group(sub: Any, name: str, help_text: str) -> Any:
    return sub.add_parser(name, help=help_text).add_subparsers(dest="action", required=True)


def _add_dlq(sub: Any, common: argparse.ArgumentParser) -> None:
    dlq = _group(sub, "dlq", "the dead-letter queue")
    ls = _leaf(dlq, common, "ls", "list records (pending by default), oldest first")
    ls.add_argument("--status", choices=("pending", "requeued", "replayed", "abandoned", "all"),
                    default="pending",
                    help="requeued: pending records marked for redelivery by the fleet")
    ls.add_argument("--operation-type", default=None)
    ls.add_argument("--limit", type=int, default=100, help="at most this many (0: all)")
    ls.add_argument("--after", default=None, metavar="STREAM_ID",
                    help="continue after this record (its stream_id or dlq_id)")
    ls.add_argument("--key", default=None, metavar="KEY",
                    help="only the records of this idempotency key as its user knows it: a "
                    "caller's key as given (every agent's, unless --agent), a content key "
                    "or a stored form")
    ls.add_argument("--agent", default=None, help="with --key: only this agent's caller key")
    _leaf(dlq, common, "show", "one record, with its operation").add_argument("id")
    rp = _leaf(dlq, common, "replay", "replay through the layer (original idempotency key)")
    rp.add_argument("id", nargs="?", default=None)
    rp.add_argument("--all", action="store_true", help="every pending record, oldest first")
    rp.add_argument("--handler", required=True, metavar="MODULE:FUNCTION",
                    help="called with an OperationContext (ctx.payload is the operation)")
    rp.add_argument("--operation-type", default=None, help="with --all: only this type")
    rp.add_argument("--limit", type=int, default=None, help="with --all: at most this many")
    rp.add_argument("--max-per-second", type=float, default=None)
    rp.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                    help="how long to wait for an operation in progress elsewhere (a live "
                    "delivery) before deferring its record; default: the claim's lease")
    rp.add_argument("-q", "--quiet", action="store_true",
                    help="print only the summary line (no per-record lines, no progress, "
                    "only durabilis's warnings on stderr); --json output is unchanged")
    ab = _leaf(dlq, common, "abandon",
               "give up on pending records (final): by id, or a filter (confirmed)")
    ab.add_argument("id", nargs="*", default=[])
    ab.add_argument("--by", default=None, help="who (default: user@host)")
    _add_dlq_selection(ab, ("pending", "requeued"), "pending", confirm=True)
    rq = _leaf(dlq, common, "requeue",
               "mark pending records for redelivery: the replicas that have the handlers "
               "replay them (no handler needed here)")
    rq.add_argument("id", nargs="*", default=[])
    rq.add_argument("--by", default=None, help="who (default: user@host)")
    _add_dlq_selection(rq, None, None, confirm=False)
    pg = _leaf(dlq, common, "purge",
               "remove records for good (any status; confirmed): by id, or a filter")
    pg.add_argument("id", nargs="*", default=[])
    pg.add_argument("--by", default=None, help="who (default: user@host)")
    _add_dlq_selection(pg, ("pending", "requeued", "replayed", "abandoned", "all"), "all",
                       confirm=True)
    _leaf(dlq, common, "stats", "counts by status and operation type")
    _leaf(dlq, common, "cleanup", "remove expired records now")


def _add_dlq_selection(p: Any, statuses: tuple[str, ...] | None, default: str | None, *,
                       confirm: bool) -> None:
    """The record filter of ``dlq requeue`` / ``abandon`` / ``purge``."""
    p.add_argument("--all", action="store_true",
                   help="every record the filters let through (no id given)")
    p.add_argument("--type", "--operation-type", dest="operation_type", default=None,
                   metavar="T", help="only this operation type")
    p.add_argument("--reason", default=None, metavar="R",
                   help="only records whose original or last error starts with this code or "
                   "type (NETWORK_TIMEOUT, WORKER_LOST, TimeoutError...)")
    p.add_argument("--older-than", default=None, metavar="AGE",
                   help="only records parked longer ago than AGE (90s, 15m, 2h, 7d)")
    if statuses is not None:
        p.add_argument("--status", choices=statuses, default=default,
                       help=f"only records in this status (default: {default})")
        p.set_defaults(status_default=default)
    p.add_argument("--dry-run", action="store_true", help="show what would be done, do nothing")
    if confirm:
        p.add_argument("-y", "--yes", action="store_true",
                       help="do not ask (needed without a terminal)")


def _add_breaker(sub: Any, common: argparse.ArgumentParser) -> None:
    brk = _group(sub, "breaker", "circuit breakers")
    ls = _leaf(brk, common, "ls", "every breaker: configured ones and those found in Redis")
    ls.add_argument("--limit", type=int, default=1000,
                    help="read at most this many names from Redis (default 1000)")
    _leaf(brk, common, "show", "one breaker's state and config").add_argument("name")
    _leaf(brk, common, "open", "force a breaker OPEN (reset timer restarted)").add_argument(
        "name"
    )
    _leaf(brk, common, "close", "force a breaker CLOSED (everything reset)").add_argument("name")
    ev = _leaf(brk, common, "events", "a breaker's transitions, oldest first")
    ev.add_argument("name")
    ev.add_argument("--limit", type=int, default=50)


def _add_checkpoint(sub: Any, common: argparse.ArgumentParser) -> None:
    ckpt = _group(sub, "checkpoint", "checkpoints")
    ls = _leaf(ckpt, common, "ls", "an agent's current checkpoints of a task, newest first")
    ls.add_argument("task")
    ls.add_argument("agent")
    _leaf(ckpt, common, "show", "one checkpoint, with its state").add_argument("id")
    hist = _leaf(ckpt, common, "history", "the lineage of the agent's newest checkpoint")
    hist.add_argument("task")
    hist.add_argument("agent")
    hist.add_argument("--limit", type=int, default=None)


def _add_config(sub: Any, common: argparse.ArgumentParser) -> None:
    cfg = _group(sub, "config", "config files and the fleet config")
    _leaf(cfg, common, "check",
          "validate a TOML file (default: --config / DURABILIS_CONFIG); print the effective "
          "config").add_argument("file", nargs="?", default=None)
    _leaf(cfg, common, "show", "what is published to the fleet")
    pub = _leaf(cfg, common, "publish",
                "publish a file's [retry.*] / [circuit_breaker.*] to the fleet")
    pub.add_argument("file")
    pub.add_argument("--retry", action="append", default=None, metavar="OPERATION_TYPE",
                     help="only this policy (repeatable)")
    pub.add_argument("--breaker", action="append", default=None, metavar="NAME",
                     help="only this breaker (repeatable)")
    unp = _leaf(cfg, common, "unpublish",
                "remove a published entry (replicas go back to their own), whatever it "
                "holds")
    unp.add_argument("kind", choices=("retry", "breaker", "entry"),
                     help="'entry': NAME is a whole field of the fleet config hash (a foreign "
                     "one written by hand)")
    unp.add_argument("name", help="as `config show` prints it (\\xNN for a byte that is not "
                     "UTF-8), or the raw bytes")


def build_parser() -> argparse.ArgumentParser:
    common = _common(brief=True)  # the subcommands': accepted there, named on one line
    parser = _Parser(
        prog="durabilis", description="Inspect and operate the durable state of a fleet.",
        epilog=RESOLUTION_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_common()],
    )
    parser.add_argument("--version", action="version", version=f"durabilis {_version()}")
    parser.add_argument("--url", default=None, help=f"Redis URL (default: ${ENV_URL}, "
                        "$REDIS_URL, then the embedded server under ./.durabilis/)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo on the embedded default")
    demo.add_argument("--workers", type=_positive_int, default=4,
                      help=f"worker processes (1..{DEMO_MAX_WORKERS}; default 4)")
    demo.add_argument("--tasks-per-worker", type=_positive_int, default=12)
    demo.add_argument("--namespace", default=argparse.SUPPRESS,
                      help="default: a new demo-XXXXXXXX (never $DURABILIS_NAMESPACE: "
                      "the demo writes)")
    demo.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                      help="print the report as JSON")
    from durabilis.cli._scripts import add_arguments as add_scripts  # noqa: PLC0415

    add_scripts(sub)

    _add_dlq(sub, common)
    _add_breaker(sub, common)
    _add_checkpoint(sub, common)
    idem_show = _leaf(_group(sub, "idem", "idempotency records"), common, "show",
                      "the idempotency record of a key as its user knows it")
    idem_show.add_argument("key", help="a caller's key as given (idempotency_key=, an HTTP "
                           "Idempotency-Key), a content key, or a stored form (%%raw:...)")
    idem_show.add_argument("--agent", default=None, help="only this agent's caller key KEY "
                           "(HTTP: the middleware's tenant; default: every agent's)")
    rec = _leaf(sub, common, "recover", "park the operations of dead workers in the DLQ")
    rec.add_argument("--limit", type=int, default=1000)
    _leaf(sub, common, "stats", "the layer's fleet-wide totals")
    doc = _leaf(sub, common, "doctor", "check that this Redis is fit for durable state")
    doc.add_argument("--pings", type=int, default=20)
    doc.add_argument("--scan-limit", type=int, default=1_000_000)
    doc.add_argument("--allow-warnings", action="store_true",
                     help="exit 0 on warnings (still 1 on failures)")
    _add_config(sub, common)
    from durabilis._cli_web import add_arguments  # noqa: PLC0415  (argparse only)

    add_arguments(_leaf(sub, common, "web", "serve the web console (the 'web' extra)"))
    return parser
