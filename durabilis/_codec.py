"""Value encoding: msgpack for everything stored, canonical JSON for hashing.

Never pickle: stored values must be safe to read from any language and must
not execute code when decoded.

Values users return round-trip exactly: :func:`unpack` gives back an equal
value of the same type. msgpack carries ``None``, ``bool``, ``int`` (64-bit),
``float``, ``str``, ``bytes``, ``list`` and ``dict`` itself; the types below
use msgpack ext types, one code per kind (part of the stored format):

====  =============  ===============================================================
code  type           encoding (payload fields big-endian, in ``struct`` notation)
====  =============  ===============================================================
1     ``tuple``      array ``[ext 1 (empty), item, ...]``
2     ``set``        array ``[ext 2 (empty), item, ...]``
3     ``frozenset``  array ``[ext 3 (empty), item, ...]``
4     ``Enum``       array ``[ext 4 (empty), module, qualname, value]``
5     ``datetime``   ext 5: ``>HBBBBBI`` year, month, day, hour, minute, second,
                     microsecond; aware: then ``>q`` UTC offset in microseconds
6     ``date``       ext 6: ``>HBB`` year, month, day
7     ``time``       ext 7: ``>BBBI`` hour, minute, second, microsecond; aware: then
                     ``>q`` UTC offset in microseconds
8     ``timedelta``  ext 8: ``>iII`` days, seconds, microseconds
9     ``Decimal``    ext 9: ``str(d)``, ASCII (NaN, sNaN, -0, Infinity, any exponent)
10    ``UUID``       ext 10: its 16 bytes
====  =============  ===============================================================

Why this shape:

- Containers are arrays led by an empty ext "head", not ext payloads of
  nested msgpack: each nested ``unpackb`` takes ~50 KB of C stack, and a
  prototype died (SIGSEGV) on ~150 nested tuples, which anyone with Redis
  access could plant. As arrays, nesting stays within msgpack's own limits
  (511 levels packing, 1024 unpacking), which raise. A tuple (or frozenset)
  dict key is such an array, rebuilt before the map hashes it.
- Date/time fields, not ``isoformat()``: ``datetime.fromisoformat`` loses the
  sign of an offset under a minute (``-00:00:00.000001`` comes back as UTC).
  ``struct``, not nested msgpack: a ``packb`` inside ``packb`` costs ~25 us.

What comes back:

- An ``Enum`` member (``IntEnum``, ``StrEnum``, ``Flag`` too) comes back as the
  member only if its module is already in ``sys.modules`` and ``qualname``
  there is an ``Enum`` subclass with a member of that value; otherwise as the
  plain value. Decoding never imports (and looks attributes up statically):
  it must not run code chosen by the data.
- An aware ``datetime``/``time`` comes back with a fixed
  ``timezone(timedelta(...))`` of the same offset: a ``zoneinfo`` zone or a
  named ``timezone`` becomes its offset at that instant (equality holds). A
  ``time`` with a ``zoneinfo`` zone has no offset: it comes back naive.
  ``fold`` is not kept (equality ignores it).
- Subclasses come back as their base: ``OrderedDict``/``defaultdict`` as
  ``dict``, a named tuple as ``tuple``, ``str``/``int``/``float`` subclasses
  as such, ``bytearray``/``memoryview`` as ``bytes``. Anything else raises
  :class:`InvalidPayload` naming the type.
- Unknown ext codes (foreign data) and malformed payloads raise
  :class:`CorruptData`; msgpack's own timestamp (ext -1) decodes to
  ``msgpack.Timestamp``. Data written before these ext types decodes as it
  did (tuples as lists, tuple dict keys as tuples).
"""

from __future__ import annotations

import inspect
import json
import struct
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Context, Decimal, InvalidOperation
from enum import Enum, Flag
from typing import Any
from uuid import UUID

import msgpack
from msgpack import ExtType

from durabilis.errors import CorruptData, InvalidPayload, PayloadTooLarge

