"""The hard maximum of every duration and count a config can set (one place).

DESIGN §6, "Every bound is finite": a value a config, a TOML file or a fleet
config entry can set is checked against these at construction (each config's
``validate()`` raises :class:`~durabilis.ConfigError` naming the field), so a
hostile or mistyped value (``max_attempts = 10**9``, a ten-year breaker
timeout) is refused everywhere, by every replica, instead of wedging an
operation or a breaker for ever. docs/production.md, "Limits", lists each bound
with its reason; :data:`LIMITS` is that table (a test keeps the two in step).

No I/O here, and nothing imported from the pillars: every config module
imports this one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from durabilis.errors import ConfigError

__all__ = [
    "DAY",
    "DEFAULT_RETRY_DEADLINE_MS",
    "HOUR",
    "LIMITS",
    "MAX_ATTEMPTS",
    "MAX_BREAKER_IDLE_TTL_SECONDS",
    "MAX_BREAKER_PROBES",
    "MAX_BREAKER_REPORTERS",
    "MAX_BREAKER_TIMEOUT_SECONDS",
    "MAX_BREAKER_WINDOW_SIZE",
    "MAX_BUDGET_MIN_RETRIES",
    "MAX_BUDGET_RATIO",
    "MAX_BUDGET_WINDOW_SECONDS",
    "MAX_CHECKPOINTS",
    "MAX_CLAIM_TTL_SECONDS",
    "MAX_DEDUP_WINDOW_SECONDS",
    "MAX_KEY_LENGTH",
    "MAX_LEASE_SECONDS",
    "MAX_LINEAGE_PER_TASK",
    "MAX_MULTIPLIER",
    "MAX_NAME_BYTES",
    "MAX_PENDING",
    "MAX_RETRY_DEADLINE_MS",
    "MAX_RETRY_DELAY_MS",
    "MAX_STORED_BYTES",
    "MAX_STORED_TTL_SECONDS",
    "Limit",
    "check_limits",
]

HOUR: Final = 3600
DAY: Final = 86_400

# --- retry ------------------------------------------------------------------------------

MAX_ATTEMPTS: Final = 100
"""``RetryPolicy.max_attempts``: more attempts than this is an outage, not a blip."""

MAX_RETRY_DELAY_MS: Final = HOUR * 1000
"""``initial_delay_ms`` / ``max_delay_ms``: one backoff sleep holds the claim."""

MAX_RETRY_DEADLINE_MS: Final = DAY * 1000
"""``deadline_ms`` (and a call's ``deadline_seconds``): the longest an operation
may hold its claim while retrying; then it is parked in the DLQ."""

DEFAULT_RETRY_DEADLINE_MS: Final = HOUR * 1000
"""The deadline of a policy whose ``deadline_ms`` is ``None`` ("no deadline"
is not unbounded: one hour, then the DLQ)."""

MAX_MULTIPLIER: Final = 1000
"""``multiplier``: beyond it the first retry already hits ``max_delay_ms``."""

MAX_BUDGET_RATIO: Final = MAX_ATTEMPTS
"""``RetryBudget.ratio``: one call can never retry more than ``MAX_ATTEMPTS - 1`` times."""

MAX_BUDGET_MIN_RETRIES: Final = 1_000_000
"""``RetryBudget.min_retries`` per window."""

MAX_BUDGET_WINDOW_SECONDS: Final = HOUR
"""``RetryBudget.window_seconds``: a stricter budget setting of one replica
binds the others for one such window after its last use."""

# --- circuit breaker --------------------------------------------------------------------

MAX_BREAKER_TIMEOUT_SECONDS: Final = DAY
"""``reset_timeout_seconds``, ``probe_timeout_seconds``, ``window_seconds`` (and
``slow_call_duration_ms``, in ms): an open breaker refuses for at most a day."""

MAX_BREAKER_WINDOW_SIZE: Final = 100_000
"""``window_size`` and ``min_request_count``: results kept per breaker (a
time-based window at 100 reports/s for 1000 s)."""

MAX_BREAKER_PROBES: Final = 1000
"""``probe_success_required``: probes in flight at once, fleet-wide."""

MAX_BREAKER_REPORTERS: Final = 10_000
"""``min_distinct_reporters``: replicas that must have reported a failure."""

MAX_BREAKER_IDLE_TTL_SECONDS: Final = 30 * DAY
"""``idle_ttl_seconds``: the keys of a breaker nobody calls any more."""

# --- idempotency, checkpoints, DLQ ------------------------------------------------------

MAX_DEDUP_WINDOW_SECONDS: Final = 366 * DAY
"""``dedup_window_seconds``: a year (and a leap day) of dedup."""

MAX_LEASE_SECONDS: Final = HOUR
"""``in_progress_ttl_seconds``: a dead worker's claim is recoverable within an
hour (a live worker renews it, whatever the operation's length)."""

MAX_KEY_LENGTH: Final = 8192
"""``max_key_length`` (bytes): an idempotency key is a Redis key name."""

MAX_STORED_BYTES: Final = 512 * 1024 * 1024
"""``max_value_bytes``, ``max_state_bytes``, ``max_payload_bytes``,
``max_error_bytes``: what one Redis string can hold (``proto-max-bulk-len``)."""

MAX_STORED_TTL_SECONDS: Final = 366 * DAY
"""Checkpoint and DLQ ``default_ttl_seconds`` (and a call's ``ttl_seconds``)."""

MAX_CLAIM_TTL_SECONDS: Final = DAY
"""``DlqConfig.claim_ttl_seconds``: a replayer that died releases its record within a day."""

MAX_CHECKPOINTS: Final = 100_000_000
"""``max_checkpoints`` in a namespace."""

MAX_LINEAGE_PER_TASK: Final = 10_000
"""``max_lineage_per_task``; also a lineage walk's read bound per task it crosses
(records other than that task's current checkpoints), whatever the reader's cap."""

MAX_PENDING: Final = 1_000_000_000
"""``DlqConfig.max_pending`` (a warning threshold)."""

MAX_NAME_BYTES: Final = 8192
"""``DlqConfig.max_name_bytes``: agent ids and operation types."""


@dataclass(frozen=True, slots=True)
class Limit:
    """One bound: ``field`` of config class ``owner`` is at most ``maximum`` ``unit``."""

    owner: str
    field: str
    maximum: float
    unit: str


def _limits() -> tuple[Limit, ...]:
    table: list[Limit] = []

    def add(owner: str, maximum: float, unit: str, *fields: str) -> None:
        table.extend(Limit(owner, f, maximum, unit) for f in fields)

    add("RetryPolicy", MAX_ATTEMPTS, "", "max_attempts")
    add("RetryPolicy", MAX_RETRY_DELAY_MS, "ms", "initial_delay_ms", "max_delay_ms")
    add("RetryPolicy", MAX_MULTIPLIER, "", "multiplier")
    add("RetryPolicy", MAX_RETRY_DEADLINE_MS, "ms", "deadline_ms")
    add("RetryBudget", MAX_BUDGET_RATIO, "", "ratio")
    add("RetryBudget", MAX_BUDGET_MIN_RETRIES, "", "min_retries")
    add("RetryBudget", MAX_BUDGET_WINDOW_SECONDS, "s", "window_seconds")
    add("CircuitBreakerConfig", MAX_BREAKER_WINDOW_SIZE, "", "min_request_count", "window_size")
    add("CircuitBreakerConfig", MAX_BREAKER_PROBES, "", "probe_success_required")
    add("CircuitBreakerConfig", MAX_BREAKER_REPORTERS, "", "min_distinct_reporters")
    add("CircuitBreakerConfig", MAX_BREAKER_TIMEOUT_SECONDS, "s",
        "reset_timeout_seconds", "probe_timeout_seconds", "window_seconds")
    add("CircuitBreakerConfig", MAX_BREAKER_TIMEOUT_SECONDS * 1000, "ms", "slow_call_duration_ms")
    add("CircuitBreakerConfig", MAX_BREAKER_IDLE_TTL_SECONDS, "s", "idle_ttl_seconds")
    add("IdempotencyConfig", MAX_DEDUP_WINDOW_SECONDS, "s", "dedup_window_seconds")
    add("IdempotencyConfig", MAX_LEASE_SECONDS, "s", "in_progress_ttl_seconds")
    add("IdempotencyConfig", MAX_KEY_LENGTH, "bytes", "max_key_length")
    add("IdempotencyConfig", MAX_STORED_BYTES, "bytes", "max_value_bytes")
    add("CheckpointConfig", MAX_STORED_TTL_SECONDS, "s", "default_ttl_seconds")
    add("CheckpointConfig", MAX_CHECKPOINTS, "", "max_checkpoints")
    add("CheckpointConfig", MAX_STORED_BYTES, "bytes", "max_state_bytes")
    add("CheckpointConfig", MAX_LINEAGE_PER_TASK, "", "max_lineage_per_task")
    add("DlqConfig", MAX_STORED_TTL_SECONDS, "s", "default_ttl_seconds")
    add("DlqConfig", MAX_CLAIM_TTL_SECONDS, "s", "claim_ttl_seconds")
    add("DlqConfig", MAX_PENDING, "", "max_pending")
    add("DlqConfig", MAX_STORED_BYTES, "bytes", "max_payload_bytes", "max_error_bytes")
    add("DlqConfig", MAX_NAME_BYTES, "bytes", "max_name_bytes")
    return tuple(table)


LIMITS: Final[tuple[Limit, ...]] = _limits()
"""Every bound, in docs/production.md's order."""

_BY_OWNER: dict[str, tuple[Limit, ...]] = {}
for _limit in LIMITS:
    _BY_OWNER[_limit.owner] = (*_BY_OWNER.get(_limit.owner, ()), _limit)


def _shown(limit: Limit) -> str:
    value = f"{limit.maximum:,.0f}".replace(",", "_")
    return f"{value} {limit.unit}".rstrip()


def check_limits(config: Any) -> None:
    """Refuse a field of ``config`` over its maximum (:data:`LIMITS`, by class name).

    Only numbers are compared (``None`` and other types are each config's own
    checks to report), so it can run before or after those.

    Raises:
        ConfigError: Naming the first field over its maximum.
    """
    for limit in _BY_OWNER.get(type(config).__name__, ()):
        value = getattr(config, limit.field, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if (isinstance(value, float) and math.isnan(value)) or value > limit.maximum:
            raise ConfigError(
                limit.field, f"must be at most {_shown(limit)} (docs/production.md, Limits), "
                f"got {value!r}"
            )
