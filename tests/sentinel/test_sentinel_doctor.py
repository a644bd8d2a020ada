"""``durabilis doctor`` on a ``redis+sentinel://`` URL: the primary the Sentinels
name, its replicas with their offsets and lag, the quorum."""

from __future__ import annotations

import json

import pytest

import durabilis
from durabilis import DurabilityConfig
from durabilis.cli import EXIT_OK, main
from durabilis.doctor import run_doctor
from tests.support.sentinel import LocalSentinel


def test_doctor_reports_the_primary_its_replicas_and_the_quorum(
    redis_url: str, redis_sentinel: LocalSentinel, capsys: pytest.CaptureFixture[str]
) -> None:
    redis_sentinel.wait_healthy(30)
    main(["doctor", "--url", redis_url, "--json", "--pings", "3"])
    report = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in report["checks"]}
    host, port = redis_sentinel.primary()
    sentinel = checks["sentinel"]
    assert sentinel["status"] == "ok", sentinel
    assert sentinel["details"]["primary"] == f"{host}:{port}"
    assert sentinel["details"]["quorum"] == 2
    assert (sentinel["details"]["sentinels"], sentinel["details"]["reachable"]) == (3, 3)
    assert sentinel["details"]["ckquorum"].startswith("OK")
    assert checks["mode"]["details"]["mode"] == "sentinel"
    replicas = checks["replication"]["details"]["replicas"]["server"]
    assert sorted(int(r.rsplit(":", 1)[1]) for r in replicas) == sorted(
        redis_sentinel.replica_ports())
    assert all(r["state"] == "online" and r["lag_bytes"] >= 0 and r["offset"] >= 0
               for r in replicas.values()), replicas
    assert checks["replication"]["status"] == "info"  # acks="primary": the risk is named


def test_doctor_exit_code_is_that_of_a_healthy_topology(
    redis_url: str, redis_sentinel: LocalSentinel, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the namespace and persistence checks may complain here (a fresh, empty
    namespace; data nodes without AOF): every Sentinel-specific check passes."""
    code = main(["doctor", "--url", redis_url, "--json", "--pings", "3"])
    report = json.loads(capsys.readouterr().out)
    bad = {c["name"] for c in report["checks"] if c["status"] in ("warn", "fail")}
    assert bad <= {"persistence", "namespace"}
    assert (code == EXIT_OK) == (not bad)


def test_doctor_fails_replication_when_the_layer_asks_for_more_replicas_than_answer(
    redis_url: str, redis_sentinel: LocalSentinel
) -> None:
    redis_sentinel.wait_healthy(30)
    store = durabilis.connect(redis_url)
    try:
        wants_three = run_doctor(store, pings=1, config=DurabilityConfig(acks="replicas:3"))
        wants_two = run_doctor(store, pings=1, config=DurabilityConfig(acks="replicas:2"))
    finally:
        store.close()
    verdict = {c.name: c for c in wants_three.checks}["replication"]
    assert verdict.status == "fail" and "NotReplicated" in verdict.summary
    assert {c.name: c for c in wants_two.checks}["replication"].status == "ok"
