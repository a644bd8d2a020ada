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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from durabilis import _codec
from durabilis._acks import DEFAULT_ACKS_TIMEOUT
from durabilis._escape import escape_unprintable
from durabilis._fork import reset_in_child
from durabilis._log import get_logger
from durabilis._retry_core import RetryBudget, RetryPolicy
from durabilis._scripts import ScriptCall
from durabilis._store import AsyncStore, Store
from durabilis.breaker import CircuitBreakerConfig, default_replica_id
from durabilis.checkpoint import CheckpointConfig
from durabilis.dlq import DlqConfig
from durabilis.errors import ConfigError, ConfigFileError, CorruptData, DurabilisError
from durabilis.idempotency import IdempotencyConfig
from durabilis.layer import DurabilityConfig

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

_log = get_logger()

ENV_PREFIX: Final = "DURABILIS__"
"""Environment overrides: ``DURABILIS__<SECTION>__<FIELD>`` (``__`` between parts)."""

ENVIRONMENT: Final = "environment"
"""The ``path`` of a :class:`ConfigFileError` raised for an environment override."""

RETRY: Final = "retry"
BREAKER: Final = "breaker"
_KINDS = (RETRY, BREAKER)
_RESERVED = ("v", "t")  # the fleet config hash's own fields (version, time)

MAX_ENTRY_BYTES: Final = 64 * 1024
"""The largest fleet config entry (its JSON text, in bytes) a replica decodes.

A bigger value is rejected unparsed (a policy or a breaker takes under 1 KiB);
publishing one is refused before any I/O."""

MAX_ENTRY_DEPTH: Final = 16
"""The deepest nesting of JSON arrays and objects a fleet config entry may have.

Checked by a linear scan BEFORE the JSON is parsed, so a hostile value
(``[[[[...`` 100,000 deep) is rejected instead of exhausting the parser's
recursion. A policy or a breaker nests 2 deep."""

_REASON_CHARS = 300  # a rejection reason is clipped to this (it may quote the value)
_NAME_CHARS = 200  # an entry's name in an event is clipped to this

_SECTIONS = (
    "idempotency", "retry", "circuit_breaker", "checkpoint", "dlq", "dependencies", "layer",
)
_INCLUDE_DEFAULTS = "include_defaults"


# --- reading TOML ------------------------------------------------------------------------


