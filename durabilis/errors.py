"""The one error hierarchy of durabilis, rooted at :class:`DurabilisError`.

Every error carries the data a caller needs to act on it (the key, the
dependency, the DLQ id, ...), as attributes, not only in its message.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any


class DurabilisError(Exception):
    """Root of every error raised by durabilis itself.

    Attributes:
        partial: Set when a multi-script step failed part-way (internal: which
            of its calls had run, see ``Store.run_step``); ``None`` otherwise.
    """

    partial: Any = None


# --- configuration and input -------------------------------------------------


class ConfigError(DurabilisError, ValueError):
    """A configuration value is invalid.

    Attributes:
        field: The name of the offending field (``"max_attempts"``, ...).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnsupportedUrl(ConfigError):
    """The connection URL names a scheme durabilis cannot (yet) connect to."""

    def __init__(self, url: str, message: str) -> None:
        from durabilis._mask import mask_url  # noqa: PLC0415  (errors imports nothing else)

        super().__init__("url", f"{message} (url={mask_url(url)!r})")
        self.url = url


class ConfigFileError(ConfigError):
    """A configuration file (or an environment override) holds an invalid value.

    Attributes:
        path: The file, or ``"environment"`` for an override.
        section: The TOML section (``"retry.mcp_call"``), ``""`` for the file as a whole.
        field: The field (``"max_attempts"``), ``""`` for a whole section or file.
        variable: The environment variable that set the value, if one did.
    """

    def __init__(
        self, path: str, section: str, field: str, message: str, *, variable: str | None = None
    ) -> None:
        super().__init__(field, message)
        where = path if variable is None else f"{path} {variable}"
        if section:
            where += f" [{section}]"
        if field:
            where += f" {field}"
        self.args = (f"{where}: {message}",)
        self.path = path
        self.section = section
        self.variable = variable


class InvalidKey(DurabilisError, ValueError):
    """An idempotency key (or one of its parts) is empty or too long.

    Attributes:
        key: The offending key text (possibly truncated in the message).
    """

    def __init__(self, key: str, message: str) -> None:
        shown = key if len(key) <= 80 else key[:77] + "..."
        super().__init__(f"{message}: {shown!r}")
        self.key = key


class InvalidPayload(DurabilisError, TypeError):
    """A value cannot be stored: not msgpack/JSON encodable."""


class PayloadTooLarge(DurabilisError, ValueError):
    """An encoded value is larger than the configured limit.

    Attributes:
        size: The encoded size in bytes.
        limit: The configured limit in bytes.
    """

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size} bytes encoded, over the limit of {limit} bytes")
        self.size = size
        self.limit = limit


# --- storage -----------------------------------------------------------------


class StorageUnavailable(DurabilisError):
    """Redis could not be reached or did not answer in time.

    Always raised *from* the underlying redis-py error, never swallowed.
    """


class NotReplicated(StorageUnavailable):
    """A write ran on the primary but too few replicas confirmed it in time
    (``acks="replicas:N"``): it may be lost if a replica is promoted now, so the
    step is treated as failed, its outcome unknown (a claim is not used).

    Attributes:
        acked: How many replicas confirmed the write (``WAIT``'s reply).
        wanted: How many were asked for (``N``).
    """

    def __init__(self, acked: int, wanted: int, timeout_ms: int, where: str = "") -> None:
        super().__init__(
            f"a write{where} was confirmed by {acked} of the {wanted} replica(s) asked for "
            f"within {timeout_ms} ms (acks=\"replicas:{wanted}\"): it may not survive a "
            "failover, so it counts as failed"
        )
        self.acked = acked
        self.wanted = wanted


class WrongEventLoop(DurabilisError, RuntimeError):
    """An asyncio store (or a layer on it) was used on another event loop than the
    one it belongs to: the loop of its first call, for good. redis-py's asyncio
    connections belong to the loop that opened them; on another loop they failed
    midway (a ``DurabilisError`` "unexpected error" from asyncio's
    ``RuntimeError``: "Event loop is closed", "attached to a different loop").
    This is raised before anything is sent or held: make one store per event
    loop (call ``connect_async`` inside the coroutine ``asyncio.run`` runs, or
    one per thread's loop).
    """


class CorruptData(DurabilisError):
    """Data found in Redis is not what durabilis wrote there.

    Attributes:
        key: The Redis key holding the foreign or corrupt data.
    """

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"corrupt or foreign data at Redis key {key!r}: {detail}")
        self.key = key


# --- idempotency -------------------------------------------------------------


class LeaseLost(DurabilisError):
    """A stale owner tried to record or release a claim it no longer holds.

    Attributes:
        key: The idempotency key.
    """

    def __init__(self, key: str) -> None:
        super().__init__(
            f"the claim on {key!r} is no longer held by this token "
            "(its lease expired and was taken over, or it was released)"
        )
        self.key = key


class KeyReuseMismatch(DurabilisError):
    """A caller-supplied key was reused with a different payload (IETF 422).

    Attributes:
        key: The idempotency key.
    """

    def __init__(self, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was already used with a different payload"
        )
        self.key = key


class OperationInProgress(DurabilisError):
    """Another caller holds the claim on this key and has not finished yet.

    Attributes:
        key: The idempotency key.
        claimed_at: When the running claim was made (UTC).
    """

    def __init__(self, key: str, claimed_at: datetime | None = None) -> None:
        super().__init__(f"operation {key!r} is already in progress elsewhere")
        self.key = key
        self.claimed_at = claimed_at


