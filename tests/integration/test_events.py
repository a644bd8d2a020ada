"""The seed's audit events, each emitted with its metadata fields; and no
payload, result, state or error text in any log line unless redaction is off."""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

import durabilis
from durabilis import CircuitBreakerConfig, IdempotencyConfig, OperationError, RetryPolicy
from durabilis.breaker import CircuitBreakerRegistry
from durabilis.checkpoint import CheckpointManager
from durabilis.config import ConfigSync
from durabilis.events import (
    AUDIT_EVENTS,
    REDACT_ENV,
    REDACTED,
    configure_logging,
    redact,
    redaction_enabled,
)
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext
from durabilis.retry import RetryEngine
from durabilis.testing import instant_retries

POLICY = RetryPolicy(
    "job", 3, 1, 2, jitter=False, retryable_errors=("NETWORK_TIMEOUT",),
    non_retryable_errors=("PERMISSION_DENIED",),
)


def config(min_requests: int = 50) -> DurabilityConfig:
    return DurabilityConfig(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=30),
        retry_policies=(POLICY,),
        breakers=(CircuitBreakerConfig("svc", 0.5, min_requests, 1, 1, 50, 1),),
        dependencies={"job": "svc"},
    )


@pytest.fixture(autouse=True)
def default_redaction() -> Iterator[None]:
    configure_logging(redact=True)
    yield
    configure_logging(redact=None)


def events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


def has_seed_fields(event: MutableMapping[str, Any]) -> None:
    missing = set(AUDIT_EVENTS[event["event"]]) - set(event)
    assert not missing, f"{event['event']} lacks {sorted(missing)}"


def failing(message: str = "upstream timed out") -> Any:
    """Always times out (called with the layer's context, or with nothing by the engine)."""

    def fn(*ctx: OperationContext) -> None:
        raise OperationError("NETWORK_TIMEOUT", message)

    return fn


# --- each audit event with its fields ----------------------------------------------------


def test_retry_attempt_and_exhausted_carry_the_seed_fields(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, config())
    with capture_logs() as logs, instant_retries(), pytest.raises(
        durabilis.RetryExhausted
    ) as info:
        layer.execute("agent-7", "job", {"n": 1}, failing())
    attempts = events(logs, "durability_retry_attempt")
    assert [(e["attempt_number"], e["max_attempts"], e["error_code"], e["agent_id"])
            for e in attempts] == [(1, 3, "NETWORK_TIMEOUT", "agent-7"),
                                   (2, 3, "NETWORK_TIMEOUT", "agent-7")]
    assert [e["delay_ms"] for e in attempts] == [1.0, 2.0]
    assert all(e["operation_type"] == "job" and e["log_level"] == "warning" for e in attempts)
    (stop,) = events(logs, "durability_retry_exhausted")
    assert stop["operation_type"] == "job" and stop["agent_id"] == "agent-7"
    assert (stop["attempts"], stop["max_attempts"], stop["reason"]) == (3, 3, "EXHAUSTED")
    assert stop["sent_to_dlq"] is True and stop["dlq_id"] == info.value.dlq_id
    assert stop["last_error"] == f"NETWORK_TIMEOUT: {REDACTED}"  # the code kept, the text redacted
    for event in [*attempts, stop]:
        has_seed_fields(event)

    engine = RetryEngine(policies=[POLICY])  # the bare engine parks nothing: no dlq_id
    with capture_logs() as bare, instant_retries():
        engine.execute("job", failing())
    (alone,) = events(bare, "durability_retry_exhausted")
    assert alone["dlq_id"] is None and alone["last_error"] == f"NETWORK_TIMEOUT: {REDACTED}"
    has_seed_fields(alone)
    layer.close()


def test_circuit_opened_and_recovered_carry_the_seed_fields(store: durabilis.Store) -> None:
    registry = CircuitBreakerRegistry(store, [CircuitBreakerConfig("svc", 0.5, 2, 1, 1, 4, 1)])
    with capture_logs() as logs:
        for _ in range(2):
            registry.after_call("svc", False, registry.before_call("svc"))
        time.sleep(1.05)  # the reset timeout: the next call is the probe
        registry.after_call("svc", True, registry.before_call("svc"))
    (opened,) = events(logs, "durability_circuit_opened")
    assert opened["dependency"] == "svc" and opened["failure_rate"] == 1.0
    assert opened["request_count"] == 2 and opened["reset_timeout_seconds"] == 1
    assert (opened["from_state"], opened["to_state"]) == ("closed", "open")
    (recovered,) = events(logs, "durability_circuit_recovered")
    assert recovered["dependency"] == "svc" and recovered["to_state"] == "closed"
    assert recovered["request_count"] == 1  # the probe successes that closed it
    has_seed_fields(opened)
    has_seed_fields(recovered)


def test_checkpoint_saved_is_logged_by_the_manager_itself_and_once_through_the_layer(
    store: durabilis.Store,
) -> None:
    manager = CheckpointManager(store)
    with capture_logs() as logs:
        first = manager.save("task-1", "agent-1", "draft", {"x": 1}, ttl_seconds=3600)
        fork = manager.fork(first.checkpoint_id, "task-2")
    saved = events(logs, "durability_checkpoint_saved")
    assert [(e["checkpoint_id"], e["task_id"], e["agent_id"], e["phase"], e["mode"])
            for e in saved] == [(first.checkpoint_id, "task-1", "agent-1", "draft", "save"),
                                (fork.checkpoint_id, "task-2", "agent-1", "draft", "fork")]
    assert saved[0]["ttl_seconds"] == 3600 and saved[0]["parent_checkpoint_id"] is None
    assert saved[1]["parent_checkpoint_id"] == first.checkpoint_id
    for event in saved:
        has_seed_fields(event)

    layer = DurabilityLayer(store, config())
    with capture_logs() as through_layer:
        layer.execute("agent-1", "job", {"n": 2}, lambda ctx: {"ok": True},
                      task_id="task-3", phase="publish")
    (one,) = events(through_layer, "durability_checkpoint_saved")
    assert one["task_id"] == "task-3" and one["phase"] == "publish"
    layer.close()


