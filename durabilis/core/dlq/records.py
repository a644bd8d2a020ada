"""The record codec: ids, stream ids and their index form, the operation's
encoding, reply helpers, and what the call builders hand each other."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from durabilis import _codec
from durabilis.core.dlq.types import DlqRecord
from durabilis.errors import (
    ConfigError,
    CorruptData,
    InvalidKey,
)

PAGE = 100
JSON_FIELD = "original_operation"
MSGPACK_FIELD = "original_operation_msgpack"
META_PREFIX = "meta:"
MAX_METADATA_FIELDS = 1000
"""Most metadata fields a record may carry (each is a field of its stream entry)."""
# Caller-chosen ids end up inside index members separated by "|": keep them plain.
ID_RE = re.compile(r"^[A-Za-z0-9_.:%\-]{1,200}$")
_SID_RE = re.compile(r"^(\d{1,20})-(\d{1,20})$")


def expected_args(
    dlq_ids: Sequence[str], expected: Mapping[str, tuple[str, int]] | None
) -> list[str]:
    """The ids as ``dlq_purge`` / ``dlq_requeue`` take them: ``"<dlq_id> <stream id>
    <parkings>"`` for an id in ``expected`` (acted on only while the record is
    that one), the bare id otherwise.

    Raises:
        ConfigError: An expectation that is not (stream id, parking count >= 1).
    """
    if not expected:
        return list(dlq_ids)
    out = []
    for dlq_id in dlq_ids:
        seen = expected.get(dlq_id)
        if seen is None:
            out.append(dlq_id)
            continue
        if (not isinstance(seen, tuple) or len(seen) != 2 or not isinstance(seen[0], str)
                or _SID_RE.fullmatch(seen[0]) is None or not isinstance(seen[1], int)
                or isinstance(seen[1], bool) or seen[1] < 1):
            raise ConfigError("expected", f"{dlq_id}: must be (stream_id, parkings >= 1), "
                              f"got {seen!r}")
        out.append(f"{dlq_id} {seen[0]} {seen[1]}")
    return out


def record_id_for(merge_key: str) -> str:
    """The id of an operation's first DLQ record, derived from its idempotency key
    (every replica parking the operation names the same record)."""
    return hashlib.sha256(f"dlq\x00{merge_key}".encode()).hexdigest()[:32]


def sort_key(stream_id: str) -> str:
    """The index form of a stream id whose byte order is the enqueue order.

    ``"1700000000000-12"`` -> ``"001700000000000-b12"``: milliseconds padded to
    15 digits, the sequence prefixed by a letter giving its digit count (so
    ``-a9`` < ``-b10``). The Lua scripts compute the same.

    Raises:
        InvalidKey: ``stream_id`` is not a stream entry id.
    """
    match = _SID_RE.fullmatch(stream_id) if isinstance(stream_id, str) else None
    if match is None:
        raise InvalidKey(str(stream_id), "not a stream entry id (<ms>-<seq>)")
    ms, seq = str(int(match[1])), str(int(match[2]))
    return f"{ms.zfill(15)}-{chr(96 + len(seq))}{seq}"


def stream_id_of(key: str) -> str:
    """The stream id a :func:`sort_key` was made of (``""`` when ``key`` is not one)."""
    ms, sep, rest = key.partition("-")
    if not sep or not ms.isdigit() or len(rest) < 2 or not rest[1:].isdigit():
        return ""
    return f"{int(ms)}-{int(rest[1:])}"


KEEP_MS = 253402300799999
"""The expiry of a pending record kept by ``DlqConfig.keep_pending``: never
(9999-12-31T23:59:59.999Z; the scripts use the same number)."""

CLEANUP_BATCHES = 20
"""Most cleanup batches (scripts) one :meth:`DeadLetterQueue.cleanup_due` runs:
the rest waits for the next period (bounded work per period)."""

BY_BYTES = 256
"""The longest ``replayed_by`` / ``by`` name kept on a record (bytes)."""


def clean(text: str) -> str:
    """``text`` with lone surrogates (from badly decoded bytes) replaced by ``?``.

    Text written down for a failed operation must never make its enqueue fail.
    """
    return text.encode("utf-8", errors="replace").decode("utf-8")


def truncate(text: str, limit: int) -> str:
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return data.decode("utf-8")
    marker = " ...[truncated]"
    return data[: limit - len(marker)].decode("utf-8", errors="ignore") + marker


def encode_operation(value: Any, room: int | None = None) -> tuple[str, bytes]:
    """JSON text when the value survives a JSON round trip unchanged (and fits
    in ``room`` bytes), else msgpack (often smaller: bytes, floats, non-ASCII)."""
    text = _codec.json_text_or_none(value)
    if text is not None:
        try:
            same = bool(json.loads(text) == value)
        except Exception:  # a foreign __eq__ may raise anything
            same = False
        if same:
            try:
                encoded = text.encode("utf-8")
            except UnicodeEncodeError:
                encoded = None  # a lone surrogate: msgpack refuses it too, as InvalidPayload
            if encoded is not None:
                if room is None or len(encoded) <= room:
                    return JSON_FIELD, encoded
                packed = _codec.pack(value, what="original_operation")
                if len(packed) < len(encoded):
                    return MSGPACK_FIELD, packed
                return JSON_FIELD, encoded
    return MSGPACK_FIELD, _codec.pack(value, what="original_operation")


def field_text(value: Any, key: str, name: str) -> str:
    return _codec.as_text(value, key=key, field=name)


def flat_to_dict(flat: Any, key: str) -> dict[str, Any]:
    if isinstance(flat, dict):
        return {field_text(k, key, "field name"): v for k, v in flat.items()}
    if not isinstance(flat, (list, tuple)) or len(flat) % 2:
        raise CorruptData(key, f"expected field/value pairs, got {type(flat).__name__}")
    return {field_text(flat[i], key, "field name"): flat[i + 1] for i in range(0, len(flat), 2)}


reply_tag = _codec.reply_tag
"""A script reply's tag (:func:`durabilis._codec.reply_tag`)."""


