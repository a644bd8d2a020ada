"""The docs' TOML examples pass ``durabilis config check`` as printed, and the
doctor sample output counts the Lua scripts that really ship."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOML_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.S | re.M)


def _toml_blocks() -> list[tuple[str, str]]:
    return [(f"{doc.name}#{i}", block)
            for doc in DOCS
            for i, block in enumerate(TOML_BLOCK.findall(doc.read_text(encoding="utf-8")))]


def test_the_docs_have_toml_examples() -> None:
    assert any(name.startswith("production.md") for name, _ in _toml_blocks())


@pytest.mark.parametrize(("name", "block"), _toml_blocks(), ids=[n for n, _ in _toml_blocks()])
def test_every_toml_block_in_the_docs_passes_config_check(
    name: str, block: str, tmp_path: Path
) -> None:
    path = tmp_path / "example.toml"
    path.write_text(block, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "durabilis", "config", "check", str(path)],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, f"{name}: {proc.stderr or proc.stdout}"
    assert proc.stdout.startswith(f"{path}: ok (")


def test_the_doctor_sample_output_counts_the_scripts_that_ship() -> None:
    text = (ROOT / "docs" / "production.md").read_text(encoding="utf-8")
    shown = re.findall(r"all (\d+) Lua scripts load", text)
    assert shown and {int(n) for n in shown} == {len(list((ROOT / "lua").glob("*.lua")))}
