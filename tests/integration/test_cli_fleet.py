"""The CLI at fleet scale: the Redis, namespace and config found like the
library finds them (environment, then flags), a wrong namespace named instead
of an empty answer (exit 5), quiet replays, a progress line only on a
terminal, error types kept when texts are redacted, and ``idem show`` pointing
to the DLQ record of an operation that has no idempotency record any more."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import durabilis
from durabilis import OperationError
from durabilis.cli import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WRONG_NAMESPACE,
    describe_error,
    describe_error_text,
    main,
    replay_progress_text,
)
from durabilis.config import load_config
from durabilis.dlq import ReplaySummary
from durabilis.doctor import (
    FAIL,
    INFO,
    NamespaceSurvey,
    check_namespace,
    namespace_of,
    survey_namespaces,
)
from durabilis.events import configure_logging, redaction_enabled
from durabilis.layer import DurabilityLayer, OperationContext
from durabilis.testing import RedisServer, instant_retries, isolated_namespace
from tests.integration import _cli_handlers
from tests.integration._cli_support import fleet_toml, run_cli
from tests.integration._layer_workers import die_inside

ROOT = Path(__file__).resolve().parents[2]
HANDLER = "tests.integration._cli_handlers:"

FLEET_TOML = fleet_toml(lease=0.5, breaker="""
failure_rate_threshold = 0.99
min_request_count = 50
window_size = 100
""")

OTHER_TOML = """
[circuit_breaker]
include_defaults = false

[circuit_breaker.other_dep]
failure_rate_threshold = 0.5
"""


@pytest.fixture(autouse=True)
def _no_cli_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the variables it is about (the runner's own must not leak in)."""
    for name in ("DURABILIS_REDIS_URL", "REDIS_URL", "DURABILIS_NAMESPACE", "DURABILIS_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fleet_toml(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(textwrap.dedent(FLEET_TOML), encoding="utf-8")
    return path


@pytest.fixture
def layer(store: durabilis.Store, fleet_toml: Path) -> Iterator[DurabilityLayer]:
    made = DurabilityLayer(store, load_config(fleet_toml, environ={}))
    yield made
    made.close()


@pytest.fixture
def redaction() -> Iterator[None]:
    """Error texts redacted (the default), whatever the runner's DURABILIS_LOG_REDACT."""
    before = redaction_enabled()
    configure_logging(redact=True)
    yield
    configure_logging(redact=before)


run = run_cli


def park(layer: DurabilityLayer, payload: Any) -> str:
    """An operation that times out until it is parked; returns its DLQ id."""

    def down(ctx: OperationContext) -> None:
        raise OperationError("NETWORK_TIMEOUT", "upstream timed out")

    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as info:
        layer.execute("agent-1", "job", payload, down)
    assert info.value.dlq_id is not None
    return info.value.dlq_id


# --- where the Redis, the namespace and the config come from --------------------------


def test_durabilis_namespace_is_honoured_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    redis_url: str, namespace: str, layer: DurabilityLayer, fleet_toml: Path,
) -> None:
    dlq_id = park(layer, {"page": 1})
    monkeypatch.setenv("DURABILIS_REDIS_URL", redis_url)
    monkeypatch.setenv("DURABILIS_NAMESPACE", namespace)
    code, out, err = run(capsys, "dlq", "ls", "--json")  # no --url, no --namespace
    assert code == EXIT_OK, err
    assert [r["dlq_id"] for r in json.loads(out)["records"]] == [dlq_id]

    code, out, _ = run(capsys, "doctor", "--json", "--pings", "1", "--allow-warnings")
    assert json.loads(out)["namespace"] == namespace
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["namespace"]["status"] == "ok"

    # The flag wins over the variable.
    monkeypatch.setenv("DURABILIS_NAMESPACE", isolated_namespace())
    code, out, err = run(capsys, "--namespace", namespace, "dlq", "stats", "--json")
    assert code == EXIT_OK, err
    assert json.loads(out)["by_status"]["pending"] == 1

    monkeypatch.setenv("DURABILIS_NAMESPACE", "not:valid")
    code, _, err = run(capsys, "dlq", "ls")
    assert code == EXIT_USAGE and "$DURABILIS_NAMESPACE" in err


