"""The CLI's one helper for stored fields on a terminal: one line, nothing forged."""

from __future__ import annotations

import json

import pytest

from durabilis.cli import _cell, escape_controls, print_table, printable


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ("agent-1", "agent-1"),
        ("a\nstatus  abandoned", "a\\nstatus  abandoned"),
        ("x\r\x1b[2Ky", "x\\r\\x1b[2Ky"),
        ("tab\there", "tab\\there"),
        ("bell\x07 del\x7f c1\x85 csi\x9b", "bell\\x07 del\\x7f c1\\x85 csi\\x9b"),
        ("rtl\u202eevil", "rtl\\u202eevil"),
        ("line\u2028sep", "line\\u2028sep"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("not utf-8 \udcff", "not utf-8 \\xff"),
        ("caf\u00e9 \u4e2d", "caf\u00e9 \u4e2d"),  # printable text stays as it is
        # the escape character is escaped too: a stored "\n" (two characters)
        # cannot pass for a folded newline, nor "\x1b" for a folded escape
        ("literal \\n and \\x1b", "literal \\\\n and \\\\x1b"),
        (42, "42"),
    ],
)
def test_printable_folds_controls_and_escapes_the_escape_character(
    stored: object, shown: str
) -> None:
    assert printable(stored) == shown
    assert "\n" not in printable(stored) and printable(stored).isprintable()


def test_printable_is_injective_on_what_it_folds() -> None:
    texts = ["a\nb", "a\\nb", "a\\\nb", "a\\\\nb", "\x1b", "\\x1b", "\\\x1b"]
    assert len({printable(t) for t in texts}) == len(texts)


def test_printable_for_the_clis_own_messages_keeps_backslashes() -> None:
    assert printable("no record 'a\\nb'\nnext", escape_backslash=False) == (
        "no record 'a\\nb'\\nnext"
    )


def test_table_cells_and_shown_fields_use_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cell("a\nb", None) == "a\\nb"
    assert _cell("x" * 100 + "\n") == "x" * 45 + "..."
    print_table(("ID", "AGENT"), [("1", "a\nstatus  abandoned\r")], "none")
    out = capsys.readouterr().out
    assert out.splitlines() == ["ID  AGENT", "1   a\\nstatus  abandoned\\r"]


def test_the_output_filter_escapes_what_printable_escapes_but_newline_and_tab() -> None:
    text = 'x\u2028\u2029\u061c\u200e\u200f\u200b\ufeff\x85\U000e0041\x1b\t"\n'
    escaped = escape_controls(text)
    assert all(ch.isprintable() or ch in "\n\t" for ch in escaped)
    assert escape_controls("plain\ttext\n") == "plain\ttext\n"
    # valid JSON inside a string: reads back as the same characters
    doc = json.dumps({"k": text}, ensure_ascii=False)
    assert json.loads(escape_controls(doc)) == {"k": text}
    # one definition: what printable() leaves raw, the filter leaves raw too
    assert escape_controls(printable(text)) == printable(text)
