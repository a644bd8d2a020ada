"""The ``durabilis`` command line (a thin shell over the public sync API).

Exit codes (stable; scripts may rely on them):

- 0: done; the record exists; every check passed.
- 1: not found (unknown id, key, breaker), nothing to do, a replay that did
  not succeed, or ``doctor`` / ``config check`` found problems.
- 2: usage: bad arguments, an invalid config file, a handler that cannot be imported.
- 3: Redis unavailable (cannot connect, timed out, not ready).
- 4: another durabilis error (foreign data at a key, refused by an ACL, ...).
- 5: wrong or empty namespace: a read found nothing because the namespace holds
  no key at all, while other durabilis namespaces exist in that Redis (named on stderr).

Where the CLI finds its Redis, namespace and config (as the library does; a
flag wins over the environment, which wins over the default):

- Redis: ``--url``, else ``DURABILIS_REDIS_URL``, else ``REDIS_URL``, else the
  embedded server under ``./.durabilis/``;
- namespace: ``--namespace``, else ``DURABILIS_NAMESPACE``, else ``durabilis``;
- config: ``--config FILE``, else ``DURABILIS_CONFIG``, else the library's defaults
  (``DURABILIS__<SECTION>__<FIELD>`` overrides apply on top in every case).

``--json`` prints one JSON document on stdout (shapes in ``docs/cli.md``).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import enum
import importlib
import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import Any, ClassVar, TextIO, cast

from durabilis._escape import escape_unprintable

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_ERROR = 4
EXIT_WRONG_NAMESPACE = 5
EXIT_DEFERRED = 6

DEFAULT_NAMESPACE = "durabilis"
ENV_URL = "DURABILIS_REDIS_URL"
ENV_NAMESPACE = "DURABILIS_NAMESPACE"
ENV_CONFIG = "DURABILIS_CONFIG"

RESOLUTION_HELP = f"""\
where the Redis, namespace and config come from (a flag wins over the environment):
  Redis      --url, then ${ENV_URL}, then $REDIS_URL, then the embedded server
             under ./.durabilis/
  namespace  --namespace, then ${ENV_NAMESPACE}, then "{DEFAULT_NAMESPACE}"
  config     --config FILE, then ${ENV_CONFIG}, then the library's defaults
             ($DURABILIS__<SECTION>__<FIELD> overrides apply on top)

exit codes:
  0 ok   1 not found / not done / checks failed   2 usage   3 Redis unavailable
  4 other durabilis error   5 wrong or empty namespace (others exist; named on stderr)
  6 dlq replay: records deferred (breaker open, or still in progress): none failed
"""
_STREAM_ID = re.compile(r"^\d+-\d+$")
DEFAULT_TIMEOUT = 5.0
MAX_TIMEOUT = 86400.0
MAX_PINGS = 10_000
DEMO_MAX_WORKERS = 64


class CliError(Exception):
    """Ends the command with ``code`` and ``message`` on stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- the parser -------------------------------------------------------------------------


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
    _leaf(brk, common, "ls", "every breaker: configured ones and those found in Redis")
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

    scripts = sub.add_parser(
        "scripts", help="the Lua scripts this installation ships (no Redis): name, SHA1 "
        "(EVALSHA's), @acks tag; with NAME, its source as sent (includes expanded)")
    scripts.add_argument("name", nargs="?", default=None)
    scripts.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                         help="print them as JSON")

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
    return parser


# --- output -------------------------------------------------------------------------------


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """A JSON-compatible copy: datetimes as ISO-8601 UTC, enums as their value,
    bytes as ``{"base64": ...}``, tuples as lists, dataclasses as objects."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not f.name.startswith("_")}
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return str(value)


def _print_json(document: Any) -> None:
    print(json.dumps(jsonable(document), indent=2, ensure_ascii=False))


def printable(value: Any, *, escape_backslash: bool = True) -> str:
    """``value`` as text that stays on one line of a terminal and cannot forge one.

    Every stored field the CLI prints in a table or a ``show`` goes through it
    (``--json`` keeps the real value, escaped by JSON). Newline, carriage
    return and tab are written ``\\n``, ``\\r``, ``\\t``; other characters
    that are not printable (controls, ANSI escape ``\\x1b``, bidi overrides,
    line separators, unassigned code points) ``\\xNN``, ``\\uNNNN`` or
    ``\\UNNNNNNNN``; a byte that was not UTF-8 (kept as a lone surrogate)
    ``\\xNN``. The backslash itself is doubled, so a stored text that spells
    an escape (a literal ``\\n``) reads differently from the character it spells.

    Args:
        value: Any value (``str()`` of it when not a string).
        escape_backslash: ``False`` for messages of the CLI's own (error lines
            on stderr, often quoting a ``repr``), which only need to stay on
            one line.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and (not escape_backslash or "\\" not in text):
        return text
    return escape_unprintable(text, short=True, backslash=escape_backslash)


def _cell(value: Any, limit: int | None = 48) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, enum.Enum):
        return printable(value.value)
    if isinstance(value, float):
        return f"{value:.3g}"
    text = printable(value)
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> None:
    """Aligned columns (the last one not padded); ``empty`` when there is no row."""
    cells = [[_cell(v) for v in row] for row in rows]
    if not cells:
        print(empty)
        return
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    for row in [list(headers), *cells]:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        print("  ".join([*padded, row[-1]]).rstrip())


def _print_fields(pairs: Iterable[tuple[str, Any]]) -> None:
    items = list(pairs)
    width = max(len(k) for k, _ in items)
    for k, v in items:
        print(f"{k.ljust(width)}  {_cell(v, None)}")


def _print_value(title: str, value: Any) -> None:
    print(f"{title}:")
    print(json.dumps(jsonable(value), indent=2, ensure_ascii=False))


# --- errors as printed: the type always, the text redacted like durabilis's events -------

def describe_error(exc: BaseException, *, redacted: bool = True) -> str:
    """``"TimeoutError: <text>"``: the exception's type always, its text redacted
    (``durabilis.events.redact``: ``[REDACTED]`` unless ``DURABILIS_LOG_REDACT=0``)
    when ``redacted``; the bare type name when the text is empty."""
    from durabilis.events import redact  # noqa: PLC0415

    name = type(exc).__name__
    text = str(exc).strip()
    if not text:
        return name
    return f"{name}: {redact(text) if redacted else text}"