def corrupt_error(reply: Any, default_key: str) -> CorruptData:
    """The ``{"corrupt", key, detail}`` reply as an error naming the key."""
    try:
        key = _codec.as_text(reply[1], key=default_key, field="key")
        detail = _codec.as_text(reply[2], key=default_key, field="detail")
    except (IndexError, TypeError, CorruptData):
        return CorruptData(default_key, f"unexpected script reply {reply!r}")
    return CorruptData(key, detail)


class Member(NamedTuple):
    """A pending-index member: ``raw`` (the bytes to continue after) and its parts."""

    raw: bytes
    sort_key: str
    dlq_id: str


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What the enqueue script did (for the composed layer's pipelines)."""

    dlq_id: str
    created: bool
    stream_id: str
    pending: int = 0
    merged: bool = False
    made_here: bool = False  # "exists": this very parking created it (sent again)

    @property
    def new_record(self) -> bool:
        """This parking made a new pending record: an operation parked (the
        layer's ``parked`` counter), not a re-parking."""
        return self.created or self.made_here


@dataclass(frozen=True, slots=True)
class Prepared:
    """A DLQ record checked and encoded ahead of time (``DlqOps.prepare``)."""

    agent_id: str
    operation_type: str
    payload_field: str
    payload: bytes
    metadata: tuple[str, ...]  # field, value, ... (fields already prefixed)


@dataclass(frozen=True, slots=True)
class Claimed:
    token: str
    record: DlqRecord
    taken_over: bool
    until: float = 0.0  # (monotonic) the claim's expiry at the latest (set by the replay)
    via: bytes = b""  # (a requeue pass) the requeue-index entry it was claimed through


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