@pytest.mark.topologies("cluster", "sentinel")  # the connect path per URL scheme
def test_the_console_script_finds_everything_in_the_environment(
    redis_url: str, namespace: str, layer: DurabilityLayer, fleet_toml: Path
) -> None:
    dlq_id = park(layer, {"page": "env"})
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL",)}
    env.update(DURABILIS_REDIS_URL=redis_url, DURABILIS_NAMESPACE=namespace,
               DURABILIS_CONFIG=str(fleet_toml))
    script = Path(sys.executable).parent / "durabilis"
    shown = subprocess.run([str(script), "breaker", "show", "svc", "--json"], env=env,
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["config"]["min_request_count"] == 50  # from the TOML
    listed = subprocess.run([str(script), "dlq", "ls", "--json"], env=env,
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    assert [r["dlq_id"] for r in json.loads(listed.stdout)["records"]] == [dlq_id]


def test_durabilis_config_is_honoured_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    redis_url: str, namespace: str, store: durabilis.Store, fleet_toml: Path,
) -> None:
    # not empty
    durabilis.checkpoint.CheckpointManager(store).save("task", "agent", "draft", {"n": 1})
    base = ["--url", redis_url, "--namespace", namespace]
    monkeypatch.setenv("DURABILIS_CONFIG", str(fleet_toml))

    code, out, err = run(capsys, "breaker", "ls", "--json", *base)
    assert code == EXIT_OK, err
    by_name = {b["name"]: b for b in json.loads(out)["breakers"]}
    assert by_name["svc"]["configured"] is True
    assert by_name["svc"]["config"]["failure_rate_threshold"] == 0.99

    code, out, err = run(capsys, "config", "check", "--json")  # no FILE: $DURABILIS_CONFIG
    assert code == EXIT_OK, err
    assert set(json.loads(out)["config"]["circuit_breaker"]) >= {"svc"}

    other = tmp_path / "other.toml"
    other.write_text(textwrap.dedent(OTHER_TOML), encoding="utf-8")
    code, out, _ = run(capsys, "breaker", "ls", "--json", "--config", str(other), *base)
    names = {b["name"] for b in json.loads(out)["breakers"] if b["configured"]}
    assert "other_dep" in names and "svc" not in names

    monkeypatch.setenv("DURABILIS_CONFIG", str(tmp_path / "missing.toml"))
    code, _, err = run(capsys, "dlq", "ls", *base)
    assert code == EXIT_USAGE and "$DURABILIS_CONFIG" in err and "missing.toml" in err
    monkeypatch.delenv("DURABILIS_CONFIG")
    code, _, err = run(capsys, "config", "check")
    assert code == EXIT_USAGE and "DURABILIS_CONFIG" in err


def test_help_documents_the_resolution_order_and_every_exit_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for word in ("DURABILIS_REDIS_URL", "DURABILIS_NAMESPACE", "DURABILIS_CONFIG",
                 "a flag wins over the environment", "5 wrong or empty namespace",
                 "6 dlq replay: records deferred"):
        assert word in text, word
    doc = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    codes = doc.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert [line.split("|")[1].strip() for line in codes.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()] == [
        "0", "1", "2", "3", "4", "5", "6",
    ]
    assert "DURABILIS_NAMESPACE" in doc and "DURABILIS_CONFIG" in doc


# --- a wrong or empty namespace -------------------------------------------------------


def test_an_empty_namespace_among_others_exits_5_and_names_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    private_redis: RedisServer, namespace: str, fleet_toml: Path,
) -> None:
    # A Redis of its own: on the shared one, hundreds of test namespaces would be
    # named before this one (the list is bounded).
    redis_url = private_redis.url
    with durabilis.connect(redis_url, namespace=namespace) as store:
        own = DurabilityLayer(store, load_config(fleet_toml, environ={}))
        park(own, {"page": 1})  # this test's namespace exists: the empty one is not alone
        own.close()
    empty = isolated_namespace()
    for args in (["dlq", "ls"], ["dlq", "ls", "--json"], ["dlq", "stats", "--json"],
                 ["dlq", "show", "0" * 32], ["breaker", "ls"], ["breaker", "show", "svc"],
                 ["stats"], ["idem", "show", "order-1"], ["checkpoint", "ls", "t", "a"]):
        code, out, err = run(capsys, *args, "--url", redis_url, "--namespace", empty)
        assert code == EXIT_WRONG_NAMESPACE, (args, err)
        assert out == "", args  # nothing that looks like an (empty) answer
        assert f"namespace {empty!r} holds no key" in err and namespace in err, args

    monkeypatch.setenv("DURABILIS_NAMESPACE", empty)
    code, _, err = run(capsys, "dlq", "ls", "--url", redis_url)
    assert code == EXIT_WRONG_NAMESPACE and "from $DURABILIS_NAMESPACE" in err

    # doctor: a failed check naming the namespaces found (exit 1, as any failed check).
    code, out, _ = run(capsys, "doctor", "--url", redis_url, "--json", "--pings", "1")
    assert code == EXIT_NOT_FOUND
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "namespace")
    assert check["status"] == FAIL and namespace in check["details"]["others"]
    assert namespace in check["summary"]

    # Commands that create state, or sweep it, do not ask.
    code, out, _ = run(capsys, "recover", "--url", redis_url, "--json")
    assert code == EXIT_OK and json.loads(out)["recovered"] == 0


