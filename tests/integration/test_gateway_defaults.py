"""A DurabilityLayer built with no settings fits a gateway: transport errors of the
common HTTP clients are retried without registration, nothing unconfigured appears."""

from __future__ import annotations

import durabilis
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext

# What `import httpx` would define; the classification reads module and class name.
ReadTimeout = type("ReadTimeout", (Exception,), {"__module__": "httpx"})
ConnectError = type("ConnectError", (Exception,), {"__module__": "httpx"})


def test_an_httpx_timeout_is_retried_with_no_registration(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, DurabilityConfig())
    calls: list[int] = []

    def send(ctx: OperationContext) -> str:
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise ReadTimeout("timed out")
        if len(calls) == 2:
            raise ConnectError("connection refused")
        return "sent"

    try:
        assert layer.execute("a1", "ledger_post", {"amount": 5}, send) == "sent"
    finally:
        layer.close()
    assert calls == [0, 1, 2]  # the "*" gateway policy: 3 attempts


def test_an_unconfigured_layer_has_no_breakers_and_one_policy(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, DurabilityConfig())
    try:
        assert layer.breakers.names() == []
        assert list(layer.retry.policies) == ["*"]
        assert layer.execute("a1", "anything", {}, lambda ctx: 1) == 1
        assert layer.breakers.names() == []  # no dependency: no breaker made on the fly
    finally:
        layer.close()
