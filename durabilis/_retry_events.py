"""The retry loop's events (logger ``"durabilis"``, docs/production.md): emitted
by both engines and by the layer's own attempt loop; none raises (a logging
hook that fails is told once, ``durability_event_failed``)."""

from __future__ import annotations

import contextlib
from typing import Any

from durabilis.core import logsink
from durabilis.core.retry import NON_RETRYABLE, RetryDecision
from durabilis.events import redact_error

_EMIT_FAILED: set[str] = set()  # the events whose logging raised (told once each)


def _emit(level: str, event: str, fields: dict[str, Any]) -> None:
    """Log ``event``; a logging hook that raises (a filter, a handler, a structlog
    processor) never reaches the call: the event is lost, and the failure is
    logged once per event and process (``durability_event_failed``, the error's
    type only), if logging that does not raise too."""
    try:
        getattr(logsink.SINK, level)(event, **fields)
    except Exception as exc:
        if event not in _EMIT_FAILED:
            _EMIT_FAILED.add(event)
            with contextlib.suppress(Exception):
                logsink.SINK.warning(
                    "durability_event_failed", lost_event=event, error=type(exc).__qualname__
                )


def emit_retry_attempt(operation_type: str, decision: RetryDecision, **context: Any) -> None:
    """Log ``durability_retry_attempt``: attempt ``attempt_number`` (1-based) failed, retrying.

    ``context`` adds fields (the composed layer adds ``agent_id``). Never
    raises: a logging hook's error is logged once (``durability_event_failed``).
    """
    _emit("warning", "durability_retry_attempt", {
        "operation_type": operation_type,
        "attempt_number": decision.attempts,
        "max_attempts": decision.max_attempts,
        "delay_ms": round(decision.delay * 1000.0, 3),
        "error_code": decision.error_code,
        **context,
    })


def emit_retry_stop(
    operation_type: str,
    decision: RetryDecision,
    *,
    last_error: str | None = None,
    dlq_id: str | None = None,
    **context: Any,
) -> None:
    """Log why a retry loop stopped without success.

    ``durability_retry_non_retryable`` for a non-retryable error, otherwise
    ``durability_retry_exhausted`` with the ``reason`` (``EXHAUSTED``,
    ``DEADLINE_EXCEEDED`` or ``RETRY_BUDGET_EXHAUSTED``). ``last_error`` is
    logged redacted unless redaction is off (:mod:`durabilis.events`);
    ``dlq_id`` is the record the operation was parked in, if any; ``context``
    adds fields (the composed layer adds ``agent_id``). Never raises, as
    :func:`emit_retry_attempt`.
    """
    event = (
        "durability_retry_non_retryable"
        if decision.stop_reason == NON_RETRYABLE
        else "durability_retry_exhausted"
    )
    _emit("error", event, {
        "operation_type": operation_type,
        "attempts": decision.attempts,
        "max_attempts": decision.max_attempts,
        "error_code": decision.error_code,
        "reason": decision.stop_reason,
        "sent_to_dlq": decision.sent_to_dlq,
        "dlq_id": dlq_id,
        "last_error": redact_error(last_error),
        **context,
    })
