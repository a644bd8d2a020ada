"""Every Python, TOML and ``$ durabilis`` block of README.md and docs/*.md runs,
in order, against the suite's redis-server (the harness: conftest.py), or is
marked ``<!-- illustrative: REASON -->``."""

from __future__ import annotations

from pathlib import Path
from unittest import SkipTest

import pytest

from tests.docs.conftest import DOCS, DOCUMENTS, ROOT, Harness

pytestmark = pytest.mark.standalone_only  # a reader's Redis: one plain server


@pytest.mark.parametrize("path", DOCUMENTS, ids=[str(p.relative_to(ROOT)) for p in DOCUMENTS])
def test_every_block_of_the_document_runs_in_order(
    path: Path, docs_harness: Harness, request: pytest.FixtureRequest
) -> None:
    document = DOCS.parse(path)
    document.namespace.update(docs_harness.namespace)
    where = path.relative_to(ROOT)
    for example in document.examples():
        try:
            example.evaluate()
        except SkipTest as skipped:  # <!-- illustrative: REASON -->
            request.node.user_properties.append(("illustrative", f"{where}:{example.line}: "
                                                 f"{skipped}"))
        except BaseException as exc:
            if hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(f"{where}, the block at line {example.line}")
            raise


def _run(path: Path, harness: Harness) -> list[str]:
    """Evaluate every block of ``path``; the outcome of each, in order."""
    document = DOCS.parse(path)
    document.namespace.update(harness.namespace)
    outcomes = []
    for example in document.examples():
        try:
            example.evaluate()
        except SkipTest as skipped:
            outcomes.append(f"skipped: {skipped}")
        except Exception as exc:
            outcomes.append(f"failed: {type(exc).__name__}")
        else:
            outcomes.append("ran")
    return outcomes


def test_the_runner_fails_a_wrong_block_and_skips_only_an_illustrative_one(
    docs_harness: Harness, tmp_path: Path
) -> None:
    doc = tmp_path / "sample.md"
    doc.write_text(
        "```python\nx = durabilis_store = store\nwiki.put({'p': 1})\n```\n\n"
        "<!-- illustrative: a sketch -->\n```python\nundefined_name\n```\n\n"
        "```python\nundefined_name\n```\n\n"
        "```python\nimport asyncio\nawait asyncio.sleep(0)\ny = x\n```\n\n"
        "```toml\n[retry.payments]\nmax_attempts = 2\n```\n\n"
        "```toml\n[idempotency]\ndedup_window_seconds = -1\n```\n\n"
        "```text\n$ durabilis dlq ls --limit x\n"
        "durabilis dlq ls: error: argument --limit: invalid int value: 'x' (see …)\n```\n\n"
        "```\n$ durabilis dlq ls --limit x\nsomething else\n```\n\n"
        "```sh\n$ redis-cli PING\nPONG\n```\n",
        encoding="utf-8")
    assert _run(doc, docs_harness) == [
        "ran",
        "ran", "skipped: illustrative: a sketch",  # the marker, then the block it marks
        "failed: NameError", "ran",
        "failed: AssertionError",  # [retry.payments] lacks the delays a new policy needs
        "failed: AssertionError", "ran", "failed: AssertionError", "failed: AssertionError",
    ]
