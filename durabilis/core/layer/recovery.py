"""Recovery of orphaned claims: the in-flight index, the birth index, parking."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from durabilis import _codec
from durabilis._keys import bucket_tag
from durabilis._scripts import Replies, ScriptCall
from durabilis.core import logsink
from durabilis.core.dlq import DlqStatus, Prepared
from durabilis.core.idempotency import IdempotencyKey
from durabilis.core.layer.base import (
    _REASON_ROOM,
    _WALK,
    _WALK_KEEP_MS,
    _WALK_PER_PASS,
    _missed,
    _not_released,
    _tag,
    dlq_id_for,
)
from durabilis.core.layer.park import _Parking
from durabilis.core.layer.types import WORKER_LOST
from durabilis.core.steps import IO, Plan
from durabilis.errors import ConfigError, CorruptData, DurabilisError


class _Recovery(_Parking):
    """Recovery: the in-flight index and the birth index walked, orphans parked."""

    # -- crash recovery --

    def recover_plan(self, limit: int) -> Plan[list[str]]:
        """Park every operation whose lease ended (its worker died), at most ``limit``.

        Unfused stores (Cluster) also read a slice of the birth index per pass
        (:meth:`_walk_births`): a claim listed only there is found within a
        cycle of passes (32 on Cluster), fleet-wide."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError("limit", f"must be an integer >= 1, got {limit!r}")
        parked: list[str] = []
        seen = 0
        while seen < limit:
            batch = min(limit - seen, 100)
            replies = yield IO([ScriptCall("layer_orphans", [self._index], [batch])])
            members = list(replies[0] or ())
            for raw in members:
                seen += 1
                dlq_id = yield from self._recover_one(raw, self._index)
                if dlq_id is not None:
                    parked.append(dlq_id)
            if len(members) < batch:
                break
        if seen < limit:
            yield from self._walk_births(limit - seen, parked)
        return parked

    def _walk_births(self, room: int, parked: list[str]) -> Plan[None]:
        """Recovery's look at the birth index (unfused stores), at most ``room`` entries."""
        # Unfused stores: then a slice of _WALK_PER_PASS buckets of the birth
        # index, handed out in turn fleet-wide (layer_walk: on Cluster every
        # bucket once in 32 passes), _WALK per wave. An entry found only there
        # is a claim whose worker died before its index entry landed, hence
        # before fn (fn runs only once both are written): it is parked
        # (WORKER_LOST) all the same, to be replayed. The rest are birth
        # entries left by settled claims: dropped, one look each. A bucket
        # whose node does not answer is read again next cycle.
        n = self._buckets
        if not n:
            return
        seen = 0
        span = min(n, _WALK_PER_PASS)
        reply = (yield IO([ScriptCall("layer_walk", [self._walk], [_WALK_KEEP_MS])]))[0]
        start = (_codec.as_int(reply, key=self._walk, field="pass") - 1) * span % n
        buckets = [self._keys.inflight_bucket(bucket_tag((start + i) % n, n))
                   for i in range(span)]
        for first in range(0, len(buckets), _WALK):
            if seen >= room:
                break
            chunk = buckets[first:first + _WALK]
            batch = min(room - seen, 100)
            calls = [ScriptCall("layer_orphans", [b], [batch]) for b in chunk]
            try:
                replies = yield IO(calls, waves=[0] * len(chunk))
            except DurabilisError as exc:
                logsink.SINK.warning("durability_birth_index_unread", buckets=len(chunk),
                                     error=f"{type(exc).__name__}: {exc}")
                replies = exc.partial or Replies([None] * len(chunk), "?" * len(chunk))
            for i, index in enumerate(chunk):
                if replies.status[i] != "c":
                    continue
                for raw in list(replies[i] or ())[:max(0, room - seen)]:
                    seen += 1
                    dlq_id = yield from self._recover_one(raw, index)
                    if dlq_id is not None:
                        parked.append(dlq_id)

    def _entry_note(
        self, index: str, mode: str, members: Sequence[str | bytes], *, at: int | None = None,
        **counts: int,
    ) -> list[ScriptCall]:
        """A note on the entry recovery found in ``index`` (the in-flight index or a
        birth-index bucket, whose notes carry no counts: they go by the batch)."""
        if index == self._index:
            return [self._found_note(mode, members, at=at, **counts)]
        return [self._birth(mode, index, members, at=at)]

    def _recover_one(self, raw: Any, index: str) -> Plan[str | None]:
        try:
            member = _codec.as_text(raw, key=index, field="member")
        except CorruptData:
            member = ""
        key, sep, nonce = member.rpartition("|")
        if not sep or not key or not nonce:  # foreign data in the index: drop it
            logsink.SINK.error("durability_orphan_index_corrupt", member=repr(raw)[:200])
            yield IO(self._entry_note(index, "rem", [raw]))
            return None
        rkey = self._keys.idem(key)
        reply = (yield IO([self._idem.reclaim(key, self._lease_ms, nonce)]))[0]
        tag = _tag(reply)
        if tag != "reclaimed":
            why = _codec.as_text(reply[1], key=rkey, field="reason") if tag == "skip" else "?"
            if why == "alive":  # its lease was renewed: look again when it ends
                at = _codec.as_int(reply[2], key=rkey, field="le")
                yield IO(self._entry_note(index, "at", [member], at=at))
                return None
            if why == "corrupt":
                logsink.SINK.error("durability_orphan_record_corrupt", idempotency_key=key)
            yield IO(self._entry_note(index, "rem", [member]))
            return None
        token = _codec.as_text(reply[1], key=rkey, field="tok")
        env: dict[str, Any] = {}
        try:
            unpacked = _codec.unpack(reply[2], key=rkey) if reply[2] else {}
            if not isinstance(unpacked, dict):
                raise CorruptData(rkey, "the claim's payload is not a mapping")
            env = unpacked
        except CorruptData:
            # Parked without it, saying why: a replay must never run fn with a
            # payload it made up (None, under the original key).
            logsink.SINK.exception("durability_orphan_payload_unreadable", idempotency_key=key)
            if len(reply) > 5 and reply[5]:  # kept apart from it: the parked record's
                # fingerprint, so the operation's later parkings fill that record in
                with contextlib.suppress(CorruptData):
                    env = {"fingerprint": _codec.as_text(reply[5], key=rkey, field="fp")}
        return (yield from self._park_orphan(key, nonce, token, member, env, index))

    def _park_orphan(  # noqa: PLR0917  (what recovery found, one by one)
        self, key: str, nonce: str, token: str, member: str, env: Mapping[str, Any],
        index: str,
    ) -> Plan[str | None]:
        """Park a reclaimed orphan and release its claim, as one step."""
        prepared = self._prepare_orphan(key, env)
        calls = [
            self._dlq.enqueue_prepared(
                prepared, 0, WORKER_LOST, dlq_id=dlq_id_for(key, nonce),
                metadata={"reason": WORKER_LOST, "claim": nonce},
                merge_key=self._merge_key(key),
            ),
            # (touched: a later delivery is told the dead worker may have had its effect)
            self._idem.release(IdempotencyKey(key), token, hold_ms=self._dlq.hold_ms(),
                               touched=True),
            *self._entry_note(index, "rem", [member], recovered=1, parkings=1),
        ]
        # The release is gated: if the claim is no longer the one reclaimed (its
        # worker came back and recorded the outcome by its nonce, or another
        # process took it over), nothing is parked. Standalone: one atomic step,
        # the enqueue is not written either. Cluster: the enqueue ran first (a
        # crash between the two leaves the claim, and recovery parks again under
        # the same parking id); a record it created is finished when the
        # operation completed. The enqueue is gated too: the operation's record
        # may be another than expected ("miss": sent again naming it).
        for _ in range(3):
            out = yield IO(calls, {0: _missed, 1: _not_released})
            again = self._dlq.enqueue_again(calls[0], out[0]) if out.status[0] == "r" else None
            if again is None:
                break
            calls[0] = again
        else:
            return None  # the key's record keeps moving: the next recovery pass parks it
        if out.status[1] == "r":
            if out.status[0] == "c":
                made = self._dlq.decode_enqueue(calls[0], out[0])
                state = (yield IO([self._idem.check(IdempotencyKey(key))]))[0]
                dup = self._idem.decode_check(IdempotencyKey(key), state)
                if made.created and dup is not None and not dup.in_progress:
                    yield IO([self._dlq.finish(made.dlq_id, DlqStatus.REPLAYED, by="its worker")])
            yield IO(self._entry_note(index, "rem", [member]))
            return None
        made = self._dlq.decode_enqueue(calls[0], out[0])
        dlq_id: str = made.dlq_id
        parked = {"parked": 1} if made.new_record else {}  # an operation, not a re-parking
        if index != self._index:  # (a bucket's note carries no counts)
            self._leave([], {"recovered": 1, "parkings": 1, **parked})
        elif parked:
            self._leave([], parked)
        logsink.SINK.warning(
            "durability_orphan_recovered", idempotency_key=key, dlq_id=dlq_id,
            operation_type=prepared.operation_type, agent_id=prepared.agent_id,
        )
        return dlq_id

    def _prepare_orphan(self, key: str, env: Mapping[str, Any]) -> Prepared:
        """The DLQ record of an orphan; never raises (recovery must reach every orphan).

        An orphan whose envelope holds no payload (unreadable, or not a
        durabilis envelope) is parked without one, saying why, like one whose
        payload cannot be parked: its replay is refused, never run with a
        payload of ``None`` under the original key.
        """
        agent = str(env.get("agent_id") or "unknown")
        op = str(env.get("operation_type") or "unknown")
        missing = None if "payload" in env else "CorruptData"
        if missing is None:
            meta = self._metadata(
                key, *(str(env[f]) if env.get(f) else None
                       for f in ("dependency", "task_id", "phase", "fingerprint"))
            )
            try:
                prepared: Prepared = self._dlq.prepare(
                    agent, op, env.get("payload"), meta, spare_bytes=_REASON_ROOM
                )
                return prepared
            except DurabilisError as exc:
                # Written by an older config or another version: park it
                # anyway, saying why its payload is missing.
                logsink.SINK.error("durability_orphan_payload_not_parkable", idempotency_key=key,
                                   error=f"{type(exc).__name__}: {exc}")
                missing = type(exc).__name__
        note = {"idempotency_key": key, "payload_error": missing}
        if env.get("fingerprint"):
            note["fingerprint"] = str(env["fingerprint"])
        try:
            fallback: Prepared = self._dlq.prepare(agent, op, None, note)
        except DurabilisError:
            fallback = self._dlq.prepare("unknown", "unknown", None, note)
        return fallback
