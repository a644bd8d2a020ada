"""msgpack encoding of stored values: every supported type round-trips exactly.

"Exactly" means equal AND of the same type, all the way down (``1 == 1.0 ==
True`` in Python, so the tests compare :func:`shape`, which spells out types).
No Redis: ``_codec`` is pure.
"""

from __future__ import annotations

import enum
import json
import math
import re
import struct
import sys
import threading
import types
import zoneinfo
from collections import OrderedDict, defaultdict, namedtuple
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from enum import Enum, Flag, IntEnum, IntFlag
from typing import Any
from uuid import UUID

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgpack import ExtType

from durabilis import _codec
from durabilis.errors import CorruptData, InvalidPayload, PayloadTooLarge

# --- module-level Enums: this module is in sys.modules, so they resolve -------------------


class Color(Enum):
    RED = 1
    GREEN = "green"
    PAIR = (1, "a")


class Level(IntEnum):
    LOW = 1
    HIGH = 2


class Shade(str, Enum):
    DARK = "dark"


class Perm(Flag):
    R = 1
    W = 2
    X = 4


class Bits(IntFlag):
    ONE = 1
    TWO = 2


class Outer:
    class Inner(Enum):
        A = "a"


ENUM_MEMBERS: list[Enum] = [
    *Color, *Level, *Shade, *Perm, Perm.R | Perm.W, Bits.ONE | Bits.TWO, Outer.Inner.A
]


class Mood(enum.StrEnum):
    CALM = "calm"


ENUM_MEMBERS.append(Mood.CALM)


# --- helpers ---------------------------------------------------------------------------------


def shape(value: Any) -> Any:
    """A hashable description of ``value`` that differs whenever type or value differs.

    Floats by ``hex()`` (NaN equals NaN, -0.0 differs from 0.0), Decimals by
    ``as_tuple()`` (NaN, sNaN, -0 and trailing zeros kept), datetimes and times by
    their fields and tzinfo, containers element by element (dicts in order).
    """
    kind = type(value)
    if isinstance(value, Enum):
        return (kind, value.name, shape(value.value))
    if kind is float:
        return (kind, value.hex())
    if kind is Decimal:
        return (kind, value.as_tuple())
    if kind in (list, tuple):
        return (kind, tuple(shape(v) for v in value))
    if kind in (set, frozenset):
        return (kind, len(value), frozenset(shape(v) for v in value))
    if kind is dict:
        return (kind, tuple((shape(k), shape(v)) for k, v in value.items()))
    if kind in (datetime, time):
        naive = value.replace(tzinfo=None).isoformat()
        return (kind, naive, type(value.tzinfo), value.tzinfo)  # timezone == compares offsets
    if kind in (type(None), bool, int, str, bytes, date, timedelta, UUID):
        return (kind, value)
    raise AssertionError(f"unexpected type {kind!r} in a decoded value")


def round_trip(value: Any) -> Any:
    return _codec.unpack(_codec.pack(value), key="k")


def assert_exact(value: Any) -> None:
    assert shape(round_trip(value)) == shape(value)


def ext(code: int, data: bytes) -> bytes:
    """Hand-made msgpack ext 8 (any code, negative ones included)."""
    return bytes([0xC7, len(data)]) + struct.pack("b", code) + data


def head(code: int, *items: Any) -> bytes:
    """Hand-made msgpack: an array led by an ext head (a tuple, set or Enum on the wire)."""
    return msgpack.packb([ExtType(code, b""), *items])  # type: ignore[no-any-return]


def corrupt(data: bytes) -> CorruptData:
    with pytest.raises(CorruptData) as err:
        _codec.unpack(data, key="the:key")
    assert err.value.key == "the:key"
    return err.value


# --- every type, by example --------------------------------------------------------------

PLUS_0530 = timezone(timedelta(hours=5, minutes=30))
ODD = timezone(-timedelta(microseconds=1))  # isoformat would lose this sign

