"""One definition of how text read from Redis is shown on a terminal or in a log."""

from __future__ import annotations

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_unprintable(text: str, *, short: bool = False, backslash: bool = False) -> str:
    """``text`` with every character ``str.isprintable()`` refuses escaped.

    A byte that was not UTF-8 (kept as a lone surrogate, ``surrogateescape``) is
    ``\\xNN``; other characters ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``.

    Args:
        text: The text.
        short: Newline, carriage return and tab as ``\\n``, ``\\r``, ``\\t``.
        backslash: Double the backslash, so a text that spells an escape reads
            differently from the character it spells.
    """
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\" if backslash else ch)
        elif short and ch in _SHORT:
            out.append(_SHORT[ch])
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)
