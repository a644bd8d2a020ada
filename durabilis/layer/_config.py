"""The layer's settings and the values it hands out (no I/O, no plans)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from durabilis._acks import DEFAULT_ACKS_TIMEOUT, Acks
from durabilis._steps import CURRENT
from durabilis.breaker import DEFAULT_BREAKER_CONFIGS, CircuitBreakerConfig
from durabilis.checkpoint import CheckpointConfig
from durabilis.dlq import DlqConfig
from durabilis.errors import ConfigError
from durabilis.idempotency import IdempotencyConfig
from durabilis.retry import RetryPolicy

DEFAULT_DEPENDENCIES: Mapping[str, str] = MappingProxyType(
    {
        "mcp_call": "external_mcp_client",
        "memory_write": "memory_service",
        "wiki_write": "wiki_service",
    }
)
"""Which breaker guards which operation type by default (the seed's three breakers)."""

RECOVERY_WARN_SECONDS = 60
"""A lease longer than this makes recovery slow enough to warn about."""

WORKER_LOST = "WORKER_LOST"
"""``last_error`` of an operation whose worker died mid-flight (``recover_orphans``): it
may or may not have run."""

CIRCUIT_OPEN = "CIRCUIT_OPEN"
"""``final_error`` of an operation parked because its breaker was open."""


# --- configuration -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DurabilityConfig:
    """The five pillars' settings, and which breaker guards which operation type.

    The defaults fit a gateway: one ``"*"`` retry policy for every operation type
    (:func:`durabilis.retry.gateway_policies`), no breaker, no dependency, and a
    30 s claim lease. :meth:`seed` gives the seed's five policies, three breakers
    and their dependencies (what the demo runs; ``examples/seed.toml``).

    Attributes:
        idempotency: Dedup window, key limits and the claim's lease
            (``in_progress_ttl_seconds``, 30 s: how long after a worker's death
            its operation can be recovered; a live worker renews it).
        retry_policies: The retry policies; ``None``: the ``"*"`` gateway policy.
        breakers: The breakers; ``None``: none.
        checkpoint: Checkpoint settings.
        dlq: Dead-letter queue settings.
        dependencies: Operation type -> breaker name (``execute(dependency=…)``
            overrides it); types not listed run without a breaker.
        renew_every_seconds: How often a live worker renews its leases;
            ``None``: a third of the lease.
        acks: When a write counts as done: ``"primary"`` (once the primary ran
            it) or ``"replicas:N"`` (once N replicas confirmed it, ``WAIT``; fewer
            within ``acks_timeout_seconds`` fail the step, its outcome unknown:
            a claim is not used, nothing runs). ``None``: the store's level
            (``connect(acks=...)``, ``"primary"`` by default). docs/operations.md,
            "Acknowledgements", gives what each level survives and costs.
        acks_timeout_seconds: How long ``"replicas:N"`` waits for the replicas.
    """

    idempotency: IdempotencyConfig = field(default_factory=IdempotencyConfig)
    retry_policies: tuple[RetryPolicy, ...] | None = None
    breakers: tuple[CircuitBreakerConfig, ...] | None = None
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dlq: DlqConfig = field(default_factory=DlqConfig)
    dependencies: Mapping[str, str] = field(default_factory=dict)
    renew_every_seconds: float | None = None
    acks: str | None = None
    acks_timeout_seconds: float = DEFAULT_ACKS_TIMEOUT
    acks_level: Acks | None = field(default=None, init=False, repr=False, compare=False)
    """``acks`` with ``acks_timeout_seconds``, parsed once (by :meth:`validate`);
    ``None``: the store's own level."""

    @classmethod
    def seed(cls, **overrides: Any) -> DurabilityConfig:
        """The seed's setup: its five retry policies, three breakers and the
        dependencies ``mcp_call``/``memory_write``/``wiki_write`` -> their breakers."""
        from durabilis.retry import default_policies  # noqa: PLC0415  (retry imports nothing here)

        values: dict[str, Any] = {
            "retry_policies": tuple(default_policies()),
            "breakers": tuple(DEFAULT_BREAKER_CONFIGS),
            "dependencies": dict(DEFAULT_DEPENDENCIES),
        }
        values.update(overrides)
        return cls(**values)

    @property
    def policies(self) -> tuple[RetryPolicy, ...]:
        """The retry policies in effect (``retry_policies``, else the gateway default)."""
        if self.retry_policies is not None:
            return self.retry_policies
        from durabilis.retry import gateway_policies  # noqa: PLC0415

        return tuple(gateway_policies())

    @property
    def breaker_configs(self) -> tuple[CircuitBreakerConfig, ...]:
        """The breakers in effect (``breakers``, else none)."""
        return self.breakers or ()

    def warnings(self) -> list[str]:
        """What an operator should know about these settings (``config check``, ``doctor``)."""
        out = []
        lease = self.idempotency.in_progress_ttl_seconds
        if lease > RECOVERY_WARN_SECONDS:
            out.append(
                f"idempotency.in_progress_ttl_seconds is {lease:g} s: a dead worker's operations "
                f"wait that long before recover_orphans can park them (over "
                f"{RECOVERY_WARN_SECONDS} s)"
            )
        return out

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ``ConfigError`` naming the first invalid field."""
        checks: tuple[tuple[str, object, type], ...] = (
            ("idempotency", self.idempotency, IdempotencyConfig),
            ("checkpoint", self.checkpoint, CheckpointConfig),
            ("dlq", self.dlq, DlqConfig),
        )
        for name, value, kind in checks:
            if not isinstance(value, kind):
                raise ConfigError(name, f"must be a {kind.__name__}, got {type(value).__name__}")
        if not isinstance(self.dependencies, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v
            for k, v in self.dependencies.items()
        ):
            raise ConfigError("dependencies", "must map operation types to breaker names (str)")
        level = None
        if self.acks is not None or self.acks_timeout_seconds != DEFAULT_ACKS_TIMEOUT:
            level = Acks.parse(self.acks or "primary", self.acks_timeout_seconds)
        object.__setattr__(self, "acks_level", level if self.acks is not None else None)
        renew = self.renew_every_seconds
        if renew is not None and (
            isinstance(renew, bool)
            or not isinstance(renew, (int, float))
            or not 0 < renew < self.idempotency.in_progress_ttl_seconds
        ):
            raise ConfigError(
                "renew_every_seconds",
                "must be > 0 and shorter than idempotency.in_progress_ttl_seconds",
            )

    @property
    def renew_interval(self) -> float:
        return self.renew_every_seconds or self.idempotency.in_progress_ttl_seconds / 3.0

    @classmethod
    def from_toml(
        cls, path: str | Path | None, *, environ: Mapping[str, str] | None = None
    ) -> DurabilityConfig:
        """Load a TOML file in the seed's layout, with environment overrides.

        See :func:`durabilis.config.load_config` (``docs/production.md``).

        Raises:
            ConfigFileError: Naming the file (or variable), section and field.
        """
        from durabilis.config import load_config  # noqa: PLC0415  (config imports this module)

        return load_config(path, environ=environ)


# --- what fn sees ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OperationContext:
    """What an operation is handed: forward ``idempotency_key`` and ``token`` downstream.

    A downstream that dedups on ``idempotency_key`` (and, to fence stale
    writers, refuses a ``token`` lower than one it has seen) makes even the
    rare re-run after a crash between its side effect and our record harmless.

    Attributes:
        agent_id: Who runs it.
        operation_type: Its type (selects the retry policy).
        payload: The operation's payload.
        idempotency_key: The key claimed for it, as stored: for a caller's key
            (``idempotency_key=``, an HTTP ``Idempotency-Key``) its scoped form
            ``%raw:<agent>:<key>``, which two agents sending the same key to
            one downstream never share (docs/layer.md, "Which key to forward").
        token: The claim's fencing token (``None`` with idempotency disabled);
            tokens of successive claims of one key increase.
        attempt: 0-based attempt number.
        dependency: The breaker guarding it, if any.
        task_id: The checkpointed task, if any.
        phase: The checkpoint phase, if any.
        replay: The operation runs from a DLQ replay.
        recovered: An earlier run of this operation may have had its effect:
            it was taken over from a worker whose lease ended (it died, or
            could not record its outcome), or an earlier run was interrupted
            after ``fn`` started (a cancellation or timeout, ``SystemExit``,
            ``KeyboardInterrupt``: any ``BaseException`` not ``fn``'s own
            ``Exception``), or a dead worker's claim was parked by
            recovery. It stays set for every later run until one records an
            outcome. With ``replay``, the two cases in which ``fn`` may see an
            operation again after its effect: forward ``idempotency_key`` (the
            same on every run; ``token`` higher) so the downstream keeps it
            exactly once.
        caller_key: The caller's key as given (``order-1`` of
            ``%raw:gw-1:order-1``; the same on replays); ``None`` for a content
            key. Forward it instead of ``idempotency_key`` only to a downstream
            that keeps each agent's keys apart itself (one account per agent).
    """

    agent_id: str
    operation_type: str
    payload: Any
    idempotency_key: str
    token: str | None
    attempt: int
    dependency: str | None = None
    task_id: str | None = None
    phase: str | None = None
    replay: bool = False
    recovered: bool = False
    caller_key: str | None = None


def current_operation() -> OperationContext | None:
    """The context of the durable operation running now (inside ``fn`` and
    ``@layer.durable`` functions, also in the worker thread of a plain
    function run by the asyncio layer)."""
    current: OperationContext | None = CURRENT.get()
    return current


@dataclass(frozen=True, slots=True)
class LayerStats:
    """Fleet-wide totals kept in Redis by every layer of the namespace.

    Attributes:
        started: Operations that won their claim and ran.
        succeeded: Operations whose result was recorded.
        duplicates: Calls answered from a stored result or refused as in progress.
        retries: Retries made (attempts after the first), counted as each
            starts, in the process's batch of counts.
        parked: Operations parked in the DLQ (exhausted, circuit open, recovered):
            each counted once, when its parking makes a new pending record
            (as ``durabilis dlq stats`` and ``dlq ls`` count them). Counted
            after the record is written, in the process's batch of counts.
        parkings: Every parking, a re-parking of an operation already pending
            in the DLQ too (it merges into that record: ``DlqRecord.parkings``).
        non_retryable: Operations stopped by a non-retryable error.
        recovered: Orphans (dead workers) moved to the DLQ by ``recover_orphans``.
        in_flight: Operations holding a live claim now: the in-flight index's
            entries whose lease has not ended (a live worker renews its own).
        lease_ended: The index's entries whose lease ended: workers that died
            (or processes that ended without removing theirs), until
            ``recover_orphans`` parks or drops them. Never counted in flight:
            a crashed process cannot leave ``in_flight`` wrong past one lease.
    """

    started: int = 0
    succeeded: int = 0
    duplicates: int = 0
    retries: int = 0
    parked: int = 0
    parkings: int = 0
    non_retryable: int = 0
    recovered: int = 0
    in_flight: int = 0
    lease_ended: int = 0