def test_an_empty_namespace_in_an_empty_redis_is_just_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        code, out, _ = run(capsys, "dlq", "ls", "--url", server.url)
        assert code == EXIT_OK and out.strip() == "no DLQ records"
        code, out, _ = run(capsys, "doctor", "--url", server.url, "--json", "--pings", "1")
        check = next(c for c in json.loads(out)["checks"] if c["name"] == "namespace")
        assert check["status"] == INFO
        client = redis.Redis.from_url(server.url)
        client.set("cache:user:1", "not durabilis")  # a foreign key is not a namespace
        client.close()
        code, out, _ = run(capsys, "dlq", "ls", "--url", server.url)
        assert code == EXIT_OK and out.strip() == "no DLQ records"
    finally:
        server.stop()


def test_the_namespace_survey_is_bounded_and_says_at_least(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        client = redis.Redis.from_url(server.url)
        for i in range(40):
            client.set(f"ns{i % 4}:idem:{{k{i}}}", "1")
        client.close()
        with durabilis.connect(server.url, namespace="wanted") as store:
            whole = survey_namespaces(store)
            assert whole.wrong and not whole.truncated and whole.scanned == 40
            assert whole.others == ("ns0", "ns1", "ns2", "ns3")
            assert whole.found_text() == "ns0, ns1, ns2, ns3"
            part = survey_namespaces(store, limit=10)
            assert part.truncated and part.scanned == 10 and part.empty
            assert part.certain and part.wrong  # its own keys were searched for: none
            assert part.found_text().startswith("at least ")
            assert "stopped after 10 keys" in part.found_text()
        with durabilis.connect(server.url, namespace="ns2") as store:
            assert not survey_namespaces(store).empty
            # Past the bound, the namespace's own keys are still looked for (a big,
            # shared Redis must not make a busy namespace look empty).
            assert not survey_namespaces(store, limit=1, probe=False).empty
    finally:
        server.stop()


def test_namespace_markers_and_the_check_rules() -> None:
    assert namespace_of("prod:dlq:{dlq}:stream") == "prod"
    assert namespace_of("prod:layer:{layer}:stats") == "prod"
    assert namespace_of("a.b-c_1:cb-names") == "a.b-c_1"
    assert namespace_of("prod:idem:{agent:op:abc}") == "prod"
    assert namespace_of("prod:ckpt:{ckpt}:live") == "prod"
    assert namespace_of("prod:config:{config}:fleet") == "prod"
    assert namespace_of("prod:cb:{wiki}:window") == "prod"
    for foreign in ("cache:user:1", "prod:cb-names:extra", "plain", "bad ns:cb-names",
                    ":cb-names", "prod:idem:nobrace"):
        assert namespace_of(foreign) is None, foreign
    assert check_namespace(NamespaceSurvey("x", empty=False)).status == "ok"
    assert check_namespace(NamespaceSurvey("x", True, (), 5)).status == INFO
    wrong = check_namespace(NamespaceSurvey("x", True, ("prod",), 5))
    assert wrong.status == FAIL and "prod" in wrong.summary
    many = NamespaceSurvey("x", True, tuple(f"n{i:02}" for i in range(25)), 99, True)
    assert many.found_text(shown=3) == (
        "at least n00, n01, n02, ... (22 more) (stopped after 99 keys)"
    )


# --- replays: --quiet, progress, errors -------------------------------------------------


def test_replay_all_quiet_prints_only_the_summary_line(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str,
    layer: DurabilityLayer, fleet_toml: Path, redaction: None,
) -> None:
    ids = [park(layer, {"page": i}) for i in range(3)]
    base = ["--url", redis_url, "--namespace", namespace, "--config", str(fleet_toml)]
    code, out, _ = run(capsys, "dlq", "replay", "--all", "--handler", HANDLER + "fail", *base)
    assert code == EXIT_NOT_FOUND
    lines = out.splitlines()
    assert lines[0] == "replayed 0, failed 3, skipped 0, claim lost 0, deferred 0"
    # The layer's retries gave up again: durabilis's own text, with the error code, is whole.
    exhausted = "RetryExhausted: job: gave up after 2 attempt(s), last error NETWORK_TIMEOUT"
    assert sorted(lines[1:]) == sorted(f"failed: {i}: {exhausted}; dlq_id=None" for i in ids)

    code, out, _ = run(capsys, "dlq", "replay", "--all", "--quiet", "--handler",
                       HANDLER + "fail", *base)
    assert code == EXIT_NOT_FOUND
    assert out == "replayed 0, failed 3, skipped 0, claim lost 0, deferred 0\n"

    # --json is one document with or without --quiet.
    code, out, _ = run(capsys, "dlq", "replay", "--all", "--quiet", "--json", "--handler",
                       HANDLER + "fail", *base)
    quiet = json.loads(out)
    code, out, _ = run(capsys, "dlq", "replay", "--all", "--json", "--handler",
                       HANDLER + "fail", *base)
    loud = json.loads(out)
    assert set(quiet) == set(loud) and quiet["failed"] == loud["failed"] == 3
    assert set(quiet["errors"]) == set(ids)
    assert all(e.startswith(exhausted) for e in quiet["errors"].values())

    # The breaker is open after so many failures: close it, then replay for real.
    assert main(["breaker", "close", "svc", *base]) == EXIT_OK
    code, out, err = run(capsys, "dlq", "replay", "--all", "-q", "--handler",
                         HANDLER + "record", *base)
    assert code == EXIT_OK and out == "replayed 3, failed 0, skipped 0, claim lost 0, deferred 0\n"
    assert "durability_dlq_replayed" not in err  # no line per record


def test_replay_all_draws_a_progress_line_only_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    redis_url: str, namespace: str, layer: DurabilityLayer, fleet_toml: Path,
) -> None:
    ids = [park(layer, {"page": i}) for i in range(4)]
    base = ["--url", redis_url, "--namespace", namespace, "--config", str(fleet_toml)]

    # Not a terminal (a pipe, a file, a CI log): never a \r.
    code, out, err = run(capsys, "dlq", "replay", "--all", "--limit", "1", "--handler",
                         HANDLER + "record", *base)
    assert code == EXIT_OK and "\r" not in err and "\r" not in out

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main(["dlq", "replay", "--all", "--limit", "1", "-q", "--handler",
                 HANDLER + "record", *base]) == EXIT_OK
    assert "\r" not in quiet.getvalue()  # --quiet: no progress either

    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["dlq", "replay", "--all", "--handler", HANDLER + "record", *base]) == EXIT_OK
    monkeypatch.undo()
    drawn = tty.getvalue()
    assert "\rreplayed 1/2: 1 ok, 0 failed" in drawn
    assert drawn.rstrip(" ").endswith("\r")  # cleared at the end: nothing left on the line
    assert "replayed 2, failed 0" in capsys.readouterr().out
    assert len(ids) == 4


