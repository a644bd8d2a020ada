"""The structlog events durabilis emits, and the redaction switch for what they may carry.

Every event goes to ``structlog.get_logger("durabilis")``. The six audit events
keep the names and metadata fields of the seed gateway's audit log:

- ``durability_retry_attempt``: ``operation_type, attempt_number, max_attempts,
  delay_ms, error_code`` (+ ``agent_id`` in the layer);
- ``durability_retry_exhausted``: ``operation_type, attempts, max_attempts,
  error_code, reason, sent_to_dlq, dlq_id, last_error`` (+ ``agent_id`` in the layer);
- ``durability_circuit_opened``: ``dependency, failure_rate, request_count,
  reset_timeout_seconds, from_state, to_state, reason, generation, replica_id``;
- ``durability_circuit_recovered``: the same fields (``request_count`` is the
  number of probe successes that closed it: the seed's ``probe_success_count``);
- ``durability_checkpoint_saved``: ``checkpoint_id, task_id, agent_id, phase,
  ttl_seconds, parent_checkpoint_id, mode`` (``save``, ``fork`` or ``rewind``);
- ``durability_dlq_replayed``: ``dlq_id, operation_type, agent_id, replayed_by,
  replay_attempts, claim_taken_over``.

**Redaction.** No event carries a payload, a result or a checkpoint state.
Error *texts* (``last_error`` of an exhausted operation, the error of a failed
DLQ replay) may quote a payload or a secret (URLs, tokens), so they are logged
as ``"[REDACTED]"`` unless redaction is turned off, by
``configure_logging(redact=False)`` or the environment variable
``DURABILIS_LOG_REDACT=0``. Error *codes* (``NETWORK_TIMEOUT``...) are always
logged. The stored DLQ record keeps the full text (``durabilis dlq show``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "AUDIT_EVENTS",
    "REDACTED",
    "REDACT_ENV",
    "configure_logging",
    "redact",
    "redaction_enabled",
]

REDACTED = "[REDACTED]"
"""What a redacted text is logged as (the seed's audit scrubber's marker)."""

REDACT_ENV = "DURABILIS_LOG_REDACT"
"""Environment variable: ``0``/``false``/``no``/``off`` logs error texts in clear."""

_OFF = frozenset({"0", "false", "no", "off"})

AUDIT_EVENTS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "durability_retry_attempt": (
            "operation_type", "attempt_number", "max_attempts", "delay_ms", "error_code",
        ),
        "durability_retry_exhausted": (
            "operation_type", "attempts", "max_attempts", "error_code", "reason",
            "sent_to_dlq", "dlq_id", "last_error",
        ),
        "durability_circuit_opened": (
            "dependency", "failure_rate", "request_count", "reset_timeout_seconds",
        ),
        "durability_circuit_recovered": ("dependency", "request_count"),
        "durability_checkpoint_saved": ("checkpoint_id", "task_id", "agent_id", "phase",
                                        "ttl_seconds"),
        "durability_dlq_replayed": ("dlq_id", "operation_type", "agent_id", "replayed_by"),
    }
)
"""The seed's six audit events and the fields each always carries."""


class _Switch:
    __slots__ = ("redact",)

    def __init__(self) -> None:
        self.redact = _from_env()


def _from_env() -> bool:
    return os.environ.get(REDACT_ENV, "1").strip().lower() not in _OFF


_SWITCH = _Switch()


def configure_logging(*, redact: bool | None = None) -> None:
    """Choose whether error texts are redacted in durabilis's log events.

    Args:
        redact: ``True`` (the default state): log ``"[REDACTED]"`` instead of
            error texts. ``False``: log them in clear (e.g. in development).
            ``None``: go back to what ``DURABILIS_LOG_REDACT`` says.
    """
    _SWITCH.redact = _from_env() if redact is None else bool(redact)


def redaction_enabled() -> bool:
    """Whether error texts are redacted in log events now."""
    return _SWITCH.redact


def redact(text: str | None) -> str | None:
    """``text`` as it may appear in a log event: ``"[REDACTED]"`` unless redaction is off."""
    if text is None:
        return None
    return REDACTED if _SWITCH.redact else text
