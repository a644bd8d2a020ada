"""The ``durabilis`` CLI against a real Redis: every subcommand, its ``--json``
output parsed, its exit code, and a DLQ replay through ``--handler``."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

import durabilis
from durabilis import CircuitBreakerConfig, OperationError
from durabilis.breaker import CircuitBreakerRegistry
from durabilis.cli import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    main,
)
from durabilis.config import config_to_dict, load_config
from durabilis.layer import DurabilityLayer, OperationContext
from durabilis.testing import free_port, instant_retries
from tests.integration import _cli_handlers
from tests.integration._cli_support import fleet_toml
from tests.integration._layer_workers import die_inside

pytestmark = pytest.mark.topologies("cluster")

ROOT = Path(__file__).resolve().parents[2]

FLEET_TOML = fleet_toml(
    lease=0.5,
    breaker="""
failure_rate_threshold = 0.99
min_request_count = 10
reset_timeout_seconds = 1
probe_success_required = 1
window_size = 20
probe_timeout_seconds = 1
""",
    retry_extra="""
[retry.other]
max_attempts = 1
initial_delay_ms = 1
max_delay_ms = 1
""",
)

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def fleet_toml(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(textwrap.dedent(FLEET_TOML), encoding="utf-8")
    return path


@pytest.fixture
def cli(
    redis_url: str, namespace: str, fleet_toml: Path, capsys: pytest.CaptureFixture[str]
) -> Run:
    """``cli("dlq", "ls", "--json")`` -> ``(exit code, stdout, stderr)`` on the test's namespace."""

    def run(*args: str, config: bool = True) -> tuple[int, str, str]:
        extra = ["--url", redis_url, "--namespace", namespace]
        if config:
            extra += ["--config", str(fleet_toml)]
        capsys.readouterr()  # what the test itself logged while seeding
        code = main([*args, *extra])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def js(result: tuple[int, str, str], expected: int = EXIT_OK) -> Any:
    code, out, err = result
    assert code == expected, err
    return json.loads(out)


@pytest.fixture
def layer(store: durabilis.Store, fleet_toml: Path) -> Any:
    made = DurabilityLayer(store, load_config(fleet_toml, environ={}))
    yield made
    made.close()


def declared_breakers(path: Path | None) -> set[str]:
    """The breakers a config file (``None``: the defaults) declares, as ``config check`` shows."""
    table = config_to_dict(load_config(path, environ={}))["circuit_breaker"]
    return {name for name, value in table.items() if isinstance(value, dict)}


def park(layer: Any, payload: Any, operation_type: str = "job") -> str:
    """Run an operation that always times out until it is parked; returns its DLQ id."""

    def down(ctx: OperationContext) -> None:
        raise OperationError("NETWORK_TIMEOUT", "upstream timed out")

    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as info:
        layer.execute("agent-1", operation_type, payload, down)
    assert info.value.dlq_id is not None
    return info.value.dlq_id


# --- dlq -------------------------------------------------------------------------------