def describe_error_text(text: str | None) -> str | None:
    """A stored error text as the CLI prints it (:func:`durabilis.events.redact_error`)."""
    from durabilis.events import redact_error  # noqa: PLC0415

    return redact_error(text)


# --- progress on a terminal -----------------------------------------------------------


def replay_progress_text(done: int, total: int, summary: Any) -> str:
    """``"replayed 120/237: 117 ok, 3 failed"`` (+ skipped / claim lost when any)."""
    parts = [f"{summary.replayed} ok", f"{summary.failed} failed"]
    if summary.skipped:
        parts.append(f"{summary.skipped} skipped")
    if summary.lost:
        parts.append(f"{summary.lost} claim lost")
    if summary.deferred:
        parts.append(f"{summary.deferred} deferred")
    return f"replayed {done}/{max(total, done)}: {', '.join(parts)}"


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


class Progress:
    """One line on stderr, redrawn in place (a carriage return), erased at the end.

    Drawn only when stderr is a terminal (``enabled`` and ``isatty()``): never in
    a pipe, a file or a CI log. Redrawn at most every ``interval`` seconds; a
    write by durabilis's events (through :class:`_Stderr`) clears it first.
    """

    def __init__(self, *, enabled: bool = True, interval: float = 0.1) -> None:
        self.enabled = enabled and _is_tty(sys.stderr)
        self.interval = interval
        self._shown = 0  # width of the line on screen (0: none)
        self._drawn_at = -math.inf

    def update(self, text: str) -> None:
        """Show ``text`` (unless the line was drawn less than ``interval`` ago)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self._shown and now - self._drawn_at < self.interval:
            return
        pad = " " * max(0, self._shown - len(text))
        sys.stderr.write(f"\r{text}{pad}")
        sys.stderr.flush()
        self._shown = len(text)
        self._drawn_at = now

    def clear(self) -> None:
        """Erase the line (before other output, and at the end)."""
        if self._shown:
            sys.stderr.write("\r" + " " * self._shown + "\r")
            sys.stderr.flush()
            self._shown = 0

    def __enter__(self) -> Progress:
        _Stderr.progress = self
        return self

    def __exit__(self, *exc: object) -> None:
        _Stderr.progress = None
        self.clear()


# --- the session: store, config and layer, built on demand --------------------------------


def _operator() -> str:
    user = os.environ.get("USER") or os.environ.get("USERNAME") or "operator"
    return f"{user}@{socket.gethostname()}"


def _setting(flag: str | None, variable: str) -> tuple[str | None, str | None]:
    """``(value, where it came from)``: the flag, else the environment variable
    (an empty one counts as unset), else ``(None, None)``."""
    if flag is not None:
        return flag, None
    value = os.environ.get(variable) or None
    return value, (variable if value is not None else None)


class _Session:
    """The command's store, config and layer, built on first use.

    Every command resolves its Redis, namespace and config the same way
    (``RESOLUTION_HELP``): a flag, else the environment, else the default.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.json = bool(getattr(args, "json", False))
        namespace, self.namespace_from = _setting(getattr(args, "namespace", None),
                                                  ENV_NAMESPACE)
        self.namespace: str = namespace or DEFAULT_NAMESPACE
        self.config_path, self.config_from = _setting(getattr(args, "config", None), ENV_CONFIG)
        self.timeout: float = getattr(args, "timeout", DEFAULT_TIMEOUT)
        self._store: Any = None
        self._layer: Any = None
        self._config: Any = None

    def config(self) -> Any:
        if self._config is None:
            from durabilis.config import load_config  # noqa: PLC0415  (keeps --help fast)
            from durabilis.errors import ConfigError  # noqa: PLC0415

            try:
                self._config = load_config(self.config_path)
            except ConfigError as exc:
                if self.config_from is None:
                    raise
                raise CliError(EXIT_USAGE, f"{exc} (the file named by ${self.config_from})"
                               ) from exc
        return self._config

    def store(self) -> Any:
        if self._store is None:
            import durabilis  # noqa: PLC0415
            from durabilis.errors import ConfigError  # noqa: PLC0415

            if not (isinstance(self.timeout, (int, float))
                    and 0 < self.timeout <= MAX_TIMEOUT):
                raise CliError(
                    EXIT_USAGE, f"--timeout must be a finite number > 0 and at most "
                    f"{MAX_TIMEOUT:g} (seconds), got {self.timeout!r}"
                )
            try:
                self._store = durabilis.connect(
                    getattr(self.args, "url", None), namespace=self.namespace,
                    socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
                )
            except ConfigError as exc:
                if self.namespace_from is None or exc.field != "namespace":
                    raise
                raise CliError(EXIT_USAGE, f"${self.namespace_from}: {exc}") from exc
        return self._store

    def layer(self) -> Any:
        """A layer with the fleet's configs: ``--config`` (or defaults), then what is published."""
        if self._layer is None:
            from durabilis.config import ConfigSync  # noqa: PLC0415
            from durabilis.layer import DurabilityLayer  # noqa: PLC0415

            config = self.config()
            store = self.store()
            self._layer = DurabilityLayer(store, config, replica_id=f"cli:{_operator()}")
            from durabilis.errors import CorruptData  # noqa: PLC0415

            try:
                ConfigSync(self._layer).refresh()
            except CorruptData as exc:  # the fleet config hash itself is unreadable
                print(f"durabilis: warning: the published fleet config is unreadable "
                      f"({exc}); using the local config only (repair the hash with "
                      "redis-cli: docs/production.md)", file=sys.stderr)
        return self._layer

    def check_namespace(self) -> None:
        """Exit 5 when the namespace holds no key but other durabilis namespaces exist.

        Called by read commands whose result was empty (nothing listed, nothing
        found, all zero), where "nothing" may only mean a wrong ``--namespace``
        or ``DURABILIS_NAMESPACE``. Commands that create state never call it.
        """
        from durabilis.doctor import hide_password, survey_namespaces  # noqa: PLC0415
        from durabilis.errors import DurabilisError, StorageUnavailable  # noqa: PLC0415

        store = self.store()
        try:
            survey = survey_namespaces(store)
        except StorageUnavailable:
            raise
        except DurabilisError:  # SCAN refused by an ACL: the empty answer stands
            return
        if not survey.wrong:
            return
        where = f" (from ${self.namespace_from})" if self.namespace_from else (
            " (the default)" if getattr(self.args, "namespace", None) is None else "")
        raise CliError(
            EXIT_WRONG_NAMESPACE,
            f"namespace {self.namespace!r}{where} holds no key in {hide_password(store.url)}, "
            f"which holds other durabilis namespaces: {survey.found_text()}. Pass "
            f"--namespace NS or set ${ENV_NAMESPACE}.",
        )

    def close(self) -> None:
        if self._layer is not None:
            self._layer.close()
        if self._store is not None:
            self._store.close()


