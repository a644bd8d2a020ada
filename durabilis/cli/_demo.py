"""``durabilis demo``: the demo on the embedded default."""

from __future__ import annotations

import argparse

from durabilis.cli._base import DEMO_MAX_WORKERS, EXIT_ERROR, EXIT_UNAVAILABLE, EXIT_USAGE
from durabilis.cli._output import describe_error, fail


def run_demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
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
    fail(text)
    return code