# Ext type codes: part of the stored format, never renumber (table in the module docstring).
_TUPLE = 1
_SET = 2
_FROZENSET = 3
_ENUM = 4
_DATETIME = 5
_DATE = 6
_TIME = 7
_TIMEDELTA = 8
_DECIMAL = 9
_UUID = 10

_MICROSECOND = timedelta(microseconds=1)
_DATETIME_FIELDS = struct.Struct(">HBBBBBI")
_DATE_FIELDS = struct.Struct(">HBB")
_TIME_FIELDS = struct.Struct(">BBBI")
_TIMEDELTA_FIELDS = struct.Struct(">iII")
_OFFSET_FIELD = struct.Struct(">q")
# Decimal(text) is exact whatever the context; the context only decides whether a malformed
# text raises or quietly becomes NaN, so pin it instead of trusting the thread's context.
_DECIMAL_STRICT = Context(traps=[InvalidOperation])


def _packer() -> msgpack.Packer:
    # strict_types: tuples and subclasses reach _default instead of being packed as
    # their base type (a tuple as a list, an IntEnum as an int).
    return msgpack.Packer(use_bin_type=True, strict_types=True, default=_default)


_PACKERS: list[msgpack.Packer] = []
"""Packers free for reuse (see :func:`pack`)."""
_SPARE_PACKERS = 16


def pack(value: Any, *, what: str = "value", limit: int | None = None) -> bytes:
    """Encode ``value`` as msgpack, with the ext types of the module docstring.

    Args:
        value: What to store.
        what: Names the value in error messages (``"checkpoint state"``, ...).
        limit: Largest encoding accepted, in bytes; ``None`` for no limit.

    Returns:
        The msgpack bytes.

    Raises:
        InvalidPayload: The value holds something that cannot be encoded (names the type),
            an integer outside 64 bits, a lone surrogate, or nesting deeper than 511 levels.
        PayloadTooLarge: The encoding is longer than ``limit`` bytes.
    """
    # A packer is reused (``msgpack.packb`` builds one per call): taken from a
    # free list (pop and append are atomic: a thread, or a nested pack from
    # _default, never shares one in use) and put back only after a clean pack.
    try:
        packer = _PACKERS.pop()
    except IndexError:
        packer = _packer()
    try:
        data: bytes = packer.pack(value)
    except (TypeError, ValueError, OverflowError, BufferError, RecursionError) as exc:
        raise InvalidPayload(f"{what} cannot be stored (msgpack): {exc}") from exc
    if len(_PACKERS) < _SPARE_PACKERS:
        _PACKERS.append(packer)
    if limit is not None and len(data) > limit:
        raise PayloadTooLarge(what, len(data), limit)
    return data


def unpack(data: bytes, *, key: str) -> Any:
    """Decode msgpack written by :func:`pack`.

    Args:
        data: The stored bytes.
        key: The Redis key they came from (named by :class:`CorruptData`).

    Returns:
        The value, of the types it was packed with (module docstring).

    Raises:
        CorruptData: ``data`` is not one complete msgpack value, holds an unknown ext
            type or a malformed ext payload, or nests too deeply (names ``key``).
    """
    # The common case (no tuple, set or Enum) is one plain unpackb, as fast as before.
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)
    except _HasHeads:
        pass  # tuples, sets or Enums: decode again, with the hooks that rebuild them
    except TypeError:
        pass  # data written before ext types: a tuple map key came back as a list
    except _BadExt as exc:
        raise CorruptData(key, str(exc)) from exc
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CorruptData(key, f"value is not msgpack ({type(exc).__name__})") from exc
    heads = _Heads()
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            ext_hook=heads.ext_hook,
            list_hook=heads.list_hook,
            object_pairs_hook=_dict_with_frozen_keys,
        )
    except _BadExt as exc:
        raise CorruptData(key, str(exc)) from exc
    except Exception as exc:
        raise CorruptData(key, f"value is not msgpack ({type(exc).__name__})") from exc
    if heads.open:
        raise CorruptData(key, "msgpack ext head (tuple/set/Enum) outside the head of an array")
    return value


