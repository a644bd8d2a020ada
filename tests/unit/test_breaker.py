"""The breaker's pure parts: config validation, call building, reply decoding (no Redis)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import durabilis
from durabilis import breaker as cb
from durabilis._keys import KeySpace
from durabilis.breaker import (
    DEFAULT_BREAKER_CONFIGS,
    BreakerState,
    CircuitBreakerConfig,
    CircuitBreakerRegistry,
    Permit,
    StateTransition,
    admission,
    outcome_code,
)
from tests.support.logs import own_logs

LUA = Path(__file__).resolve().parents[2] / "durabilis" / "lua"


class NoIO:
    """A store that fails the test if anything reaches Redis."""

    keys = KeySpace("unit")

    def run(self, call: Any) -> Any:
        raise AssertionError(f"unexpected I/O: {call.name}")

    run_many = command = run


def registry(*configs: CircuitBreakerConfig) -> CircuitBreakerRegistry:
    return CircuitBreakerRegistry(NoIO(), configs or None, replica_id="unit-replica")  # type: ignore[arg-type]


# --- config ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        # The seed's rules in the seed's order: each case also breaks every later rule.
        ({"name": "", "failure_rate_threshold": 0, "min_request_count": 0}, "name"),
        ({"failure_rate_threshold": 0, "min_request_count": 0}, "failure_rate_threshold"),
        ({"failure_rate_threshold": 1.01, "min_request_count": 0}, "failure_rate_threshold"),
        ({"failure_rate_threshold": math.nan}, "failure_rate_threshold"),
        ({"min_request_count": 0, "reset_timeout_seconds": 0}, "min_request_count"),
        ({"reset_timeout_seconds": 0.5, "probe_success_required": 0}, "reset_timeout_seconds"),
        ({"probe_success_required": 0, "window_size": 0}, "probe_success_required"),
        ({"window_size": 0, "probe_timeout_seconds": 0}, "window_size"),
        ({"probe_timeout_seconds": 0.99}, "probe_timeout_seconds"),
        # Ours, after the seed's.
        ({"min_request_count": 21, "window_size": 20}, "min_request_count"),
        ({"window_seconds": 0}, "window_seconds"),
        ({"slow_call_duration_ms": 100}, "slow_call_rate_threshold"),
        ({"slow_call_rate_threshold": 0.5}, "slow_call_rate_threshold"),
        ({"slow_call_duration_ms": -1, "slow_call_rate_threshold": 0.5}, "slow_call_duration_ms"),
        ({"slow_call_duration_ms": 5, "slow_call_rate_threshold": 0}, "slow_call_rate_threshold"),
        ({"min_distinct_reporters": 0}, "min_distinct_reporters"),
        ({"min_request_count": True}, "min_request_count"),
        ({"window_size": 2.5}, "window_size"),
        ({"idle_ttl_seconds": 10, "reset_timeout_seconds": 60}, "idle_ttl_seconds"),
    ],
)
def test_invalid_config_names_the_first_bad_field(fields: dict[str, Any], field: str) -> None:
    fields = {"name": "dep", **fields}
    with pytest.raises(durabilis.ConfigError) as raised:
        CircuitBreakerConfig(**fields)
    assert raised.value.field == field


def test_min_request_count_above_window_size_is_rejected_with_a_clear_message() -> None:
    with pytest.raises(durabilis.ConfigError, match="window_size=20") as raised:
        CircuitBreakerConfig("dep", min_request_count=25)
    assert "never" in str(raised.value)


def test_boundary_values_are_accepted() -> None:
    CircuitBreakerConfig(
        "dep",
        failure_rate_threshold=1.0,
        min_request_count=1,
        reset_timeout_seconds=1,
        probe_success_required=1,
        window_size=1,
        probe_timeout_seconds=1,
        window_seconds=0.001,
        slow_call_duration_ms=0,
        slow_call_rate_threshold=1.0,
    )


def test_seed_default_configs() -> None:
    got = {
        c.name: (
            c.failure_rate_threshold,
            c.min_request_count,
            c.reset_timeout_seconds,
            c.probe_success_required,
            c.window_size,
            c.probe_timeout_seconds,
        )
        for c in DEFAULT_BREAKER_CONFIGS
    }
    assert got == {
        "memory_service": (0.5, 10, 30, 2, 20, 30),
        "external_mcp_client": (0.3, 5, 60, 1, 20, 30),
        "wiki_service": (0.4, 8, 45, 2, 20, 30),
    }
    assert cb.default_breaker_configs() == list(DEFAULT_BREAKER_CONFIGS)


def test_registry_rejects_a_bad_replica_id_or_stream_cap() -> None:
    with pytest.raises(durabilis.ConfigError) as raised:
        CircuitBreakerRegistry(NoIO(), replica_id="")  # type: ignore[arg-type]
    assert raised.value.field == "replica_id"
    with pytest.raises(durabilis.ConfigError) as raised:
        CircuitBreakerRegistry(NoIO(), events_maxlen=0)  # type: ignore[arg-type]
    assert raised.value.field == "events_maxlen"


def test_default_replica_id_is_host_pid_random() -> None:
    host, pid, rand = cb.default_replica_id().rsplit(":", 2)
    assert host and pid.isdigit() and len(rand) == 6
    assert cb.default_replica_id() != cb.default_replica_id()


# --- pure rules -------------------------------------------------------------------


def test_admission_rule() -> None:
    config = CircuitBreakerConfig(
        "dep", reset_timeout_seconds=10, probe_timeout_seconds=5, probe_success_required=2
    )

    def ask(state: BreakerState, **kw: int) -> tuple[bool, bool, int]:
        args = {"now_ms": 100_000, "opened_at_ms": 0, "newest_probe_ms": 0, "probes_in_flight": 0}
        args.update(kw)
        return admission(state, config=config, **args)

    assert ask(BreakerState.CLOSED) == (True, False, 0)
    assert ask(BreakerState.OPEN, opened_at_ms=95_000) == (False, False, 5_000)
    assert ask(BreakerState.OPEN, opened_at_ms=90_000) == (True, True, 0)
    assert ask(BreakerState.HALF_OPEN, probes_in_flight=1) == (True, True, 0)
    full = {"probes_in_flight": 2, "newest_probe_ms": 99_000}
    assert ask(BreakerState.HALF_OPEN, **full) == (False, False, 4_000)
    assert ask(BreakerState.HALF_OPEN, probes_in_flight=2, newest_probe_ms=95_000) == (
        True,
        True,
        0,
    )
    # Stored "in the future": the server clock stepped back; the timeout restarts from now.
    assert ask(BreakerState.OPEN, opened_at_ms=3_700_000) == (False, False, 10_000)
    assert ask(BreakerState.HALF_OPEN, probes_in_flight=2, newest_probe_ms=3_700_000) == (
        False, False, 5_000,
    )
    assert ask(BreakerState.HALF_OPEN, probes_in_flight=1, newest_probe_ms=3_700_000) == (
        True, True, 0,
    )


def test_outcome_codes() -> None:
    assert outcome_code(None) == "s"
    assert outcome_code(ValueError) == "f"
    assert outcome_code(KeyboardInterrupt) == "r"


# --- call building (no I/O) ---------------------------------------------------------


def test_unknown_dependency_fails_before_any_io() -> None:
    reg = registry(CircuitBreakerConfig("dep"))
    for call in (
        lambda: reg.before_call("nope"),
        lambda: reg.after_call("nope", True),
        lambda: reg.state_info("nope"),
        lambda: reg.guard("nope"),
        lambda: reg.transitions("nope"),
    ):
        with pytest.raises(durabilis.errors.DependencyNotFound):
            call()


def test_every_script_call_uses_keys_of_one_hash_tag() -> None:
    ops = registry(CircuitBreakerConfig("my:dep{x}")).ops
    calls = [
        ops.before_call("my:dep{x}"),
        ops.after_call("my:dep{x}", True),
        ops.force("my:dep{x}", "open"),
        ops.read("my:dep{x}"),
    ]
    for call in calls:
        texts = [k.decode() if isinstance(k, bytes) else k for k in call.keys]
        tags = {t.split("{")[1].split("}")[0] for t in texts}
        assert tags == {"my%3Adep%7Bx%7D"}, call


def test_report_is_plain_only_for_a_successful_non_probe_count_based_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(cb, "monotonic", lambda: clock[0])
    slow = CircuitBreakerConfig("slow", slow_call_duration_ms=50, slow_call_rate_threshold=0.5)
    timed = CircuitBreakerConfig("timed", window_seconds=60)
    ops = registry(CircuitBreakerConfig("dep"), slow, timed).ops

    def report(name: str, *args: Any) -> str:
        value = ops.after_call(name, *args).args[1]
        assert isinstance(value, str)
        return value

    # The first report of each breaker asks the script to check the TTLs.
    assert report("dep", True, Permit("dep", 3)) == "3||s|-1|1"
    assert report("dep", True, Permit("dep", 3)) == "+20|3"
    assert report("dep", True) == "+20|"
    assert report("dep", False, Permit("dep", 3), 12.3456) == "3||f|12.346|0"
    assert report("dep", True, Permit("dep", 4, "17")) == "4|17|s|-1|0"
    report("slow", True)
    assert report("slow", True, None, 40) == "+20|"
    assert report("slow", True, None, 60) == "||s|60.000|0"
    report("timed", True)
    assert report("timed", True) == "||s|-1|0"
    clock[0] += 1.0
    assert report("dep", True) == "||s|-1|1"
    assert ops.release("dep", Permit("dep", 4, "17")).args[1] == "4|17|r|-1|0"


def test_before_call_takes_a_caller_chosen_probe_id_and_keeps_its_prebuilt_call() -> None:
    ops = registry(CircuitBreakerConfig("dep")).ops
    plain = ops.before_call("dep")
    assert ops.before_call("dep") is plain  # the hot path: prebuilt, only looked up
    assert ops.before_call("dep", None) is plain
    assert len(plain.args) == 1
    chosen = ops.before_call("dep", "layer-1")
    assert (chosen.name, chosen.keys, chosen.args) == (
        "cb_before", plain.keys, (plain.args[0], "layer-1")
    )
    assert ops.before_call("dep", "é" * 64).args[1] == "é" * 64


def test_release_probe_names_the_probe_without_a_permit_generation() -> None:
    ops = registry(CircuitBreakerConfig("dep")).ops
    call = ops.release_probe("dep", "layer-1")
    assert call.name == "cb_after" and call.keys == ops.after_call("dep", True).keys
    assert call.args[1] == "|layer-1|r|-1|0"  # no generation, that probe id, a release
    with pytest.raises(durabilis.errors.DependencyNotFound):
        ops.release_probe("nope", "layer-1")


@pytest.mark.parametrize("probe_id", ["", "a|b", "x" * 65, "\ud800", 7, b"id", None])
def test_an_invalid_probe_id_is_a_value_error_before_any_io(probe_id: Any) -> None:
    ops = registry(CircuitBreakerConfig("dep")).ops
    if probe_id is not None:
        with pytest.raises(ValueError, match="probe id"):
            ops.before_call("dep", probe_id)
    with pytest.raises(ValueError, match="probe id"):
        ops.release_probe("dep", probe_id)


def test_the_report_config_carries_the_probe_timeout_before_the_replica_id() -> None:
    reg = CircuitBreakerRegistry(
        NoIO(), [CircuitBreakerConfig("dep", probe_timeout_seconds=2.5)],  # type: ignore[arg-type]
        replica_id="host|with|bars",
    )
    config_arg = reg.ops.after_call("dep", True).args[0]
    assert isinstance(config_arg, bytes)
    fields = config_arg.decode().split("|", 12)
    assert fields[11] == "2500"  # probe_timeout_ms
    assert fields[12] == "host|with|bars"  # the rest of the argument


def test_after_call_refuses_a_permit_of_another_dependency() -> None:
    ops = registry(CircuitBreakerConfig("a"), CircuitBreakerConfig("b")).ops
    with pytest.raises(ValueError, match="issued for 'a'"):
        ops.after_call("b", True, Permit("a", 0))


# --- reply decoding -----------------------------------------------------------------


def test_decode_before_hot_path_reuses_one_permit_per_generation() -> None:
    ops = registry(CircuitBreakerConfig("dep")).ops
    first, transition = ops.decode_before("dep", 7)
    assert first == Permit("dep", 7) and transition is None and not first.is_probe
    assert ops.decode_before("dep", 7)[0] is first
    assert ops.decode_before("dep", 8)[0].generation == 8


def test_decode_before_probe_with_its_transition() -> None:
    ops = registry(CircuitBreakerConfig("dep", reset_timeout_seconds=30)).ops
    reply = [b"ok", 4, b"9", b"H", 0, [b"O", b"H", 1_700_000_000_000, 0, 12, 0,
                                       b"reset_timeout", 4, b"1700000000000-0"]]
    permit, transition = ops.decode_before("dep", reply)
    assert permit == Permit("dep", 4, "9") and permit.is_probe
    assert transition is not None
    assert transition.from_state is BreakerState.OPEN
    assert transition.to_state is BreakerState.HALF_OPEN
    assert (transition.request_count, transition.failure_rate) == (12, None)
    assert transition.at.tzinfo is not None and transition.at.year == 2023
    assert (transition.reset_timeout_seconds, transition.replica_id) == (30, "unit-replica")
    assert transition.event_id == "1700000000000-0"


def test_decode_before_rejection_carries_retry_after() -> None:
    ops = registry(CircuitBreakerConfig("dep")).ops
    with pytest.raises(durabilis.CircuitOpen) as raised:
        ops.decode_before("dep", [b"open", 3, 1500])
    assert (raised.value.dependency, raised.value.retry_after) == ("dep", 1.5)


@pytest.mark.parametrize(
    ("script", "index", "key"),
    [
        ("before", 1, "breaker"),
        ("before", 2, "breaker_probes"),
        ("before", 3, "breaker_events"),
        ("after", 2, "breaker_window"),
        ("after", 5, "breaker_reporters"),
    ],
)
def test_corrupt_replies_name_the_key_holding_foreign_data(
    script: str, index: int, key: str
) -> None:
    ops = registry(CircuitBreakerConfig("dep")).ops
    decode = ops.decode_before if script == "before" else ops.decode_after
    with pytest.raises(durabilis.errors.CorruptData) as raised:
        decode("dep", [b"corrupt", index, b"WRONGTYPE"])
    assert raised.value.key == getattr(ops.keys, key)("dep")


def test_unexpected_replies_are_corrupt_data_not_bare_errors() -> None:
    ops = registry(CircuitBreakerConfig("dep")).ops
    for reply in ([b"what"], [], None, [b"ok"], 3.5):
        with pytest.raises(durabilis.errors.CorruptData):
            ops.decode_before("dep", reply)
    for reply in ([b"what"], [], None, 2):
        with pytest.raises(durabilis.errors.CorruptData):
            ops.decode_after("dep", reply)
    with pytest.raises(durabilis.errors.CorruptData):
        ops.decode_read("dep", [b"info", b"X", 0])
    with pytest.raises(durabilis.errors.CorruptData) as raised:
        ops.decode_events("dep", [(b"1-0", {b"from": b"nowhere"})])
    assert raised.value.key == ops.keys.breaker_events("dep")


def test_decode_after() -> None:
    ops = registry(CircuitBreakerConfig("dep", reset_timeout_seconds=30)).ops
    assert ops.decode_after("dep", 1) == (True, None)
    assert ops.decode_after("dep", [b"stale", b"C", 3]) == (False, None)
    assert ops.decode_after("dep", [b"ignored", b"O", 3]) == (False, None)
    assert ops.decode_after("dep", [b"released", b"H", 3]) == (True, None)
    counted, transition = ops.decode_after(
        "dep",
        [b"counted", b"O", 2, [b"C", b"O", 1_700_000_000_000, 3, 4, 0, b"failure_rate", 2, b"1-0"]],
    )
    assert counted and transition is not None
    assert (transition.failure_rate, transition.failure_count, transition.generation) == (
        0.75,
        3,
        2,
    )


def test_decode_read_reports_the_truth_and_what_a_call_would_get() -> None:
    ops = registry(CircuitBreakerConfig("dep", reset_timeout_seconds=10, min_request_count=4)).ops
    now = 1_700_000_000_000
    info = ops.decode_read("dep", [b"info", b"O", 5, now - 20_000, 0, 0, 0, now, 4, 3, 1, 2])
    assert info.state is BreakerState.OPEN  # past its reset timeout, still OPEN
    assert (info.call_allowed, info.probe_allowed, info.retry_after) == (True, True, 0.0)
    assert (info.failure_rate, info.slow_call_rate, info.failure_reporters) == (0.75, 0.25, 2)
    assert info.opened_at is not None and info.checked_at > info.opened_at
    info = ops.decode_read("dep", [b"info", b"C", 0, 0, 0, 0, 0, now, 3, 3, 0, 1])
    assert (info.failure_rate, info.opened_at) == (None, None)


# --- callbacks ------------------------------------------------------------------------


def test_fire_transition_logs_a_raising_callback_and_runs_the_others() -> None:
    reg = registry(CircuitBreakerConfig("dep"))
    ops = reg.ops
    _, transition = ops.decode_after(
        "dep",
        [b"counted", b"O", 1, [b"C", b"O", 1_700_000_000_000, 4, 4, 0, b"failure_rate", 1, b"1-0"]],
    )
    assert transition is not None
    seen: list[StateTransition] = []

    @reg.on_transition
    def broken(t: StateTransition) -> None:
        raise RuntimeError("bug in a callback")

    reg.on_transition(seen.append)
    with own_logs() as logs:
        reg.fire_transition(transition)
    assert seen == [transition]
    assert [e["event"] for e in logs] == [
        "durability_circuit_opened",
        "durability_transition_callback_failed",
    ]
    assert logs[1]["callback"].endswith("broken")


def test_upsert_config_is_local_and_immediate() -> None:
    reg = registry(CircuitBreakerConfig("dep"))
    reg.upsert_config(CircuitBreakerConfig("dep", window_size=50))
    assert reg.get_config("dep").window_size == 50
    config_arg = reg.ops.after_call("dep", True).args[0]
    assert isinstance(config_arg, bytes) and config_arg.startswith(b"50|0|")
    reg.upsert_config(CircuitBreakerConfig("new"))
    assert sorted(reg.names()) == ["dep", "new"]
    with pytest.raises(TypeError):
        reg.upsert_config({"name": "x"})  # type: ignore[arg-type]


# --- the scripts ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cb_before", "cb_after", "cb_force", "cb_read", "cb_register"])
def test_every_script_opens_with_its_contract_header(name: str) -> None:
    text = (LUA / f"{name}.lua").read_text()
    header = text.split("]]", 1)[0]
    assert header.startswith(f"--[[ {name}:")
    assert "KEYS[1]" in header and "ARGV[1]" in header and "Returns" in header
    assert "redis.call(\"KEYS\"" not in text and "SCAN" not in text.upper().replace("ZSCAN", "")


class FlakyStore(NoIO):
    """Admits (the CLOSED hot path reply) but cannot take reports: Redis went away."""

    def run(self, call: Any) -> Any:
        if call.name in ("cb_before", "cb_register"):
            return 0
        raise durabilis.StorageUnavailable("connection refused")


def test_a_report_lost_after_the_call_ran_is_logged_and_the_result_returned() -> None:
    reg = CircuitBreakerRegistry(FlakyStore(), [CircuitBreakerConfig("dep")])  # type: ignore[arg-type]
    empty: dict[str, int] = {}
    with own_logs() as logs:
        assert reg.call("dep", lambda: 42) == 42
        with pytest.raises(KeyError):
            reg.call("dep", empty.__getitem__, "missing")  # the call's own error wins
    assert [e["event"] for e in logs] == ["durability_breaker_report_failed"] * 2
    with pytest.raises(durabilis.StorageUnavailable):
        reg.after_call("dep", True)  # by hand, the error is the caller's to handle


def test_no_admission_no_call_when_redis_is_down() -> None:
    ran: list[int] = []
    reg = registry(CircuitBreakerConfig("dep"))
    with pytest.raises(AssertionError, match="unexpected I/O"):
        reg.call("dep", ran.append, 1)
    assert ran == []