def _tomllib() -> Any:
    """``tomllib`` (Python >= 3.11), else ``tomli`` (the dependency on 3.10)."""
    for name in ("tomllib", "tomli"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ConfigError("path", "reading TOML on Python 3.10 needs tomli: pip install tomli")


def _read_toml(path: Path) -> dict[str, Any]:
    toml = _tomllib()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(str(path), "", "", f"cannot read the file: {exc}") from exc
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ConfigFileError(str(path), "", "", f"not valid TOML: {exc}") from exc
    return dict(data)


def _env_value(text: str) -> Any:
    """An override's value: a TOML value when it parses as one, else the text itself."""
    toml = _tomllib()
    try:
        return toml.loads(f"v = {text}")["v"]
    except toml.TOMLDecodeError:
        return text


# --- building a DurabilityConfig -----------------------------------------------------------


class _Source:
    """Where the values came from, to name the file or variable in errors."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.origins: dict[tuple[str, str], str] = {}  # (section, field) -> variable

    def error(self, section: str, field_name: str, message: str) -> ConfigFileError:
        variable = self.origins.get((section, field_name))
        if variable is not None:
            return ConfigFileError(ENVIRONMENT, section, field_name, message, variable=variable)
        return ConfigFileError(self.path, section, field_name, message)

    def wrap(self, section: str, exc: ConfigError) -> ConfigFileError:
        text = str(exc)
        prefix = f"{exc.field}: "
        message = text[len(prefix):] if text.startswith(prefix) else text
        return self.error(section, exc.field, message)


def _apply_env(data: dict[str, Any], environ: Mapping[str, str], source: _Source) -> None:
    for variable in sorted(environ):
        if not variable.upper().startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in variable[len(ENV_PREFIX):].split("__")]
        if len(parts) < 2 or not all(parts):
            raise ConfigFileError(
                ENVIRONMENT, "", "",
                "an override is named DURABILIS__<SECTION>__<FIELD> (parts joined by '__')",
                variable=variable,
            )
        *tables, name = parts
        section = ".".join(tables)
        node = data
        for depth, table in enumerate(tables):
            child = node.setdefault(table, {})
            if not isinstance(child, dict):
                raise ConfigFileError(
                    ENVIRONMENT, ".".join(tables[:depth]), table,
                    "is a value in the file, not a section", variable=variable,
                )
            node = child
        node[name] = _env_value(environ[variable])
        source.origins[(section, name)] = variable


def _table(data: Mapping[str, Any], name: str, source: _Source) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise source.error("", name, "must be a section ([name]), not a value")
    return value


def _dataclass_fields(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.init}


def _check_fields(
    values: Mapping[str, Any], allowed: Iterable[str], section: str, source: _Source
) -> None:
    known = set(allowed)
    for name in values:
        if name not in known:
            raise source.error(
                section, name, f"unknown field (known: {', '.join(sorted(known))})"
            )


def _replace(
    base: Any, values: Mapping[str, Any], section: str, source: _Source, *, named_by: str = ""
) -> Any:
    _check_fields(values, _dataclass_fields(type(base)) - {named_by}, section, source)
    try:
        return dataclasses.replace(base, **values)
    except ConfigError as exc:
        raise source.wrap(section, exc) from exc
    except TypeError as exc:
        raise source.error(section, "", str(exc)) from exc


def _include_defaults(table: dict[str, Any], section: str, source: _Source) -> bool:
    flag = table.pop(_INCLUDE_DEFAULTS, True)
    if not isinstance(flag, bool):
        raise source.error(section, _INCLUDE_DEFAULTS, f"must be true or false, got {flag!r}")
    return flag


def _subtables(table: dict[str, Any], section: str, source: _Source) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, value in table.items():
        if not isinstance(value, dict):
            raise source.error(
                section, name,
                f"must be a section [{section}.{name}] (or {_INCLUDE_DEFAULTS} = true/false)",
            )
        out[name] = dict(value)
    return out


def _policies(
    data: Mapping[str, Any], source: _Source, base: DurabilityConfig
) -> tuple[RetryPolicy, ...]:
    table = dict(_table(data, "retry", source))
    keep = _include_defaults(table, "retry", source)
    policies = {p.operation_type: p for p in base.policies} if keep else {}
    for op_type, values in _subtables(table, "retry", source).items():
        section = f"retry.{op_type}"
        if "operation_type" in values:
            raise source.error(section, "operation_type", "is the section's name: leave it out")
        budget = values.pop("budget", None)
        if budget is not None:
            if not isinstance(budget, dict):
                raise source.error(section, "budget", f"must be a section [{section}.budget]")
            _check_fields(budget, _dataclass_fields(RetryBudget), f"{section}.budget", source)
            try:
                values["budget"] = RetryBudget(**budget)
            except ConfigError as exc:
                raise source.wrap(f"{section}.budget", exc) from exc
        known = policies.get(op_type)
        if known is not None:
            policies[op_type] = _replace(known, values, section, source, named_by="operation_type")
            continue
        allowed = _dataclass_fields(RetryPolicy) - {"operation_type"}
        _check_fields(values, allowed, section, source)
        for required in ("max_attempts", "initial_delay_ms", "max_delay_ms"):
            if required not in values:
                raise source.error(section, required, "is required for a new policy")
        try:
            policies[op_type] = RetryPolicy(op_type, **values)
        except ConfigError as exc:
            raise source.wrap(section, exc) from exc
    return tuple(policies.values())


def _breakers(
    data: Mapping[str, Any], source: _Source, base: DurabilityConfig
) -> tuple[CircuitBreakerConfig, ...]:
    table = dict(_table(data, "circuit_breaker", source))
    keep = _include_defaults(table, "circuit_breaker", source)
    configs = {c.name: c for c in base.breaker_configs} if keep else {}
    for name, values in _subtables(table, "circuit_breaker", source).items():
        section = f"circuit_breaker.{name}"
        if "name" in values:
            raise source.error(section, "name", "is the section's name: leave it out")
        found = configs.get(name)
        if found is None:
            _check_fields(values, _dataclass_fields(CircuitBreakerConfig) - {"name"}, section,
                          source)
            try:
                configs[name] = CircuitBreakerConfig(name, **values)
            except ConfigError as exc:
                raise source.wrap(section, exc) from exc
        else:
            configs[name] = _replace(found, values, section, source, named_by="name")
    return tuple(configs.values())


def _dependencies(
    data: Mapping[str, Any], breakers: Iterable[CircuitBreakerConfig], source: _Source,
    base: DurabilityConfig,
) -> dict[str, str]:
    table = dict(_table(data, "dependencies", source))
    keep = _include_defaults(table, "dependencies", source)
    deps = dict(base.dependencies) if keep else {}
    for op_type, name in table.items():
        if not isinstance(name, str):
            raise source.error(
                "dependencies", op_type, f"must be a breaker name (text), got {name!r}"
            )
        if name:
            deps[op_type] = name
        else:  # "" removes a default: the operation type runs without a breaker
            deps.pop(op_type, None)
    known = {b.name for b in breakers}
    for op_type, name in deps.items():
        if name not in known:
            raise source.error(
                "dependencies", op_type,
                f"names breaker {name!r}, which is not configured: add "
                f"[circuit_breaker.{name}] or set {op_type} = \"\" (no breaker)",
            )
    return deps


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str = "<config>",
    environ: Mapping[str, str] | None = None,
) -> DurabilityConfig:
    """Build a :class:`~durabilis.DurabilityConfig` from parsed TOML data (see :func:`load_config`).

    Args:
        data: The TOML document as a mapping.
        source: How to name it in errors (the file's path).
        environ: Environment overrides to apply (``os.environ`` when ``None``).

    Raises:
        ConfigFileError: Naming the source (or variable), section and field.
    """
    src = _Source(source)
    doc: dict[str, Any] = json.loads(json.dumps(data, default=str))  # a deep, plain copy
    _apply_env(doc, os.environ if environ is None else environ, src)
    for name in doc:
        if name not in _SECTIONS:
            raise src.error(name, "", f"unknown section (known: {', '.join(_SECTIONS)})")
    layer = dict(_table(doc, "layer", src))
    preset = layer.pop("preset", "gateway")
    if preset not in PRESETS:
        raise src.error("layer", "preset", f"must be one of {', '.join(PRESETS)}, got {preset!r}")
    base = DurabilityConfig.seed() if preset == "seed" else DurabilityConfig()
    idem: IdempotencyConfig = _replace(
        base.idempotency, _table(doc, "idempotency", src), "idempotency", src
    )
    ckpt: CheckpointConfig = _replace(
        base.checkpoint, _table(doc, "checkpoint", src), "checkpoint", src
    )
    dlq: DlqConfig = _replace(base.dlq, _table(doc, "dlq", src), "dlq", src)
    policies = _policies(doc, src, base)
    breakers = _breakers(doc, src, base)
    deps = _dependencies(doc, breakers, src, base)
    _check_fields(
        layer, ("renew_every_seconds", "acks", "acks_timeout_seconds"), "layer", src
    )
    try:
        return DurabilityConfig(
            idempotency=idem, retry_policies=policies, breakers=breakers, checkpoint=ckpt,
            dlq=dlq, dependencies=deps, renew_every_seconds=layer.get("renew_every_seconds"),
            acks=layer.get("acks"),
            acks_timeout_seconds=layer.get("acks_timeout_seconds", DEFAULT_ACKS_TIMEOUT),
        )
    except ConfigError as exc:
        raise src.wrap("layer", exc) from exc


PRESETS = ("gateway", "seed")
"""``[layer] preset``: what a file starts from. ``gateway`` (default): one ``"*"``
retry policy, no breaker, no dependency. ``seed``: the seed's five policies,
three breakers and their dependencies (:meth:`DurabilityConfig.seed`)."""


def load_config(
    path: str | os.PathLike[str] | None, *, environ: Mapping[str, str] | None = None
) -> DurabilityConfig:
    """Load a :class:`~durabilis.DurabilityConfig` from a TOML file and the environment.

    Sections: ``[idempotency]``, ``[retry.<operation_type>]`` (with an optional
    ``[retry.<operation_type>.budget]``), ``[circuit_breaker.<name>]``,
    ``[checkpoint]``, ``[dlq]``, ``[dependencies]`` (operation type -> breaker
    name, ``""`` for none) and ``[layer]`` (``renew_every_seconds``, ``acks``,
    ``acks_timeout_seconds``, ``preset``).
    A file starts from its preset (:data:`PRESETS`): by default
    :class:`~durabilis.DurabilityConfig`'s one ``"*"`` retry policy, no breaker,
    no dependency; ``preset = "seed"``: the seed's setup (spelled out in
    ``examples/seed.toml``). A section of an entry of the preset overrides only
    the fields it lists; a new name defines a new one. ``include_defaults =
    false`` in ``[retry]``, ``[circuit_breaker]`` or ``[dependencies]`` drops the
    preset's entries.

    Args:
        path: The TOML file; ``None``: the defaults plus the environment.
        environ: Where to read ``DURABILIS__...`` overrides (``os.environ`` when ``None``).

    Raises:
        ConfigFileError: Unreadable file, invalid TOML, unknown section or
            field, or an invalid value: naming the file (or the variable),
            the section and the field.
    """
    data = {} if path is None else _read_toml(Path(path))
    return parse_config(data, source="<defaults>" if path is None else str(path), environ=environ)


def declared_entries(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """The retry policies and breakers a file (plus overrides) declares by name.

    What ``durabilis config publish FILE`` publishes: the ``[retry.<type>]``
    and ``[circuit_breaker.<name>]`` sections, not the seed defaults.

    Returns:
        ``(operation types, breaker names)``, in file order.
    """
    data = _read_toml(Path(path))
    _apply_env(data, os.environ if environ is None else environ, _Source(str(path)))
    names: list[list[str]] = []
    for section in ("retry", "circuit_breaker"):
        table = data.get(section, {})
        names.append(
            [k for k, v in table.items() if isinstance(v, dict)] if isinstance(table, dict)
            else []
        )
    return names[0], names[1]


def config_to_dict(config: DurabilityConfig) -> dict[str, Any]:
    """The effective settings as a JSON-compatible dict, in the file's layout."""
    policies = config.policies
    breakers = config.breaker_configs
    return {
        "idempotency": _plain(config.idempotency),
        # Every policy in effect, spelled out: read back, it gives this config.
        "retry": {
            _INCLUDE_DEFAULTS: False, **{p.operation_type: policy_to_dict(p) for p in policies}
        },
        "circuit_breaker": {b.name: breaker_to_dict(b) for b in breakers},
        "checkpoint": _plain(config.checkpoint),
        "dlq": _plain(config.dlq),
        "dependencies": dict(config.dependencies),
        "layer": {
            "renew_every_seconds": config.renew_every_seconds,
            "acks": config.acks,
            "acks_timeout_seconds": config.acks_timeout_seconds,
        },
    }


# --- fleet-wide hot reload: the entries as JSON ---------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) if f.name not in _SECRETS
                else _masked(getattr(value, f.name))  # never printed
                for f in dataclasses.fields(value) if f.init}
    return value


