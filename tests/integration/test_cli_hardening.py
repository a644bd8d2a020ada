"""What the CLI prints of stored data: no terminal control sequences, no secret
unless asked, no password."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import durabilis
from durabilis.cli import EXIT_OK, EXIT_USAGE
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
        # shown, escaped: \x1b in a table or a show, \u001b in JSON
        assert ("\\u001b" if "--json" in args else "\\x1b") in out, args
    code, out, _ = run(capsys, "dlq", "ls", "--json", "--show-errors", "--url", redis_url,
                       "--namespace", namespace)
    assert json.loads(out)["records"][0]["last_error"] == FORGED  # JSON stays exact


INVISIBLE = "\u2028\u2029\u061c\u200e\u200f\u202a\u2066\u200b\ufeff\x85"


def test_line_separators_and_bidi_marks_in_payload_and_metadata_are_printed_escaped(
    store: durabilis.Store, redis_url: str, namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dlq = DeadLetterQueue(store)
    stored = f"a{INVISIBLE}b"
    dlq_id = dlq.enqueue("agent-1", "job", {stored: stored}, 1, "boom",
                         metadata={f"m{INVISIBLE}": stored})
    for args in (["dlq", "show", dlq_id], ["dlq", "show", dlq_id, "--json"]):
        code, out, err = run(capsys, *args, "--url", redis_url, "--namespace", namespace)
        assert code == EXIT_OK, err
        for raw in INVISIBLE:
            assert raw not in out, (args, hex(ord(raw)))
        assert "\\u2028" in out, args
    doc = json.loads(out)  # JSON stays exact
    assert doc["original_operation"] == {stored: stored}
    assert doc["metadata"][f"m{INVISIBLE}"] == stored


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


# --- real processes: what an operator's shell sees ---------------------------------------

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "durabilis"


def durabilis_cli(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    """``durabilis ARGS`` in a fresh process (the console script)."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DURABILIS_NAMESPACE")}
    env.pop("DURABILIS_REDIS_URL", None)
    if url is not None:
        env["DURABILIS_REDIS_URL"] = url
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT, check=False)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("--url", "redis://localhost:99999", "dlq", "ls"), "bad port '99999'"),
        (("--url", "redis://[::1", "dlq", "ls"), "unclosed '['"),
        (("dlq", "ls", "--url", "redis://localhost:6379/?db=x"), "bad query option db='x'"),
        (("dlq", "show", "x", "--url", "redis://localhost:6379/x"), "bad db 'x'"),
        (("dlq", "stats", "--url", "redis://h:1?bogus=1"), "unknown query option 'bogus'"),
        (("dlq", "ls", "--url", "http://localhost:6379"), "unknown scheme"),
        (("breaker", "ls", "--url", "redis+cluster://a:1,b:x"), "bad port 'x'"),
        (("stats", "--url", "redis+cluster://a:1/3"), "only database 0"),
        (("doctor", "--url", "redis+sentinel://a:1/svc/x"), "bad db 'x'"),
        (("checkpoint", "ls", "t", "a", "--url", "redis+sentinel://[::1/svc"), "unclosed '['"),
        (("--url", "redis://h:1\nstatus  abandoned", "dlq", "ls"), "control character"),
        (("--url", "redis://localhost:99999", "demo"), "bad port '99999'"),
        (("demo", "--workers", "0"), "argument --workers: must be >= 1"),
        (("demo", "--workers", "100000"), "argument --workers: at most 64"),
        (("dlq", "ls", "--limit", "x"), "argument --limit: invalid int value: 'x'"),
        (("dlq", "ls", "--timeout", "soon"), "argument --timeout: invalid float value"),
        (("dlq", "ls", "--status", "lost"), "argument --status: invalid choice: 'lost'"),
        (("dlq", "ls", "--url", ""), "--url is empty"),
        (("dlq", "ls", "--namespace", ""), "--namespace is empty"),
        (("dlq", "ls", "--bogus", "a\nb"), "unrecognized arguments: --bogus a\\nb"),
        (("dlq", "ls", "--timeout", "1e300"), "--timeout must be a finite number > 0"),
        (("doctor", "--pings", "99999999999999999999"), "--pings must be at most"),
    ],
)
def test_a_malformed_url_or_option_is_one_usage_line_and_exit_2(
    args: tuple[str, ...], problem: str
) -> None:
    args = tuple(a.replace("\\n", "\n") for a in args)  # a real newline in the value
    done = durabilis_cli(*args)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr  # one line naming the problem
    assert problem in done.stderr, done.stderr


FORGING = {
    "agent_id": "agent-1\nstatus            abandoned",
    "operation_type": "job\r\x1b[2Kstatus  replayed\x1b[0m",
    "last_error": "NETWORK_TIMEOUT: boom\r\nabandoned_by      mallory\x1b]0;pwned\x07 \\n",
}


def test_newlines_and_escapes_in_stored_fields_cannot_forge_cli_lines(
    store: durabilis.Store, redis_url: str, namespace: str
) -> None:
    dlq = DeadLetterQueue(store)
    dlq_id = dlq.enqueue(FORGING["agent_id"], FORGING["operation_type"], {"line": "a\nb"}, 1,
                         FORGING["last_error"])
    where = ("--namespace", namespace, "--show-errors")

    shown = durabilis_cli("dlq", "show", dlq_id, *where, url=redis_url)
    assert shown.returncode == EXIT_OK, shown.stderr
    fields = shown.stdout.split("metadata:\n")[0].splitlines()
    names = [line.split()[0] for line in fields]
    assert len(names) == len(set(names))  # exactly one line per field: none forged
    assert {"status", "agent_id", "operation_type", "last_error", "abandoned_by"} <= set(names)
    by_name = {line.split()[0]: line.split(None, 1)[1] for line in fields}
    assert by_name["status"] == "pending"
    assert by_name["abandoned_by"] == "-"
    assert by_name["agent_id"] == "agent-1\\nstatus            abandoned"
    assert by_name["operation_type"] == "job\\r\\x1b[2Kstatus  replayed\\x1b[0m"
    assert by_name["last_error"] == (
        "NETWORK_TIMEOUT: boom\\r\\nabandoned_by      mallory\\x1b]0;pwned\\x07 \\\\n"
    )
    for raw in ("\r", "\x1b", "\x07"):
        assert raw not in shown.stdout

    listed = durabilis_cli("dlq", "ls", *where, url=redis_url)
    assert listed.returncode == EXIT_OK, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.startswith("DLQ_ID") and len(rows) == 1  # one record, one line
    assert rows[0].startswith(dlq_id) and "\\nstatus" in rows[0] and "\r" not in rows[0]

    for args in (("dlq", "show", dlq_id), ("dlq", "ls")):
        as_json = durabilis_cli(*args, *where, "--json", url=redis_url)
        assert as_json.returncode == EXIT_OK, as_json.stderr
        doc = json.loads(as_json.stdout)
        record = doc if "dlq_id" in doc else doc["records"][0]
        for field, value in FORGING.items():
            assert record[field] == value  # JSON round-trips the real values
