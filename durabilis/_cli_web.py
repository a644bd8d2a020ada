"""``durabilis web``: serve the web console (:mod:`durabilis.web`) with uvicorn.

Its Redis, namespace and config come from the same places as every other
command's (``--url``, ``--namespace``, ``--config``, then the environment);
``--show-errors`` shows error texts, payloads and checkpoint states in clear.
Actions need both ``--actions`` and ``--authorize MODULE:CALLABLE`` (the hook
that names the actor of each request, or refuses it).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8300
SECRET_ENV = "DURABILIS_WEB_SECRET"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``durabilis web`` (besides the ones every command takes)."""
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default: {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to listen on (default: {DEFAULT_PORT})")
    p.add_argument("--root-path", default="", metavar="PATH",
                   help="the path prefix a reverse proxy serves the console under and "
                   "strips before forwarding (e.g. /durabilis): the pages' links carry it")
    p.add_argument("--actions", action="store_true",
                   help="enable requeue, abandon and purge (needs --authorize)")
    p.add_argument("--authorize", default=None, metavar="MODULE:CALLABLE",
                   help="authorize(request, action, target) -> actor name, or None to "
                   "refuse; required by --actions")


def _hook(spec: str) -> Any:
    from durabilis.cli import EXIT_USAGE, CliError, load_handler  # noqa: PLC0415

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(EXIT_USAGE, f"--authorize must be MODULE:CALLABLE, got {spec!r}")
    return load_handler(spec)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the exit code (2: usage, 3: Redis unavailable)."""
    from durabilis.cli import (  # noqa: PLC0415
        DEFAULT_NAMESPACE,
        ENV_CONFIG,
        ENV_NAMESPACE,
        EXIT_ERROR,
        EXIT_OK,
        EXIT_UNAVAILABLE,
        EXIT_USAGE,
        CliError,
        printable,
    )
    from durabilis.errors import ConfigError, DurabilisError, StorageUnavailable  # noqa: PLC0415

    def fail(code: int, message: str) -> int:
        print(f"durabilis: {printable(message, escape_backslash=False)}", file=sys.stderr)
        return code

    if args.actions and not args.authorize:
        return fail(EXIT_USAGE, "--actions needs --authorize MODULE:CALLABLE (the hook that "
                    "names who acts, or refuses)")
    if not 0 < args.port < 65536:
        return fail(EXIT_USAGE, f"--port must be in 1..65535, got {args.port}")
    try:
        import uvicorn  # noqa: PLC0415

        from durabilis.web import create_app  # noqa: PLC0415
    except ImportError as exc:
        return fail(EXIT_USAGE, f"durabilis web needs the 'web' extra: pip install "
                    f"'durabilis[web]' ({exc})")
    namespace = (getattr(args, "namespace", None) or os.environ.get(ENV_NAMESPACE)
                 or DEFAULT_NAMESPACE)
    config_path = getattr(args, "config", None) or os.environ.get(ENV_CONFIG) or None
    try:
        authorize = _hook(args.authorize) if args.authorize else None
        from durabilis.config import load_config  # noqa: PLC0415

        config = load_config(config_path)
        import durabilis  # noqa: PLC0415

        timeout = getattr(args, "timeout", 5.0)
        if not (isinstance(timeout, (int, float)) and 0 < timeout <= 86400):
            return fail(EXIT_USAGE, f"--timeout must be a number in (0, 86400], got {timeout}")
        store = durabilis.connect(getattr(args, "url", None), namespace=namespace,
                                  socket_timeout=timeout, socket_connect_timeout=timeout)
        app = create_app(
            store, config=config,
            actions=bool(args.actions), authorize=authorize,
            redact=not getattr(args, "show_errors", False),
            secret_key=os.environ.get(SECRET_ENV) or None,
        )
    except CliError as exc:
        return fail(exc.code, exc.message)
    except ConfigError as exc:
        return fail(EXIT_USAGE, str(exc))
    except StorageUnavailable as exc:
        return fail(EXIT_UNAVAILABLE, str(exc))
    except DurabilisError as exc:
        return fail(EXIT_ERROR, f"{type(exc).__name__}: {exc}")
    print(f"durabilis web: namespace {namespace!r} on http://{args.host}:{args.port}"
          f"{args.root_path or '/'} ({'actions enabled' if args.actions else 'read-only'})",
          file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, root_path=args.root_path,
                    log_level="warning", proxy_headers=False)
    finally:
        store.close()
    return EXIT_OK