_SECRETS = ("key_secret", "previous_key_secrets")


def _masked(secret: Any) -> Any:
    if isinstance(secret, tuple):
        return ["***"] * len(secret)
    return None if secret is None else "***"


def policy_to_dict(policy: RetryPolicy) -> dict[str, Any]:
    """A retry policy as a JSON-compatible dict (every constructor field)."""
    out: dict[str, Any] = _plain(policy)
    return out


def breaker_to_dict(config: CircuitBreakerConfig) -> dict[str, Any]:
    """A breaker config as a JSON-compatible dict (every constructor field)."""
    out: dict[str, Any] = _plain(config)
    return out


def _fields_of(cls: type[Any], data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(what, f"must be a JSON object, got {type(data).__name__}")
    unknown = set(data) - _dataclass_fields(cls)
    if unknown:
        raise ConfigError(what, f"unknown fields {sorted(unknown)}")
    return dict(data)


def policy_from_dict(data: Mapping[str, Any]) -> RetryPolicy:
    """The inverse of :func:`policy_to_dict`. Raises ``ConfigError`` naming the field."""
    values = _fields_of(RetryPolicy, data, "retry_policy")
    budget = values.get("budget")
    if budget is not None:
        values["budget"] = RetryBudget(**_fields_of(RetryBudget, budget, "budget"))
    try:
        return RetryPolicy(**values)
    except TypeError as exc:  # a required field is missing
        raise ConfigError("retry_policy", str(exc)) from exc


def breaker_from_dict(data: Mapping[str, Any]) -> CircuitBreakerConfig:
    """The inverse of :func:`breaker_to_dict`. Raises ``ConfigError`` naming the field."""
    try:
        return CircuitBreakerConfig(**_fields_of(CircuitBreakerConfig, data, "breaker"))
    except TypeError as exc:
        raise ConfigError("breaker", str(exc)) from exc


def _json_text(data: Mapping[str, Any]) -> str:
    return _codec.canonical_json(data).decode("utf-8")


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """What the fleet config in Redis holds (``ConfigSync.fleet_config()``).

    Attributes:
        version: Bumped by every change (0: nothing was ever published).
        updated_at: When it last changed (Redis server clock, UTC).
        retry_policies: Published retry policies by operation type.
        breakers: Published breaker configs by name.
        rejected: Entries that could not be decoded: field -> reason. A field
            name that is not UTF-8 keeps its bytes as lone surrogates
            (``surrogateescape``): :func:`printable_entry` shows it,
            ``remove_entry`` takes it back as is.
    """

    version: int
    updated_at: datetime | None
    retry_policies: dict[str, RetryPolicy] = field(default_factory=dict)
    breakers: dict[str, CircuitBreakerConfig] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reload:
    """What one replica applied from the fleet config (passed to ``on_reload`` callbacks).

    Attributes:
        version: The fleet config version now applied.
        retry_policies: Operation types whose policy changed here.
        breakers: Breakers whose config changed here.
        removed: Entries no longer published (``retry:<type>`` / ``breaker:<name>``):
            back to this replica's own config.
        rejected: Entries that could not be applied: field -> reason (logged).
        initial: The first refresh of this sync.
    """

    version: int
    retry_policies: tuple[str, ...] = ()
    breakers: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    rejected: dict[str, str] = field(default_factory=dict)
    initial: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.retry_policies or self.breakers or self.removed)