EXAMPLES = [
    None, True, False, 0, 1, -1, 2**64 - 1, -(2**63), 1.0, -0.0, math.inf, math.nan,
    "", "hi", "Grüße \U0001f600", b"", b"\x00\xff", [], [1, [2.0, [True]]], {},
    {"page": 7, "text": "hi", "tags": ["a", "b"]}, {1: "int key", b"k": "bytes key"},
    datetime(2024, 2, 29, 12, 30, 45, 123456),
    datetime(2024, 2, 29, 12, 30, 45, 123456, tzinfo=PLUS_0530),
    datetime(2024, 1, 1, tzinfo=UTC),
    datetime(2024, 1, 1, tzinfo=ODD),
    datetime(2024, 1, 1, tzinfo=timezone(timedelta(hours=-23, minutes=-59, seconds=-59))),
    datetime.min, datetime.max, datetime.max.replace(tzinfo=timezone(timedelta(hours=23))),
    date(2024, 2, 29), date.min, date.max,
    time(0, 0), time(23, 59, 59, 999999), time(1, 2, 3, 4, tzinfo=PLUS_0530),
    time(1, 2, 3, tzinfo=ODD),
    timedelta(0), timedelta(days=-1, microseconds=1), timedelta.min, timedelta.max,
    Decimal("1.10"), Decimal("-0"), Decimal("0E-7"), Decimal("NaN"), Decimal("-NaN123"),
    Decimal("sNaN"), Decimal("Infinity"), Decimal("-Infinity"),
    Decimal("1E+999999999999999999"), Decimal("-1E-999999999999999999"),
    Decimal("3.14159265358979323846264338327950288419716939937510582097494459"),
    UUID(int=0), UUID("12345678-1234-5678-1234-567812345678"), UUID(int=2**128 - 1),
    (), (1,), (1, (2, (3, ()))), ([1], {"a": (2,)}),
    set(), {1, "a", b"b", None}, frozenset(), frozenset({1, (2, 3)}),
    {(1, 2), (3, (4, 5)), frozenset({6})},
    *ENUM_MEMBERS,
    [Color.PAIR, Level.HIGH, (Shade.DARK,)],
]


def stable_id(value: Any) -> str:
    """``repr`` the same in every process (pytest-xdist's workers must collect the same
    ids): set members sorted, no object address."""
    if isinstance(value, (set, frozenset)):
        inner = ", ".join(sorted(stable_id(v) for v in value))
        return f"{type(value).__name__}({{{inner}}})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{stable_id(k)}: {stable_id(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        inner = ", ".join(stable_id(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


@pytest.mark.parametrize("value", EXAMPLES, ids=stable_id)
def test_every_supported_type_round_trips_exactly(value: Any) -> None:
    assert_exact(value)


def test_types_that_compare_equal_stay_apart() -> None:
    value = [1, 1.0, True, Decimal(1), Level.LOW, Color.RED, (1,), [1], {1}, frozenset({1})]
    out = round_trip(value)
    assert [type(v) for v in out] == [type(v) for v in value]
    assert shape(out) == shape(value)


def test_tuples_inside_sets_inside_dict_values_and_tuple_keys() -> None:
    value = {
        (1, "a"): {"inner": [{(2, (3, 4)), frozenset({(5,)})}]},
        ((1, 2), frozenset({3})): (datetime(2024, 1, 1, tzinfo=PLUS_0530), {Level.LOW}),
        frozenset({"k", (6, 7)}): None,
        date(2024, 1, 1): "date key",
        Color.PAIR: "enum key",
        Decimal("2.50"): "decimal key",
        UUID(int=7): "uuid key",
    }
    out = round_trip(value)
    assert shape(out) == shape(value)
    assert out[(1, "a")]["inner"][0] == {(2, (3, 4)), frozenset({(5,)})}
    assert all(type(k) is type(k2) for k, k2 in zip(out, value, strict=True))


