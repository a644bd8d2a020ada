"""Config files in the seed's layout, environment overrides, errors that name
file / section / field, and the fleet config's JSON and apply rules (no Redis)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from durabilis import CircuitBreakerConfig, ConfigError, IdempotencyConfig, RetryPolicy
from durabilis._codec import canonical_json
from durabilis.breaker import DEFAULT_BREAKER_CONFIGS
from durabilis.config import (
    _Applier,
    breaker_from_dict,
    breaker_to_dict,
    config_to_dict,
    declared_entries,
    decode_entry,
    load_config,
    parse_config,
    policy_from_dict,
    policy_to_dict,
)
from durabilis.errors import ConfigFileError
from durabilis.layer import DEFAULT_DEPENDENCIES, DurabilityConfig
from durabilis.retry import RetryBudget, RetryEngine, default_policies

NO_ENV: dict[str, str] = {}
SEED = '[layer]\npreset = "seed"\n'  # files that override the seed's entries start so

SEED_LAYOUT = """
[layer]
preset = "seed"
renew_every_seconds = 5

[idempotency]
dedup_window_seconds = 7200
in_progress_ttl_seconds = 45

[retry.mcp_call]
max_attempts = 5
retryable_errors = ["NETWORK_TIMEOUT"]

[circuit_breaker.memory_service]
failure_rate_threshold = 0.6

[checkpoint]
default_ttl_seconds = 3600
max_checkpoints = 500

[dlq]
claim_ttl_seconds = 120

