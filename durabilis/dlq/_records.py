"""Records, their encodings and the replies' decoding helpers: moved to
:mod:`durabilis.core.dlq.records` (re-exported here).

Kept so that imports of this module keep working; new code imports the core.
"""

from __future__ import annotations

from durabilis.core.dlq.records import (
    BY_BYTES,
    CLEANUP_BATCHES,
    ID_RE,
    JSON_FIELD,
    KEEP_MS,
    MAX_METADATA_FIELDS,
    META_PREFIX,
    MSGPACK_FIELD,
    PAGE,
    Claimed,
    Enqueued,
    Member,
    Prepared,
    clean,
    corrupt_error,
    default_owner,
    encode_operation,
    field_text,
    flat_to_dict,
    record_id_for,
    reply_tag,
    sort_key,
    stream_id_of,
    truncate,
)

__all__ = [
    "BY_BYTES",
    "CLEANUP_BATCHES",
    "ID_RE",
    "JSON_FIELD",
    "KEEP_MS",
    "MAX_METADATA_FIELDS",
    "META_PREFIX",
    "MSGPACK_FIELD",
    "PAGE",
    "Claimed",
    "Enqueued",
    "Member",
    "Prepared",
    "clean",
    "corrupt_error",
    "default_owner",
    "encode_operation",
    "field_text",
    "flat_to_dict",
    "record_id_for",
    "reply_tag",
    "sort_key",
    "stream_id_of",
    "truncate",
]