def test_dict_order_is_kept() -> None:
    value = {"b": 1, "a": 2, (0,): 3, 1: 4}
    assert list(round_trip(value)) == list(value)


def test_nesting_round_trips_up_to_msgpack_limit_and_deeper_is_refused() -> None:
    value: Any = ()
    for _ in range(1000):
        value = (value, {1})
    out = _codec.unpack(_codec.pack(value), key="k")
    for _ in range(1000):  # walked, not compared: == would hit Python's recursion limit
        assert type(out) is tuple and len(out) == 2 and type(out[1]) is set and out[1] == {1}
        out = out[0]
    assert out == ()
    for _ in range(100):
        value = (value,)
    with pytest.raises(InvalidPayload, match="recursion limit"):
        _codec.pack(value)


# --- dates and times ------------------------------------------------------------------------


def test_naive_and_aware_stay_distinct() -> None:
    naive = datetime(2024, 5, 1, 12, 0, 0, 1)
    aware = naive.replace(tzinfo=UTC)
    out_naive, out_aware = round_trip([naive, aware])
    assert out_naive.tzinfo is None and out_naive == naive
    assert out_aware.tzinfo is UTC and out_aware == aware
    t_naive, t_aware = round_trip([time(12, 0, 0, 1), time(12, 0, 0, 1, tzinfo=PLUS_0530)])
    assert t_naive.tzinfo is None
    assert t_aware.utcoffset() == timedelta(hours=5, minutes=30)


def test_an_offset_is_kept_to_the_microsecond() -> None:
    offset = -timedelta(hours=3, minutes=7, seconds=9, microseconds=11)
    value = datetime(2000, 1, 2, 3, 4, 5, 6, tzinfo=timezone(offset))
    out = round_trip(value)
    assert out.utcoffset() == offset
    assert out.tzinfo == timezone(offset)


@pytest.mark.parametrize("month", [1, 7])
def test_a_zoneinfo_zone_comes_back_as_its_fixed_offset(month: int) -> None:
    try:
        paris = zoneinfo.ZoneInfo("Europe/Paris")
    except zoneinfo.ZoneInfoNotFoundError:
        pytest.skip("no time zone database (install tzdata)")
    value = datetime(2024, month, 15, 9, 30, tzinfo=paris)
    out = round_trip(value)
    assert out == value
    assert type(out.tzinfo) is timezone
    assert out.utcoffset() == value.utcoffset() == timedelta(hours=1 if month == 1 else 2)
    # A time has no date to pick the offset: zoneinfo gives none, so it comes back naive.
    assert round_trip(time(9, 30, tzinfo=paris)) == time(9, 30)


def test_a_named_timezone_keeps_its_offset_not_its_name() -> None:
    value = datetime(2024, 1, 1, tzinfo=timezone(timedelta(hours=1), "CET"))
    out = round_trip(value)
    assert out == value and out.utcoffset() == timedelta(hours=1)
    assert out.tzname() == "UTC+01:00"


# --- subclasses -----------------------------------------------------------------------------


class Text(str):
    def __str__(self) -> str:
        return "overridden"


class Count(int):
    pass


class Ratio(float):
    pass


class Blob(bytes):
    pass


class Money(Decimal):
    pass


class Stamp(datetime):
    pass


Point = namedtuple("Point", "x y")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (OrderedDict([("b", 1), ("a", 2)]), {"b": 1, "a": 2}),
        (defaultdict(list, {"a": [1]}), {"a": [1]}),
        (Point(1, (2,)), (1, (2,))),
        (Text("text"), "text"),
        (Count(5), 5),
        (Ratio(0.5), 0.5),
        (Blob(b"x"), b"x"),
        (bytearray(b"ba"), b"ba"),
        (memoryview(b"mv"), b"mv"),
        (Money("1.50"), Decimal("1.50")),
        (Stamp(2024, 1, 2, tzinfo=PLUS_0530), datetime(2024, 1, 2, tzinfo=PLUS_0530)),
        (type("S", (set,), {})({1}), {1}),
        (type("L", (list,), {})([1, (2,)]), [1, (2,)]),
    ],
    ids=lambda v: type(v).__name__,
)
def test_subclasses_come_back_as_their_base_type(value: Any, expected: Any) -> None:
    out = round_trip(value)
    assert shape(out) == shape(expected)
    if isinstance(expected, dict):
        assert list(out) == list(expected)


