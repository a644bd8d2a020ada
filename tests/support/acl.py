"""The ACL line of ``docs/operations.md``: parsed, checked against the code, applied.

The documented line is the single source: the integration test creates the
user from it (namespace and password substituted), and a unit test checks it
grants every command the Lua scripts and the pillars send.
"""

from __future__ import annotations

import re
from pathlib import Path

import redis

from durabilis._scripts import sources

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"

_CALL = re.compile(r"""redis\.p?call\(\s*["']([A-Za-z]+)["']""")
# Plain commands the pillars send through Store.command: ("XRANGE", key, ...).
_PLAIN = re.compile(r"""\(\s*"([A-Z]{3,})",""")


def documented_setuser() -> tuple[str, list[str]]:
    """``(user, rules)`` of the ``ACL SETUSER`` line under ``<!-- acl -->``."""
    text = DOC.read_text(encoding="utf-8")
    block = text.split("<!-- acl -->", 1)[1].split("```", 2)[1]
    words = block.split()
    if words[:2] != ["ACL", "SETUSER"]:
        raise ValueError(f"no ACL SETUSER line under <!-- acl --> in {DOC}")
    return words[2], words[3:]


def rules_for(namespace: str, password: str) -> list[str]:
    """The documented rules for ``namespace`` with ``password``."""
    _, rules = documented_setuser()
    return [
        ">" + password if rule.startswith(">")
        else f"~{namespace}:*" if rule.startswith("~")
        else rule
        for rule in rules
    ]


def granted(rules: list[str]) -> set[str]:
    """Commands (``name`` or ``name|sub``, lower case) the rules allow."""
    return {r[1:].lower() for r in rules if r.startswith("+") and not r.startswith("+@")}


def script_commands() -> set[str]:
    """Every command a shipped Lua script calls (lower case; includes expanded)."""
    found: set[str] = set()
    for text in sources().values():
        found |= {c.lower() for c in _CALL.findall(text)}
    return found


def plain_commands() -> set[str]:
    """Commands the library modules send outside scripts (tuples like ``("XRANGE", ...``).

    Upper-case words opening a tuple are kept when redis-py has a method of that
    name (every Redis command does; table headers and error codes do not).
    """
    found: set[str] = set()
    for path in sorted((ROOT / "durabilis").rglob("*.py")):
        found |= {w.lower() for w in _PLAIN.findall(path.read_text(encoding="utf-8"))}
    return {c for c in found if callable(getattr(redis.Redis, c, None))}