_VERSION = re.compile(rb"[0-9]{1,15}")
"""A fleet config version, as ``config_publish.lua`` accepts it."""


class _ConfigOps:
    """Builds the fleet config's calls and decodes its replies (no I/O)."""

    __slots__ = ("fleet_key", "log_key", "log_maxlen", "replica_id")

    def __init__(self, store: Store | AsyncStore, replica_id: str, log_maxlen: int) -> None:
        self.fleet_key = store.keys.config("fleet")
        self.log_key = store.keys.config("log")
        self.replica_id = replica_id
        self.log_maxlen = log_maxlen

    @staticmethod
    def entry(kind: str, name: str) -> str:
        if kind not in _KINDS:
            raise ConfigError("kind", f"must be {RETRY!r} or {BREAKER!r}, got {kind!r}")
        if not isinstance(name, str) or not name:
            raise ConfigError("name", "must be a non-empty string")
        return f"{kind}:{name}"

    def publish(self, kind: str, name: str, data: Mapping[str, Any] | None) -> ScriptCall:
        entry = self.entry(kind, name)
        if data is None:
            return self.remove(entry)
        text = _json_text(data)
        size = len(text.encode("utf-8"))
        if size > MAX_ENTRY_BYTES:  # every replica would reject it
            raise ConfigError(entry, f"is {size} bytes of JSON, over the cap of {MAX_ENTRY_BYTES}")
        return self._call("set", entry, text)

    def remove(self, entry: str) -> ScriptCall:
        """Remove one field of the fleet config hash, whatever its name and value hold.

        A name read back with bytes that were not UTF-8 (lone surrogates, as
        :meth:`decode_entries` keeps them) is sent as those exact bytes.
        """
        if not isinstance(entry, str) or not entry or entry in _RESERVED:
            raise ConfigError(
                "entry", f"must be a field of the fleet config (not {', '.join(_RESERVED)}),"
                f" got {entry!r}",
            )
        return self._call("del", entry, "")

    def _call(self, mode: str, entry: str, text: str) -> ScriptCall:
        return ScriptCall(
            "config_publish",
            [self.fleet_key, self.log_key],
            [mode, _field_bytes(entry), text, self.replica_id, self.log_maxlen],
        )

    def decode_publish(self, reply: Any) -> tuple[bool, int]:
        """``(changed, version)``."""
        tag = _codec.as_text(reply[0], key=self.fleet_key, field="reply")
        if tag in ("ok", "same"):
            return tag == "ok", _codec.as_int(reply[1], key=self.fleet_key, field="v")
        if tag == "corrupt":
            key = _codec.as_text(reply[1], key=self.fleet_key, field="key")
            raise CorruptData(key, _codec.as_text(reply[2], key=key, field="detail"))
        raise CorruptData(self.fleet_key, f"unexpected script reply {reply!r}")

    def version_command(self) -> tuple[str, str, str, str]:
        return ("HMGET", self.fleet_key, "v", "t")

    def snapshot_command(self) -> tuple[str, str]:
        return ("HGETALL", self.fleet_key)

    def decode_version(self, reply: Any) -> tuple[int, int | None]:
        """``(version, updated_ms)`` of the fleet config: the pair names one
        change. The version alone does not: if the hash is lost (a restart
        without persistence, ``FLUSHALL``, a failover to a replica that was
        behind), later publishes count again from there, and may reach the
        version a replica holds with other entries."""
        v, t = reply if reply is not None else (None, None)
        version = 0 if v is None else self._version(v)
        return version, None if t is None else _timestamp(t)

    def _version(self, value: Any) -> int:
        """``v`` as ``config_publish.lua`` reads it: ASCII digits only."""
        raw = value if isinstance(value, (bytes, bytearray)) else str(value).encode()
        if not _VERSION.fullmatch(raw):
            raise CorruptData(self.fleet_key, f"field 'v' is not a version number: {value!r}")
        return int(raw)

    def decode_entries(self, reply: Any) -> tuple[int, int | None, dict[str, bytes]]:
        """``(version, updated_ms, {field: raw value})`` of an HGETALL reply.

        Only the version must be sound (else ``CorruptData``: the hash is not
        the fleet config). The entries stay raw, each to be decoded on its own
        (:func:`decode_entry`): one hostile entry cannot spoil the others. A
        field name that is not UTF-8 keeps its bytes as lone surrogates
        (``surrogateescape``), so it can still be removed by that name; a
        timestamp that is not a number is ignored (``updated_at`` None).
        """
        version: int = 0
        at: int | None = None
        entries: dict[str, bytes] = {}
        for raw_name, raw_value in (reply or {}).items():
            name = (
                bytes(raw_name).decode("utf-8", "surrogateescape")
                if isinstance(raw_name, (bytes, bytearray)) else str(raw_name)
            )
            value = (
                bytes(raw_value) if isinstance(raw_value, (bytes, bytearray))
                else _as_bytes(str(raw_value))
            )
            if name == "v":
                version = self._version(value)
            elif name == "t":
                at = _timestamp(value)
            else:
                entries[name] = value
        return version, at, entries

    def decode_snapshot(self, reply: Any) -> FleetConfig:
        version, at, entries = self.decode_entries(reply)
        policies: dict[str, RetryPolicy] = {}
        breakers: dict[str, CircuitBreakerConfig] = {}
        rejected: dict[str, str] = {}
        for name, text in sorted(entries.items()):
            try:
                decoded = decode_entry(name, text)
            except Exception as exc:  # decode_entry raises ConfigError only; whatever else
                rejected[name] = _reason(exc)
                continue
            if isinstance(decoded, RetryPolicy):
                policies[decoded.operation_type] = decoded
            else:
                breakers[decoded.name] = decoded
        updated: datetime | None = None
        if at is not None:
            with contextlib.suppress(OverflowError, ValueError, OSError):
                updated = _codec.ms_to_datetime(at)
        return FleetConfig(version, updated, policies, breakers, rejected)


def _field_bytes(entry: str) -> bytes:
    """A field name as Redis holds it (lone surrogates back to the bytes they stand for)."""
    try:
        return entry.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise ConfigError("entry", f"cannot be sent to Redis: {exc.reason}") from exc


