"""``durabilis doctor``: flags a Redis that would lose or evict durable state,
passes a well-configured one; the classification rules on their own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from durabilis import _scripts
from durabilis.cli import EXIT_NOT_FOUND, EXIT_OK, EXIT_UNAVAILABLE, main
from durabilis.doctor import (
    FAIL,
    INFO,
    OK,
    WARN,
    check_eviction,
    check_latency,
    check_memory,
    check_mode,
    check_persistence,
    check_replication,
    check_sentinel,
    check_version,
    count_keys,
    hide_password,
    replicas_of,
)
from durabilis.testing import RedisServer, free_port
from tests.support.acl import ROOT, documented_setuser, rules_for

pytestmark = pytest.mark.topologies("cluster", "sentinel")


def doctor(capsys: pytest.CaptureFixture[str], url: str, *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", "--url", url, "--json", "--pings", "5", *extra])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


@pytest.fixture
def servers(tmp_path: Path) -> Any:
    started: list[RedisServer] = []

    def start(name: str, **options: Any) -> RedisServer:
        server = RedisServer(tmp_path / name, **options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# --- Must show 2 ---------------------------------------------------------------------


def test_doctor_flags_appendonly_off_and_allkeys_lru_and_exits_1(
    servers: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    server = servers("careless", appendonly=False,
                     extra=["--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb"])
    code, report = doctor(capsys, server.url)
    assert code == EXIT_NOT_FOUND and report["ok"] is False
    found = statuses(report)
    assert found["persistence"] == WARN
    assert found["eviction"] == WARN
    checks = {c["name"]: c for c in report["checks"]}
    assert "appendonly is off" in checks["persistence"]["summary"]
    assert "allkeys-lru" in checks["eviction"]["summary"]
    assert checks["eviction"]["details"]["maxmemory_policy"] == {"server": "allkeys-lru"}
    # The rest of the server is fine: only the two problems are flagged.
    assert {n for n, s in found.items() if s in (WARN, FAIL)} == {"persistence", "eviction"}
    # --allow-warnings: warnings alone do not fail the run.
    assert doctor(capsys, server.url, "--allow-warnings")[0] == EXIT_OK


def test_doctor_passes_a_well_configured_redis(
    servers: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    server = servers("careful", appendonly=True, appendfsync="always",
                     extra=["--maxmemory-policy", "noeviction"])
    code, report = doctor(capsys, server.url)
    assert code == EXIT_OK and report["ok"] is True
    found = statuses(report)
    assert set(found.values()) <= {OK, INFO}
    assert found["persistence"] == OK and found["eviction"] == OK
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["scripts"]["details"]["scripts"] == len(_scripts.sources())
    assert checks["version"]["details"]["versions"]["server"].count(".") == 2
    assert checks["mode"]["details"]["mode"] == "standalone"
    assert checks["latency"]["details"]["pings"] == 5


def test_doctor_flags_volatile_policies_too(
    servers: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    server = servers("volatile", appendonly=True, extra=["--maxmemory-policy", "volatile-lru"])
    code, report = doctor(capsys, server.url)
    assert code == EXIT_NOT_FOUND
    eviction = next(c for c in report["checks"] if c["name"] == "eviction")
    assert eviction["status"] == WARN and "every durabilis record" in eviction["summary"]


def test_doctor_counts_the_namespaces_keys_per_pillar(
    redis_url: str, namespace: str, raw: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    raw.set(f"{namespace}:idem:{{a}}", "1")
    raw.set(f"{namespace}:idem:{{b}}", "1")
    raw.set(f"{namespace}:dlq:{{dlq}}:stream", "1")
    raw.set(f"{namespace}:cb-names", "1")
    raw.set(f"{namespace}-other:idem:{{c}}", "1")  # another namespace: not counted
    code, report = doctor(capsys, redis_url, "--namespace", namespace, "--allow-warnings")
    keys = next(c for c in report["checks"] if c["name"] == "keys")
    assert keys["details"]["total"] == 4
    by = keys["details"]["by_pillar"]
    assert (by["idempotency"], by["dlq"], by["circuit_breaker"]) == (2, 1, 1)
    assert code in (EXIT_OK, EXIT_NOT_FOUND)  # the session server's own settings decide


def test_doctor_without_info_rights_warns_instead_of_crashing(
    servers: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    server = servers("acl", appendonly=True)
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "app", *rules_for("durabilis", "pw"))
    admin.close()
    url = server.url.replace("redis://", "redis://app:pw@")
    code, report = doctor(capsys, url)
    assert code == EXIT_NOT_FOUND
    found = statuses(report)
    # The application's user has neither INFO nor SCAN: both checks say so.
    assert found["server"] == WARN and found["scripts"] == OK and found["keys"] == WARN
    assert "app:***@" in report["url"] and "pw" not in report["url"]


def operator_rules() -> tuple[str, list[str]]:
    text = (ROOT / "docs" / "production.md").read_text(encoding="utf-8")
    words = text.split("<!-- operator-acl -->", 1)[1].split("```", 2)[1].split()
    assert words[:2] == ["ACL", "SETUSER"]
    return words[2], words[3:]


def test_the_documented_operator_user_runs_doctor_and_the_cli_cleanly(
    servers: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    user, rules = operator_rules()
    _, app_rules = documented_setuser()
    extra = [r for r in rules if r not in app_rules and not r.startswith(">")]
    # the app's line (which has +sscan and +hscan: a registry's bounded
    # stored_names(limit=), ckpt_find's bounded read), plus these
    assert extra == ["+scan", "+info", "+cluster|info"]
    server = servers("ops", appendonly=True, appendfsync="always",
                     extra=["--maxmemory-policy", "noeviction"])
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", user, *[">pw" if r.startswith(">") else r
                                                    for r in rules])
    admin.close()
    url = server.url.replace("redis://", f"redis://{user}:pw@")
    operator = redis.Redis.from_url(url)
    with pytest.raises(redis.exceptions.NoPermissionError):  # no password to read
        operator.config_get("requirepass")
    operator.close()
    code, report = doctor(capsys, url)
    assert code == EXIT_OK, report
    persistence = next(c for c in report["checks"] if c["name"] == "persistence")
    assert "unknown (CONFIG GET refused)" in persistence["summary"]
    for args in (["dlq", "ls"], ["breaker", "ls"], ["config", "show"], ["recover"]):
        assert main([*args, "--url", url]) == EXIT_OK, args
    capsys.readouterr()


def test_doctor_on_an_unreachable_redis_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--url", f"redis://127.0.0.1:{free_port()}/0", "--timeout", "0.5"])
    assert code == EXIT_UNAVAILABLE
    assert "Redis unavailable" in capsys.readouterr().err


# --- the rules ----------------------------------------------------------------------------


def test_version_below_6_2_warns() -> None:
    assert check_version({"a": "7.0.15", "b": "6.2.0"}).status == OK
    old = check_version({"a": "7.0.15", "b": "6.0.16"})
    assert old.status == WARN and old.details["below_6_2"] == ["b"]


def test_persistence_rules() -> None:
    def fields(aof: int, fsync: str | None, write: str = "ok") -> dict[str, Any]:
        return {"aof_enabled": aof, "appendfsync": fsync, "aof_last_write_status": write}

    assert check_persistence({"n": fields(1, "always")}).status == OK
    everysec = check_persistence({"n": fields(1, "everysec")})
    assert everysec.status == OK and "1 s" in everysec.summary
    assert check_persistence({"n": fields(1, None)}).status == OK  # CONFIG GET refused
    assert check_persistence({"n": fields(1, "no")}).status == WARN
    assert check_persistence({"n": fields(1, "always"), "m": fields(0, "always")}).status == WARN
    assert check_persistence({"n": fields(1, "always", "err")}).status == FAIL


@pytest.mark.parametrize(
    ("policy", "status"),
    [("noeviction", OK), ("volatile-lru", WARN), ("volatile-ttl", WARN),
     ("allkeys-lru", WARN), ("allkeys-random", WARN)],
)
def test_only_noeviction_keeps_every_record(policy: str, status: str) -> None:
    assert check_eviction({"n": {"maxmemory_policy": policy, "maxmemory": 0}}).status == status


def test_memory_latency_mode_and_key_counts() -> None:
    assert check_memory({"n": {"used_memory": 95, "maxmemory": 100}}).status == WARN
    assert check_memory({"n": {"used_memory": 50, "maxmemory": 100}}).status == OK
    assert check_memory({"n": {"used_memory": 50, "maxmemory": 0}}).status == INFO
    fast = check_latency([0.2, 0.1, 0.3])
    assert fast.status == OK and fast.details["median_ms"] == 0.2
    assert check_latency([20.0, 30.0, 25.0]).status == WARN
    assert check_latency([]).status == WARN
    assert check_mode("standalone", 1, None).status == INFO
    assert check_mode("cluster", 3, "ok").status == INFO
    assert check_mode("cluster", 3, "fail").status == FAIL
    counts = count_keys(
        ["ns:idem:{k}", "ns:cb:{x}", "ns:cb-names", "ns:ckpt:{ckpt}:live", "ns:weird",
         "other:idem:{k}", "ns:config:{config}:fleet", "ns:layer:{layer}:stats"], "ns",
    )
    assert counts["idempotency"] == 1 and counts["circuit_breaker"] == 2
    assert counts["checkpoint"] == 1 and counts["config"] == 1 and counts["layer"] == 1
    assert counts["other"] == 1


def test_passwords_are_hidden_in_the_reported_url() -> None:
    assert hide_password("redis://u:secret@h:1/0") == "redis://u:***@h:1/0"
    assert hide_password("redis://h:1/0") == "redis://h:1/0"
    assert hide_password("redis+cluster://u:s@h:1,h:2") == "redis+cluster://u:***@h:1,h:2"


def test_replication_rules() -> None:
    info = {"master_repl_offset": 1000,
            "slave0": {"ip": "10.0.0.2", "port": 6380, "state": "online", "offset": 990, "lag": 0},
            "slave1": {"ip": "10.0.0.3", "port": 6380, "state": "wait_bgsave", "offset": 0,
                       "lag": 3},
            "slaves_output": 7}  # (not a replica: no number after "slave")
    seen = replicas_of(info)
    assert seen == {
        "10.0.0.2:6380": {"state": "online", "offset": 990, "lag_bytes": 10, "lag_s": 0},
        "10.0.0.3:6380": {"state": "wait_bgsave", "offset": 0, "lag_bytes": 1000, "lag_s": 3},
    }
    one_online = {"p": seen}
    assert check_replication(one_online, 0, failover=True).status == INFO  # acks=primary
    assert check_replication(one_online, 1, failover=True).status == OK
    refused = check_replication(one_online, 2, failover=True)  # only one is online
    assert refused.status == FAIL and "NotReplicated" in refused.summary
    assert check_replication({"p": {}}, 0, failover=True).status == WARN
    assert check_replication({"p": {}}, 0, failover=False).status == INFO  # plain + AOF
    assert check_replication({"p": {}}, 1, failover=False).status == FAIL


def test_sentinel_rules() -> None:
    healthy = {"service": "s", "primary": "h:1", "flags": "master", "sentinels": 3,
               "reachable": 3, "quorum": 2, "ckquorum": "OK 3 usable Sentinels."}
    assert check_sentinel(healthy).status == OK
    assert check_sentinel({**healthy, "reachable": 2}).status == WARN
    assert check_sentinel({**healthy, "sentinels": 1, "reachable": 1}).status == WARN
    assert check_sentinel({**healthy, "ckquorum": "NOQUORUM 1 usable"}).status == WARN
    assert check_sentinel({**healthy, "flags": "master,o_down"}).status == FAIL
    assert check_sentinel({k: v for k, v in healthy.items() if k != "primary"}).status == FAIL


def test_doctor_on_the_session_backend_reports_its_mode_and_replication(
    redis_url: str, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same run on a server, on Cluster and through Sentinel (CI runs all three)."""
    main(["doctor", "--url", redis_url, "--json", "--pings", "3"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["mode"]["details"]["mode"] == backend
    replicas = checks["replication"]["details"]["replicas"]
    per_primary = {"standalone": 0, "cluster": 1, "sentinel": 2}[backend]
    assert replicas and all(len(r) == per_primary for r in replicas.values())
    assert ("sentinel" in checks) == (backend == "sentinel")
