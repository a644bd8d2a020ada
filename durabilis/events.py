"""The structlog events durabilis emits, and the redaction switch for what they may carry.

Every event goes through the standard library logger ``"durabilis"`` (its level
decides; INFO events are silent until enabled) to structlog when the application
configured it, else to that logger's handlers: see :mod:`durabilis._log` and
docs/production.md. The six audit events
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
as ``"[REDACTED]"`` (after the codes and exception types that lead them:
``"NETWORK_TIMEOUT: ReadTimeout: [REDACTED]"``) unless redaction is turned off, by
``configure_logging(redact=False)`` or the environment variable
``DURABILIS_LOG_REDACT=0``. Error *codes* (``NETWORK_TIMEOUT``...) are always
logged. The stored DLQ record keeps the full text (``durabilis dlq show``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "AUDIT_EVENTS",
    "REDACTED",
    "REDACT_ENV",
    "configure_logging",
    "error_text",
    "redact",
    "redact_error",
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


def redact(text: str | None, *, enabled: bool | None = None) -> str | None:
    """``text`` as it may appear in a log event: ``"[REDACTED]"`` unless redaction is off
    (``enabled``: this call's choice, whatever the switch says; the web console's)."""
    if text is None:
        return None
    return REDACTED if (_SWITCH.redact if enabled is None else enabled) else text


_ERROR_PREFIX = re.compile(
    r"^([A-Za-z_][\w.]*(?::[ \t]*[A-Za-z_][\w.]*(?=:|$))*)(?::[ \t]*(.*))?$", re.DOTALL
)
_OWN_TEXTS = frozenset({"RetryExhausted", "CircuitOpen", "OperationInProgress"})
"""Errors whose text durabilis writes from names, counts and error codes only
(``job: gave up after 2 attempt(s), last error NETWORK_TIMEOUT``): never redacted."""


def redact_error(text: str | None, *, enabled: bool | None = None) -> str | None:
    """An error text (``"NETWORK_TIMEOUT: ReadTimeout: timed out for https://…"``) as
    it may appear in a log event: the leading codes and exception types are kept,
    the rest redacted like :func:`redact` (``"NETWORK_TIMEOUT: ReadTimeout:
    [REDACTED]"``); texts durabilis writes itself are kept whole. ``enabled``
    as :func:`redact`."""
    if text is None:
        return None
    match = _ERROR_PREFIX.match(text.strip())
    if match is None:
        return redact(text, enabled=enabled)
    code, rest = match[1], (match[2] or "").strip()
    if not rest:
        return code
    if any(part.strip() in _OWN_TEXTS for part in code.split(":")):
        return f"{code}: {rest}"
    return f"{code}: {redact(rest, enabled=enabled)}"


def exception_str(exc: BaseException) -> str:
    """``str(exc)``, never raising: an exception of the user's whose ``__str__``
    fails (or returns no string) is named by its type. What the layer writes
    down after ``fn`` ran must not fail on it (the outcome would go unrecorded)."""
    try:
        return str(exc)
    except BaseException:  # (SystemExit & co. raised by its own __str__, too)
        return f"<{type(exc).__name__}: str() failed>"


def error_text(exc: BaseException) -> str:
    """How an exception is written down as ``last_error``.

    An error whose message starts with its ``code`` (e.g.
    :class:`~durabilis.OperationError`) keeps it as is; others are written
    ``"<type>: <message>"`` (the type alone when the message is empty), so the
    exception's type is never lost.
    """
    name = type(exc).__name__
    text = exception_str(exc).strip()
    try:
        code = getattr(exc, "code", None)
    except BaseException:  # a property of the user's that raises (SystemExit & co. too)
        code = None
    if isinstance(code, str):
        code = str.__str__(code)  # a plain copy: a str subclass's own methods never run
    if isinstance(code, str) and code and text.startswith(code):
        return text.rstrip(": \t") or name  # "NETWORK_TIMEOUT: " -> "NETWORK_TIMEOUT"
    return f"{name}: {text}" if text else name