[dependencies]
memory_write = "memory_service"
"""


def write(tmp_path: Path, text: str, name: str = "durabilis.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def policies(cfg: DurabilityConfig) -> dict[str, RetryPolicy]:
    return {p.operation_type: p for p in cfg.retry_policies or ()}


def breakers(cfg: DurabilityConfig) -> dict[str, CircuitBreakerConfig]:
    return {b.name: b for b in cfg.breakers or ()}


# --- loading ---------------------------------------------------------------------------


def test_a_file_in_the_seed_layout_overrides_only_the_fields_it_lists(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, SEED_LAYOUT), environ=NO_ENV)
    seed = {p.operation_type: p for p in default_policies()}

    assert cfg.idempotency.dedup_window_seconds == 7200
    assert cfg.idempotency.in_progress_ttl_seconds == 45
    assert cfg.idempotency.max_key_length == 256  # not listed: the default

    mcp = policies(cfg)["mcp_call"]
    assert mcp.max_attempts == 5 and mcp.retryable_errors == ("NETWORK_TIMEOUT",)
    assert mcp.initial_delay_ms == 500 and mcp.max_delay_ms == 10_000
    assert mcp.non_retryable_errors == seed["mcp_call"].non_retryable_errors
    assert set(policies(cfg)) == set(seed)  # the other seed policies stay
    assert policies(cfg)["wiki_write"] == seed["wiki_write"]

    mem = breakers(cfg)["memory_service"]
    assert mem.failure_rate_threshold == 0.6 and mem.min_request_count == 10
    assert set(breakers(cfg)) == {b.name for b in DEFAULT_BREAKER_CONFIGS}

    assert cfg.checkpoint.default_ttl_seconds == 3600 and cfg.checkpoint.max_checkpoints == 500
    assert cfg.dlq.claim_ttl_seconds == 120 and cfg.dlq.default_ttl_seconds == 86400
    assert dict(cfg.dependencies) == {**DEFAULT_DEPENDENCIES, "memory_write": "memory_service"}
    assert cfg.renew_every_seconds == 5


def test_from_toml_on_the_config_class_is_load_config(tmp_path: Path) -> None:
    path = write(tmp_path, SEED_LAYOUT)
    assert DurabilityConfig.from_toml(path, environ=NO_ENV) == load_config(path, environ=NO_ENV)


def test_no_file_gives_the_gateway_defaults_whatever_builds_the_config(tmp_path: Path) -> None:
    cfg = load_config(None, environ=NO_ENV)
    assert [p.operation_type for p in cfg.policies] == ["*"]  # one policy for every type
    assert cfg.breaker_configs == () and dict(cfg.dependencies) == {}
    assert cfg.idempotency == DurabilityConfig().idempotency
    # One source of truth for the lease: every way of building a config gives 30 s.
    for built in (
        cfg, DurabilityConfig(), DurabilityConfig.seed(),
        DurabilityConfig(idempotency=IdempotencyConfig(dedup_window_seconds=7200)),
        load_config(write(tmp_path, "[idempotency]\ndedup_window_seconds = 7200\n"),
                    environ=NO_ENV),
    ):
        assert built.idempotency.in_progress_ttl_seconds == 30
    assert IdempotencyConfig().in_progress_ttl_seconds == 30


def test_the_seed_preset_and_the_example_file_are_the_seeds_setup(tmp_path: Path) -> None:
    seed = DurabilityConfig.seed()
    assert policies(seed) == {p.operation_type: p for p in default_policies()}
    assert breakers(seed) == {b.name: b for b in DEFAULT_BREAKER_CONFIGS}
    assert dict(seed.dependencies) == dict(DEFAULT_DEPENDENCIES)
    preset = load_config(write(tmp_path, '[layer]\npreset = "seed"\n'), environ=NO_ENV)
    example = load_config(Path(__file__).parents[2] / "examples" / "seed.toml", environ=NO_ENV)
    for cfg in (preset, example):
        assert cfg.policies == seed.policies and cfg.breaker_configs == seed.breaker_configs
        assert dict(cfg.dependencies) == dict(seed.dependencies)


def test_a_lease_that_slows_recovery_down_is_warned_about() -> None:
    assert DurabilityConfig().warnings() == []
    slow = DurabilityConfig(idempotency=IdempotencyConfig(in_progress_ttl_seconds=300))
    (warning,) = slow.warnings()
    assert "300 s" in warning and "recover_orphans" in warning


def test_new_policies_and_breakers_are_defined_by_their_sections(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, """
        [retry.payments]
        max_attempts = 2
        initial_delay_ms = 100
        max_delay_ms = 1000
        jitter = false
        deadline_ms = 5000

        [retry.payments.budget]
        ratio = 0.1
        min_retries = 3

        [retry."*"]
        max_attempts = 1
        initial_delay_ms = 1
        max_delay_ms = 1

        [circuit_breaker.payments_api]
        min_request_count = 5
        window_seconds = 60

        [dependencies]
        payments = "payments_api"
        mcp_call = ""
    """), environ=NO_ENV)
    pay = policies(cfg)["payments"]
    assert (pay.max_attempts, pay.jitter, pay.deadline_ms) == (2, False, 5000)
    assert pay.budget == RetryBudget(ratio=0.1, min_retries=3)
    assert policies(cfg)["*"].max_attempts == 1
    api = breakers(cfg)["payments_api"]
    assert api.min_request_count == 5 and api.window_seconds == 60
    assert api.failure_rate_threshold == 0.5  # CircuitBreakerConfig's default
    assert cfg.dependencies["payments"] == "payments_api"
    assert "mcp_call" not in cfg.dependencies  # "" removed the default mapping


def test_include_defaults_false_drops_the_seed_entries(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, """
        [retry]
        include_defaults = false
        [retry.job]
        max_attempts = 3
        initial_delay_ms = 1
        max_delay_ms = 2

        [circuit_breaker]
        include_defaults = false
        [circuit_breaker.svc]
        min_request_count = 4

        [dependencies]
        include_defaults = false
        job = "svc"
    """), environ=NO_ENV)
    assert set(policies(cfg)) == {"job"}
    assert set(breakers(cfg)) == {"svc"}
    assert dict(cfg.dependencies) == {"job": "svc"}


def test_environment_overrides_win_and_are_read_as_toml_values(tmp_path: Path) -> None:
    env = {
        "DURABILIS__RETRY__MCP_CALL__MAX_ATTEMPTS": "7",
        "DURABILIS__RETRY__MCP_CALL__JITTER": "false",
        "DURABILIS__RETRY__MCP_CALL__RETRYABLE_ERRORS": '["RATE_LIMITED", "NETWORK_TIMEOUT"]',
        "DURABILIS__RETRY__MCP_CALL__BUDGET__RATIO": "0.25",
        "DURABILIS__CIRCUIT_BREAKER__MEMORY_SERVICE__FAILURE_RATE_THRESHOLD": "0.75",
        "DURABILIS__IDEMPOTENCY__DEDUP_WINDOW_SECONDS": "60",
        "DURABILIS__DEPENDENCIES__MESSAGE_SEND": "wiki_service",  # plain text, not TOML
        "DURABILIS_REDIS_URL": "redis://ignored",  # one underscore: not an override
        "OTHER__RETRY__X": "1",
    }
    cfg = load_config(write(tmp_path, SEED_LAYOUT), environ=env)
    mcp = policies(cfg)["mcp_call"]
    assert mcp.max_attempts == 7 and mcp.jitter is False
    assert mcp.retryable_errors == ("RATE_LIMITED", "NETWORK_TIMEOUT")
    assert mcp.budget == RetryBudget(ratio=0.25)
    assert breakers(cfg)["memory_service"].failure_rate_threshold == 0.75
    assert cfg.idempotency.dedup_window_seconds == 60
    assert cfg.idempotency.in_progress_ttl_seconds == 45  # from the file
    assert cfg.dependencies["message_send"] == "wiki_service"
    # Without a file, the overrides apply to the defaults.
    alone = load_config(None, environ={'DURABILIS__RETRY__*__MAX_ATTEMPTS': "9"})
    assert policies(alone)["*"].max_attempts == 9


@pytest.mark.parametrize(
    ("text", "section", "field"),
    [
        (SEED + "[retry.mcp_call]\nmax_attempts = 0\n", "retry.mcp_call", "max_attempts"),
        (SEED + "[retry.mcp_call]\nmax_attempts = 3.0\n", "retry.mcp_call", "max_attempts"),
        (SEED + "[retry.mcp_call]\nmax_atempts = 3\n", "retry.mcp_call", "max_atempts"),
        (SEED + "[retry.mcp_call]\nmax_delay_ms = 1\n", "retry.mcp_call", "max_delay_ms"),
        (SEED + "[retry.mcp_call.budget]\nratio = -1\n", "retry.mcp_call.budget", "ratio"),
        ("[retry.job]\nmax_attempts = 2\ninitial_delay_ms = 1\n", "retry.job", "max_delay_ms"),
        ("[retry.job]\noperation_type = 'x'\n", "retry.job", "operation_type"),
        ("[retry]\nmcp_call = 3\n", "retry", "mcp_call"),
        (SEED + "[circuit_breaker.memory_service]\nfailure_rate_threshold = 1.5\n",
         "circuit_breaker.memory_service", "failure_rate_threshold"),
        (SEED + "[circuit_breaker.memory_service]\nmin_request_count = 50\n",
         "circuit_breaker.memory_service", "min_request_count"),
        ("[circuit_breaker.new_one]\nbogus = 1\n", "circuit_breaker.new_one", "bogus"),
        ("[idempotency]\nenabled = 'yes'\n", "idempotency", "enabled"),
        ("[checkpoint]\nmax_checkpoints = 0\n", "checkpoint", "max_checkpoints"),
        ("[dlq]\nclaim_ttl_seconds = 'long'\n", "dlq", "claim_ttl_seconds"),
        ("[dependencies]\nmcp_call = 3\n", "dependencies", "mcp_call"),
        ("[dependencies]\npayments = 'nope'\n", "dependencies", "payments"),
        ("[layer]\nrenew_every_seconds = 600\n", "layer", "renew_every_seconds"),
        ("[layer]\nrenew = 1\n", "layer", "renew"),
        ("[layer]\nacks = 'replicas'\n", "layer", "acks"),
        ("[layer]\nacks = 'replicas:1'\nacks_timeout_seconds = 0\n", "layer",
         "acks_timeout"),
        ("[retries]\nx = 1\n", "retries", ""),
    ],
)
def test_an_invalid_value_names_the_file_section_and_field(
    tmp_path: Path, text: str, section: str, field: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigFileError) as info:
        load_config(path, environ=NO_ENV)
    err = info.value
    assert (err.path, err.section, err.field, err.variable) == (str(path), section, field, None)
    assert str(err).startswith(f"{path} [{section}]")
    assert isinstance(err, ConfigError)


def test_an_invalid_override_names_the_variable_section_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, SEED_LAYOUT)
    variable = "DURABILIS__CIRCUIT_BREAKER__WIKI_SERVICE__WINDOW_SIZE"
    with pytest.raises(ConfigFileError) as info:
        load_config(path, environ={variable: "0"})
    err = info.value
    assert (err.path, err.variable) == ("environment", variable)
    assert (err.section, err.field) == ("circuit_breaker.wiki_service", "window_size")
    assert str(err).startswith(f"environment {variable} [circuit_breaker.wiki_service]")
    with pytest.raises(ConfigFileError) as bad_name:
        load_config(path, environ={"DURABILIS__RETRY": "1"})
    assert bad_name.value.variable == "DURABILIS__RETRY"


def test_a_file_that_is_not_toml_or_not_readable_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[retry.mcp_call\nmax_attempts = 3\n")
    with pytest.raises(ConfigFileError) as info:
        load_config(path, environ=NO_ENV)
    assert info.value.path == str(path) and "not valid TOML" in str(info.value)
    with pytest.raises(ConfigFileError) as missing:
        load_config(tmp_path / "absent.toml", environ=NO_ENV)
    assert "cannot read" in str(missing.value)


def test_parse_config_takes_already_parsed_data() -> None:
    cfg = parse_config({"layer": {"preset": "seed"}, "retry": {"mcp_call": {"max_attempts": 4}}},
                       environ=NO_ENV)
    assert policies(cfg)["mcp_call"].max_attempts == 4


def test_declared_entries_are_the_named_sections_of_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, SEED_LAYOUT + "\n[retry.payments]\nmax_attempts = 2\n")
    assert declared_entries(path, environ=NO_ENV) == (["mcp_call", "payments"],
                                                      ["memory_service"])
    env = {"DURABILIS__CIRCUIT_BREAKER__WIKI_SERVICE__WINDOW_SIZE": "30"}
    assert declared_entries(path, environ=env)[1] == ["memory_service", "wiki_service"]


def test_the_effective_config_reads_back_as_the_same_config(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, SEED_LAYOUT), environ=NO_ENV)
    doc = config_to_dict(cfg)
    assert doc["retry"]["mcp_call"]["max_attempts"] == 5
    assert doc["circuit_breaker"]["memory_service"]["failure_rate_threshold"] == 0.6
    for policy in doc["retry"].values():
        if isinstance(policy, dict):
            policy.pop("operation_type")
    for breaker in doc["circuit_breaker"].values():
        breaker.pop("name")
    assert parse_config(doc, environ=NO_ENV) == cfg


# --- the fleet config's entries ------------------------------------------------------------


def test_policies_and_breakers_round_trip_through_their_json_form() -> None:
    policy = RetryPolicy(
        "payments", 4, 100, 2000, 3.0, False, ("NETWORK_TIMEOUT",), ("PERMISSION_DENIED",),
        retry_policy_id="payments-v2", deadline_ms=9000, budget=RetryBudget(0.3, 2, 5.0),
    )
    assert policy_from_dict(policy_to_dict(policy)) == policy
    assert policy_to_dict(policy)["budget"] == {"ratio": 0.3, "min_retries": 2,
                                                "window_seconds": 5.0}
    for seed in default_policies():
        assert policy_from_dict(policy_to_dict(seed)) == seed
    breaker = CircuitBreakerConfig("api", 0.2, 3, 5, 1, 10, 7, window_seconds=30,
                                   slow_call_duration_ms=250, slow_call_rate_threshold=0.5,
                                   min_distinct_reporters=2, idle_ttl_seconds=3600)
    assert breaker_from_dict(breaker_to_dict(breaker)) == breaker


@pytest.mark.parametrize(
    ("name", "text", "field"),
    [
        ("retry:mcp_call", "{not json", "retry:mcp_call"),
        ("retry:mcp_call", '{"operation_type": "mcp_call", "max_attempts": 0, '
         '"initial_delay_ms": 1, "max_delay_ms": 1}', "max_attempts"),
        ("retry:mcp_call", '{"operation_type": "mcp_call"}', "retry_policy"),
        ("retry:mcp_call", '{"operation_type": "other", "max_attempts": 1, '
         '"initial_delay_ms": 1, "max_delay_ms": 1}', "operation_type"),
        ("retry:x", '{"operation_type": "x", "max_attempts": 1, "initial_delay_ms": 1, '
         '"max_delay_ms": 1, "from_the_future": 1}', "retry_policy"),
        ("breaker:api", '{"name": "api", "window_size": 0}', "window_size"),
        ("breaker:api", '{"name": "other"}', "name"),
        ("breaker:api", "[1, 2]", "breaker"),
        ("budget:x", "{}", "field"),
    ],
)
def test_a_foreign_fleet_entry_is_refused_naming_the_field(
    name: str, text: str, field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        decode_entry(name, text)
    assert info.value.field == field


class _Registry:
    """Stands in for a breaker registry: what the applier calls."""

    def __init__(self, *configs: CircuitBreakerConfig) -> None:
        self.configs = {c.name: c for c in configs}

    def names(self) -> list[str]:
        return list(self.configs)

    def get_config(self, name: str) -> CircuitBreakerConfig:
        return self.configs[name]

    def upsert_config(self, config: CircuitBreakerConfig) -> None:
        self.configs[config.name] = config


def entry(obj: Any) -> tuple[str, str]:
    if isinstance(obj, RetryPolicy):
        return f"retry:{obj.operation_type}", canonical_json(policy_to_dict(obj)).decode()
    return f"breaker:{obj.name}", canonical_json(breaker_to_dict(obj)).decode()


def test_the_applier_installs_changes_only_and_unpublishing_restores_the_replicas_own() -> None:
    engine = RetryEngine()
    own_mcp = engine.get_policy("mcp_call")
    registry = _Registry(*DEFAULT_BREAKER_CONFIGS)
    applier = _Applier(engine, registry)
    mcp5 = RetryPolicy("mcp_call", 5, 500, 10_000)
    mem = CircuitBreakerConfig("memory_service", 0.9, 10, 30, 2, 20, 30)
    newb = CircuitBreakerConfig("brand_new", 0.5, 2, 1, 1, 4, 1)
    entries = dict([entry(mcp5), entry(mem), entry(newb)])

    first = applier.apply(3, entries)
    assert first.initial and first.version == 3
    assert first.retry_policies == ("mcp_call",)
    assert set(first.breakers) == {"memory_service", "brand_new"}
    assert engine.get_policy("mcp_call") == mcp5 and registry.configs["memory_service"] == mem

    again = applier.apply(4, entries)  # the version moved, nothing of ours changed
    assert not again.changed and not again.initial

    del entries["retry:mcp_call"], entries["breaker:brand_new"]
    gone = applier.apply(5, entries)
    assert set(gone.removed) == {"retry:mcp_call", "breaker:brand_new"}
    assert engine.get_policy("mcp_call") == own_mcp  # back to this replica's own
    assert registry.configs["brand_new"] == newb  # no own config: the last one stays


def test_a_snapshot_older_than_this_replicas_own_publish_does_not_revert_it() -> None:
    engine = RetryEngine()
    applier = _Applier(engine, None)
    old, new = RetryPolicy("mcp_call", 2, 1, 1), RetryPolicy("mcp_call", 9, 1, 1)
    applier.apply(1, dict([entry(old)]))
    # This replica publishes v2 while its poller holds a snapshot of v1.
    read_at = applier.seq  # the poller asks for a snapshot...
    name, text = entry(new)
    applier.published_here(name, new, text, changed=True)  # ...this replica publishes...
    assert engine.get_policy("mcp_call") == new
    stale = applier.apply(1, dict([entry(old)]), read_at=read_at)  # ...the snapshot lands
    assert not stale.changed and engine.get_policy("mcp_call") == new
    fresh = applier.apply(2, dict([entry(new)]), read_at=applier.seq)
    assert not fresh.changed and engine.get_policy("mcp_call") == new


def test_a_snapshot_read_after_this_replicas_publish_applies_whatever_its_version() -> None:
    engine = RetryEngine()
    applier = _Applier(engine, None)
    mine, theirs = RetryPolicy("mcp_call", 2, 1, 1), RetryPolicy("mcp_call", 9, 1, 1)
    name, text = entry(mine)
    applier.published_here(name, mine, text, changed=True)  # at version 5, say
    # The hash was lost and published again since: version 1, read after the publish.
    reload = applier.apply(1, dict([entry(theirs)]), read_at=applier.seq)
    assert reload.retry_policies == ("mcp_call",) and engine.get_policy("mcp_call") == theirs


def test_a_rejected_entry_is_reported_once_and_others_still_apply() -> None:
    engine = RetryEngine()
    applier = _Applier(engine, None)
    good = RetryPolicy("memory_write", 8, 1, 1)
    entries = {**dict([entry(good)]), "retry:mcp_call": '{"operation_type": "mcp_call"}'}
    first = applier.apply(1, entries)
    assert set(first.rejected) == {"retry:mcp_call"}
    assert first.retry_policies == ("memory_write",)
    assert engine.get_policy("memory_write") == good
    assert applier.apply(2, entries).rejected == {}  # the same bad text: not again


def test_the_layer_section_sets_the_acknowledgement_level(tmp_path: Path) -> None:
    text = "[layer]\nacks = 'replicas:2'\nacks_timeout_seconds = 0.25\n"
    cfg = load_config(write(tmp_path, text), environ=NO_ENV)
    assert (cfg.acks, cfg.acks_timeout_seconds) == ("replicas:2", 0.25)
    assert load_config(write(tmp_path, ""), environ=NO_ENV).acks is None  # the store's level
