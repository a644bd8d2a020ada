"""Every duration and count a config can set has a hard maximum (durabilis._limits):
refused at construction and in a TOML file (``durabilis config check``), accepted
at the maximum itself, and listed in docs/production.md's "Limits" section.
(Published fleet entries: tests/integration/test_fleet_config_hostile.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durabilis import CircuitBreakerConfig, ConfigError, RetryPolicy
from durabilis._limits import LIMITS, MAX_ATTEMPTS, MAX_RETRY_DEADLINE_MS, Limit
from durabilis.checkpoint import CheckpointConfig
from durabilis.cli import EXIT_NOT_FOUND, EXIT_OK, main
from durabilis.dlq import DlqConfig
from durabilis.idempotency import IdempotencyConfig
from durabilis.retry import RetryBudget, RetryEngine

DOCS = Path(__file__).resolve().parents[2] / "docs" / "production.md"


def value_at(limit: Limit, factor: float) -> float:
    value = limit.maximum * factor
    return int(value) if float(limit.maximum).is_integer() and factor >= 1 else value


def companions(limit: Limit, value: float) -> dict[str, Any]:
    """The other fields a config needs so that ``limit.field = value`` is the only issue."""
    field = limit.field
    if limit.owner == "RetryPolicy" and field == "initial_delay_ms":
        return {"max_delay_ms": value}
    if limit.owner == "CircuitBreakerConfig":
        if field == "min_request_count":
            return {"window_size": value}
        if field == "slow_call_duration_ms":
            return {"slow_call_rate_threshold": 0.5}
        if field in ("reset_timeout_seconds", "probe_timeout_seconds", "window_seconds"):
            return {"idle_ttl_seconds": max(value, 7 * 86400)}
    return {}


def build(limit: Limit, value: float) -> object:
    values = {limit.field: value, **companions(limit, value)}
    if limit.owner == "RetryPolicy":
        return RetryPolicy("job", **{"max_attempts": 3, "initial_delay_ms": 1,
                                     "max_delay_ms": 10, **values})
    if limit.owner == "RetryBudget":
        return RetryPolicy("job", 3, 1, 10, budget=RetryBudget(**values))
    if limit.owner == "CircuitBreakerConfig":
        return CircuitBreakerConfig("svc", **values)
    kinds: dict[str, Any] = {"IdempotencyConfig": IdempotencyConfig,
                             "CheckpointConfig": CheckpointConfig, "DlqConfig": DlqConfig}
    return kinds[limit.owner](**values)


IDS = [f"{limit.owner}.{limit.field}" for limit in LIMITS]


@pytest.mark.parametrize("limit", LIMITS, ids=IDS)
def test_each_bound_is_refused_at_construction_naming_the_field(limit: Limit) -> None:
    with pytest.raises(ConfigError) as info:
        build(limit, value_at(limit, 2))
    assert info.value.field == limit.field


@pytest.mark.parametrize("limit", LIMITS, ids=IDS)
def test_each_bound_itself_is_accepted(limit: Limit) -> None:
    build(limit, value_at(limit, 1))


def test_max_attempts_of_a_billion_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        RetryPolicy("job", 10**9, 1, 10)
    assert info.value.field == "max_attempts" and str(MAX_ATTEMPTS) in str(info.value)


def test_no_deadline_means_the_default_deadline_not_unbounded() -> None:
    assert RetryPolicy("job", 3, 1, 10).deadline_seconds == 3600.0
    assert RetryPolicy("job", 3, 1, 10, deadline_ms=5000).deadline_seconds == 5.0


def test_a_call_deadline_over_the_maximum_is_refused_before_fn_runs() -> None:
    ran: list[int] = []
    engine = RetryEngine(policies=[RetryPolicy("job", 3, 1, 10)])
    with pytest.raises(ConfigError) as info:
        engine.execute("job", lambda: ran.append(1),
                       deadline_seconds=MAX_RETRY_DEADLINE_MS / 1000 + 1)
    assert info.value.field == "deadline_seconds" and ran == []


# --- in a TOML file: `durabilis config check` ------------------------------------------------

POLICY = {"max_attempts": 3, "initial_delay_ms": 1, "max_delay_ms": 10}
SECTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "RetryPolicy": ("retry.job", POLICY),
    "RetryBudget": ("retry.job.budget", {}),
    "CircuitBreakerConfig": ("circuit_breaker.svc", {}),
    "IdempotencyConfig": ("idempotency", {}),
    "CheckpointConfig": ("checkpoint", {}),
    "DlqConfig": ("dlq", {}),
}


def toml_for(limit: Limit, value: float) -> str:
    section, base = SECTIONS[limit.owner]
    values = {**base, limit.field: value, **companions(limit, value)}
    text = "[retry.job]\n" + "".join(f"{k} = {v!r}\n" for k, v in POLICY.items())
    if limit.owner == "RetryPolicy":
        text = ""
    return text + f"[{section}]\n" + "".join(f"{k} = {v!r}\n" for k, v in values.items())


def check(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["config", "check", str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("limit", LIMITS, ids=IDS)
def test_each_bound_is_refused_by_config_check_naming_the_field(
    limit: Limit, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    over = tmp_path / "over.toml"
    over.write_text(toml_for(limit, value_at(limit, 2)))
    code, report = check(capsys, over)
    assert code == EXIT_NOT_FOUND and report["ok"] is False
    assert report["field"] == limit.field, report
    at = tmp_path / "at.toml"
    at.write_text(toml_for(limit, value_at(limit, 1)))
    code, report = check(capsys, at)
    assert code == EXIT_OK and report["ok"] is True, report


# --- documented -------------------------------------------------------------------------------


def test_docs_production_lists_every_limit_with_its_maximum() -> None:
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Limits"):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    for limit in LIMITS:
        shown = f"{limit.maximum:,.0f}".replace(",", "_")
        row = f"| `{limit.owner}.{limit.field}` | {shown}"
        assert row in section, row