class ResultNotStored(DurabilisError):
    """The operation RAN and completed, but its result could not be stored.

    Its record says "completed, result not stored" (with ``reason``), so the
    operation is never run again for this key: every duplicate gets this error
    too. Raised instead of returning when the result is not encodable (see
    ``docs/layer.md``, "Values that round-trip") or is over a size limit of a
    pillar that stores it.

    Attributes:
        key: The idempotency key.
        reason: Why the result was not stored.
        result: The result itself, for the caller whose ``fn`` produced it
            (``None`` for duplicates: it was never stored).
    """

    def __init__(self, key: str, reason: str, result: Any = None) -> None:
        super().__init__(
            f"operation {key!r} ran and completed, but its result was not stored: {reason}"
        )
        self.key = key
        self.reason = reason
        self.result = result


class OutcomeUnrecorded(DurabilisError):
    """The operation RAN, but its outcome could not be recorded in Redis.

    The layer kept trying while its claim's lease lasted (renewing it). The
    claim stays in progress: once the lease ends, the operation is treated as
    one whose worker died (taken over with ``ctx.recovered`` set, or parked by
    ``recover_orphans`` as ``WORKER_LOST``), so a downstream that dedups on the
    forwarded idempotency key keeps it exactly once.

    Attributes:
        key: The idempotency key.
        succeeded: ``fn`` succeeded (its result was not recorded); ``False``:
            it failed and could not be parked.
        result: ``fn``'s result when it succeeded.
    """

    def __init__(self, key: str, *, succeeded: bool, result: Any = None) -> None:
        what = "succeeded" if succeeded else "failed"
        super().__init__(
            f"operation {key!r} ran and {what}, but its outcome could not be recorded "
            "(Redis unavailable for the whole lease)"
        )
        self.key = key
        self.succeeded = succeeded
        self.result = result


class LayerClosed(DurabilisError):
    """The layer was closed: it accepts no new operation."""


# --- retry -------------------------------------------------------------------


class OperationError(Exception):
    """A ready-made error for operations: carries a classification ``code``.

    Not a :class:`DurabilisError`: it is raised by *your* operation (or the
    service behind it), and the retry engine classifies it by ``code``.

    Attributes:
        code: The error code (``"NETWORK_TIMEOUT"``, ``"RATE_LIMITED"``, ...).
        retry_after: Seconds the service asked to wait before retrying, if any.
    """

    def __init__(self, code: str, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
        self.retry_after = retry_after


class RetryExhausted(DurabilisError):
    """Every attempt failed; the operation was parked in the dead-letter queue.

    Attributes:
        operation_type: The operation type whose policy was used.
        attempts: How many attempts ran.
        final_error: The error code of the last failure.
        dlq_id: The id of the DLQ record, or ``None`` when none was written.
    """

    def __init__(
        self,
        operation_type: str,
        attempts: int,
        final_error: str | None,
        dlq_id: str | None = None,
    ) -> None:
        super().__init__(
            f"{operation_type}: gave up after {attempts} attempt(s), last error "
            f"{final_error}; dlq_id={dlq_id}"
        )
        self.operation_type = operation_type
        self.attempts = attempts
        self.final_error = final_error
        self.dlq_id = dlq_id


# --- circuit breaker ---------------------------------------------------------


class CircuitOpen(DurabilisError):
    """The dependency's breaker rejects calls for now.

    Attributes:
        dependency: The breaker's name.
        retry_after: Seconds until a call is sure to be admitted: the end of the
            reset timeout when OPEN; when HALF_OPEN with every probe slot taken,
            the re-arm of the slots (a slot may free up sooner, when a probe reports).
    """

    def __init__(self, dependency: str, retry_after: float) -> None:
        super().__init__(
            f"circuit for {dependency!r} is open; retry after {retry_after:.3f}s"
        )
        self.dependency = dependency
        self.retry_after = retry_after


class DependencyNotFound(DurabilisError, KeyError):
    """No breaker configuration exists for this dependency name.

    Attributes:
        dependency: The unknown name.
    """

    def __init__(self, dependency: str) -> None:
        super().__init__(f"no circuit breaker is configured for {dependency!r}")
        self.dependency = dependency

    def __str__(self) -> str:  # KeyError would quote the message again
        return str(self.args[0])


# --- checkpoint --------------------------------------------------------------


class CheckpointNotFound(DurabilisError, LookupError):
    """No live checkpoint matches the request."""


class CheckpointConflict(DurabilisError):
    """A save was based on a checkpoint that is no longer the task's latest.

    Attributes:
        task_id: The task.
        expected: The checkpoint id the save said it builds on.
        actual: The task's latest checkpoint id at the time of the save.
    """

    def __init__(self, task_id: str, expected: str | None, actual: str | None) -> None:
        super().__init__(
            f"checkpoint conflict on task {task_id!r}: expected latest {expected!r}, "
            f"found {actual!r}"
        )
        self.task_id = task_id
        self.expected = expected
        self.actual = actual


class InvalidTtl(ConfigError):
    """A TTL of zero or less was given."""

    def __init__(self, ttl_seconds: float) -> None:
        super().__init__("ttl_seconds", f"must be > 0, got {ttl_seconds!r}")
        self.ttl_seconds = ttl_seconds