def _timestamp(value: bytes | str) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def printable_entry(text: str, limit: int | None = _NAME_CHARS) -> str:
    """A fleet config entry's name (or any text read from Redis) fit for a log or a terminal.

    Bytes that were not UTF-8 (kept as lone surrogates, see
    :meth:`ConfigSync.fleet_config`) are shown as ``\\xNN``, other unprintable
    characters (controls, escape sequences) as ``\\xNN`` / ``\\uNNNN``; the
    result is clipped to ``limit`` characters (``None``: whole). What ``durabilis
    config show`` prints, and what ``durabilis config unpublish`` accepts back.
    """
    clipped = limit is not None and len(text) > limit
    shown = escape_unprintable(text[:limit] if clipped else text)
    return f"{shown}... ({len(text)} characters)" if clipped else shown


def _clip(text: str, limit: int = _REASON_CHARS) -> str:
    return printable_entry(text, limit)


def _reason(exc: BaseException) -> str:
    """Why an entry was rejected: the ConfigError's text, or the unexpected error's type too."""
    text = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
    return _clip(text)


def _nesting_depth(text: str, limit: int) -> int:
    """How deep JSON arrays and objects nest in ``text`` (stops counting past ``limit``).

    A linear scan that skips strings (and their escapes); no recursion, so any
    input is safe. Unbalanced or invalid text is left to the JSON parser.
    """
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif ch in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _as_bytes(value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "surrogatepass")  # a lone surrogate fails to decode below


def decode_entry(name: str, text: str | bytes) -> RetryPolicy | CircuitBreakerConfig:
    """One fleet config entry (``retry:<type>`` / ``breaker:<name>`` -> JSON text).

    Safe on any value, whoever wrote it into Redis: a value over
    :data:`MAX_ENTRY_BYTES`, not UTF-8, or nested deeper than
    :data:`MAX_ENTRY_DEPTH` is refused before it is parsed, and any other
    failure is a ``ConfigError`` too.

    Raises:
        ConfigError: (and only that) Too big, not UTF-8, too deep, not JSON
            (NaN and Infinity included), an unknown kind, the wrong JSON type,
            or an invalid config (naming the field).
    """
    try:
        return _decode_entry(name, text)
    except ConfigError:
        raise
    except Exception as exc:  # e.g. a constructor choking on a foreign type
        raise ConfigError(printable_entry(name), _reason(exc)) from exc


