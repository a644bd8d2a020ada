"""``durabilis scripts [NAME]``: the Lua scripts this installation sends to Redis (no Redis)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from durabilis.cli._base import EXIT_NOT_FOUND, EXIT_OK
from durabilis.cli._output import fail, print_json


def add_arguments(sub: Any) -> None:
    scripts = sub.add_parser(
        "scripts", help="the Lua scripts this installation ships (no Redis): name, SHA1 "
        "(EVALSHA's), @acks tag; with NAME, its source as sent (includes expanded)")
    scripts.add_argument("name", nargs="?", default=None)
    scripts.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                         help="print them as JSON")


def run(args: argparse.Namespace) -> int:
    """Lists the scripts (name, SHA1, @acks tag), or prints one as Redis runs it."""
    try:
        return _run(args)
    except BrokenPipeError:  # `durabilis scripts dlq_enqueue | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    import hashlib  # noqa: PLC0415

    from durabilis._scripts import acks_tags, sources  # noqa: PLC0415

    texts, tags = sources(), acks_tags()
    as_json = bool(getattr(args, "json", False))
    rows = [{"name": n, "sha1": hashlib.sha1(t.encode()).hexdigest(), "acks": str(tags[n])}
            for n, t in texts.items()]
    if args.name is None:
        if as_json:
            print_json(rows)
        else:
            for row in rows:
                print(f"{row['name']:<16} {row['sha1']}  @acks: {row['acks']}")
        return EXIT_OK
    found = [r for r in rows if r["name"] == args.name]
    if not found:
        fail(f"no script {args.name!r} (`durabilis scripts` lists them)")
        return EXIT_NOT_FOUND
    if as_json:
        print_json({**found[0], "source": texts[args.name]})
    else:
        sys.stdout.write(texts[args.name])
    return EXIT_OK
