"""The composed layer's settings: :class:`DurabilityConfig` (pure values, no I/O).

It lives in the config package, below the layer: :mod:`durabilis.config`
loads, checks and hot-reloads it without importing :mod:`durabilis.layer`
(which re-exports it from ``durabilis.layer._config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from durabilis._acks import DEFAULT_ACKS_TIMEOUT, Acks
from durabilis.breaker import DEFAULT_BREAKER_CONFIGS, CircuitBreakerConfig
from durabilis.checkpoint import CheckpointConfig
from durabilis.core.retry import RetryPolicy
from durabilis.core.retry.defaults import default_policies, gateway_policies
from durabilis.dlq import DlqConfig
from durabilis.errors import ConfigError
from durabilis.idempotency import IdempotencyConfig

__all__ = ["DEFAULT_DEPENDENCIES", "RECOVERY_WARN_SECONDS", "DurabilityConfig"]

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
        from durabilis.config._loading import load_config  # noqa: PLC0415  (it imports this module)

        return load_config(path, environ=environ)
