"""Output: JSON documents, tables, fields, error texts as printed, the
progress line, and the escaping that keeps stored data on one line of a terminal."""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from durabilis._escape import escape_unprintable


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


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


def print_json(document: Any) -> None:
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


def cell(value: Any, limit: int | None = 48) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, enum.Enum):
        return printable(value.value)
    if isinstance(value, float):
        return f"{value:.3g}"
    text = printable(value)
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> None:
    """Aligned columns (the last one not padded); ``empty`` when there is no row."""
    cells = [[cell(v) for v in row] for row in rows]
    if not cells:
        print(empty)
        return
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    for row in [list(headers), *cells]:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        print("  ".join([*padded, row[-1]]).rstrip())


def print_fields(pairs: Iterable[tuple[str, Any]]) -> None:
    items = list(pairs)
    width = max(len(k) for k, _ in items)
    for k, v in items:
        print(f"{k.ljust(width)}  {cell(v, None)}")


def print_value(title: str, value: Any) -> None:
    print(f"{title}:")
    print(json.dumps(jsonable(value), indent=2, ensure_ascii=False))


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


def describe_error_text(text: str | None, *, redacted: bool | None = None) -> str | None:
    """A stored error text as the CLI prints it (:func:`durabilis.events.redact_error`;
    ``redacted``: this call's choice over ``--show-errors``, as the web console's)."""
    from durabilis.events import redact_error  # noqa: PLC0415

    return redact_error(text, enabled=redacted)


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


def is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


class Progress:
    """One line on stderr, redrawn in place (a carriage return), erased at the end.

    Drawn only when stderr is a terminal (``enabled`` and ``isatty()``): never in
    a pipe, a file or a CI log. Redrawn at most every ``interval`` seconds; a
    write by durabilis's events (through :class:`Stderr`) clears it first.
    """

    def __init__(self, *, enabled: bool = True, interval: float = 0.1) -> None:
        self.enabled = enabled and is_tty(sys.stderr)
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
        Stderr.progress = self
        return self

    def __exit__(self, *exc: object) -> None:
        Stderr.progress = None
        self.clear()


def fail(message: str) -> None:
    """The command's error: ONE line on stderr (a newline in it is shown ``\\n``)."""
    print(f"durabilis: {printable(message, escape_backslash=False)}", file=sys.stderr)


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


class Escaped:
    """A text stream whose writes go through :func:`escape_controls` (the CLI's stdout)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return int(self._stream.write(escape_controls(text)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Stderr:
    """``sys.stderr`` as it is at each write (test runners swap it); a progress
    line on screen is cleared first (the next update draws it again)."""

    progress: ClassVar[Progress | None] = None

    def write(self, text: str) -> int:
        if self.progress is not None:
            self.progress.clear()
        return sys.stderr.write(escape_controls(text))

    def flush(self) -> None:
        sys.stderr.flush()