# --- Enum resolution ------------------------------------------------------------------------


def test_a_module_level_enum_member_comes_back_as_the_member_itself() -> None:
    out = round_trip([Color.PAIR, Level.HIGH, Shade.DARK, Perm.R | Perm.X, Outer.Inner.A])
    assert out[0] is Color.PAIR
    assert out[1] is Level.HIGH and type(out[1]) is Level  # not a plain int
    assert out[2] is Shade.DARK and type(out[2]) is Shade  # not a plain str
    assert out[3] == Perm.R | Perm.X and type(out[3]) is Perm
    assert out[4] is Outer.Inner.A


def test_an_enum_of_a_module_not_loaded_decodes_to_the_plain_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("durabilis_test_enums_gone")
    Gone = Enum("Gone", [("PAIR", (1, "a")), ("NUM", 2)], module=module.__name__)
    module.Gone = Gone  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    data = _codec.pack([Gone.PAIR, Gone.NUM])
    assert _codec.unpack(data, key="k") == [Gone.PAIR, Gone.NUM]
    monkeypatch.delitem(sys.modules, module.__name__)
    out = _codec.unpack(data, key="k")
    assert shape(out) == shape([(1, "a"), 2])


@pytest.mark.parametrize(
    ("module", "qualname", "value"),
    [
        (__name__, "NoSuchEnum", 1),  # no such name
        (__name__, "Color", 99),  # no member of that value
        (__name__, "Color", 1.0),  # equal (1.0 == 1) but not the same type
        (__name__, "Text", "x"),  # a class, not an Enum
        (__name__, "shape", "x"),  # not a class
        (__name__, "Outer.Missing", "x"),
        (__name__, "Outer.Inner.A.value", "a"),
        ("collections", "OrderedDict", [1]),
        ("", "", None),
        (__name__, "f.<locals>.Local", 1),
    ],
)
def test_an_unresolvable_enum_decodes_to_the_plain_value(
    module: str, qualname: str, value: Any
) -> None:
    assert shape(_codec.unpack(head(4, module, qualname, value), key="k")) == shape(value)


def test_decoding_an_enum_never_imports_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "this", raising=False)  # importing it prints the Zen
    assert _codec.unpack(head(4, "this", "Zen", 1), key="k") == 1
    assert "this" not in sys.modules


def test_decoding_an_enum_runs_no_module_getattr(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("durabilis_test_lazy")
    calls: list[str] = []

    def lazy(name: str) -> Any:  # a PEP 562 module __getattr__ (often a lazy import)
        calls.append(name)
        return Color

    module.__getattr__ = lazy  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert _codec.unpack(head(4, module.__name__, "Color", 1), key="k") == 1
    assert calls == []


# --- refused values, limits -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (object(), "builtins.object"),
        ({"a": [1, {object()}]}, "builtins.object"),
        (1j, "builtins.complex"),
        (Outer(), "Outer"),
        (2**64, "out of range"),
        (-(2**63) - 1, "out of range"),
        (Count(2**64), "out of range"),
        ("\ud800", "surrogate"),
        (memoryview(b"abcd")[::2], "contiguous"),
    ],
    ids=stable_id,
)
def test_what_cannot_be_encoded_raises_invalid_payload_naming_it(value: Any, named: str) -> None:
    with pytest.raises(InvalidPayload, match=named) as err:
        _codec.pack(value, what="the result")
    assert "the result" in str(err.value)