def test_dlq_replayed_carries_the_seed_fields(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, config(), replica_id="replayer-1")
    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as info:
        layer.execute("agent-2", "job", {"n": 3}, failing())
    with capture_logs() as logs:
        layer.replay(str(info.value.dlq_id), lambda ctx: "ok")
    (replayed,) = events(logs, "durability_dlq_replayed")
    assert replayed["dlq_id"] == info.value.dlq_id and replayed["operation_type"] == "job"
    assert replayed["agent_id"] == "agent-2" and replayed["replayed_by"] == "replayer-1"
    has_seed_fields(replayed)
    layer.close()


# --- redaction ------------------------------------------------------------------------------


class _Both:
    """Keeps every event dict and renders every event as the JSON line a log would hold."""

    def __init__(self) -> None:
        self.dicts: list[dict[str, Any]] = []
        self.out = io.StringIO()

    def keep(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        self.dicts.append(dict(event))
        return event

    def __enter__(self) -> _Both:
        self.saved = structlog.get_config()
        structlog.configure(
            processors=[
                structlog.processors.add_log_level,
                self.keep,
                structlog.processors.TimeStamper(fmt="iso"),
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
            logger_factory=structlog.PrintLoggerFactory(file=self.out),
        )
        return self

    def __exit__(self, *exc: object) -> None:
        structlog.configure(**self.saved)


def exercise_every_pillar(store: durabilis.Store, secret: str) -> None:
    """Payloads, results, states and error texts all hold ``secret``."""
    layer = DurabilityLayer(store, config(min_requests=2), replica_id="r1")
    payload = {"card": secret, "note": f"for {secret}"}
    with instant_retries():
        with pytest.raises(durabilis.RetryExhausted) as parked:
            layer.execute("agent", "job", payload, failing(f"timeout calling {secret}"))
        with pytest.raises(durabilis.CircuitOpen):  # the failures opened the breaker
            layer.execute("agent", "job", {"other": secret}, lambda ctx: secret)
        layer.breakers.force_close("svc")

        def denied(ctx: OperationContext) -> None:
            raise OperationError("PERMISSION_DENIED", f"no access to {secret}")

        with pytest.raises(OperationError):
            layer.execute("agent", "job", {"denied": secret}, denied)
        layer.execute("agent", "job", {"kept": secret}, lambda ctx: {"result": secret},
                      task_id="task-s", phase="p1")
        layer.checkpoints.save("task-s", "agent", "p2", {"state": secret})
        dlq_id = str(parked.value.dlq_id)

        def still_down(ctx: OperationContext) -> None:
            raise RuntimeError(f"replay failed near {secret}")

        layer.replay(dlq_id, still_down)
        layer.breakers.force_close("svc")
        layer.replay(dlq_id, lambda ctx: {"replayed": secret})
        other = layer.dlq.enqueue("agent", "job", {"x": secret}, 1, f"error {secret}")
        layer.dlq.abandon(other)
        RetryEngine(policies=[POLICY]).execute("job", failing(f"bare engine {secret}"))
        ConfigSync(layer).publish_policy(RetryPolicy("job", 2, 1, 1))
    layer.close()


def test_a_payload_never_appears_in_a_log_line_by_default(store: durabilis.Store) -> None:
    secret = f"SECRET-{uuid.uuid4().hex}"
    with _Both() as seen:
        exercise_every_pillar(store, secret)
    names = {e["event"] for e in seen.dicts}
    # The scenario did reach the events that could carry the texts.
    assert {"durability_retry_exhausted", "durability_retry_non_retryable",
            "durability_dlq_replay_failed", "durability_dlq_replayed",
            "durability_checkpoint_saved", "durability_circuit_opened",
            "durability_dlq_enqueued"} <= names
    lines = seen.out.getvalue().splitlines()
    assert len(lines) == len(seen.dicts) >= 15
    for line in lines:
        json.loads(line)
        assert secret not in line, line
    for event in seen.dicts:
        assert secret not in repr(event)
    stop = next(e for e in seen.dicts if e["event"] == "durability_retry_exhausted")
    assert stop["last_error"] == f"NETWORK_TIMEOUT: {REDACTED}"


def test_with_redaction_off_error_texts_are_logged_in_clear(store: durabilis.Store) -> None:
    secret = f"SECRET-{uuid.uuid4().hex}"
    configure_logging(redact=False)
    with _Both() as seen:
        exercise_every_pillar(store, secret)
    clear = [json.loads(line) for line in seen.out.getvalue().splitlines()
             if secret in line]
    assert {e["event"] for e in clear} == {
        "durability_retry_exhausted", "durability_retry_non_retryable",
        "durability_dlq_replay_failed",
    }
    # Only error texts: never a payload, a result or a checkpoint state.
    for event in clear:
        assert set(k for k, v in event.items() if secret in str(v)) <= {"last_error", "error"}


def test_the_switch_follows_the_environment_unless_set_in_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REDACT_ENV, "0")
    configure_logging(redact=None)
    assert not redaction_enabled() and redact("boom") == "boom"
    monkeypatch.setenv(REDACT_ENV, "yes")
    configure_logging(redact=None)
    assert redaction_enabled() and redact("boom") == REDACTED
    configure_logging(redact=False)
    assert not redaction_enabled()
    assert redact(None) is None
