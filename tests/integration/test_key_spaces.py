"""Caller-supplied keys live in a key space of their own, scoped per agent and
bound to their payload: no caller can reach another's result through a key."""

from __future__ import annotations

import time
from typing import Any

import pytest

import durabilis
from durabilis import IdempotencyKey, OperationError
from durabilis.errors import KeyReuseMismatch
from durabilis.idempotency import IdempotencyGuard, New
from durabilis.layer import DurabilityLayer, OperationContext
from durabilis.testing import instant_retries
from tests.integration._layer_support import Counter, fast_config

pytestmark = pytest.mark.topologies("cluster")


def test_a_caller_key_cannot_take_another_agents_content_key(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, fast_config())
    victims = IdempotencyKey.new("victim", "job", {"to": "acct 456"})
    attacker = Counter(result="attacker's result")
    assert layer.execute("mallory", "job", {"to": "acct 999"}, attacker,
                         idempotency_key=victims.value) == "attacker's result"
    victim = Counter(result="victim's result")
    assert layer.execute("victim", "job", {"to": "acct 456"}, victim) == "victim's result"
    assert len(victim.calls) == 1  # its own operation ran
    assert attacker.calls[0].idempotency_key.startswith("%raw:mallory:")
    layer.close()


def test_two_agents_using_the_same_caller_key_do_not_meet(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, fast_config())
    a, b = Counter(result="a"), Counter(result="b")
    assert layer.execute("agent-a", "job", {"n": 1}, a, idempotency_key="order-1") == "a"
    assert layer.execute("agent-b", "job", {"n": 1}, b, idempotency_key="order-1") == "b"
    assert layer.execute("agent-a", "job", {"n": 1}, a, idempotency_key="order-1") == "a"
    assert (len(a.calls), len(b.calls)) == (1, 1)
    layer.close()


def test_a_caller_key_is_bound_to_its_payload(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, fast_config())
    op = Counter(result="charged")
    assert layer.execute("a1", "job", {"amount": 5}, op, idempotency_key="pay-1") == "charged"
    with pytest.raises(KeyReuseMismatch):
        layer.execute("a1", "job", {"amount": 500}, op, idempotency_key="pay-1")
    assert len(op.calls) == 1
    layer.close()


def test_a_stored_fingerprint_is_not_matched_by_a_claim_without_one(
    store: durabilis.Store,
) -> None:
    guard = IdempotencyGuard(store)
    claim = guard.check_and_record(IdempotencyKey.from_raw("k-1", payload={"n": 1}))
    assert isinstance(claim, New)
    guard.record(IdempotencyKey.from_raw("k-1", payload={"n": 1}), "secret", token=claim.token)
    with pytest.raises(KeyReuseMismatch):
        guard.check_and_record("k-1")  # no fingerprint: not the key's payload
    unbound = guard.check_and_record("k-2")
    assert isinstance(unbound, New)
    with pytest.raises(KeyReuseMismatch):  # and the reverse
        guard.check_and_record(IdempotencyKey.from_raw("k-2", payload={"n": 1}))


def test_a_parked_caller_key_operation_replays_under_its_key(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, fast_config())

    def down(ctx: OperationContext) -> Any:
        raise OperationError("NETWORK_TIMEOUT", "down")

    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as info:
        layer.execute("a1", "job", {"when": "now"}, down, idempotency_key="http-7")
    seen: list[str] = []

    def again(ctx: OperationContext) -> str:
        seen.append(ctx.idempotency_key)
        return "done"

    result = layer.replay(str(info.value.dlq_id), again)
    assert result.replayed and seen == ["%raw:a1:http-7"]
    op = Counter()
    assert layer.execute("a1", "job", {"when": "now"}, op, idempotency_key="http-7") == "done"
    assert op.calls == []
    layer.close()