# --- encoding ------------------------------------------------------------------------------

# The heads are constants: packing a tuple costs one list, no nested msgpack call.
_TUPLE_HEAD = ExtType(_TUPLE, b"")
_SET_HEAD = ExtType(_SET, b"")
_FROZENSET_HEAD = ExtType(_FROZENSET, b"")
_ENUM_HEAD = ExtType(_ENUM, b"")


def _encode_datetime(obj: datetime) -> ExtType:
    naive = _DATETIME_FIELDS.pack(
        obj.year, obj.month, obj.day, obj.hour, obj.minute, obj.second, obj.microsecond
    )
    return ExtType(_DATETIME, naive + _offset(obj.utcoffset()))


def _encode_date(obj: date) -> ExtType:
    return ExtType(_DATE, _DATE_FIELDS.pack(obj.year, obj.month, obj.day))


def _encode_time(obj: time) -> ExtType:
    naive = _TIME_FIELDS.pack(obj.hour, obj.minute, obj.second, obj.microsecond)
    return ExtType(_TIME, naive + _offset(obj.utcoffset()))


def _offset(offset: timedelta | None) -> bytes:
    # Whole microseconds: a UTC offset is a timedelta strictly inside +-24 h.
    return b"" if offset is None else _OFFSET_FIELD.pack(offset // _MICROSECOND)


def _encode_timedelta(obj: timedelta) -> ExtType:
    return ExtType(_TIMEDELTA, _TIMEDELTA_FIELDS.pack(obj.days, obj.seconds, obj.microseconds))


def _encode_decimal(obj: Decimal) -> ExtType:
    # Decimal.__str__, not str(): a subclass may override __str__.
    return ExtType(_DECIMAL, Decimal.__str__(obj).encode("ascii"))


def _encode_uuid(obj: UUID) -> ExtType:
    return ExtType(_UUID, obj.int.to_bytes(16, "big"))


def _encode_enum(obj: Enum) -> list[Any]:
    cls = type(obj)
    return [_ENUM_HEAD, cls.__module__, cls.__qualname__, obj.value]


def _encode_bytes(obj: Any) -> bytes:
    return bytes(memoryview(obj))  # bytes(obj) would call a subclass's __bytes__


# Exact types first (one dict lookup), so the common ext types cost no isinstance chain.
_ENCODERS: dict[type, Callable[[Any], Any]] = {
    tuple: lambda obj: [_TUPLE_HEAD, *obj],
    set: lambda obj: [_SET_HEAD, *obj],
    frozenset: lambda obj: [_FROZENSET_HEAD, *obj],
    datetime: _encode_datetime,
    date: _encode_date,
    time: _encode_time,
    timedelta: _encode_timedelta,
    Decimal: _encode_decimal,
    UUID: _encode_uuid,
}

# Subclasses, as their base type. Order matters: datetime is a date, bool cannot be
# subclassed, and Enum is checked before all of these (IntEnum is an int).
_SUBCLASS_ENCODERS: tuple[tuple[type | tuple[type, ...], Callable[[Any], Any]], ...] = (
    (datetime, _encode_datetime),
    (date, _encode_date),
    (time, _encode_time),
    (timedelta, _encode_timedelta),
    (Decimal, _encode_decimal),
    (UUID, _encode_uuid),
    (tuple, _ENCODERS[tuple]),
    (frozenset, _ENCODERS[frozenset]),
    (set, _ENCODERS[set]),
    (dict, dict),
    (list, list),
    # The base class's own conversions: str(obj) or int(obj) would call overrides.
    (str, str.__str__),
    (int, int.__int__),
    (float, float.__float__),
    ((bytes, bytearray, memoryview), _encode_bytes),
)


def _default(obj: Any) -> Any:
    """msgpack's hook for what it does not pack itself; returns something it does."""
    encode = _ENCODERS.get(type(obj))
    if encode is not None:
        return encode(obj)
    if type(obj) is int:  # msgpack hands over ints that do not fit in 64 bits
        raise OverflowError(f"integer out of range (-2**63 .. 2**64-1): {obj}")
    if isinstance(obj, Enum):
        return _encode_enum(obj)
    for base, encode in _SUBCLASS_ENCODERS:
        if isinstance(obj, base):
            return encode(obj)
    cls = type(obj)
    raise TypeError(f"cannot encode an object of type {cls.__module__}.{cls.__qualname__}")


# --- decoding ------------------------------------------------------------------------------


class _HasHeads(Exception):
    """The fast first decoding met a tuple/set/Enum head: decode again with the hooks."""


class _BadExt(ValueError):
    """An ext value is unknown or malformed; ``unpack`` turns it into CorruptData."""


def _fields(data: bytes, fields: struct.Struct) -> tuple[tuple[int, ...], timezone | None]:
    """The fixed fields of a date/time payload, and its UTC offset if it has one."""
    if len(data) == fields.size:
        return fields.unpack(data), None
    if len(data) != fields.size + _OFFSET_FIELD.size:
        raise ValueError(f"{len(data)} bytes")
    (offset,) = _OFFSET_FIELD.unpack_from(data, fields.size)
    return fields.unpack_from(data), timezone(timedelta(microseconds=offset))


def _decode_datetime(data: bytes) -> datetime:
    (year, month, day, hour, minute, second, microsecond), tz = _fields(data, _DATETIME_FIELDS)
    return datetime(year, month, day, hour, minute, second, microsecond, tzinfo=tz)


def _decode_date(data: bytes) -> date:
    return date(*_DATE_FIELDS.unpack(data))


def _decode_time(data: bytes) -> time:
    (hour, minute, second, microsecond), tz = _fields(data, _TIME_FIELDS)
    return time(hour, minute, second, microsecond, tzinfo=tz)


def _decode_timedelta(data: bytes) -> timedelta:
    days, seconds, microseconds = _TIMEDELTA_FIELDS.unpack(data)
    return timedelta(days=days, seconds=seconds, microseconds=microseconds)


def _decode_decimal(data: bytes) -> Decimal:
    return Decimal(data.decode("ascii"), _DECIMAL_STRICT)


def _decode_uuid(data: bytes) -> UUID:
    if len(data) != 16:
        raise ValueError("not 16 bytes")
    return UUID(bytes=data)


_DECODERS: dict[int, tuple[str, Callable[[bytes], Any]]] = {
    _DATETIME: ("datetime", _decode_datetime),
    _DATE: ("date", _decode_date),
    _TIME: ("time", _decode_time),
    _TIMEDELTA: ("timedelta", _decode_timedelta),
    _DECIMAL: ("Decimal", _decode_decimal),
    _UUID: ("UUID", _decode_uuid),
}


def _ext_hook(code: int, data: bytes) -> Any:
    """msgpack's hook for ext values: the leaf types; a head stops the fast decoding."""
    entry = _DECODERS.get(code)
    if entry is None:
        if code in _HEADS:
            raise _HasHeads
        raise _BadExt(f"unknown msgpack ext type {code}")
    kind, decode = entry
    try:
        return decode(data)
    except Exception as exc:  # ValueError, OverflowError, InvalidOperation, ...
        raise _BadExt(f"malformed {kind} (msgpack ext type {code}): {exc}") from exc


def _build_enum(items: list[Any]) -> Any:
    if len(items) != 4 or type(items[1]) is not str or type(items[2]) is not str:
        raise ValueError("not [head, module, qualname, value]")
    _, module_name, qualname, value = items
    cls = _loaded_class(module_name, qualname)
    if cls is None or not issubclass(cls, Enum):
        return value
    member = _enum_member(cls, value)
    return value if member is None else member


def _loaded_class(module_name: str, qualname: str) -> type | None:
    """The class ``qualname`` of an already imported module, looked up without running code.

    ``sys.modules`` only: never import. ``getattr_static``: a module ``__getattr__`` (lazy
    imports), a lazy module or a metaclass ``__getattr__`` would otherwise run.
    """
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        if obj is None:
            return None
        obj = inspect.getattr_static(obj, part, None)
    return obj if isinstance(obj, type) else None


def _enum_member(cls: type[Enum], value: Any) -> Enum | None:
    """The member of ``cls`` whose value is ``value`` (same type), or None."""
    for member in cls.__members__.values():  # aliases included
        if _same_value(member.value, value):
            return member
    if issubclass(cls, Flag) and type(value) is int:
        # A combination (A|B) is no named member; the class builds it. This runs the
        # class's _missing_, code of a module already loaded, not of the data.
        try:
            member = cls(value)
        except Exception:
            return None
        if type(member) is cls and _same_value(member.value, value):
            return member
    return None


def _same_value(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # Decimal('sNaN') == raises, a foreign __eq__ may raise anything
        return False


class _Head:
    """What a head (ext 1-4) decodes to until :meth:`_Heads.list_hook` rebuilds its array."""

    __slots__ = ("build", "kind")

    def __init__(self, kind: str, build: Callable[[list[Any]], Any]) -> None:
        self.kind = kind
        self.build = build


_HEADS: dict[int, _Head] = {
    _TUPLE: _Head("tuple", lambda items: tuple(items[1:])),
    _SET: _Head("set", lambda items: set(items[1:])),
    _FROZENSET: _Head("frozenset", lambda items: frozenset(items[1:])),
    _ENUM: _Head("Enum", _build_enum),
}


class _Heads:
    """The hooks of one decoding of data holding heads.

    msgpack calls ``list_hook`` as each array ends, innermost first and before an array
    becomes a map key, so nesting needs no recursion here and a tuple key is a tuple by
    the time the map hashes it. ``open`` counts heads not yet rebuilt: one left at the end
    stood somewhere else than first in an array (foreign data).
    """

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = 0

    def ext_hook(self, code: int, data: bytes) -> Any:
        head = _HEADS.get(code)
        if head is None:
            return _ext_hook(code, data)
        if data:
            raise _BadExt(f"malformed {head.kind} (msgpack ext type {code}): head has a payload")
        self.open += 1
        return head

    def list_hook(self, items: list[Any]) -> Any:
        if not items or type(items[0]) is not _Head:
            return items
        head: _Head = items[0]
        self.open -= 1
        try:
            return head.build(items)
        except Exception as exc:  # set() of unhashable items, a bad Enum array, ...
            raise _BadExt(f"malformed {head.kind}: {type(exc).__name__}: {exc}") from exc


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple((_frozen(k), _frozen(v)) for k, v in value.items())
    return value


def _dict_with_frozen_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A map; keys that were tuples before ext types (packed as arrays) become tuples."""
    try:
        return dict(pairs)
    except TypeError:
        return {_frozen(k): v for k, v in pairs}


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
"""What ``json.dumps`` builds per call with these options (it keeps no state)."""


def canonical_json(value: Any) -> bytes:
    """Sorted-key, compact, UTF-8 JSON: the same bytes for equal values.

    Raises:
        InvalidPayload: The value is not JSON-compatible (or holds NaN/inf).
    """
    try:
        return _CANONICAL.encode(value).encode("utf-8")  # a lone surrogate fails here
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
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


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


def reply_tag(reply: Any, key: str) -> str:
    """A script reply's tag (its first element, as text); :class:`CorruptData`
    naming ``key`` for a reply without one."""
    try:
        return as_text(reply[0], key=key, field="reply")
    except (TypeError, IndexError, KeyError) as exc:
        raise CorruptData(key, f"unexpected script reply {reply!r}") from exc


def as_text(value: Any, *, key: str, field: str) -> str:
    """A UTF-8 string read back from Redis, or :class:`CorruptData` naming the key."""
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, ValueError) as exc:
        raise CorruptData(key, f"field {field!r} is not UTF-8 text") from exc
