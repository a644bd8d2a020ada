"""The ``durabilis`` command line (a thin shell over the public sync API)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="durabilis", description=__doc__)
    parser.add_argument("--url", default=None, help="Redis URL (default: DURABILIS_REDIS_URL, "
                        "REDIS_URL, then the embedded server under ./.durabilis/)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo on the embedded default")
    demo.add_argument("--workers", type=int, default=4)
    demo.add_argument("--operations", type=int, default=25)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from durabilis import _demo  # noqa: PLC0415  (keeps `durabilis --help` fast)

        return _demo.run(args.url, workers=args.workers, operations=args.operations)
    return 2


if __name__ == "__main__":
    sys.exit(main())
