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
    except TypeError:
        pass  # a map key that was a tuple comes back as a list: unhashable
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CorruptData(key, f"value is not msgpack ({type(exc).__name__})") from exc
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=False, object_pairs_hook=_dict_with_frozen_keys
        )
    except Exception as exc:
        raise CorruptData(key, f"value is not msgpack ({type(exc).__name__})") from exc


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple((_frozen(k), _frozen(v)) for k, v in value.items())
    return value


def _dict_with_frozen_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """Map keys that were tuples (packed as arrays) come back as tuples again."""
    return {_frozen(k): v for k, v in pairs}


def canonical_json(value: Any) -> bytes:
    """Sorted-key, compact, UTF-8 JSON: the same bytes for equal values.

    Raises:
        InvalidPayload: The value is not JSON-compatible (or holds NaN/inf).
    """
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        return text.encode("utf-8")  # a lone surrogate fails here
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayload(f"value is not JSON-compatible: {exc}") from exc


def content_bytes(content: Any) -> bytes:
    """The bytes that stand for ``content`` when hashing it.

    ``bytes`` are used as they are and ``str`` as its UTF-8 text (so
    ``"hello"`` and ``b"hello"`` hash alike); anything else is canonical JSON.
    """
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    if isinstance(content, str):
        try:
            return content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidPayload(f"text is not valid Unicode (lone surrogate): {exc}") from exc
    return canonical_json(content)


def json_text_or_none(value: Any) -> str | None:
    """JSON text of ``value`` for humans (``redis-cli``), or None if not JSON-compatible."""
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


def ms_to_datetime(ms: int | float) -> datetime:
    """Milliseconds since the epoch (Redis server clock) as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)


def as_datetime(value: Any, *, key: str, field: str) -> datetime:
    """A millisecond timestamp read back from Redis as an aware UTC datetime.

    Raises:
        CorruptData: Not an integer, or outside what ``datetime`` can hold (names the key).
    """
    ms = as_int(value, key=key, field=field)
    try:
        return ms_to_datetime(ms)
    except (OverflowError, ValueError, OSError) as exc:
        raise CorruptData(key, f"field {field!r} is not a timestamp: {value!r}") from exc


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
