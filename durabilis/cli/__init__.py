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

The package: ``_parser`` (the argument parser), ``_session`` (store, config
and layer of a command), ``_output`` (tables, JSON, escaping, progress) and one
module per command group (``_dlq``, ``_replay``, ``_dlq_bulk``, ``_breaker``,
``_checkpoint``, ``_idem``, ``_config``, ``_layer``, ``_doctor``, ``_demo``),
each with its ``COMMANDS`` table. The names below are its public face.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO, cast

from durabilis.cli import (
    _breaker,
    _checkpoint,
    _config,
    _dlq,
    _dlq_bulk,
    _doctor,
    _idem,
    _layer,
    _replay,
)
from durabilis.cli._base import (
    DEFAULT_NAMESPACE,
    DEFAULT_TIMEOUT,
    DEMO_MAX_WORKERS,
    ENV_CONFIG,
    ENV_NAMESPACE,
    ENV_URL,
    EXIT_DEFERRED,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_WRONG_NAMESPACE,
    MAX_PINGS,
    MAX_TIMEOUT,
    RESOLUTION_HELP,
    CliError,
)
from durabilis.cli._demo import run_demo
from durabilis.cli._idem import IDEM_DLQ_SCAN_LIMIT, KEY_SCAN_CALLS
from durabilis.cli._output import (
    Escaped,
    Progress,
    Stderr,
    cell,
    describe_error,
    describe_error_text,
    escape_controls,
    fail,
    jsonable,
    print_table,
    printable,
    replay_progress_text,
)
from durabilis.cli._parser import GLOBAL_OPTIONS_HELP, build_parser
from durabilis.cli._replay import load_handler
from durabilis.cli._session import Session

_cell = cell  # (its name before the package: tests/unit/test_cli_printable.py)

__all__ = [
    "DEFAULT_NAMESPACE", "DEFAULT_TIMEOUT", "DEMO_MAX_WORKERS", "ENV_CONFIG", "ENV_NAMESPACE",
    "ENV_URL", "EXIT_DEFERRED", "EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_UNAVAILABLE",
    "EXIT_USAGE", "EXIT_WRONG_NAMESPACE", "GLOBAL_OPTIONS_HELP", "IDEM_DLQ_SCAN_LIMIT",
    "KEY_SCAN_CALLS", "MAX_PINGS", "MAX_TIMEOUT", "RESOLUTION_HELP", "CliError", "Progress",
    "build_parser", "describe_error", "describe_error_text", "escape_controls", "jsonable",
    "load_handler", "main", "print_table", "printable", "replay_progress_text",
]


_COMMANDS: dict[tuple[str, str | None], Callable[[Session], int]] = {
    **_dlq.COMMANDS,
    **_replay.COMMANDS,
    **_dlq_bulk.COMMANDS,
    **_breaker.COMMANDS,
    **_checkpoint.COMMANDS,
    **_idem.COMMANDS,
    **_layer.COMMANDS,
    **_doctor.COMMANDS,
    **_config.COMMANDS,
}


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

    session = Session(args)
    redacted = redaction_enabled()
    if getattr(args, "show_errors", False):
        configure_logging(redact=False)  # for this command (events included)
    try:
        command = _COMMANDS[(args.command, getattr(args, "action", None))]
        return command(session)
    except CliError as exc:
        fail(exc.message)
        return exc.code
    except (ConfigError, InvalidKey) as exc:
        fail(str(exc))
        return EXIT_USAGE
    except StorageUnavailable as exc:
        text = str(exc)
        prefix = "" if text.startswith("Redis unavailable") else "Redis unavailable: "
        fail(prefix + text)
        return EXIT_UNAVAILABLE
    except (CheckpointNotFound, DependencyNotFound) as exc:
        fail(str(exc))
        return EXIT_NOT_FOUND
    except DurabilisError as exc:
        fail(describe_error(exc, redacted=False))
        return EXIT_ERROR
    finally:
        configure_logging(redact=redacted)
        session.close()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("url", "namespace", "config"):
        if getattr(args, flag, None) == "":
            parser.error(f"--{flag} is empty (leave it out for the default)")
    if args.command == "demo":
        return run_demo(parser, args)
    if args.command == "scripts":  # no Redis, no session
        from durabilis.cli._scripts import run as run_scripts  # noqa: PLC0415

        return run_scripts(args)
    if args.command == "web":  # a server, not a command over a session: durabilis._cli_web
        from durabilis._cli_web import run  # noqa: PLC0415

        return run(args)
    import logging  # noqa: PLC0415

    import structlog  # noqa: PLC0415

    # durabilis's events (a breaker forced open, a replay...) go to stderr:
    # stdout carries only the command's output, so --json stays parseable.
    # --quiet keeps only its warnings and errors (no line per replayed record).
    quiet = bool(getattr(args, "quiet", False))
    saved = structlog.get_config() if structlog.is_configured() else None
    options: dict[str, Any] = {
        "logger_factory": structlog.PrintLoggerFactory(file=cast(TextIO, Stderr()))
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
    sys.stdout = Escaped(real_stdout)
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
