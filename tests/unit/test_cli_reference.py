"""docs/cli.md's command tables match the parser: every option a subcommand's
``--help`` lists is in that command's row (or, a global option, in the table of
options every command takes), and every option a row names exists.

``--help`` is argparse's ``format_help()`` of the subcommand's parser, read here
from ``durabilis.cli.build_parser()`` (the same object ``main`` parses with).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from durabilis.cli import build_parser

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[str, argparse.ArgumentParser]]:
    """Every runnable subcommand (``"dlq ls"``) and its parser."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield " ".join(path), parser
    for group in groups:
        for name, sub in group.choices.items():
            yield from leaves(sub, (*path, name))


COMMANDS = dict(leaves(build_parser()))


def section(title: str) -> str:
    text = CLI_MD.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def global_options() -> set[str]:
    """The options of the table "Options every command takes"."""
    return {m for line in section("Options every command takes").splitlines()
            if line.startswith("| `") for m in OPTION.findall(line.split("|")[1])}


def documented() -> dict[str, set[str]]:
    """Command -> the options its rows of the command tables name (first column)."""
    found: dict[str, set[str]] = {}
    for line in CLI_MD.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        first = re.split(r"(?<!\\)\|", line)[1]
        for span in re.findall(r"`([^`]+)`", first):
            named = [c for c in COMMANDS if span == c or span.startswith(c + " ")]
            if named:
                command = max(named, key=len)
                found.setdefault(command, set()).update(OPTION.findall(span))
    return found


def helped(command: str) -> set[str]:
    """The options ``durabilis COMMAND --help`` lists (its own and the global ones)."""
    return set(OPTION.findall(COMMANDS[command].format_help())) - {"--help"}


def test_the_reference_has_a_row_for_every_subcommand() -> None:
    assert set(COMMANDS) - set(documented()) == set()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_of_a_subcommand_is_in_its_row_and_every_documented_one_exists(
    command: str,
) -> None:
    rows, common, listed = documented().get(command, set()), global_options(), helped(command)
    assert listed - rows - common == set(), f"`durabilis {command} --help` lists these, " \
        "docs/cli.md's row does not"
    assert rows - listed == set(), f"docs/cli.md's row of `{command}` names these, " \
        f"`durabilis {command} --help` does not"


def test_the_global_options_table_matches_the_top_level_parser() -> None:
    top = set(OPTION.findall(build_parser().format_help())) - {"--help", "--version"}
    assert top == global_options()
