"""Value encoding: msgpack for everything stored, canonical JSON for hashing.

Never pickle: stored values must be safe to read from any language and must
not execute code when decoded.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import msgpack

from durabilis.errors import CorruptData, InvalidPayload, PayloadTooLarge


def pack(value: Any, *, what: str = "value", limit: int | None = None) -> bytes:
    """Encode ``value`` as msgpack.

    Raises:
        InvalidPayload: The value holds something msgpack cannot encode.
        PayloadTooLarge: The encoding is longer than ``limit`` bytes.
    """
    try:
        data: bytes = msgpack.packb(value, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidPayload(f"{what} cannot be stored (msgpack): {exc}") from exc
    if limit is not None and len(data) > limit:
        raise PayloadTooLarge(what, len(data), limit)
    return data


def unpack(data: bytes, *, key: str) -> Any:
    """Decode msgpack written by :func:`pack`.

    Raises:
        CorruptData: ``data`` is not one complete msgpack value (names ``key``).
    """
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CorruptData(key, f"value is not msgpack ({type(exc).__name__})") from exc


def canonical_json(value: Any) -> bytes:
    """Sorted-key, compact, UTF-8 JSON: the same bytes for equal values.

    Raises:
        InvalidPayload: The value is not JSON-compatible (or holds NaN/inf).
    """
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"value is not JSON-compatible: {exc}") from exc
    return text.encode("utf-8")


def content_bytes(content: Any) -> bytes:
    """The bytes that stand for ``content`` when hashing it.

    ``bytes`` are used as they are and ``str`` as its UTF-8 text (so
    ``"hello"`` and ``b"hello"`` hash alike); anything else is canonical JSON.
    """
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    if isinstance(content, str):
        return content.encode("utf-8")
    return canonical_json(content)


def json_text_or_none(value: Any) -> str | None:
    """JSON text of ``value`` for humans (``redis-cli``), or None if not JSON-compatible."""
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None


def ms_to_datetime(ms: int | float) -> datetime:
    """Milliseconds since the epoch (Redis server clock) as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)


def as_int(value: Any, *, key: str, field: str) -> int:
    """An integer read back from Redis, or :class:`CorruptData` naming the key."""
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise CorruptData(key, f"field {field!r} is not an integer: {value!r}") from exc


def as_text(value: Any, *, key: str, field: str) -> str:
    """A UTF-8 string read back from Redis, or :class:`CorruptData` naming the key."""
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, ValueError) as exc:
        raise CorruptData(key, f"field {field!r} is not UTF-8 text") from exc
