"""Configuration files, environment overrides, and fleet-wide hot reload.

**Files.** :func:`load_config` (also ``DurabilityConfig.from_toml``) reads a
TOML file in the seed's layout::

    [idempotency]
    dedup_window_seconds = 3600

    [retry."*"]                       # overrides fields of the default policy
    max_attempts = 5

    [retry.mcp_call]                  # a policy of its own for one operation type
    max_attempts = 3
    initial_delay_ms = 500
    max_delay_ms = 10000

    [circuit_breaker.memory_service]  # a breaker (none exist unless declared)
    failure_rate_threshold = 0.6
    min_request_count = 10

    [checkpoint]
    default_ttl_seconds = 86400

    [dlq]
    claim_ttl_seconds = 120

    [dependencies]                    # operation type -> breaker
    mcp_call = "external_mcp_client"

**Environment overrides** win over the file: ``DURABILIS__<SECTION>__<FIELD>``
with ``__`` between the parts, e.g. ``DURABILIS__RETRY__MCP_CALL__MAX_ATTEMPTS=5``.
Values are read as TOML values (``5``, ``0.5``, ``true``, ``["A", "B"]``), or as
plain text when they are not one. Every error names the file (or variable),
the section and the field: :class:`~durabilis.errors.ConfigFileError`.

**Fleet-wide hot reload.** :class:`ConfigSync` stores retry policies and
breaker configs in Redis (one Lua script: store the JSON text and bump a
version) and every replica running a ``ConfigSync`` applies them within
``interval_seconds`` (plus three round trips), logging ``durability_config_reloaded``.
What a replica reads there is decoded entry by entry under caps
(:data:`MAX_ENTRY_BYTES`, :data:`MAX_ENTRY_DEPTH`): one hostile entry is
rejected (``durability_config_entry_rejected``), the others still apply, and
the poller never dies.

The package: ``_model`` (the entries, their JSON and its caps; nothing of the
layer), ``_loading`` (TOML, environment, presets), ``_ops`` and ``_apply``
(the fleet config's calls and how a replica applies them, no I/O) and
``_sync`` (the two pollers). The names below are its public face.
"""

from __future__ import annotations

from durabilis.config._apply import Applier
from durabilis.config._apply import ReloadCallback as ReloadCallback
from durabilis.config._loading import (
    ENV_PREFIX,
    ENVIRONMENT,
    config_to_dict,
    declared_entries,
    load_config,
    parse_config,
)
from durabilis.config._loading import PRESETS as PRESETS
from durabilis.config._model import (
    BREAKER,
    MAX_ENTRY_BYTES,
    MAX_ENTRY_DEPTH,
    RETRY,
    FleetConfig,
    Reload,
    breaker_from_dict,
    breaker_to_dict,
    decode_entry,
    policy_from_dict,
    policy_to_dict,
    printable_entry,
)
from durabilis.config._sync import AsyncConfigSync, ConfigSync

_Applier = Applier  # (its name before the package: tests/unit/test_config.py)

__all__ = [
    "BREAKER",
    "ENVIRONMENT",
    "ENV_PREFIX",
    "MAX_ENTRY_BYTES",
    "MAX_ENTRY_DEPTH",
    "RETRY",
    "AsyncConfigSync",
    "ConfigSync",
    "FleetConfig",
    "Reload",
    "breaker_from_dict",
    "breaker_to_dict",
    "config_to_dict",
    "declared_entries",
    "decode_entry",
    "load_config",
    "parse_config",
    "policy_from_dict",
    "policy_to_dict",
    "printable_entry",
]