def test_progress_text() -> None:
    summary = ReplaySummary(replayed=117, failed=3)
    assert replay_progress_text(120, 237, summary) == "replayed 120/237: 117 ok, 3 failed"
    both = ReplaySummary(replayed=1, failed=0, skipped=2, lost=1)
    assert replay_progress_text(4, 3, both) == (
        "replayed 4/4: 1 ok, 0 failed, 2 skipped, 1 claim lost"
    )


def test_a_failed_replay_keeps_the_error_type_when_its_text_is_redacted(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str,
    layer: DurabilityLayer, fleet_toml: Path, redaction: None,
) -> None:
    dlq_id = park(layer, {"page": "secret"})
    base = ["--url", redis_url, "--namespace", namespace, "--config", str(fleet_toml)]
    code, out, err = run(capsys, "dlq", "replay", dlq_id, "--handler", HANDLER + "reject",
                         *base)
    assert code == EXIT_NOT_FOUND
    assert out == f"{dlq_id}: failed: ValueError: [REDACTED]\n"
    assert _cli_handlers.SECRET not in out + err

    code, out, _ = run(capsys, "dlq", "replay", dlq_id, "--json", "--handler",
                       HANDLER + "reject", *base)
    doc = json.loads(out)
    assert doc["outcome"] == "failed" and doc["error"] == "ValueError: [REDACTED]"

    configure_logging(redact=False)
    code, out, _ = run(capsys, "dlq", "replay", dlq_id, "--handler", HANDLER + "reject",
                       *base)
    assert out == f"{dlq_id}: failed: ValueError: the service rejected {_cli_handlers.SECRET}\n"
    # The stored record keeps the full text whatever the switch says.
    code, out, _ = run(capsys, "dlq", "show", dlq_id, "--json", *base)
    assert _cli_handlers.SECRET in json.loads(out)["last_error"]


