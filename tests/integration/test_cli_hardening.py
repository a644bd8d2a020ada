"""What the CLI prints of stored data: no terminal control sequences, no secret
unless asked, no password."""

from __future__ import annotations

import json

import pytest

import durabilis
from durabilis.cli import EXIT_OK
from durabilis.dlq import DeadLetterQueue
from tests.integration._cli_support import run_cli

FORGED = "NETWORK_TIMEOUT: boom\x1b]0;pwned\x07\r\x1b[2Kstatus abandoned\u202e"
SECRET = "Bearer sk_live_0123456789"


run = run_cli


def test_stored_control_characters_are_printed_escaped(
    store: durabilis.Store, redis_url: str, namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dlq = DeadLetterQueue(store)
    dlq_id = dlq.enqueue("agent\x1b[31m", "job", {"note": "\x9b31m"}, 1, FORGED)
    for args in (["dlq", "ls", "--show-errors"], ["dlq", "show", dlq_id, "--show-errors"],
                 ["dlq", "ls", "--json", "--show-errors"], ["dlq", "show", dlq_id]):
        code, out, err = run(capsys, *args, "--url", redis_url, "--namespace", namespace)
        assert code == EXIT_OK, err
        for raw in ("\x1b", "\x07", "\r", "\x9b", "\u202e"):
            assert raw not in out, (args, raw)
        assert "\\u001b" in out, args  # shown, escaped
    code, out, _ = run(capsys, "dlq", "ls", "--json", "--show-errors", "--url", redis_url,
                       "--namespace", namespace)
    assert json.loads(out)["records"][0]["last_error"] == FORGED  # JSON stays exact


def test_error_texts_are_redacted_unless_asked(
    store: durabilis.Store, redis_url: str, namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dlq = DeadLetterQueue(store)
    dlq_id = dlq.enqueue("agent-1", "job", {"n": 1}, 1, f"ValueError: refused {SECRET}")
    for args in (["dlq", "ls"], ["dlq", "show", dlq_id], ["dlq", "ls", "--json"]):
        _, out, _ = run(capsys, *args, "--url", redis_url, "--namespace", namespace)
        assert "sk_live" not in out and "ValueError: [REDACTED]" in out, args
    _, out, _ = run(capsys, "dlq", "show", dlq_id, "--show-errors", "--url", redis_url,
                    "--namespace", namespace)
    assert SECRET in out
