"""The doctor sample output counts the Lua scripts that really ship.

(The docs' TOML examples pass ``durabilis config check`` as printed: the docs
runner checks them, with every other block: tests/docs/conftest.py.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_doctor_sample_output_counts_the_scripts_that_ship() -> None:
    text = (ROOT / "docs" / "production.md").read_text(encoding="utf-8")
    shown = re.findall(r"all (\d+) Lua scripts load", text)
    shipped = len(list((ROOT / "durabilis" / "lua").glob("*.lua")))
    assert shown and {int(n) for n in shown} == {shipped}
