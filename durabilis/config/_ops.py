"""The fleet config's calls and the decoding of their replies (no I/O)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from durabilis import _codec
from durabilis._retry_core import RetryPolicy
from durabilis._scripts import ScriptCall
from durabilis._store import AsyncStore, Store
from durabilis.breaker import CircuitBreakerConfig
from durabilis.config._model import (
    BREAKER,
    KINDS,
    MAX_ENTRY_BYTES,
    RESERVED,
    RETRY,
    FleetConfig,
    as_bytes,
    decode_entry,
    json_text,
    rejection_reason,
)
from durabilis.errors import ConfigError, CorruptData

_VERSION = re.compile(rb"[0-9]{1,15}")
"""A fleet config version, as ``config_publish.lua`` accepts it."""


class ConfigOps:
    """Builds the fleet config's calls and decodes its replies (no I/O)."""

    __slots__ = ("fleet_key", "log_key", "log_maxlen", "replica_id")

    def __init__(self, store: Store | AsyncStore, replica_id: str, log_maxlen: int) -> None:
        self.fleet_key = store.keys.config("fleet")
        self.log_key = store.keys.config("log")
        self.replica_id = replica_id
        self.log_maxlen = log_maxlen

    @staticmethod
    def entry(kind: str, name: str) -> str:
        if kind not in KINDS:
            raise ConfigError("kind", f"must be {RETRY!r} or {BREAKER!r}, got {kind!r}")
        if not isinstance(name, str) or not name:
            raise ConfigError("name", "must be a non-empty string")
        return f"{kind}:{name}"

    def publish(self, kind: str, name: str, data: Mapping[str, Any] | None) -> ScriptCall:
        entry = self.entry(kind, name)
        if data is None:
            return self.remove(entry)
        text = json_text(data)
        size = len(text.encode("utf-8"))
        if size > MAX_ENTRY_BYTES:  # every replica would reject it
            raise ConfigError(entry, f"is {size} bytes of JSON, over the cap of {MAX_ENTRY_BYTES}")
        return self._call("set", entry, text)

    def remove(self, entry: str) -> ScriptCall:
        """Remove one field of the fleet config hash, whatever its name and value hold.

        A name read back with bytes that were not UTF-8 (lone surrogates, as
        :meth:`decode_entries` keeps them) is sent as those exact bytes.
        """
        if not isinstance(entry, str) or not entry or entry in RESERVED:
            raise ConfigError(
                "entry", f"must be a field of the fleet config (not {', '.join(RESERVED)}),"
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
                else as_bytes(str(raw_value))
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
                rejected[name] = rejection_reason(exc)
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