# --- dlq ------------------------------------------------------------------------------------


def _record_row(r: Any, *, payload: bool) -> dict[str, Any]:
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


def _dlq_ls(s: _Session) -> int:
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
    if after and not _STREAM_ID.match(after):  # a dlq_id: continue after its stream entry
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
    rows = [_record_row(r, payload=False) for r in records]
    if s.json:
        _print_json({"records": rows, "count": len(rows), "pending_count": pending})
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


def _dlq_show(s: _Session) -> int:
    record = s.layer().dlq.get(s.args.id)
    if record is None:
        s.check_namespace()
        raise CliError(EXIT_NOT_FOUND, f"no live DLQ record {s.args.id!r}")
    row = _record_row(record, payload=True)
    if s.json:
        _print_json(row)
        return EXIT_OK
    operation = row.pop("original_operation")
    metadata = row.pop("metadata")
    _print_fields(row.items())
    _print_value("metadata", metadata)
    _print_value("original_operation", operation)
    return EXIT_OK


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


def _dlq_replay(s: _Session) -> int:
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


def _print_replay_summary(s: _Session, replay: _ReplayPass, summary: Any) -> None:
    if s.json:
        _print_json({**jsonable(summary), "errors": replay.errors()})
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


def _replay_one(s: _Session, layer: Any, handler: Callable[..., Any]) -> int:
    from durabilis.dlq import ReplayOutcome  # noqa: PLC0415

    result = layer.replay(s.args.id, handler, wait=s.args.wait)
    if result.outcome is ReplayOutcome.NOT_FOUND:
        s.check_namespace()
    error = result.error  # CLAIMED_ELSEWHERE: who holds the claim, not an error
    if result.outcome in (ReplayOutcome.FAILED, ReplayOutcome.CLAIM_LOST):
        error = describe_error_text(error)
    if s.json:
        _print_json({**jsonable(result), "error": error})
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


def _dlq_abandon(s: _Session) -> int:
    if len(s.args.id) != 1 or _dlq_filtered(s.args) or s.args.dry_run or s.args.yes:
        return _dlq_bulk(s, "abandon")
    s.args.id = s.args.id[0]
    done = s.layer().dlq.abandon(s.args.id, by=s.args.by or _operator())
    if not done:
        s.check_namespace()
    if s.json:
        _print_json({"dlq_id": s.args.id, "abandoned": done})
    else:
        print(f"{printable(s.args.id)}: abandoned" if done else
              f"{printable(s.args.id)}: not abandoned (unknown, expired, already final, "
              "or held by a running replay: try again when it ends)")
    return EXIT_OK if done else EXIT_NOT_FOUND



# --- dlq requeue / bulk abandon / purge ---------------------------------------------------

_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_AGE_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _dlq_filtered(a: argparse.Namespace) -> bool:
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


def _dlq_select(s: _Session, verb: str) -> list[Any]:
    """The records a bulk command acts on: the ids given, or every record the
    filters let through (read page by page; the scripts check each again)."""
    a = s.args
    dlq = s.layer().dlq
    status = getattr(a, "status", None)
    if a.id and (a.all or a.operation_type or a.reason or a.older_than):
        raise CliError(EXIT_USAGE, "give DLQ ids or a filter (--all, --type, --reason, "
                       "--older-than), not both")
    if not a.id and not _dlq_filtered(a):
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


