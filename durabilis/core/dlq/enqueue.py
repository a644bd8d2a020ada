"""Parking a record: checked and encoded ahead, the enqueue call and its reply (no I/O).

Events go to ``self.log`` (the shells hand in the package's logger)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from durabilis import _codec
from durabilis._scripts import ScriptCall
from durabilis.core.dlq.base import OpsBase
from durabilis.core.dlq.plan import Plan
from durabilis.core.dlq.records import (
    ID_RE,
    MAX_METADATA_FIELDS,
    META_PREFIX,
    Enqueued,
    Prepared,
    clean,
    corrupt_error,
    encode_operation,
    field_text,
    record_id_for,
    reply_tag,
    truncate,
)
from durabilis.errors import (
    CorruptData,
    DurabilisError,
    InvalidKey,
    InvalidPayload,
    PayloadTooLarge,
)

MISS_ROUNDS = 3
"""Sends of one enqueue at most (each ``"miss"`` names the record to send to)."""


class EnqueueOps(OpsBase):
    """Parking a record: checked and encoded, then the enqueue call and its reply (no I/O)."""

    __slots__ = ()

    # enqueue ---------------------------------------------------------------

    def prepare(
        self,
        agent_id: str,
        operation_type: str,
        original_operation: Any,
        metadata: Mapping[str, str] | None = None,
        *,
        spare_bytes: int = 0,
    ) -> Prepared:
        """Check and encode what a later :meth:`enqueue_prepared` parks (no I/O).

        The composed layer prepares its DLQ record BEFORE it claims an
        operation, so a failure can always be parked (check before the effect).

        Args:
            spare_bytes: Room kept under ``max_payload_bytes`` for metadata
                added at enqueue time.

        Raises:
            InvalidKey: Empty/over-long/NUL ``agent_id`` or ``operation_type``.
            InvalidPayload: Metadata not str -> str, too many metadata fields, or
                an operation msgpack cannot encode.
            PayloadTooLarge: The encoded operation plus metadata is over
                ``max_payload_bytes``.
        """
        self.name("agent_id", agent_id)
        self.name("operation_type", operation_type)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise InvalidPayload(f"metadata must be a mapping, got {type(metadata).__name__}")
        if metadata is not None and len(metadata) > MAX_METADATA_FIELDS:
            raise InvalidPayload(
                f"metadata has {len(metadata)} fields, over the limit of {MAX_METADATA_FIELDS}"
            )
        meta: list[str] = []
        size = spare_bytes
        for key, value in (metadata or {}).items():
            if not isinstance(key, str) or not key or not isinstance(value, str):
                raise InvalidPayload(
                    f"metadata must map non-empty str to str, got {key!r}: {type(value).__name__}"
                )
            meta += [META_PREFIX + clean(key), clean(value)]
            size += len(key.encode("utf-8", "replace")) + len(value.encode("utf-8", "replace"))
        payload_field, payload = encode_operation(
            original_operation, self.config.max_payload_bytes - size
        )
        size += len(payload)
        if size > self.config.max_payload_bytes:
            raise PayloadTooLarge("original_operation", size, self.config.max_payload_bytes)
        return Prepared(agent_id, operation_type, payload_field, payload, tuple(meta))

    def room(self, prepared: Prepared, metadata: Mapping[str, str]) -> int:
        """The bytes ``prepared``'s record has left under ``max_payload_bytes``
        with ``metadata`` added at enqueue (counted as :meth:`prepare` counts:
        the payload, each metadata name and value); negative: over."""
        size = len(prepared.payload)
        fields = prepared.metadata
        for name, value in zip(fields[::2], fields[1::2], strict=True):
            size += len(name.encode("utf-8", "replace")) - len(META_PREFIX)
            size += len(value.encode("utf-8", "replace"))
        for name, value in metadata.items():
            size += len(name.encode("utf-8", "replace")) + len(value.encode("utf-8", "replace"))
        return int(self.config.max_payload_bytes) - size

    def enqueue_prepared(
        self,
        prepared: Prepared,
        retry_count: int,
        last_error: str,
        *,
        dlq_id: str,
        ttl_seconds: float | None = None,
        metadata: Mapping[str, str] | None = None,
        merge_key: str | None = None,
        candidate: str | None = None,
    ) -> ScriptCall:
        """The enqueue call of a prepared record (never raises for its content:
        the error text is truncated, ``metadata`` here is small and trusted).

        With ``merge_key`` (the operation's idempotency key), a parking of an
        operation whose record is pending lands in that record (one record per
        operation); ``dlq_id`` names this parking, and a new record takes the id
        ``candidate`` (by default :func:`record_id_for`) or, when that id is taken
        by an older record of the key, ``dlq_id``. A reply ``"miss"`` (the key's
        record is another) is sent again with :meth:`enqueue_again`.
        """
        meta = list(prepared.metadata)
        for key, value in (metadata or {}).items():
            meta += [META_PREFIX + clean(key), clean(value)]
        mkey = merge_key or ""
        cand = (candidate or record_id_for(mkey)) if mkey else dlq_id
        return ScriptCall(
            "dlq_enqueue",
            [
                self.stream_key,
                *self.status_keys(dlq_id),
                self.record_key(cand),  # keys[7]: see enqueue_again
                self.log_key,
                self.requeue_key,
            ],
            [
                dlq_id,
                self.ttl_ms(ttl_seconds),
                self.config.purge_per_enqueue,
                prepared.agent_id,
                prepared.operation_type,
                str(max(0, int(retry_count))),
                truncate(clean(last_error), self.config.max_error_bytes),
                prepared.payload_field,
                prepared.payload,
                mkey,
                cand,
                self.config.max_pending if self.config.keep_pending else 0,
                *meta,
            ],
        )

    def enqueue_again(self, call: ScriptCall, reply: Any) -> ScriptCall | None:
        """After a ``"miss"`` reply: the same enqueue, naming the record the key's
        entry names; ``None`` for any other reply."""
        if reply_tag(reply, str(call.keys[5])) != "miss":
            return None
        cand = field_text(reply[1], self.bykey_key, "dlq_id")
        keys = list(call.keys)
        keys[7] = self.record_key(cand)
        args = list(call.args)
        args[10] = cand
        return ScriptCall(call.name, keys, args)

    def enqueue(  # noqa: PLR0917  (the seed's signature, the shells' arguments)
        self, agent_id: str, operation_type: str, original_operation: Any, retry_count: int,
        last_error: str | None, ttl_seconds: float | None = None, *,
        metadata: Mapping[str, str] | None = None, dlq_id: str | None = None,
    ) -> ScriptCall:
        """The enqueue call; every input is checked here, before any I/O.

        Raises:
            InvalidKey: Empty/over-long/NUL ``agent_id`` or ``operation_type``,
                or a malformed caller-chosen ``dlq_id``.
            InvalidPayload: ``retry_count`` not an int >= 0, ``last_error`` not
                text, metadata not str -> str (or more than
                ``MAX_METADATA_FIELDS`` fields), or an operation msgpack cannot encode.
            PayloadTooLarge: The encoded operation plus metadata is over
                ``max_payload_bytes``.
            InvalidTtl: ``ttl_seconds`` <= 0.
        """
        prepared = self.prepare(agent_id, operation_type, original_operation, metadata)
        if not isinstance(retry_count, int) or isinstance(retry_count, bool) or retry_count < 0:
            raise InvalidPayload(f"retry_count must be an integer >= 0, got {retry_count!r}")
        if last_error is None:
            last_error = ""
        if not isinstance(last_error, str):
            raise InvalidPayload(f"last_error must be a string, got {type(last_error).__name__}")
        if dlq_id is None:
            dlq_id = uuid.uuid4().hex
        elif not isinstance(dlq_id, str) or not ID_RE.fullmatch(dlq_id):
            raise InvalidKey(str(dlq_id), "a dlq_id must be 1-200 chars of [A-Za-z0-9_.:%-]")
        self.ttl_ms(ttl_seconds)
        return self.enqueue_prepared(
            prepared, retry_count, last_error, dlq_id=dlq_id, ttl_seconds=ttl_seconds
        )

    def enqueue_plan(self, call: ScriptCall) -> Plan[Enqueued]:
        """Send an enqueue until it lands: after a ``"miss"`` (the merge key's
        entry names another record) once more naming that record, at most
        ``MISS_ROUNDS`` sends in all; then decode the reply.

        Raises:
            DurabilisError: The key's record changed under every send (other
                writers parking and settling it meanwhile); nothing was written.
            CorruptData: A key holds what durabilis did not write.
        """
        for _ in range(MISS_ROUNDS):
            reply = yield call
            again = self.enqueue_again(call, reply)
            if again is None:
                return self.decode_enqueue(call, reply)
            call = again
        raise DurabilisError("DLQ enqueue: the operation's record kept changing; try again")

    def decode_enqueue(self, call: ScriptCall, reply: Any) -> Enqueued:
        """Decode the enqueue reply (logs the events); a ``"miss"`` is not decoded
        here (see :meth:`enqueue_again`)."""
        parking = str(call.args[0])
        key = str(call.keys[5])
        tag = reply_tag(reply, key)
        if tag == "exists":
            sid = field_text(reply[1], key, "sid")
            dlq_id = field_text(reply[2], key, "dlq_id") if len(reply) > 2 else parking
            made = len(reply) > 3 and _codec.as_int(reply[3], key=key, field="made") == 1
            self.log.info("durability_dlq_enqueue_existing", dlq_id=dlq_id, stream_id=sid)
            return Enqueued(dlq_id, created=False, stream_id=sid, made_here=made)
        if tag == "merged":
            sid = field_text(reply[1], key, "sid")
            dlq_id = field_text(reply[2], key, "dlq_id")
            parkings = _codec.as_int(reply[3], key=key, field="pk")
            self.log.info(
                "durability_dlq_parked_again", dlq_id=dlq_id, operation_type=str(call.args[4]),
                agent_id=str(call.args[3]), parkings=parkings,
            )
            return Enqueued(dlq_id, created=False, stream_id=sid, merged=True)
        if tag != "ok":
            raise corrupt_error(reply, key)
        sid = field_text(reply[1], key, "sid")
        pending = _codec.as_int(reply[4], key=key, field="pending")
        dlq_id = field_text(reply[5], key, "dlq_id")
        kept = len(reply) > 6 and _codec.as_int(reply[6], key=key, field="kept") == 1
        if len(reply) > 7:
            self.report_expired(reply[7], key)
        operation_type = str(call.args[4])
        self.log.info(
            "durability_dlq_enqueued",
            dlq_id=dlq_id,
            agent_id=str(call.args[3]),
            operation_type=operation_type,
            retry_count=int(str(call.args[5])),
        )
        keeping = self.config.keep_pending
        if pending > self.config.max_pending or (keeping and not kept):
            # Nothing is dropped (peers drop the oldest); the operator is told.
            # With keep_pending, a record over max_pending is not kept: it
            # expires (reported) after its TTL, so memory stays bounded.
            self.log.warning(
                "durability_dlq_max_pending_exceeded",
                dlq_id=dlq_id,
                operation_type=operation_type,
                pending=pending,
                max_pending=self.config.max_pending,
                **({"kept": kept} if keeping else {}),
            )
        return Enqueued(dlq_id, created=True, stream_id=sid, pending=pending)

    def report_expired(self, flat: Any, key: str) -> list[tuple[str, str, str]]:
        """Log ``durability_dlq_expired`` for each pending record a script reported
        expired (flat dlq_id, operation type, idempotency key, agent_id); returns
        (dlq_id, operation type, idempotency key) per record."""
        items = list(flat or ())
        if len(items) % 4:
            raise CorruptData(key, f"unexpected expired-record list {items!r}"[:300])
        out = []
        for i in range(0, len(items), 4):
            dlq_id, op, ik, agent = (field_text(v, key, "expired") for v in items[i:i + 4])
            self.log.warning(
                "durability_dlq_expired", dlq_id=dlq_id, operation_type=op,
                idempotency_key=ik or None, agent_id=agent or None,
            )
            out.append((dlq_id, op, ik))
        return out