def test_error_descriptions_keep_the_type(redaction: None) -> None:
    assert describe_error(TimeoutError()) == "TimeoutError"
    assert describe_error(TimeoutError("db at redis://u:pw@h")) == "TimeoutError: [REDACTED]"
    assert describe_error(KeyError("k"), redacted=False) == "KeyError: 'k'"
    assert describe_error_text("NETWORK_TIMEOUT: upstream said no") == (
        "NETWORK_TIMEOUT: [REDACTED]"
    )
    assert describe_error_text("NETWORK_TIMEOUT: ") == "NETWORK_TIMEOUT"
    assert describe_error_text("WORKER_LOST") == "WORKER_LOST"
    assert describe_error_text("ValueError: bad\nvalue") == "ValueError: [REDACTED]"
    assert describe_error_text("no code here") == "[REDACTED]"
    assert describe_error_text(None) is None
    own = "RetryExhausted: job: gave up after 3 attempt(s), last error RATE_LIMITED; dlq_id=None"
    assert describe_error_text(own) == own  # names, counts and codes only: never redacted
    configure_logging(redact=False)
    assert describe_error_text("NETWORK_TIMEOUT: upstream said no") == (
        "NETWORK_TIMEOUT: upstream said no"
    )


def test_replay_rejects_a_bad_limit_or_rate(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str
) -> None:
    for extra in (["--limit", "-1"], ["--max-per-second", "0"], ["--max-per-second", "nan"]):
        code, _, err = run(capsys, "dlq", "replay", "--all", "--handler", HANDLER + "record",
                           "--url", redis_url, "--namespace", namespace, *extra)
        assert code == EXIT_USAGE and err.startswith("durabilis: "), extra