def _confirm(s: _Session, verb: str, count: int) -> None:
    """Ask before a bulk change; without a terminal, ``--yes`` is required (exit 2)."""
    if getattr(s.args, "yes", False) or count == 0:
        return
    if not _is_tty(sys.stdin):
        raise CliError(EXIT_USAGE, f"refusing to {verb} {count} DLQ record(s) without "
                       "confirmation: stdin is not a terminal; pass --yes (see --dry-run)")
    sys.stderr.write(f"{verb} {count} DLQ record(s) in namespace {s.namespace!r}? [y/N] ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise CliError(EXIT_NOT_FOUND, "nothing done (not confirmed)")


def _print_selection(s: _Session, verb: str, records: list[Any]) -> int:
    """``--dry-run``: what would be done."""
    if s.json:
        _print_json({"dry_run": True, "action": verb, "count": len(records),
                     "records": [_record_row(r, payload=False) for r in records]})
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


def _dlq_bulk(s: _Session, verb: str) -> int:
    """``dlq abandon`` / ``dlq purge`` over ids or a filter (confirmed)."""
    records = _dlq_select(s, verb)
    if s.args.dry_run:
        return _print_selection(s, verb, records)
    if not records:
        s.check_namespace()
    if verb == "purge" or _dlq_filtered(s.args):  # (abandoning ids named one by one: no)
        _confirm(s, verb, len(records))
    dlq = s.layer().dlq
    ids = [r.dlq_id for r in records]
    by = s.args.by or _operator()
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
        _print_json({"action": verb, "count": count, "selected": len(ids),
                     "results": outcome})
    else:
        for dlq_id, text in outcome.items():
            print(f"{printable(dlq_id)}: {text}")
        print(f"{'purged' if verb == 'purge' else 'abandoned'} {count} of {len(ids)} "
              "record(s)")
    missing = len(s.args.id) - len(records) if s.args.id else 0
    return EXIT_OK if count == len(ids) and not missing and ids else EXIT_NOT_FOUND


def _dlq_requeue(s: _Session) -> int:
    """Mark records for redelivery by the fleet: no handler, no application code here."""
    records = _dlq_select(s, "requeue")
    if s.args.dry_run:
        return _print_selection(s, "requeue", records)
    ids = [r.dlq_id for r in records]
    if not ids:
        s.check_namespace()
    results = s.layer().dlq.requeue(ids, by=s.args.by or _operator()) if ids else []
    missing = len(s.args.id) - len(records) if s.args.id else 0
    counts = {k: sum(r.outcome == k for r in results)
              for k in ("requeued", "already", "final", "not_found")}
    counts["not_found"] += missing
    if s.json:
        _print_json({"results": results, **counts})
    else:
        for r in results:
            if r.outcome == "requeued":
                text = "requeued"
            elif r.outcome == "already":
                text = (f"already requeued (by {printable(r.requeued_by or '?')} at "
                        f"{_cell(r.requeued_at)}): unchanged")
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


def _dlq_purge(s: _Session) -> int:
    return _dlq_bulk(s, "purge")

def _dlq_stats(s: _Session) -> int:
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
        _print_json(doc)
        return EXIT_OK
    by = doc["by_status"]
    print(f"total {st.total}: pending {by.get('pending', 0)}, replayed "
          f"{by.get('replayed', 0)}, abandoned {by.get('abandoned', 0)}; "
          f"expired unreplayed {st.expired}")
    age = st.oldest_pending_age_seconds
    print(f"oldest pending: {_cell(st.oldest_pending_at)}"
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


def _dlq_cleanup(s: _Session) -> int:
    removed = s.layer().dlq.cleanup_expired()
    if s.json:
        _print_json({"removed": removed})
    else:
        print(f"removed {removed} expired record(s)")
    return EXIT_OK


# --- breakers ---------------------------------------------------------------------------


def _breakers(s: _Session) -> tuple[Any, set[str], set[str]]:
    """The registry, the configured names and the names found in Redis.

    A name found only in Redis is read with a default config (``configured``
    false in the output: rates and timeouts may differ from the fleet's).
    """
    from durabilis.breaker import CircuitBreakerConfig  # noqa: PLC0415
    from durabilis.errors import ConfigError  # noqa: PLC0415

    registry = s.layer().breakers
    configured = set(registry.names())
    stored = registry.stored_names()
    for name in sorted(stored - configured):
        try:
            registry.upsert_config(CircuitBreakerConfig(name))
        except ConfigError as exc:  # a member no durabilis process wrote
            print(f"durabilis: warning: skipping {name!r} found among the breaker names in "
                  f"Redis: {exc}", file=sys.stderr)
            stored = stored - {name}
    return registry, configured, stored


def _known_breaker(s: _Session, name: str, *, read: bool = False) -> tuple[Any, bool]:
    """The registry and whether ``name`` is configured; exit 1 if unknown. ``read``:
    a breaker with no state in Redis first checks the namespace (exit 5 if wrong)."""
    registry, configured, stored = _breakers(s)
    if read and name not in stored:
        s.check_namespace()
    if name not in configured and name not in stored:
        raise CliError(
            EXIT_NOT_FOUND,
            f"unknown breaker {name!r} (configured: {', '.join(sorted(configured)) or 'none'};"
            f" in Redis: {', '.join(sorted(stored)) or 'none'})",
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


def _breaker_ls(s: _Session) -> int:
    registry, configured, stored = _breakers(s)
    if not stored:
        s.check_namespace()
    docs = [_breaker_doc(registry, n, n in configured, n in stored)
            for n in sorted(configured | stored)]
    if s.json:
        _print_json({"breakers": docs, "count": len(docs)})
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


def _breaker_show(s: _Session) -> int:
    registry, configured = _known_breaker(s, s.args.name, read=True)
    doc = _breaker_doc(registry, s.args.name, configured,
                       s.args.name in registry.stored_names())
    if s.json:
        _print_json(doc)
        return EXIT_OK
    config = doc.pop("config")
    _print_fields(doc.items())
    _print_value("config" if configured else "config (defaults: not configured here)", config)
    return EXIT_OK


def _breaker_force(s: _Session) -> int:
    registry, _ = _known_breaker(s, s.args.name)
    if s.args.action == "open":
        registry.force_open(s.args.name)
    else:
        registry.force_close(s.args.name)
    state = registry.state(s.args.name)
    if s.json:
        _print_json({"name": s.args.name, "state": state})
    else:
        print(f"{printable(s.args.name)}: {state.value}")
    return EXIT_OK


def _breaker_events(s: _Session) -> int:
    if s.args.limit < 1:
        raise CliError(EXIT_USAGE, "--limit must be >= 1")
    registry, _ = _known_breaker(s, s.args.name, read=True)
    events = registry.transitions(s.args.name, s.args.limit)
    if s.json:
        _print_json({"name": s.args.name, "events": events, "count": len(events)})
        return EXIT_OK
    print_table(
        ("AT", "FROM", "TO", "REASON", "FAILURE_RATE", "REQUESTS", "REPLICA"),
        [(e.at, e.from_state, e.to_state, e.reason, e.failure_rate, e.request_count,
          e.replica_id) for e in events],
        f"no transitions of {s.args.name!r}",
    )
    return EXIT_OK


# --- checkpoints ------------------------------------------------------------------------


def _checkpoint_row(cp: Any, *, state: bool) -> dict[str, Any]:
    out = {
        "checkpoint_id": cp.checkpoint_id, "task_id": cp.task_id, "agent_id": cp.agent_id,
        "phase": cp.phase, "created_at": cp.created_at, "expires_at": cp.expires_at,
        "parent_checkpoint_id": cp.parent_checkpoint_id,
    }
    if state:
        out["state"] = cp.state
    return out


def _checkpoint_list(s: _Session, checkpoints: list[Any], empty: str) -> int:
    if not checkpoints:
        s.check_namespace()
    rows = [_checkpoint_row(cp, state=False) for cp in checkpoints]
    if s.json:
        _print_json({"checkpoints": rows, "count": len(rows)})
        return EXIT_OK
    print_table(
        ("CHECKPOINT_ID", "PHASE", "AGENT", "CREATED_AT", "EXPIRES_AT", "PARENT"),
        [(r["checkpoint_id"], r["phase"], r["agent_id"], r["created_at"], r["expires_at"],
          r["parent_checkpoint_id"]) for r in rows],
        empty,
    )
    return EXIT_OK


def _checkpoint_ls(s: _Session) -> int:
    found = s.layer().checkpoints.list_current(s.args.task, s.args.agent)
    return _checkpoint_list(s, found, f"no live checkpoint of {s.args.agent!r} in "
                            f"task {s.args.task!r}")


def _checkpoint_history(s: _Session) -> int:
    if s.args.limit is not None and s.args.limit < 1:
        raise CliError(EXIT_USAGE, "--limit must be >= 1")
    chain = s.layer().checkpoints.history(s.args.task, s.args.agent, limit=s.args.limit)
    return _checkpoint_list(s, chain, f"no live checkpoint of {s.args.agent!r} in "
                            f"task {s.args.task!r}")


def _checkpoint_show(s: _Session) -> int:
    from durabilis.errors import CheckpointNotFound  # noqa: PLC0415

    try:
        cp = s.layer().checkpoints.get_by_id(s.args.id)
    except CheckpointNotFound:
        s.check_namespace()
        raise  # exit 1
    row = _checkpoint_row(cp, state=True)
    if s.json:
        _print_json(row)
        return EXIT_OK
    state = row.pop("state")
    _print_fields(row.items())
    _print_value("state", state)
    return EXIT_OK


# --- idempotency, recovery, totals ------------------------------------------------------


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


def _by_key_records(s: _Session, stored: str) -> list[Any]:
    """The DLQ record of stored idempotency key ``stored`` named by the by-key
    index (one read; one record per operation), or its first record, whose id
    is derived from the key."""
    from durabilis.dlq import record_id_for  # noqa: PLC0415
    from durabilis.errors import CorruptData  # noqa: PLC0415

    dlq = s.layer().dlq
    try:
        current = s.store().command("HGET", dlq._ops.bykey_key, stored)
    except CorruptData as exc:  # not a hash: name the key (a plain command cannot)
        raise CorruptData(dlq._ops.bykey_key, "not the DLQ's by-key index (hash)") from exc
    for dlq_id in dict.fromkeys([*_as_id(current), record_id_for(stored)]):
        record = dlq.get(dlq_id)
        if record is not None and record.metadata.get("idempotency_key") == stored:
            return [record]
    return []


def _walk_dlq(s: _Session, wanted: Callable[[Any], bool], *, pending_only: bool = False,
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


def _parked_with_key(s: _Session, key: str) -> tuple[list[Any], bool]:
    """DLQ records whose metadata carries idempotency key ``key`` exactly (pending
    ones first, then the others), and whether the walk stopped at its bound."""
    current = _by_key_records(s, key)
    if current:
        return current, False
    return _walk_dlq(s, lambda k: k == key, stop_at_pending=True)


# --- keys as the user knows them ---------------------------------------------------------

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


def _bounded_scan(s: _Session, pattern: str, calls: int) -> tuple[list[str], bool]:
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


def _bounded_hscan(s: _Session, key: str, pattern: str, calls: int) -> tuple[list[str], bool]:
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


def _is_caller_key_of(key: str, agent: str | None) -> Callable[[Any], bool]:
    """Whether a stored key is caller key ``key`` (of ``agent``; of any agent when
    ``None``)."""
    from durabilis.idempotency import IdempotencyKey  # noqa: PLC0415

    def wanted(stored: Any) -> bool:
        parts = IdempotencyKey.split_caller(stored) if isinstance(stored, str) else None
        return parts is not None and parts[1] == key and agent in (None, parts[0])

    return wanted


def _stored_forms(s: _Session, key: str, agent: str | None) -> tuple[list[_StoredKey], bool]:
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
            s, s.layer().dlq._ops.bykey_key,
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
    is_caller = _is_caller_key_of(key, None)
    for stored in found:
        if is_caller(stored):
            parts = IdempotencyKey.split_caller(stored)
            assert parts is not None
            forms.setdefault(stored, _StoredKey(stored, parts[0]))
    ordered = sorted(forms.values(), key=lambda f: (f.stored != key, f.agent or ""))
    return ordered, truncated


def _key_args(s: _Session) -> tuple[str, str | None]:
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


def _idem_show(s: _Session) -> int:
    """``idem show KEY [--agent A]``: the records of ``KEY`` as its user knows it
    (docs/cli.md): each operation found (an idempotency record, else its DLQ
    records); one operation is shown as before, several are all shown
    (``status: "ambiguous"``, with the agents: ``--agent`` picks one)."""
    from durabilis.idempotency import IdempotencyGuard, IdempotencyKey  # noqa: PLC0415

    key, agent = _key_args(s)
    config = dataclasses.replace(s.config().idempotency, enabled=True)
    guard = IdempotencyGuard(s.store(), config)
    forms, truncated = _stored_forms(s, key, agent)
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
        parked += _by_key_records(s, form.stored)
    walked = False
    if not docs and not parked:  # records parked before the by-key index
        stored = {f.stored for f in forms}
        caller = _is_caller_key_of(key, agent)
        parked, walked = _walk_dlq(s, lambda k: k in stored or caller(k), stop_at_pending=True)
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
            _print_json(doc)
            return EXIT_OK
        result = doc.pop("result")
        _print_fields(doc.items())
        _print_value("placeholder" if doc["status"] == "in_progress" else "result", result)
        return EXIT_OK
    return _idem_in_dlq(s, key, parked, walked)


def _idem_show_several(s: _Session, key: str, agents: list[str], docs: list[dict[str, Any]],
                       parked: list[Any], *, truncated: bool) -> int:
    rows = [_dlq_row(r) for r in parked]
    if s.json:
        _print_json({"key": key, "status": "ambiguous", "agents": agents, "records": docs,
                     "dlq_records": rows, "truncated": truncated})
        return EXIT_OK
    count = len({d["stored_key"] for d in docs} | {r["idempotency_key"] for r in rows})
    print(f"{key!r} names {count} operations (agents: "
          f"{', '.join(printable(a) for a in agents) or '-'}): "
          "durabilis idem show KEY --agent AGENT shows one")
    for doc in docs:
        print()
        result = doc.pop("result")
        _print_fields(doc.items())
        _print_value("placeholder" if doc["status"] == "in_progress" else "result", result)
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


def _idem_in_dlq(s: _Session, key: str, records: list[Any], truncated: bool) -> int:
    """No idempotency record: the operation is parked (its worker died and
    ``recover`` parked it as WORKER_LOST, or it was parked after its retries)."""
    from durabilis.idempotency import IdempotencyKey  # noqa: PLC0415

    bound = f" (looked at the first {IDEM_DLQ_SCAN_LIMIT} records)" if truncated else ""
    rows = [_dlq_row(r) for r in records]
    stored = str(rows[0]["idempotency_key"])
    parts = IdempotencyKey.split_caller(stored)
    if s.json:
        _print_json({"key": key, "stored_key": stored,
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


def _dlq_ls_by_key(s: _Session) -> int:
    """``dlq ls --key KEY [--agent A]``: the records of ``KEY`` as its user knows
    it (every agent's caller key ``KEY`` without ``--agent``), oldest first."""
    a = s.args
    key, agent = _key_args(s)
    if a.after:
        raise CliError(EXIT_USAGE, "--after does not go with --key")
    forms, truncated = _stored_forms(s, key, agent)
    stored = {f.stored for f in forms}
    caller = _is_caller_key_of(key, agent)
    found: dict[str, Any] = {}
    for form in forms:  # each operation's current record, however long the DLQ
        for r in _by_key_records(s, form.stored):
            found[r.dlq_id] = r
    walked, walked_out = _walk_dlq(s, lambda k: k in stored or caller(k),
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
    rows = [_record_row(r, payload=False) for r in records]
    if s.json:
        _print_json({"key": key, "agent": agent, "records": rows, "count": len(rows),
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


def _recover(s: _Session) -> int:
    if s.args.limit < 1:
        raise CliError(EXIT_USAGE, "--limit must be >= 1")
    ids = s.layer().recover_orphans(s.args.limit)
    if s.json:
        _print_json({"recovered": len(ids), "dlq_ids": ids})
    else:
        print(f"recovered {len(ids)} orphaned operation(s) into the DLQ")
        for dlq_id in ids:
            print(printable(dlq_id))
    return EXIT_OK


def _stats(s: _Session) -> int:
    totals = s.layer().stats()
    if not any(jsonable(totals).values()):
        s.check_namespace()
    if s.json:
        _print_json(totals)
    else:
        _print_fields(jsonable(totals).items())
    return EXIT_OK


def _doctor(s: _Session) -> int:
    from durabilis.doctor import run_doctor  # noqa: PLC0415

    if s.args.pings < 1 or s.args.scan_limit < 1:
        raise CliError(EXIT_USAGE, "--pings and --scan-limit must be >= 1")
    if s.args.pings > MAX_PINGS:
        raise CliError(EXIT_USAGE, f"--pings must be at most {MAX_PINGS}")
    # A wrong namespace is one of doctor's checks ("namespace"), not exit 5.
    config = s.config() if s.config_path is not None else None
    report = run_doctor(s.store(), pings=s.args.pings, scan_limit=s.args.scan_limit,
                        config=config)
    if s.json:
        _print_json(report.to_dict())
    else:
        print(f"durabilis doctor: {printable(report.url)} (namespace {report.namespace!r})")
        width = max(len(c.name) for c in report.checks)
        for c in report.checks:
            print(f"{c.status.upper():<4}  {c.name.ljust(width)}  {printable(c.summary)}")
    if report.ok or (s.args.allow_warnings and not report.failed):
        return EXIT_OK
    return EXIT_NOT_FOUND


# --- config -------------------------------------------------------------------------------


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _config_check(s: _Session) -> int:
    from durabilis.config import config_to_dict, load_config  # noqa: PLC0415
    from durabilis.errors import ConfigError  # noqa: PLC0415

    path = s.args.file or s.config_path
    if path is None:
        raise CliError(EXIT_USAGE, f"config check: give a FILE, --config FILE or ${ENV_CONFIG}")
    try:
        config = load_config(path)
    except ConfigError as exc:
        if s.json:
            _print_json({"ok": False, "error": str(exc), "path": getattr(exc, "path", None),
                         "section": getattr(exc, "section", None), "field": exc.field})
        else:
            print(f"durabilis: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    doc = config_to_dict(config)
    warnings = config.warnings()
    # Counted from the config, not from doc["retry"] (which also holds the
    # include_defaults flag that makes the printed config read back as itself).
    policies, breakers = len(config.policies), len(config.breaker_configs)
    if s.json:
        _print_json({"ok": True, "retry_policies": policies, "breakers": breakers,
                     "config": doc, "warnings": warnings})
    else:
        print(f"{printable(path)}: ok ({_plural(policies, 'retry policy', 'retry policies')}, "
              f"{_plural(breakers, 'breaker', 'breakers')})")
        for warning in warnings:
            print(f"warning: {printable(warning)}")
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    return EXIT_OK


def _fleet_sync(s: _Session) -> Any:
    from durabilis.config import ConfigSync  # noqa: PLC0415

    return ConfigSync(s.store(), replica_id=f"cli:{_operator()}")


def _unpublish_command(shown: str) -> str:
    """The command that removes a fleet config entry, from its name as printed."""
    import shlex  # noqa: PLC0415

    kind, sep, name = shown.partition(":")
    if sep and name and kind in ("retry", "breaker"):
        return f"durabilis config unpublish {kind} {shlex.quote(name)}"
    return f"durabilis config unpublish entry {shlex.quote(shown)}"


def _config_show(s: _Session) -> int:
    from durabilis.config import (  # noqa: PLC0415
        breaker_to_dict,
        policy_to_dict,
        printable_entry,
    )

    fleet = _fleet_sync(s).fleet_config()
    # A rejected entry may be named by anyone's bytes: shown escaped (\xNN), never raw.
    rejected = {printable_entry(k, None): v for k, v in fleet.rejected.items()}
    for name, reason in rejected.items():
        print(f"durabilis: warning: fleet config entry {printable_entry(name)} is rejected by "
              f"every replica ({reason}); remove it: {_unpublish_command(name)}",
              file=sys.stderr)
    doc = {
        "version": fleet.version,
        "updated_at": fleet.updated_at,
        "retry": {k: policy_to_dict(v) for k, v in sorted(fleet.retry_policies.items())},
        "circuit_breaker": {k: breaker_to_dict(v) for k, v in sorted(fleet.breakers.items())},
        "rejected": rejected,
    }
    if s.json:
        _print_json(doc)
        return EXIT_OK
    print(f"fleet config version {fleet.version}, updated {_cell(fleet.updated_at)}")
    # Names as stored: the table escapes them (printable), and `config unpublish`
    # takes that form back.
    rows = [("retry", k, json.dumps(v, sort_keys=True)) for k, v in doc["retry"].items()]
    rows += [("breaker", k, json.dumps(v, sort_keys=True))
             for k, v in doc["circuit_breaker"].items()]
    rows += [("rejected", k, v) for k, v in sorted(fleet.rejected.items())]
    print_table(("KIND", "NAME", "CONFIG"), rows, "nothing published")
    return EXIT_OK


def _config_publish(s: _Session) -> int:
    from durabilis.config import declared_entries, load_config  # noqa: PLC0415

    config = load_config(s.args.file)
    policies, breakers = declared_entries(s.args.file)
    if s.args.retry is not None or s.args.breaker is not None:
        wanted_p, wanted_b = set(s.args.retry or ()), set(s.args.breaker or ())
        missing = sorted((wanted_p - set(policies)) | (wanted_b - set(breakers)))
        if missing:
            raise CliError(EXIT_USAGE, f"{s.args.file} declares no {', '.join(missing)}")
        policies = [p for p in policies if p in wanted_p]
        breakers = [b for b in breakers if b in wanted_b]
    by_type = {p.operation_type: p for p in config.retry_policies or ()}
    by_name = {b.name: b for b in config.breakers or ()}
    sync = _fleet_sync(s)
    done = []
    for op in policies:
        done.append({"entry": f"retry:{op}", "version": sync.publish_policy(by_type[op])})
    for name in breakers:
        done.append({"entry": f"breaker:{name}", "version": sync.publish_breaker(by_name[name])})
    if not done:
        raise CliError(EXIT_NOT_FOUND, f"{s.args.file} declares no [retry.*] or "
                       "[circuit_breaker.*] section to publish")
    version = max(d["version"] for d in done)
    if s.json:
        _print_json({"published": done, "version": version})
    else:
        for d in done:
            print(f"published {d['entry']} (fleet config version {d['version']})")
    return EXIT_OK


def _published_field(fleet: Any, kind: str, name: str) -> str | None:
    """The field of the fleet config hash ``config unpublish KIND NAME`` names, if any.

    NAME as the shell passed it (its raw bytes: Python keeps those that are not
    UTF-8 as lone surrogates, as the fleet config does) or as ``config show``
    prints it (``\\xNN`` for such a byte). ``entry``: NAME is the whole field.
    """
    from durabilis.config import printable_entry  # noqa: PLC0415

    wanted = name if kind == "entry" else f"{kind}:{name}"
    fields = {*fleet.rejected, *(f"retry:{n}" for n in fleet.retry_policies),
              *(f"breaker:{n}" for n in fleet.breakers)}
    if wanted in fields:
        return wanted
    shown = sorted(f for f in fields
                   if wanted in (printable_entry(f, None), printable(f)))
    if len(shown) > 1:
        raise CliError(EXIT_USAGE, f"{printable_entry(wanted)} names {len(shown)} fleet "
                       "config entries: pass its raw bytes (e.g. bash's $'\\xff')")
    return shown[0] if shown else None


def _config_unpublish(s: _Session) -> int:
    from durabilis.config import printable_entry  # noqa: PLC0415

    sync = _fleet_sync(s)
    fleet = sync.fleet_config()  # whatever the entries hold: a bad one is in .rejected
    field = _published_field(fleet, s.args.kind, s.args.name)
    if field is None:
        wanted = s.args.name if s.args.kind == "entry" else f"{s.args.kind}:{s.args.name}"
        raise CliError(EXIT_NOT_FOUND, f"{printable_entry(wanted)} is not published")
    version = sync.remove_entry(field)
    shown = printable_entry(field, None)
    if s.json:
        _print_json({"entry": shown, "version": version})
    else:
        print(f"unpublished {printable_entry(shown)} (fleet config version {version})")
    return EXIT_OK


_COMMANDS: dict[tuple[str, str | None], Callable[[_Session], int]] = {
    ("dlq", "ls"): _dlq_ls,
    ("dlq", "show"): _dlq_show,
    ("dlq", "replay"): _dlq_replay,
    ("dlq", "abandon"): _dlq_abandon,
    ("dlq", "requeue"): _dlq_requeue,
    ("dlq", "purge"): _dlq_purge,
    ("dlq", "stats"): _dlq_stats,
    ("dlq", "cleanup"): _dlq_cleanup,
    ("breaker", "ls"): _breaker_ls,
    ("breaker", "show"): _breaker_show,
    ("breaker", "open"): _breaker_force,
    ("breaker", "close"): _breaker_force,
    ("breaker", "events"): _breaker_events,
    ("checkpoint", "ls"): _checkpoint_ls,
    ("checkpoint", "show"): _checkpoint_show,
    ("checkpoint", "history"): _checkpoint_history,
    ("idem", "show"): _idem_show,
    ("recover", None): _recover,
    ("stats", None): _stats,
    ("doctor", None): _doctor,
    ("config", "check"): _config_check,
    ("config", "show"): _config_show,
    ("config", "publish"): _config_publish,
    ("config", "unpublish"): _config_unpublish,
}


def _fail(message: str) -> None:
    """The command's error: ONE line on stderr (a newline in it is shown ``\\n``)."""
    print(f"durabilis: {printable(message, escape_backslash=False)}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    from durabilis.errors import (  # noqa: PLC0415
        CheckpointNotFound,
        ConfigError,
        DependencyNotFound,
        DurabilisError,
        InvalidKey,
        StorageUnavailable,
    )
    from durabilis.events import configure_logging, redaction_enabled  # noqa: PLC0415

    session = _Session(args)
    redacted = redaction_enabled()
    if getattr(args, "show_errors", False):
        configure_logging(redact=False)  # for this command (events included)
    try:
        command = _COMMANDS[(args.command, getattr(args, "action", None))]
        return command(session)
    except CliError as exc:
        _fail(exc.message)
        return exc.code
    except (ConfigError, InvalidKey) as exc:
        _fail(str(exc))
        return EXIT_USAGE
    except StorageUnavailable as exc:
        text = str(exc)
        prefix = "" if text.startswith("Redis unavailable") else "Redis unavailable: "
        _fail(prefix + text)
        return EXIT_UNAVAILABLE
    except (CheckpointNotFound, DependencyNotFound) as exc:
        _fail(str(exc))
        return EXIT_NOT_FOUND
    except DurabilisError as exc:
        _fail(describe_error(exc, redacted=False))
        return EXIT_ERROR
    finally:
        configure_logging(redact=redacted)
        session.close()


def _json_escape(ch: str) -> str:
    """``\\uXXXX`` (a surrogate pair past U+FFFF): valid in JSON and in text."""
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def escape_controls(text: str) -> str:
    """``text`` with every character :func:`printable` escapes, but newline and
    tab (the CLI's own layout), written as ``\\uXXXX``: the one definition of
    what is escaped is ``str.isprintable`` (controls, ANSI escape, bidi marks,
    overrides and isolates, line and paragraph separators, zero-width and
    format characters, unassigned code points). Stored data (an error text, a
    payload, a key, in a table, a ``show`` or ``--json``) can neither move the
    cursor, forge a line, reorder one nor retitle the terminal. Valid in JSON too."""
    if text.replace("\n", "").replace("\t", "").isprintable():
        return text
    return "".join(
        ch if ch.isprintable() or ch in "\n\t" else _json_escape(ch) for ch in text
    )


class _Escaped:
    """A text stream whose writes go through :func:`escape_controls` (the CLI's stdout)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return int(self._stream.write(escape_controls(text)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Stderr:
    """``sys.stderr`` as it is at each write (test runners swap it); a progress
    line on screen is cleared first (the next update draws it again)."""

    progress: ClassVar[Progress | None] = None

    def write(self, text: str) -> int:
        if self.progress is not None:
            self.progress.clear()
        return sys.stderr.write(escape_controls(text))

    def flush(self) -> None:
        sys.stderr.flush()


def _run_scripts(args: argparse.Namespace) -> int:
    """``durabilis scripts [NAME]``: what this installation sends to Redis (no Redis)."""
    import hashlib  # noqa: PLC0415

    from durabilis._scripts import acks_tags, sources  # noqa: PLC0415

    texts, tags = sources(), acks_tags()
    as_json = bool(getattr(args, "json", False))
    rows = [{"name": n, "sha1": hashlib.sha1(t.encode()).hexdigest(), "acks": str(tags[n])}
            for n, t in texts.items()]
    if args.name is None:
        if as_json:
            _print_json(rows)
        else:
            for row in rows:
                print(f"{row['name']:<16} {row['sha1']}  @acks: {row['acks']}")
        return EXIT_OK
    found = [r for r in rows if r["name"] == args.name]
    if not found:
        _fail(f"no script {args.name!r} (`durabilis scripts` lists them)")
        return EXIT_NOT_FOUND
    if as_json:
        _print_json({**found[0], "source": texts[args.name]})
    else:
        sys.stdout.write(texts[args.name])
    return EXIT_OK


def _run_demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``durabilis demo``: its own errors are one line on stderr too (exit 2, 3 or 4)."""
    from durabilis import _demo  # noqa: PLC0415  (keeps `durabilis --help` fast)
    from durabilis.errors import ConfigError, DurabilisError, StorageUnavailable  # noqa: PLC0415

    if args.workers > DEMO_MAX_WORKERS:
        parser.error(f"argument --workers: at most {DEMO_MAX_WORKERS}, got {args.workers}")
    try:
        from durabilis._store import resolve_url  # noqa: PLC0415
        from durabilis._url import check_url  # noqa: PLC0415

        check_url(resolve_url(args.url))  # before the demo writes its log file
        return _demo.run(
            args.url, workers=args.workers, tasks_per_worker=args.tasks_per_worker,
            as_json=bool(getattr(args, "json", False)),
            namespace=getattr(args, "namespace", None),
        )
    except ConfigError as exc:  # a malformed --url or --namespace
        code, text = EXIT_USAGE, str(exc)
    except StorageUnavailable as exc:
        code, text = EXIT_UNAVAILABLE, str(exc)
    except DurabilisError as exc:
        code, text = EXIT_ERROR, describe_error(exc, redacted=False)
    _fail(text)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("url", "namespace", "config"):
        if getattr(args, flag, None) == "":
            parser.error(f"--{flag} is empty (leave it out for the default)")
    if args.command == "demo":
        return _run_demo(parser, args)
    if args.command == "scripts":
        try:
            return _run_scripts(args)
        except BrokenPipeError:  # `durabilis scripts dlq_enqueue | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_OK
    import logging  # noqa: PLC0415

    import structlog  # noqa: PLC0415

    # durabilis's events (a breaker forced open, a replay...) go to stderr:
    # stdout carries only the command's output, so --json stays parseable.
    # --quiet keeps only its warnings and errors (no line per replayed record).
    quiet = bool(getattr(args, "quiet", False))
    saved = structlog.get_config() if structlog.is_configured() else None
    options: dict[str, Any] = {
        "logger_factory": structlog.PrintLoggerFactory(file=cast(TextIO, _Stderr()))
    }
    if quiet:
        options["wrapper_class"] = structlog.make_filtering_bound_logger(logging.WARNING)
    structlog.configure(**options)
    stdlib = logging.getLogger("durabilis")
    saved_level = stdlib.level
    if quiet:
        stdlib.setLevel(max(stdlib.getEffectiveLevel(), logging.WARNING))
    else:  # an operator's tool shows what it did (a line per replayed record)
        stdlib.setLevel(min(stdlib.getEffectiveLevel(), logging.INFO))
    real_stdout = sys.stdout
    sys.stdout = _Escaped(real_stdout)
    try:
        return _run(args)
    except BrokenPipeError:  # `durabilis dlq ls | head`: the reader left
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, real_stdout.fileno())
        return EXIT_NOT_FOUND
    finally:
        sys.stdout = real_stdout
        # As it was: "not configured" too. (Configured with its defaults, structlog
        # would print every later durabilis event of this process to stdout,
        # instead of going through the "durabilis" logger.)
        if saved is None:
            structlog.reset_defaults()
        else:
            structlog.configure(**saved)
        stdlib.setLevel(saved_level)


if __name__ == "__main__":
    sys.exit(main())