@pytest.mark.topologies("cluster", "sentinel")  # the connect path per URL scheme
def test_dlq_ls_show_abandon_stats_and_cleanup(cli: Run, layer: Any) -> None:
    ids = [park(layer, {"page": i}) for i in range(3)]
    other = park(layer, {"mail": 1}, "other")

    listing = js(cli("dlq", "ls", "--json"))
    assert [r["dlq_id"] for r in listing["records"]] == [*ids, other]  # oldest first
    assert listing["count"] == 4 and listing["pending_count"] == 4
    first = listing["records"][0]
    assert first["status"] == "pending" and first["operation_type"] == "job"
    assert first["agent_id"] == "agent-1" and first["retry_count"] == 2
    # Stored error texts are redacted after their code, as the events are ...
    assert first["last_error"] == "NETWORK_TIMEOUT: [REDACTED]"
    assert first["parkings"] == 1
    # ... and shown in clear when asked.
    clear = js(cli("dlq", "ls", "--json", "--show-errors"))["records"][0]
    assert clear["last_error"] == "NETWORK_TIMEOUT: upstream timed out"
    assert first["failed_at"].endswith("Z") and "original_operation" not in first

    only = js(cli("dlq", "ls", "--operation-type", "other", "--json"))
    assert [r["dlq_id"] for r in only["records"]] == [other]
    page = js(cli("dlq", "ls", "--limit", "2", "--json"))["records"]
    rest = js(cli("dlq", "ls", "--after", page[-1]["dlq_id"], "--json"))["records"]
    assert [r["dlq_id"] for r in page + rest] == [*ids, other]
    assert cli("dlq", "ls", "--after", "no-such-record")[0] == EXIT_NOT_FOUND

    shown = js(cli("dlq", "show", ids[1], "--json"))
    assert shown["original_operation"] == {"page": 1}
    key = durabilis.IdempotencyKey.new("agent-1", "job", {"page": 1})
    assert shown["metadata"]["idempotency_key"] == str(key)
    code, _, err = cli("dlq", "show", "f" * 32)
    assert code == EXIT_NOT_FOUND and "no live DLQ record" in err

    assert js(cli("dlq", "abandon", ids[0], "--by", "alice", "--json")) == {
        "dlq_id": ids[0], "abandoned": True,
    }
    assert cli("dlq", "abandon", ids[0])[0] == EXIT_NOT_FOUND  # already final
    abandoned = js(cli("dlq", "ls", "--status", "abandoned", "--json"))["records"]
    assert [(r["dlq_id"], r["abandoned_by"]) for r in abandoned] == [(ids[0], "alice")]
    assert len(js(cli("dlq", "ls", "--status", "all", "--json"))["records"]) == 4

    stats = js(cli("dlq", "stats", "--json"))
    assert stats["total"] == 4
    assert stats["by_status"] == {"pending": 3, "replayed": 0, "abandoned": 1}
    assert stats["by_operation_type"]["job"]["abandoned"] == 1
    assert stats["over_max_pending"] is False and stats["oldest_pending_at"].endswith("Z")

    layer.dlq.enqueue("agent-1", "job", {"brief": True}, 1, "X", ttl_seconds=0.05)
    time.sleep(0.1)
    assert js(cli("dlq", "cleanup", "--json")) == {"removed": 1}
    assert js(cli("dlq", "cleanup", "--json")) == {"removed": 0}