# --- idem show: where the operation went ------------------------------------------------


def test_idem_show_points_to_the_dlq_record_of_an_exhausted_operation(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str,
    layer: DurabilityLayer, fleet_toml: Path,
) -> None:
    dlq_id = park(layer, {"page": 9})
    key = str(durabilis.IdempotencyKey.new("agent-1", "job", {"page": 9}))
    base = ["--url", redis_url, "--namespace", namespace, "--config", str(fleet_toml)]
    code, out, err = run(capsys, "idem", "show", key, "--json", *base)
    assert code == EXIT_OK, err
    doc = json.loads(out)
    assert doc["status"] == "in_dlq" and doc["truncated"] is False
    (record,) = doc["dlq_records"]
    assert record["dlq_id"] == dlq_id and record["status"] == "pending"
    assert record["last_error"].startswith("NETWORK_TIMEOUT")

    code, out, _ = run(capsys, "idem", "show", key, *base)
    assert code == EXIT_OK and "the operation is in the DLQ" in out and dlq_id in out

    # Abandoned: still found (every live record is looked at, not only pending ones).
    assert main(["dlq", "abandon", dlq_id, *base]) == EXIT_OK
    code, out, _ = run(capsys, "idem", "show", key, "--json", *base)
    assert code == EXIT_OK and json.loads(out)["dlq_records"][0]["status"] == "abandoned"

    code, _, err = run(capsys, "idem", "show", "never-seen", *base)
    assert code == EXIT_NOT_FOUND and "no DLQ record carries that key" in err


def test_idem_show_points_to_the_dlq_record_of_a_dead_workers_operation(
    capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=die_inside, args=(redis_url, namespace, started))
    proc.start()
    assert started.wait(30)
    proc.kill()
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    time.sleep(0.8)  # its lease (0.5 s) runs out
    base = ["--url", redis_url, "--namespace", namespace]
    code, out, _ = run(capsys, "recover", "--json", *base)
    (dlq_id,) = json.loads(out)["dlq_ids"]
    code, out, _ = run(capsys, "dlq", "show", dlq_id, "--json", *base)
    key = json.loads(out)["metadata"]["idempotency_key"]

    code, out, err = run(capsys, "idem", "show", key, "--json", *base)
    assert code == EXIT_OK, err
    (record,) = json.loads(out)["dlq_records"]
    assert (record["dlq_id"], record["status"], record["last_error"]) == (
        dlq_id, "pending", "WORKER_LOST",
    )


# --- a slow recovery is said out loud ----------------------------------------------------


def test_a_lease_that_makes_recovery_slow_is_reported_by_config_check_and_doctor(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, redis_url: str, namespace: str,
    layer: DurabilityLayer,
) -> None:
    park(layer, {"page": 1})  # the namespace holds something: doctor's namespace check is ok
    slow = tmp_path / "slow.toml"
    slow.write_text("[idempotency]\nin_progress_ttl_seconds = 300\n", encoding="utf-8")
    code, out, _ = run(capsys, "config", "check", str(slow), "--json")
    assert code == EXIT_OK
    [warning] = json.loads(out)["warnings"]
    assert "300 s" in warning and "recover_orphans" in warning
    code, out, _ = run(capsys, "config", "check", str(slow))
    assert "warning: idempotency.in_progress_ttl_seconds is 300 s" in out
    code, out, _ = run(capsys, "doctor", "--url", redis_url, "--namespace", namespace,
                       "--config", str(slow), "--json", "--pings", "1")
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "config")
    assert check["status"] == "warn" and "300 s" in check["summary"]
    fine = tmp_path / "fine.toml"
    fine.write_text("[idempotency]\ndedup_window_seconds = 7200\n", encoding="utf-8")
    code, out, _ = run(capsys, "config", "check", str(fine), "--json")
    assert code == EXIT_OK and json.loads(out)["warnings"] == []
    assert json.loads(out)["config"]["idempotency"]["in_progress_ttl_seconds"] == 30
