"""The fleet config's model: its entries (retry policies and breaker configs)
as JSON and back, validated under caps, and what a snapshot or a reload holds
(:class:`FleetConfig`, :class:`Reload`). No I/O; nothing of the layer."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from durabilis import _codec
from durabilis._escape import escape_unprintable
from durabilis._retry_core import RetryBudget, RetryPolicy
from durabilis.breaker import CircuitBreakerConfig
from durabilis.errors import ConfigError

RETRY: Final = "retry"
BREAKER: Final = "breaker"
KINDS = (RETRY, BREAKER)
RESERVED = ("v", "t")  # the fleet config hash's own fields (version, time)

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


def dataclass_fields(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.init}


def plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) if f.name not in _SECRETS
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
    out: dict[str, Any] = plain(policy)
    return out


def breaker_to_dict(config: CircuitBreakerConfig) -> dict[str, Any]:
    """A breaker config as a JSON-compatible dict (every constructor field)."""
    out: dict[str, Any] = plain(config)
    return out


def _fields_of(cls: type[Any], data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(what, f"must be a JSON object, got {type(data).__name__}")
    unknown = set(data) - dataclass_fields(cls)
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


def json_text(data: Mapping[str, Any]) -> str:
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


def clip(text: str, limit: int = _REASON_CHARS) -> str:
    return printable_entry(text, limit)


def rejection_reason(exc: BaseException) -> str:
    """Why an entry was rejected: the ConfigError's text, or the unexpected error's type too."""
    text = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
    return clip(text)


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


def as_bytes(value: str | bytes) -> bytes:
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
        raise ConfigError(printable_entry(name), rejection_reason(exc)) from exc


def _decode_entry(name: str, text: str | bytes) -> RetryPolicy | CircuitBreakerConfig:
    shown = printable_entry(name)
    kind, sep, entry_name = name.partition(":")
    if not sep or kind not in KINDS or not entry_name:
        raise ConfigError("field", f"unknown fleet config entry '{shown}'")
    raw = as_bytes(text)
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
        raise ConfigError(shown, f"is not JSON: {clip(str(exc))}") from exc
    decoded: RetryPolicy | CircuitBreakerConfig
    if kind == RETRY:
        decoded = policy_from_dict(data)
        if decoded.operation_type != entry_name:
            raise ConfigError(
                "operation_type", f"{clip(repr(decoded.operation_type))} under '{shown}'"
            )
    else:
        decoded = breaker_from_dict(data)
        if decoded.name != entry_name:
            raise ConfigError("name", f"{clip(repr(decoded.name))} under '{shown}'")
    return decoded
