"""Replay handlers for ``durabilis dlq replay --handler tests.integration._cli_handlers:...``."""

from __future__ import annotations

import json
import os
from typing import Any

from durabilis import OperationError
from durabilis.layer import OperationContext

CALLS: list[OperationContext] = []
"""Contexts the in-process handlers received."""

LOG_ENV = "DURABILIS_TEST_HANDLER_LOG"
"""A file where the handlers append one JSON line per call (for subprocess runs)."""

NOT_CALLABLE = 3


def _log(ctx: OperationContext) -> None:
    CALLS.append(ctx)
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({
                "type": type(ctx).__name__, "idempotency_key": ctx.idempotency_key,
                "payload": ctx.payload, "replay": ctx.replay, "agent_id": ctx.agent_id,
            }) + "\n")


def record(ctx: OperationContext) -> Any:
    """Succeeds: the replayed operation's result is ``{"replayed": payload}``."""
    _log(ctx)
    return {"replayed": ctx.payload}


def fail(ctx: OperationContext) -> Any:
    """Fails like the dependency is still down."""
    _log(ctx)
    raise OperationError("NETWORK_TIMEOUT", "still down")


SECRET = "token=s3cr3t-payload"
"""What :func:`reject`'s error quotes (it must not show when redaction is on)."""


def reject(ctx: OperationContext) -> Any:
    """Fails for good (not retryable) with an error quoting a secret, as a
    payload or a URL would be."""
    _log(ctx)
    raise ValueError(f"the service rejected {SECRET}")