def _decode_entry(name: str, text: str | bytes) -> RetryPolicy | CircuitBreakerConfig:
    shown = printable_entry(name)
    kind, sep, entry_name = name.partition(":")
    if not sep or kind not in _KINDS or not entry_name:
        raise ConfigError("field", f"unknown fleet config entry '{shown}'")
    raw = _as_bytes(text)
    if len(raw) > MAX_ENTRY_BYTES:
        raise ConfigError(shown, f"is {len(raw)} bytes, over the cap of {MAX_ENTRY_BYTES}")
    try:
        decoded_text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(shown, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    if _nesting_depth(decoded_text, MAX_ENTRY_DEPTH) > MAX_ENTRY_DEPTH:
        raise ConfigError(
            shown, f"nests JSON arrays/objects deeper than the cap of {MAX_ENTRY_DEPTH}"
        )
    try:
        data = json.loads(decoded_text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(shown, f"is not JSON: {_clip(str(exc))}") from exc
    decoded: RetryPolicy | CircuitBreakerConfig
    if kind == RETRY:
        decoded = policy_from_dict(data)
        if decoded.operation_type != entry_name:
            raise ConfigError(
                "operation_type", f"{_clip(repr(decoded.operation_type))} under '{shown}'"
            )
    else:
        decoded = breaker_from_dict(data)
        if decoded.name != entry_name:
            raise ConfigError("name", f"{_clip(repr(decoded.name))} under '{shown}'")
    return decoded


ReloadCallback = Callable[[Reload], object]


class _Applier:
    """Applies fleet config entries to one replica's engine and registry (no I/O).

    Remembers this replica's own configs, to go back to them when an entry is
    unpublished, and the JSON text of what it applied, to apply only changes
    (and a digest of what it rejected, to log a rejection once, not hold it).
    """

    def __init__(self, retry: Any, breakers: Any) -> None:
        self.retry = retry
        self.breakers = breakers
        self.own_policies: dict[str, RetryPolicy] = dict(retry.policies) if retry else {}
        self.own_breakers: dict[str, CircuitBreakerConfig] = (
            {n: breakers.get_config(n) for n in breakers.names()} if breakers else {}
        )
        self.applied: dict[str, bytes] = {}
        self.rejected: dict[str, tuple[bytes, str]] = {}  # name -> (digest of the value, why)
        # Entries this replica published itself, each with the number of this
        # replica's publish that made it (``seq`` counts them): a snapshot read
        # before that publish was done (by the polling thread while it ran)
        # must not put the previous value back. Local order, not versions or
        # server times: those restart or step back when the hash is lost.
        self.seq = 0
        self.pinned: dict[str, int] = {}
        self.version: int | None = None
        self.mark: tuple[int, int | None] | None = None  # (version, updated_ms) applied
        self.lock = threading.Lock()
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        # (the parent's poller may have held it at fork: locked for good in the child)
        self.lock = threading.Lock()

    def install(self, decoded: RetryPolicy | CircuitBreakerConfig) -> bool:
        if isinstance(decoded, RetryPolicy):
            if self.retry is None:
                return False
            self.retry.upsert_policy(decoded)
            return True
        if self.breakers is None:
            return False
        self.breakers.upsert_config(decoded)
        return True

    def published_here(
        self, entry: str, config: RetryPolicy | CircuitBreakerConfig | None, text: str | None,
        *, changed: bool,
    ) -> None:
        """This replica published ``entry`` (``config``; ``None``: removed it):
        applied here at once, in ONE step with the note of it (a poll applying
        an older snapshot in between would otherwise stay installed)."""
        with self.lock:
            if config is None:
                was = self.applied.pop(entry, None) is not None
                if changed or was:  # (gone already: another removed it, or our lost try)
                    self.restore_own(entry)
            else:
                self.install(config)
                self.applied[entry] = (text or "").encode("utf-8")
            self.rejected.pop(entry, None)
            self.seq += 1
            self.pinned[entry] = self.seq

    def rejections(self) -> dict[str, str]:
        with self.lock:
            return {name: why for name, (_, why) in sorted(self.rejected.items())}

    def apply(
        self, version: int, entries: Mapping[str, str | bytes], at: int | None = None,
        read_at: int | None = None,
    ) -> Reload:
        """Apply a snapshot's entries (raw values: each is decoded on its own).

        ``read_at``: :attr:`seq` when the snapshot was asked for (``None``: now);
        an entry this replica published since is left as published.

        Never raises for an entry: whatever goes wrong decoding or installing
        one (any exception) rejects that entry with a reason; the others apply.
        """
        with self.lock:
            initial = self.version is None
            policies: list[str] = []
            breakers: list[str] = []
            rejected: dict[str, str] = {}
            seen = self.seq if read_at is None else read_at
            stale = {name for name, pin in self.pinned.items() if pin > seen}
            self.pinned = {name: self.pinned[name] for name in stale}
            for name, value in sorted(entries.items()):
                if name in stale:
                    continue
                raw = _as_bytes(value)
                if self.applied.get(name) == raw:  # back to what is applied: nothing to do
                    self.rejected.pop(name, None)
                    continue
                digest = hashlib.blake2b(raw, digest_size=16).digest()
                known = self.rejected.get(name)
                if known is not None and known[0] == digest:
                    continue  # the same bad value: rejected (and logged) already
                try:
                    decoded = decode_entry(name, raw)
                    installed = self.install(decoded)
                except Exception as exc:  # one entry, whatever it holds, spoils only itself
                    why = _reason(exc)
                    self.rejected[name] = (digest, why)
                    rejected[name] = why
                    continue
                self.rejected.pop(name, None)
                self.applied[name] = raw
                if installed:
                    (policies if isinstance(decoded, RetryPolicy) else breakers).append(
                        name.partition(":")[2]
                    )
            removed = []
            for name in sorted(set(self.applied) - set(entries) - stale):
                del self.applied[name]
                removed.append(name)
                self.restore_own(name)
            for name in set(self.rejected) - set(entries):
                del self.rejected[name]
            self.version = version
            self.mark = (version, at)
            return Reload(
                version, tuple(policies), tuple(breakers), tuple(removed), rejected, initial
            )

    def restore_own(self, entry: str) -> None:
        kind, _, name = entry.partition(":")
        if kind not in _KINDS:
            return  # a foreign field: nothing of ours was ever replaced by it
        own: RetryPolicy | CircuitBreakerConfig | None = (
            self.own_policies.get(name) if kind == RETRY else self.own_breakers.get(name)
        )
        if own is not None:  # else: no config of our own to go back to; keep the last one
            self.install(own)


class _SyncCore:
    """What both twins share: the ops, the applier, callbacks and events (no I/O)."""

    def __init__(
        self,
        source: Any,
        *,
        retry: Any,
        breakers: Any,
        interval_seconds: float,
        replica_id: str | None,
        log_maxlen: int,
    ) -> None:
        store = getattr(source, "store", source)
        if retry is None and breakers is None and store is not source:
            retry, breakers = source.retry, source.breakers
        if isinstance(interval_seconds, bool) or not isinstance(interval_seconds, (int, float)) or (
            not 0.01 <= interval_seconds <= 3600
        ):
            raise ConfigError(
                "interval_seconds", f"must be between 0.01 and 3600, got {interval_seconds!r}"
            )
        if isinstance(log_maxlen, bool) or not isinstance(log_maxlen, int) or log_maxlen < 1:
            raise ConfigError("log_maxlen", f"must be an integer >= 1, got {log_maxlen!r}")
        self.store = store
        self.interval = float(interval_seconds)
        self.replica_id = replica_id or getattr(breakers, "replica_id", None) or (
            default_replica_id()
        )
        self.ops = _ConfigOps(store, self.replica_id, log_maxlen)
        self.applier = _Applier(retry, breakers)
        self.callbacks: list[ReloadCallback] = []
        self.failing = False
        self.poll_error: str | None = None

    def publish_call(self, kind: str, name: str, config: Any) -> tuple[ScriptCall, str | None]:
        """Validate (before any I/O) and build the publish call; also returns the JSON text."""
        if kind == RETRY:
            if not isinstance(config, RetryPolicy):
                raise ConfigError("policy", f"must be a RetryPolicy, got {config!r}")
            config.validate()
            data = policy_to_dict(config)
        else:
            if not isinstance(config, CircuitBreakerConfig):
                raise ConfigError("config", f"must be a CircuitBreakerConfig, got {config!r}")
            config.validate()
            data = breaker_to_dict(config)
        call = self.ops.publish(kind, name, data)
        return call, str(call.args[2])

    def published(self, kind: str, name: str, config: Any, text: str | None, reply: Any) -> int:
        entry = self.ops.entry(kind, name)
        if config is None:
            return self.removed(entry, reply)
        changed, version = self.ops.decode_publish(reply)
        self.applier.published_here(entry, config, text, changed=changed)
        _log.info(
            "durability_config_published",
            kind=kind, name=name, version=version, removed=False, changed=changed,
            replica_id=self.replica_id,
        )
        return version

    def removed(self, entry: str, reply: Any) -> int:
        changed, version = self.ops.decode_publish(reply)
        self.applier.published_here(entry, None, None, changed=changed)
        kind, _, name = entry.partition(":")
        _log.info(
            "durability_config_published",
            kind=printable_entry(kind), name=printable_entry(name), version=version,
            removed=True, changed=changed, replica_id=self.replica_id,
        )
        return version

    def moved(self, reply: Any) -> bool:
        """Whether the fleet config changed since the snapshot applied here
        (the reply of ``version_command``)."""
        return self.ops.decode_version(reply) != self.applier.mark

    def reloaded(self, reply: Any, read_at: int | None = None) -> Reload | None:
        version, at, entries = self.ops.decode_entries(reply)
        result = self.applier.apply(version, entries, at, read_at)
        for name, reason in result.rejected.items():
            _log.warning(
                "durability_config_entry_rejected", entry=printable_entry(name), reason=reason,
                version=version, replica_id=self.replica_id,
            )
        if not result.changed and not result.initial:
            return None
        if result.changed:
            _log.info(
                "durability_config_reloaded",
                version=version, retry_policies=list(result.retry_policies),
                breakers=list(result.breakers), removed=list(result.removed),
                initial=result.initial, replica_id=self.replica_id,
            )
        for callback in list(self.callbacks):
            try:
                callback(result)
            except Exception:
                _log.exception(
                    "durability_config_callback_failed",
                    callback=getattr(callback, "__qualname__", repr(callback)),
                )
        return result

    def failed(self, exc: DurabilisError) -> None:
        if not self.failing:  # once per outage, not once per poll
            self.failing = True
            _log.warning(
                "durability_config_sync_failed", error=f"{type(exc).__name__}: {exc}",
                replica_id=self.replica_id,
            )

    def poll_failed(self, exc: Exception) -> None:
        """Not Redis, not an entry (those are handled): a bug. Logged, the poller goes on."""
        error = _clip(f"{type(exc).__name__}: {exc}")
        if error != self.poll_error:  # once per distinct failure, not once per poll
            self.poll_error = error
            _log.warning(
                "durability_config_poll_failed", error=error, replica_id=self.replica_id,
            )

    def recovered(self) -> None:
        self.poll_error = None
        if self.failing:
            self.failing = False
            _log.info("durability_config_sync_recovered", replica_id=self.replica_id)


class ConfigSync:
    """Fleet-wide hot reload of retry policies and breaker configs, through Redis.

    ``publish_policy`` / ``publish_breaker`` on one replica store the config
    in Redis (as JSON, readable with ``redis-cli HGETALL <ns>:config:{config}:fleet``)
    and bump the fleet config's version in ONE script; every replica running
    a started ``ConfigSync`` reads the version every ``interval_seconds`` and,
    when it moved, applies the changed entries to its layer's retry engine and
    breaker registry (``upsert_policy`` / ``upsert_config``) and logs
    ``durability_config_reloaded``. A change is thus applied fleet-wide within
    ``interval_seconds`` plus three round trips of the publish returning.

    Args:
        source: A :class:`~durabilis.DurabilityLayer` (its ``retry`` and
            ``breakers`` are kept in sync), or a :class:`~durabilis.Store` with
            ``retry=`` / ``breakers=``.
        retry: The retry engine to keep in sync (with a store).
        breakers: The breaker registry to keep in sync (with a store).
        interval_seconds: How often the version is checked (0.01 to 3600).
        replica_id: Who publishes, in the change log (the registry's by default).
        log_maxlen: Approximate cap of the change log stream.

    Raises:
        ConfigError: An invalid interval or cap.
    """

    def __init__(
        self,
        source: Any,
        *,
        retry: Any = None,
        breakers: Any = None,
        interval_seconds: float = 1.0,
        replica_id: str | None = None,
        log_maxlen: int = 1000,
    ) -> None:
        self._core = _SyncCore(
            source, retry=retry, breakers=breakers, interval_seconds=interval_seconds,
            replica_id=replica_id, log_maxlen=log_maxlen,
        )
        self.store: Store = self._core.store
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """A forked child does not poll (the parent's thread is not copied) until
        :meth:`start` is called in it; it keeps the configs applied so far."""
        self._stop = threading.Event()
        self._thread = None

    @property
    def interval_seconds(self) -> float:
        return self._core.interval

    @property
    def version(self) -> int | None:
        """The fleet config version this replica has applied (``None`` before the first refresh)."""
        return self._core.applier.version

    def on_reload(self, callback: ReloadCallback) -> ReloadCallback:
        """Call ``callback(reload)`` after each refresh that applied something (and the first)."""
        self._core.callbacks.append(callback)
        return callback

    @property
    def rejected(self) -> dict[str, str]:
        """Entries of the fleet config this replica refused to apply: field -> reason.

        Each was logged once (``durability_config_entry_rejected``); the
        replica keeps its config for it (its own, or the last valid one).
        """
        return self._core.applier.rejections()

    def refresh(self) -> Reload | None:
        """Check the version now; apply what changed (1 round trip, 2 when it moved).

        An entry that cannot be applied (whatever it holds) is rejected with a
        reason, the others apply: see :func:`decode_entry`.

        Returns:
            What was applied, or ``None`` when the version had not moved.

        Raises:
            StorageUnavailable: Redis down. CorruptData: Foreign data at the key
                (not a hash, or a version ``v`` that is not a number).
        """
        core = self._core
        if not core.moved(self.store.command(*core.ops.version_command())):
            return None
        read_at = core.applier.seq  # before the read: a publish done after it is pinned
        return core.reloaded(self.store.command(*core.ops.snapshot_command()), read_at)

    def start(self) -> ConfigSync:
        """Apply what is published now, then keep polling in a daemon thread.

        A Redis failure is logged (``durability_config_sync_failed``, once per
        outage), never raised: the replica keeps its configs and catches up
        when Redis is back. A rejected entry is logged and skipped
        (:attr:`rejected`); any other error of a poll is logged
        (``durability_config_poll_failed``) and the poller goes on.
        """
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._poll_once()
        self._thread = threading.Thread(
            target=self._loop, name="durabilis-config-sync", daemon=True
        )
        self._thread.start()
        return self

    def _poll_once(self) -> None:
        try:
            self.refresh()
        except DurabilisError as exc:
            self._core.failed(exc)
        except Exception as exc:  # the poller must outlive anything: the fleet relies on it
            self._core.poll_failed(exc)
        else:
            self._core.recovered()

    def _loop(self) -> None:
        while not self._stop.wait(self._core.interval):
            with contextlib.suppress(Exception):  # only the logging of a failure can get here
                self._poll_once()

    def stop(self) -> None:
        """Stop polling (the applied configs stay)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._core.interval + 5.0)

    def __enter__(self) -> ConfigSync:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def publish_policy(self, policy: RetryPolicy) -> int:
        """Publish a retry policy to the fleet (and apply it here at once).

        Returns:
            The fleet config version after the change (unchanged when the same
            policy was already published).

        Raises:
            ConfigError: An invalid policy (before any I/O). StorageUnavailable.
        """
        call, text = self._core.publish_call(RETRY, getattr(policy, "operation_type", ""), policy)
        return self._core.published(
            RETRY, policy.operation_type, policy, text, self.store.run(call)
        )

    def publish_breaker(self, config: CircuitBreakerConfig) -> int:
        """Publish a breaker config to the fleet (see :meth:`publish_policy`)."""
        call, text = self._core.publish_call(BREAKER, getattr(config, "name", ""), config)
        return self._core.published(BREAKER, config.name, config, text, self.store.run(call))

    def unpublish(self, kind: str, name: str) -> int:
        """Remove a published entry (``kind`` ``"retry"`` or ``"breaker"``).

        Every replica goes back to its own config for it (the one it started
        with); one that had none keeps the last published one.

        Returns:
            The fleet config version after the change.
        """
        call = self._core.ops.publish(kind, name, None)
        return self._core.published(kind, name, None, None, self.store.run(call))

    def remove_entry(self, entry: str) -> int:
        """Remove one field of the fleet config, whatever it holds (not ``v`` / ``t``).

        The way out for an entry :attr:`FleetConfig.rejected` lists: ``entry`` is
        its field name as given there (``retry:<type>``, ``breaker:<name>``, or
        a foreign field written by hand; a name that is not UTF-8 as read back,
        with lone surrogates). For ``retry:`` / ``breaker:`` entries it is
        :meth:`unpublish`.

        Returns:
            The fleet config version after the change (unchanged when absent).
        """
        return self._core.removed(entry, self.store.run(self._core.ops.remove(entry)))

    def fleet_config(self) -> FleetConfig:
        """What is published now (1 round trip; nothing is applied).

        Never fails for an entry: one that cannot be decoded is in ``rejected``.
        """
        return self._core.ops.decode_snapshot(
            self.store.command(*self._core.ops.snapshot_command())
        )


class AsyncConfigSync:
    """The asyncio twin of :class:`ConfigSync` (polls in a task; same methods, awaited).

    Args:
        source: An :class:`~durabilis.AsyncDurabilityLayer`, or an
            :class:`~durabilis.AsyncStore` with ``retry=`` / ``breakers=``.
    """

    def __init__(
        self,
        source: Any,
        *,
        retry: Any = None,
        breakers: Any = None,
        interval_seconds: float = 1.0,
        replica_id: str | None = None,
        log_maxlen: int = 1000,
    ) -> None:
        self._core = _SyncCore(
            source, retry=retry, breakers=breakers, interval_seconds=interval_seconds,
            replica_id=replica_id, log_maxlen=log_maxlen,
        )
        self.store: AsyncStore = self._core.store
        self._task: asyncio.Task[None] | None = None
        self._run = 0  # bumped by start() and stop(): a poller runs while it is its own
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """See :meth:`ConfigSync.after_fork_in_child` (the task is the parent loop's)."""
        self._task = None
        self._run += 1

    @property
    def interval_seconds(self) -> float:
        return self._core.interval

    @property
    def version(self) -> int | None:
        """See :attr:`ConfigSync.version`."""
        return self._core.applier.version

    @property
    def rejected(self) -> dict[str, str]:
        """See :attr:`ConfigSync.rejected`."""
        return self._core.applier.rejections()

    def on_reload(self, callback: ReloadCallback) -> ReloadCallback:
        """See :meth:`ConfigSync.on_reload`."""
        self._core.callbacks.append(callback)
        return callback

    async def refresh(self) -> Reload | None:
        """See :meth:`ConfigSync.refresh`."""
        core = self._core
        if not core.moved(await self.store.command(*core.ops.version_command())):
            return None
        read_at = core.applier.seq  # before the read: a publish done after it is pinned
        return core.reloaded(await self.store.command(*core.ops.snapshot_command()), read_at)

    async def start(self) -> AsyncConfigSync:
        """See :meth:`ConfigSync.start` (the polling runs as a task of the running loop)."""
        if self._task is not None and not self._task.done():
            return self
        self._run += 1
        run = self._run
        await self._poll_once()
        if run == self._run:  # (not stopped, nor started again, meanwhile)
            self._task = asyncio.get_running_loop().create_task(self._loop(run))
        return self

    async def _poll_once(self) -> None:
        try:
            await self.refresh()
        except DurabilisError as exc:
            self._core.failed(exc)
        except Exception as exc:  # see ConfigSync._poll_once (cancellation passes through)
            self._core.poll_failed(exc)
        else:
            self._core.recovered()

    async def _loop(self, run: int) -> None:
        # Ends at its cancellation, or when it sees it is no longer the poller
        # (stop() stays final should a cancellation ever be lost on the way).
        while run == self._run:
            await asyncio.sleep(self._core.interval)
            with contextlib.suppress(Exception):  # only the logging of a failure can get here
                await self._poll_once()

    async def stop(self) -> None:
        """See :meth:`ConfigSync.stop`."""
        self._run += 1
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Its CancelledError is returned, not raised; the caller's own propagates.
            await asyncio.gather(task, return_exceptions=True)

    async def __aenter__(self) -> AsyncConfigSync:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def publish_policy(self, policy: RetryPolicy) -> int:
        """See :meth:`ConfigSync.publish_policy`."""
        call, text = self._core.publish_call(RETRY, getattr(policy, "operation_type", ""), policy)
        return self._core.published(
            RETRY, policy.operation_type, policy, text, await self.store.run(call)
        )

    async def publish_breaker(self, config: CircuitBreakerConfig) -> int:
        """See :meth:`ConfigSync.publish_breaker`."""
        call, text = self._core.publish_call(BREAKER, getattr(config, "name", ""), config)
        return self._core.published(
            BREAKER, config.name, config, text, await self.store.run(call)
        )

    async def unpublish(self, kind: str, name: str) -> int:
        """See :meth:`ConfigSync.unpublish`."""
        call = self._core.ops.publish(kind, name, None)
        return self._core.published(kind, name, None, None, await self.store.run(call))

    async def remove_entry(self, entry: str) -> int:
        """See :meth:`ConfigSync.remove_entry`."""
        return self._core.removed(entry, await self.store.run(self._core.ops.remove(entry)))

    async def fleet_config(self) -> FleetConfig:
        """See :meth:`ConfigSync.fleet_config`."""
        return self._core.ops.decode_snapshot(
            await self.store.command(*self._core.ops.snapshot_command())
        )