def test_content_keys_are_keyed_by_the_namespace_secret(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durabilis import IdempotencyConfig
    from durabilis.config import config_to_dict
    from durabilis.layer import DurabilityConfig

    payload = {"to": "acct 456"}
    plain = IdempotencyKey.new("a1", "job", payload)
    keyed = IdempotencyKey.new("a1", "job", payload, secret="s" * 32)
    assert keyed != plain and keyed == IdempotencyKey.new("a1", "job", payload, secret="s" * 32)
    assert IdempotencyKey.new("a1", "job", payload, secret="t" * 32) != keyed
    secret = IdempotencyConfig(key_secret="s" * 32)
    replicas = [DurabilityLayer(store, fast_config(idempotency=secret)) for _ in range(2)]
    op = Counter(result="once")
    assert [r.execute("a1", "job", payload, op) for r in replicas] == ["once", "once"]
    assert len(op.calls) == 1 and op.calls[0].idempotency_key == keyed.value
    assert "s" * 32 not in repr(secret)
    shown = config_to_dict(DurabilityConfig(idempotency=secret))["idempotency"]
    assert shown["key_secret"] == "***"
    monkeypatch.setenv("DURABILIS_KEY_SECRET", "s" * 32)  # the same secret from the environment
    from_env = DurabilityLayer(store, fast_config())
    assert from_env.execute("a1", "job", payload, op) == "once" and len(op.calls) == 1
    for layer in (*replicas, from_env):
        layer.close()
    with pytest.raises(durabilis.ConfigError):
        IdempotencyConfig(key_secret="short")


BODY = b'{"page": 7, "text": "hi"}'  # the HTTP body a client's key is bound to


def _bound_key() -> IdempotencyKey:
    return IdempotencyKey.from_raw("req-1", payload=BODY)


def test_an_orphan_of_a_bound_caller_key_replays_under_the_keys_own_fingerprint(
    store: durabilis.Store,
) -> None:
    from durabilis._steps import Run
    from tests.integration.test_layer_promise import step_plan

    layer = DurabilityLayer(store, fast_config(lease=0.2))
    payload = {"page": 7, "text": "hi"}
    req = layer._core.request("a1", "job", payload, dependency=None,
                              idempotency_key=_bound_key(), task_id=None, phase=None,
                              wait=None, park_on_open=False, deadline_seconds=None)
    step_plan(layer._core.execute_plan(req, Counter()), store,
              until=lambda step: type(step) is Run)  # the worker dies inside fn
    time.sleep(0.3)
    [dlq_id] = layer.recover_orphans()
    assert layer.dlq.get(dlq_id).metadata["fingerprint"] == _bound_key().fingerprint  # type: ignore[union-attr]
    op = Counter(result="done")
    assert layer.execute("a1", "job", payload, op, idempotency_key=_bound_key()) == "done"
    # That delivery settled the parked record: nothing left to replay, not stuck.
    settled = layer.dlq.get(dlq_id)
    assert settled is not None and settled.replayed_by == "a later delivery"
    replayer = Counter()
    assert layer.replay(dlq_id, replayer).outcome.value == "not_pending"
    assert replayer.calls == []
    assert layer.execute("a1", "job", payload, op, idempotency_key=_bound_key()) == "done"
    assert len(op.calls) == 1
    layer.close()


def test_a_released_key_stays_bound_to_its_payload(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, fast_config())

    def down(ctx: OperationContext) -> Any:
        raise OperationError("NETWORK_TIMEOUT", "down")

    with instant_retries(), pytest.raises(durabilis.RetryExhausted):
        layer.execute("a1", "job", {"to": "alice"}, down, idempotency_key="pay-9")
    op = Counter()
    with pytest.raises(KeyReuseMismatch):  # parked (claim released): still alice's key
        layer.execute("a1", "job", {"to": "bob"}, op, idempotency_key="pay-9")
    assert op.calls == [] and layer.dlq.pending_count() == 1
    layer.close()