def test_an_in_process_run_leaves_the_application_s_logging_as_it_was(
    cli: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    """Left "configured" with structlog's defaults, every later durabilis event of
    the process (a keep-alive's warning) was printed to stdout, not to the
    application's "durabilis" logger (into the JSON of the next command)."""
    import logging

    import structlog

    from durabilis._log import get_logger

    structlog.reset_defaults()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep()
    logging.getLogger("durabilis").addHandler(handler)
    try:
        cli("dlq", "ls", "--json")  # (whatever its exit code)
        assert not structlog.is_configured()
        capsys.readouterr()
        get_logger().warning("durability_counts_not_sent", error="after the command")
        assert capsys.readouterr().out == ""
        assert any("durability_counts_not_sent" in m for m in seen)
    finally:
        logging.getLogger("durabilis").removeHandler(handler)


def test_dlq_ls_prints_an_aligned_table_for_humans(cli: Run, layer: Any) -> None:
    for i in range(2):
        park(layer, {"page": i})
    code, out, _ = cli("dlq", "ls")
    assert code == EXIT_OK
    header, *rows = out.splitlines()
    assert header.split() == ["DLQ_ID", "STATUS", "OPERATION_TYPE", "AGENT", "RETRIES",
                              "REPLAYS", "REQUEUED", "FAILED_AT", "LAST_ERROR"]
    assert len(rows) == 2
    for column in ("STATUS", "OPERATION_TYPE", "AGENT", "RETRIES"):
        at = header.index(column)
        assert all(row[at - 2:at] == "  " and row[at] != " " for row in rows), column
    assert cli("dlq", "ls", "--status", "abandoned")[1].strip() == "no DLQ records"


def test_dlq_replay_by_handler_runs_through_the_layer_with_the_original_key(
    cli: Run, layer: Any
) -> None:
    dlq_id = park(layer, {"page": 7})
    key = durabilis.IdempotencyKey.new("agent-1", "job", {"page": 7})
    _cli_handlers.CALLS.clear()

    handler = "tests.integration._cli_handlers:record"
    result = js(cli("dlq", "replay", dlq_id, "--handler", handler, "--json"))
    assert result["outcome"] == "replayed" and result["status"] == "replayed"
    (ctx,) = _cli_handlers.CALLS
    assert isinstance(ctx, OperationContext)
    assert ctx.idempotency_key == str(key) and ctx.payload == {"page": 7} and ctx.replay
    # The replay's result was recorded under the ORIGINAL key, by the layer.
    shown = js(cli("idem", "show", str(key), "--json"))
    assert shown["status"] == "done" and shown["result"] == {"replayed": {"page": 7}}

    again = cli("dlq", "replay", dlq_id, "--handler", handler, "--json")
    assert js(again, EXIT_NOT_FOUND)["outcome"] == "not_pending"
    assert len(_cli_handlers.CALLS) == 1


def test_a_replay_of_an_operation_that_completed_meanwhile_does_not_run_it_again(
    cli: Run, layer: Any
) -> None:
    dlq_id = park(layer, {"page": 8})
    assert layer.execute("agent-1", "job", {"page": 8}, lambda ctx: "done by a retry") == (
        "done by a retry"
    )
    # That success settled the parked record: an operator sees it replayed...
    shown = js(cli("dlq", "show", dlq_id, "--json"))
    assert shown["status"] == "replayed" and shown["replayed_by"] == "a later delivery"
    _cli_handlers.CALLS.clear()
    result = js(cli("dlq", "replay", dlq_id, "--handler",
                    "tests.integration._cli_handlers:record", "--json"), EXIT_NOT_FOUND)
    assert result["outcome"] == "not_pending"  # ...and a replay runs nothing
    assert _cli_handlers.CALLS == []


def test_dlq_replay_all_reports_failures_with_exit_1_and_successes_with_0(
    cli: Run, layer: Any
) -> None:
    ids = [park(layer, {"page": i}) for i in range(3)]
    failed = js(cli("dlq", "replay", "--all", "--handler",
                    "tests.integration._cli_handlers:fail", "--json"), EXIT_NOT_FOUND)
    # The failures open the breaker during the pass: what is left is deferred, not
    # failed (no attempt burnt into an open breaker).
    assert failed["failed"] + failed["deferred"] == 3 and failed["failed"] >= 1
    assert sorted(failed["failed_ids"] + failed["deferred_ids"]) == sorted(ids)
    assert failed["breakers_open"] == (["svc"] if failed["deferred"] else [])
    record = js(cli("dlq", "show", ids[0], "--json"))
    assert record["status"] == "pending" and record["replay_attempts"] == 1
    for dlq_id in failed["deferred_ids"]:
        assert js(cli("dlq", "show", dlq_id, "--json"))["replay_attempts"] == 0

    # 12 failures (parking, then replaying) opened the breaker: an operator closes it.
    assert js(cli("breaker", "show", "svc", "--json"))["state"] == "open"
    assert cli("breaker", "close", "svc")[0] == EXIT_OK
    done = js(cli("dlq", "replay", "--all", "--limit", "2", "--handler",
                  "tests.integration._cli_handlers:record", "--json"))
    assert done["replayed"] == 2 and done["failed"] == 0
    assert js(cli("dlq", "stats", "--json"))["by_status"]["pending"] == 1


@pytest.mark.parametrize(
    "args",
    [
        ("dlq", "replay", "--handler", "tests.integration._cli_handlers:record"),  # no id
        ("dlq", "replay", "x", "--all", "--handler", "tests.integration._cli_handlers:record"),
        ("dlq", "replay", "x", "--handler", "tests.integration._cli_handlers"),
        ("dlq", "replay", "x", "--handler", "tests.integration._no_such_module:f"),
        ("dlq", "replay", "x", "--handler", "tests.integration._cli_handlers:nope"),
        ("dlq", "replay", "x", "--handler", "tests.integration._cli_handlers:NOT_CALLABLE"),
        ("dlq", "ls", "--limit", "-1"),
        ("breaker", "events", "svc", "--limit", "0"),
        ("recover", "--limit", "0"),
        ("idem", "show", "k" * 300),
    ],
)
def test_usage_errors_exit_2(cli: Run, args: tuple[str, ...]) -> None:
    code, _, err = cli(*args)
    # main() runs in this process: a background thread of an earlier test's layer
    # (its keep-alive, its server gone) may log into the same capture.
    ours = [line for line in err.splitlines() if line.startswith("durabilis: ")]
    assert code == EXIT_USAGE and len(ours) == 1, err


# --- breakers ---------------------------------------------------------------------------


def test_breaker_ls_show_open_close_and_events(
    cli: Run, store: durabilis.Store, layer: Any
) -> None:
    # "svc" trips through the layer's registry; "legacy" is known only from Redis.
    for _ in range(10):
        permit = layer.breakers.before_call("svc")
        layer.breakers.after_call("svc", False, permit)
    legacy = CircuitBreakerRegistry(store, [CircuitBreakerConfig("legacy")])
    legacy.after_call("legacy", True, legacy.before_call("legacy"))

    listing = js(cli("breaker", "ls", "--json"))
    by_name = {b["name"]: b for b in listing["breakers"]}
    assert set(by_name) == {"svc", "legacy"} and listing["count"] == 2
    assert by_name["svc"]["state"] == "open" and by_name["svc"]["configured"] is True
    assert by_name["svc"]["failure_rate"] == 1.0 and by_name["svc"]["request_count"] == 10
    assert by_name["legacy"]["configured"] is False and by_name["legacy"]["in_redis"] is True
    assert by_name["legacy"]["state"] == "closed"

    shown = js(cli("breaker", "show", "svc", "--json"))
    assert shown["state"] == "open" and shown["call_allowed"] is False
    assert shown["config"]["failure_rate_threshold"] == 0.99
    assert shown["opened_at"].endswith("Z")

    events = js(cli("breaker", "events", "svc", "--json"))
    assert [(e["from_state"], e["to_state"], e["reason"]) for e in events["events"]] == [
        ("closed", "open", "failure_rate"),
    ]
    assert js(cli("breaker", "close", "svc", "--json")) == {"name": "svc", "state": "closed"}
    assert js(cli("breaker", "open", "legacy", "--json")) == {"name": "legacy", "state": "open"}
    assert legacy.state("legacy").value == "open"
    assert [e["reason"] for e in js(cli("breaker", "events", "svc", "--json"))["events"]] == [
        "failure_rate", "forced",
    ]
    code, _, err = cli("breaker", "show", "nope")
    assert code == EXIT_NOT_FOUND and "unknown breaker 'nope'" in err
    assert cli("breaker", "open", "nope")[0] == EXIT_NOT_FOUND

    code, out, _ = cli("breaker", "ls")
    assert code == EXIT_OK and out.splitlines()[0].split()[:3] == ["NAME", "STATE",
                                                                   "FAILURE_RATE"]
    # Without --config the defaults' breakers are the configured ones.
    names = {b["name"] for b in js(cli("breaker", "ls", "--json", config=False))["breakers"]}
    assert names == declared_breakers(None) | {"legacy", "svc"}


# --- checkpoints --------------------------------------------------------------------------


def test_checkpoint_ls_show_and_history(cli: Run, layer: Any) -> None:
    cps = layer.checkpoints
    draft = cps.save("task-1", "agent-1", "draft", {"words": 10})
    review = cps.save("task-1", "agent-1", "review", {"words": 12})
    cps.save("task-1", "agent-2", "draft", {"other": True})
    again = cps.save("task-1", "agent-1", "review", {"words": 13})  # replaces review

    listed = js(cli("checkpoint", "ls", "task-1", "agent-1", "--json"))
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == [
        again.checkpoint_id, draft.checkpoint_id,
    ]
    assert listed["count"] == 2 and "state" not in listed["checkpoints"][0]
    assert listed["checkpoints"][0]["phase"] == "review"

    shown = js(cli("checkpoint", "show", review.checkpoint_id, "--json"))
    assert shown["state"] == {"words": 12} and shown["parent_checkpoint_id"] == (
        draft.checkpoint_id
    )
    history = js(cli("checkpoint", "history", "task-1", "agent-1", "--json"))
    ids = [c["checkpoint_id"] for c in history["checkpoints"]]
    assert ids[0] == again.checkpoint_id and draft.checkpoint_id in ids
    code, _, err = cli("checkpoint", "show", "0" * 32)
    assert code == EXIT_NOT_FOUND and "no live checkpoint" in err
    assert js(cli("checkpoint", "ls", "task-1", "nobody", "--json"))["count"] == 0
    code, out, _ = cli("checkpoint", "ls", "task-1", "agent-1")
    assert code == EXIT_OK and out.splitlines()[0].split()[:2] == ["CHECKPOINT_ID", "PHASE"]


# --- idempotency, recovery, totals ----------------------------------------------------


def test_idem_show_reports_done_and_in_progress_records(
    cli: Run, store: durabilis.Store
) -> None:
    guard = durabilis.idempotency.IdempotencyGuard(store)
    claim = guard.check_and_record("order-1", placeholder="working")
    assert isinstance(claim, durabilis.idempotency.New)
    running = js(cli("idem", "show", "order-1", "--json"))
    assert running["status"] == "in_progress" and running["result"] == "working"
    guard.record("order-1", {"charged": 10, "raw": b"\x00\x01"}, token=claim.token)
    done = js(cli("idem", "show", "order-1", "--json"))
    assert done["status"] == "done" and done["lease_expired"] is False
    assert done["result"] == {"charged": 10, "raw": {"base64": "AAE="}}
    assert done["claimed_at"].endswith("Z") and done["dedup_window_expires_at"].endswith("Z")
    code, _, err = cli("idem", "show", "order-2")
    assert code == EXIT_NOT_FOUND and "no idempotency record" in err


def test_breaker_ls_reads_a_bounded_number_of_names_and_says_when_it_stopped(
    cli: Run, store: durabilis.Store, raw: redis.Redis
) -> None:
    """A namespace whose breaker-names set is large: ``breaker ls --limit N``
    lists at most N of the names found in Redis (beside the configured ones)
    and says the list is cut; ``show`` of any one of them reads that name only."""
    raw.sadd(store.keys.breaker_names(), *[f"dep-{i:02}" for i in range(30)])
    configured = declared_breakers(None)
    listing = js(cli("breaker", "ls", "--json", "--limit", "5", config=False))
    found = {b["name"] for b in listing["breakers"]} - configured
    assert len(found) == 5 and found <= {f"dep-{i:02}" for i in range(30)}
    assert listing["truncated"] is True
    code, out, err = cli("breaker", "ls", "--limit", "5", config=False)
    assert code == EXIT_OK and "--limit" in err and "dep-" in out
    whole = js(cli("breaker", "ls", "--json", config=False))
    assert whole["truncated"] is False
    assert {b["name"] for b in whole["breakers"]} - configured == {f"dep-{i:02}" for i in range(30)}
    shown = js(cli("breaker", "show", "dep-29", "--json", config=False))
    assert shown["in_redis"] is True and shown["configured"] is False
    code, _, err = cli("breaker", "ls", "--limit", "0")
    assert code == EXIT_USAGE and "--limit" in err


def test_a_breaker_name_no_durabilis_process_wrote_is_skipped_with_a_warning(
    cli: Run, store: durabilis.Store, raw: redis.Redis
) -> None:
    CircuitBreakerRegistry(store, [CircuitBreakerConfig("svc")]).before_call("svc")
    raw.sadd(store.keys.breaker_names(), "")
    code, out, err = cli("breaker", "ls", "--json")
    assert code == EXIT_OK, err
    assert "warning: skipping ''" in err
    assert "svc" in {b["name"] for b in json.loads(out)["breakers"]}


def test_foreign_bytes_in_the_keys_idem_show_and_stats_read_never_crash_the_cli(
    cli: Run, store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    # A by-key index entry that is no id durabilis wrote: a miss, not a traceback.
    raw.hset(f"{namespace}:dlq:{{dlq}}:bykey", "order-9", b"\xff\xfe")
    code, _, err = cli("idem", "show", "order-9")
    assert code == EXIT_NOT_FOUND and "Traceback" not in err
    # A field of the layer's counters that is not one of them (another version's,
    # or foreign): skipped; the counters are still read.
    raw.hset(f"{namespace}:layer:{{layer}}:stats", mapping={b"\xff\xfe": b"1", "started": 3})
    assert js(cli("stats", "--json"))["started"] == 3
    raw.hset(f"{namespace}:layer:{{layer}}:stats", "started", "many")  # one of ours: refused
    code, _, err = cli("stats")
    assert code == EXIT_ERROR and "started" in err
    # A by-key index that is not a hash: CorruptData naming it.
    raw.delete(f"{namespace}:dlq:{{dlq}}:bykey")
    raw.set(f"{namespace}:dlq:{{dlq}}:bykey", "x")
    code, _, err = cli("idem", "show", "order-9")
    assert code == EXIT_ERROR and f"{namespace}:dlq:{{dlq}}:bykey" in err


def test_recover_parks_a_dead_workers_operation_and_stats_count_it(
    cli: Run, redis_url: str, namespace: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=die_inside, args=(redis_url, namespace, started))
    proc.start()
    assert started.wait(30)
    assert js(cli("recover", "--json")) == {"recovered": 0, "dlq_ids": []}  # alive
    proc.kill()
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    time.sleep(0.8)  # its lease (0.5 s) runs out

    recovered = js(cli("recover", "--json"))
    assert recovered["recovered"] == 1
    record = js(cli("dlq", "show", recovered["dlq_ids"][0], "--json"))
    assert record["last_error"] == "WORKER_LOST"
    assert record["original_operation"] == {"to": "bob", "text": "hello"}
    stats = js(cli("stats", "--json"))
    assert stats["recovered"] == 1 and stats["parked"] == 1 and stats["in_flight"] == 0


# --- config ---------------------------------------------------------------------------


def test_config_check_publish_show_and_unpublish(
    cli: Run, fleet_toml: Path, tmp_path: Path
) -> None:
    checked = js(cli("config", "check", str(fleet_toml), "--json"))
    assert checked["ok"] is True
    assert set(checked["config"]["retry"]) - {"include_defaults"} == {"job", "other"}
    bad = tmp_path / "bad.toml"
    bad.write_text("[circuit_breaker.svc]\nwindow_size = 0\n", encoding="utf-8")
    failed = js(cli("config", "check", str(bad), "--json"), EXIT_NOT_FOUND)
    assert (failed["path"], failed["section"], failed["field"]) == (
        str(bad), "circuit_breaker.svc", "window_size",
    )
    code = main(["dlq", "stats", "--config", str(bad), "--url", "redis://127.0.0.1:1/0"])
    assert code == EXIT_USAGE  # a bad --config is a usage error, before any Redis call

    assert js(cli("config", "show", "--json"))["version"] == 0
    published = js(cli("config", "publish", str(fleet_toml), "--retry", "job", "--json"))
    assert published == {"published": [{"entry": "retry:job", "version": 1}], "version": 1}
    everything = js(cli("config", "publish", str(fleet_toml), "--json"))
    assert [p["entry"] for p in everything["published"]] == [
        "retry:job", "retry:other", "breaker:svc",
    ]
    fleet = js(cli("config", "show", "--json"))
    assert fleet["version"] == 3 and set(fleet["retry"]) == {"job", "other"}
    assert fleet["circuit_breaker"]["svc"]["failure_rate_threshold"] == 0.99
    assert js(cli("config", "unpublish", "retry", "other", "--json"))["version"] == 4
    assert cli("config", "unpublish", "retry", "other")[0] == EXIT_NOT_FOUND
    assert cli("config", "publish", str(fleet_toml), "--breaker", "nope")[0] == EXIT_USAGE


# --- exit codes and entry points ------------------------------------------------------


def test_redis_unavailable_exits_3_and_foreign_data_exits_4(
    cli: Run, namespace: str, raw: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (("dlq", "ls"), ("breaker", "ls"), ("idem", "show", "k"), ("recover",)):
        code = main([*args, "--url", url, "--timeout", "0.5"])
        assert code == EXIT_UNAVAILABLE, args
        err = capsys.readouterr().err
        # (the CLI's own lines: main() runs in the test process, where another
        # test's layer thread may log too)
        own = [line for line in err.splitlines() if line.startswith("durabilis:")]
        assert len(own) == 1 and "Redis unavailable" in own[0], err
    for timeout in ("inf", "0", "nan"):
        assert main(["dlq", "ls", "--url", url, "--timeout", timeout]) == EXIT_USAGE, timeout
        assert "--timeout must be a finite number" in capsys.readouterr().err

    raw.set(f"{namespace}:dlq:{{dlq}}:counts", "not a hash")
    code, _, err = cli("dlq", "stats")
    assert code == EXIT_ERROR and "CorruptData" in err


def test_argparse_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["dlq", "ls", "--status", "lost"])
    assert info.value.code == EXIT_USAGE
    with pytest.raises(SystemExit) as nothing:
        main([])
    assert nothing.value.code == EXIT_USAGE
    capsys.readouterr()


@pytest.mark.topologies("cluster", "sentinel")  # the connect path per URL scheme
def test_the_console_script_and_python_m_run_the_cli_in_a_fresh_process(
    redis_url: str, namespace: str, layer: Any, fleet_toml: Path, tmp_path: Path
) -> None:
    dlq_id = park(layer, {"page": "sub"})
    log = tmp_path / "handler.jsonl"
    env = {**os.environ, _cli_handlers.LOG_ENV: str(log), "DURABILIS_REDIS_URL": redis_url}
    env.pop("REDIS_URL", None)
    script = Path(sys.executable).parent / "durabilis"
    listed = subprocess.run(
        [str(script), "dlq", "ls", "--json", "--namespace", namespace],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert listed.returncode == 0, listed.stderr
    assert [r["dlq_id"] for r in json.loads(listed.stdout)["records"]] == [dlq_id]

    replayed = subprocess.run(
        [sys.executable, "-m", "durabilis", "dlq", "replay", dlq_id, "--namespace", namespace,
         "--config", str(fleet_toml), "--handler", "tests.integration._cli_handlers:record",
         "--json"],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["outcome"] == "replayed"
    assert "durability_dlq_replayed" in replayed.stderr  # events go to stderr, not stdout
    (call,) = [json.loads(line) for line in log.read_text().splitlines()]
    key = durabilis.IdempotencyKey.new("agent-1", "job", {"page": "sub"})
    assert call == {"type": "OperationContext", "idempotency_key": str(key),
                    "payload": {"page": "sub"}, "replay": True, "agent_id": "agent-1"}

    missing = subprocess.run(
        [str(script), "dlq", "show", "0" * 32, "--namespace", namespace],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert missing.returncode == EXIT_NOT_FOUND and missing.stdout == ""


# --- the public read the CLI's `checkpoint ls` uses -------------------------------------


def test_list_current_returns_the_live_current_checkpoints_newest_first(
    store: durabilis.Store, redis_url: str, namespace: str
) -> None:
    cps = durabilis.checkpoint.CheckpointManager(store)
    a = cps.save("task", "agent-1", "a", 1)
    b = cps.save("task", "agent-1", "b", 2)
    c = cps.save("task", "agent-2", "a", 3)
    b2 = cps.save("task", "agent-1", "b", 4)  # replaces b: only b2 is current
    brief = cps.save("task", "agent-2", "z", 5, ttl_seconds=0.05)
    assert [x.checkpoint_id for x in cps.list_current("task", "agent-1")] == [
        b2.checkpoint_id, a.checkpoint_id,
    ]
    assert [x.checkpoint_id for x in cps.list_current("task")] == [
        brief.checkpoint_id, b2.checkpoint_id, c.checkpoint_id, a.checkpoint_id,
    ]
    time.sleep(0.1)  # the brief one expires: it is not listed any more
    assert [x.checkpoint_id for x in cps.list_current("task")] == [
        b2.checkpoint_id, c.checkpoint_id, a.checkpoint_id,
    ]
    assert b.checkpoint_id not in {x.checkpoint_id for x in cps.list_current("task")}
    assert cps.list_current("no-such-task") == []
    with pytest.raises(durabilis.errors.InvalidKey):
        cps.list_current("")

    async def twin() -> list[str]:
        astore = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            found = await durabilis.aio.CheckpointManager(astore).list_current("task", "agent-1")
            return [x.checkpoint_id for x in found]
        finally:
            await astore.close()

    assert asyncio.run(twin()) == [b2.checkpoint_id, a.checkpoint_id]