def test_ten_thousand_nested_lists_or_tuples_raise_invalid_payload() -> None:
    nested_list: Any = []
    nested_tuple: Any = ()
    for _ in range(10_000):
        nested_list, nested_tuple = [nested_list], (nested_tuple,)
    for value in (nested_list, nested_tuple, {"k": nested_tuple}):
        with pytest.raises(InvalidPayload):
            _codec.pack(value)


def test_an_encoding_over_the_limit_raises_payload_too_large() -> None:
    data = _codec.pack(("x" * 100,))
    assert _codec.pack(("x" * 100,), limit=len(data)) == data
    with pytest.raises(PayloadTooLarge) as err:
        _codec.pack(("x" * 100,), what="state", limit=len(data) - 1)
    assert (err.value.size, err.value.limit) == (len(data), len(data) - 1)


# --- the stored format ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "raw"),
    [
        ((1, 2), [ExtType(1, b""), 1, 2]),
        ({3}, [ExtType(2, b""), 3]),
        (frozenset({4}), [ExtType(3, b""), 4]),
        (Level.HIGH, [ExtType(4, b""), __name__, "Level", 2]),
        (datetime(2024, 2, 29, 1, 2, 3, 4), ExtType(5, bytes.fromhex("07e8021d01020300000004"))),
        (
            datetime(2024, 2, 29, 1, 2, 3, 4, tzinfo=timezone(-timedelta(microseconds=1))),
            ExtType(5, bytes.fromhex("07e8021d01020300000004" + "ff" * 8)),
        ),
        (date(2024, 2, 29), ExtType(6, bytes.fromhex("07e8021d"))),
        (time(1, 2, 3, 4), ExtType(7, bytes.fromhex("01020300000004"))),
        (timedelta(days=-1, seconds=2, microseconds=3),
         ExtType(8, bytes.fromhex("ffffffff" "00000002" "00000003"))),
        (Decimal("-1.50"), ExtType(9, b"-1.50")),
        (UUID(int=1), ExtType(10, bytes(15) + b"\x01")),
    ],
    ids=repr,
)
def test_the_ext_codes_and_payloads_are_the_documented_ones(value: Any, raw: Any) -> None:
    assert msgpack.unpackb(_codec.pack(value)) == raw


def test_plain_values_encode_as_before() -> None:
    value = {"page": 7, "text": "hi", "tags": ["a", "b"], "b": b"\x00", "f": 1.5, "n": None}
    assert _codec.pack(value) == msgpack.packb(value, use_bin_type=True)


def test_data_written_before_ext_types_still_decodes() -> None:
    old = msgpack.packb({(1, (2, 3)): (4, [5])}, use_bin_type=True)  # tuples as arrays
    assert _codec.unpack(old, key="k") == {(1, (2, 3)): [4, [5]]}


def test_msgpack_timestamps_stay_msgpack_timestamps() -> None:
    stamp = msgpack.Timestamp(1, 2)
    assert round_trip(stamp) == stamp


# --- foreign and corrupt data ---------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 11, 12, 42, 127, -2, -128])
def test_an_unknown_ext_code_raises_corrupt_data_naming_the_key(code: int) -> None:
    err = corrupt(b"\x81\xa1v\x91" + ext(code, b"payload"))  # {"v": [ext]}
    assert f"unknown msgpack ext type {code}" in str(err)
    corrupt(b"\x92" + ext(1, b"") + ext(code, b""))  # in a tuple: the slow path too


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb(ExtType(5, b"\x07\xe8\x02")),  # datetime too short
        msgpack.packb(ExtType(5, bytes.fromhex("07e80d1d01020300000004"))),  # month 13
        msgpack.packb(ExtType(5, bytes.fromhex("07e8021d01020300000004") + b"\x7f" * 8)),
        msgpack.packb(ExtType(6, b"\x00\x00\x01\x01")),  # year 0
        msgpack.packb(ExtType(7, bytes.fromhex("18000000000000"))),  # hour 24
        msgpack.packb(ExtType(8, bytes.fromhex("7fffffff0000000000000000"))),  # days > 1e9
        msgpack.packb(ExtType(8, b"")),
        msgpack.packb(ExtType(9, b"abc")),
        msgpack.packb(ExtType(9, b"1\xff")),
        msgpack.packb(ExtType(9, b"")),
        msgpack.packb(ExtType(10, bytes(15))),
        msgpack.packb(ExtType(1, b"x")),  # a head with a payload
        msgpack.packb([ExtType(1, b"x"), 1]),
        msgpack.packb(ExtType(1, b"")),  # a head on its own
        msgpack.packb([1, ExtType(2, b"")]),  # a head not first
        msgpack.packb({"k": ExtType(3, b"")}),
        msgpack.packb([ExtType(1, b""), ExtType(1, b"")]),
        head(2, [1]),  # a set of unhashable items
        head(4, "mod"),  # an Enum too short
        head(4, 1, "q", 1),  # module not a string
        b"\xc1",
        b"\x92\x01",
        b"\x91" * 10_000 + b"\x90",  # 10k nested lists: msgpack's stack limit
        b"\x92\xc7\x00\x01" * 10_000 + b"\x90",  # 10k nested tuples
    ],
    ids=lambda d: d[:24].hex(),
)
def test_malformed_ext_payloads_and_garbage_raise_corrupt_data(data: bytes) -> None:
    corrupt(data)


# --- property: any mix of the supported types round-trips exactly ------------------------

offsets = st.timedeltas(
    min_value=-timedelta(hours=24) + timedelta(microseconds=1),
    max_value=timedelta(hours=24) - timedelta(microseconds=1),
)
zones = st.none() | st.just(UTC) | offsets.map(timezone)

hashable_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.datetimes(timezones=zones)
    | st.dates()
    | st.times(timezones=zones)
    | st.timedeltas()
    | st.decimals(allow_nan=False)  # NaN hashes by identity, sNaN refuses to hash
    | st.uuids()
    | st.sampled_from(ENUM_MEMBERS)
)
hashables = st.recursive(
    hashable_leaves,
    lambda inner: st.lists(inner, max_size=3).map(tuple) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
values = st.recursive(
    hashable_leaves | st.decimals(),
    lambda inner: st.lists(inner, max_size=4)
    | st.lists(inner, max_size=4).map(tuple)
    | st.dictionaries(hashables, inner, max_size=4)
    | st.sets(hashables, max_size=4)
    | st.frozensets(hashables, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=values)
def test_any_mix_of_supported_types_round_trips_exactly(value: Any) -> None:
    assert shape(round_trip(value)) == shape(value)


# --- reused packers and encoder (pack keeps packers for reuse) ---------------------------


def test_a_failed_pack_leaves_nothing_behind_for_the_next() -> None:
    """A pack that fails partway (an object msgpack cannot encode, deep inside)
    does not leave its bytes in a packer a later pack reuses."""
    good = {"a": [1, 2, 3], "b": "text", "t": (1, 2)}
    expected = _codec.pack(good)
    for _ in range(3):
        with pytest.raises(InvalidPayload):
            _codec.pack({"a": [1, 2, {"deep": object()}]})
        assert _codec.pack(good) == expected
    assert _codec.unpack(expected, key="k") == good


def test_packs_from_many_threads_never_share_a_packer() -> None:
    values = [{"i": i, "s": "x" * (i % 50), "t": (i, str(i)), "d": Decimal(i)} for i in range(200)]
    expected = [msgpack.packb(v, use_bin_type=True, strict_types=True, default=_codec._default)
                for v in values]
    wrong: list[int] = []

    def work() -> None:
        for _ in range(20):
            for i, v in enumerate(values):
                if _codec.pack(v) != expected[i]:
                    wrong.append(i)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False,
                                                                       allow_infinity=False),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20,
))
@settings(max_examples=200, deadline=None)
def test_canonical_json_is_what_json_dumps_makes(value: Any) -> None:
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    assert _codec.canonical_json(value) == text.encode("utf-8")
