"""Request building and keys: every check before any I/O (:meth:`_Requests.request`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from durabilis import _codec
from durabilis._keys import bucket_tag, hash_slot
from durabilis._scripts import ScriptCall
from durabilis.core.checkpoint import part
from durabilis.core.dlq import Prepared
from durabilis.core.idempotency import IdempotencyKey, content_digest
from durabilis.core.layer.base import _KNOWN_PAIRS, _REASON_ROOM, _Base, _Request
from durabilis.core.retry import MAX_DEADLINE_MS
from durabilis.errors import ConfigError, DurabilisError


def _size(text: str) -> int:
    """``text``'s bytes in UTF-8 (a lone surrogate as ``?``, as ``_park_room`` counts)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


class _Requests(_Base):
    """Request building: every check before any I/O, the keys, the notes' calls."""

    # -- request building: every check before any I/O --

    def request(  # noqa: PLR0912  (every check, in the order a caller meets them)
        self,
        agent_id: str,
        operation_type: str,
        payload: Any,
        *,
        dependency: str | None,
        idempotency_key: IdempotencyKey | str | None,
        task_id: str | None,
        phase: str | None,
        wait: float | None,
        park_on_open: bool,
        deadline_seconds: float | None,
        replay: bool = False,
    ) -> _Request:
        """Validate and encode an operation (no I/O).

        Raises:
            InvalidKey: A key part empty, over a cap of a pillar that stores it,
                or not valid text.
            InvalidPayload, PayloadTooLarge: The payload cannot be kept with the
                claim or parked in the DLQ, in the encoding each uses.
            DependencyNotFound: No breaker of that name.
            ConfigError: ``task_id`` without ``phase`` (or the reverse), a bad
                ``wait`` / ``deadline_seconds``.
        """
        # The key parts of a pair seen before (both exactly str) were checked
        # and escaped then: what they give is reused (see _remember).
        pair = (agent_id, operation_type)
        known = (self._known.get(pair) if type(agent_id) is str and type(operation_type) is str
                 else None)
        if (known is not None and idempotency_key is None and task_id is None and phase is None
                and wait is None and deadline_seconds is None and not replay
                and not self._previous_secrets):
            return self._common_request(
                agent_id, operation_type, payload, known, dependency, park_on_open
            )
        if idempotency_key is None and known is not None:
            key = IdempotencyKey(known + content_digest(payload, self._key_secret))
        else:
            if idempotency_key is None:
                made = IdempotencyKey.new(agent_id, operation_type, payload,
                                          secret=self._key_secret)
            elif replay:  # the key as stored (a caller key already scoped)
                made = (idempotency_key if isinstance(idempotency_key, IdempotencyKey)
                        else IdempotencyKey(idempotency_key))
            else:  # a caller's key: scoped to its agent, bound to the payload
                made = IdempotencyKey.caller(agent_id, idempotency_key, payload)
            key = self._idem.validate_key(made)
        dep = dependency if dependency is not None else self.config.dependencies.get(
            operation_type
        )
        if dep is not None:
            self._breakers.ops.entry(dep)  # DependencyNotFound before any I/O
        if (task_id is None) != (phase is None):
            raise ConfigError("phase", "task_id and phase go together")
        if task_id is not None and phase is not None:
            part("task_id", task_id)
            part("phase", phase)
            part("agent_id", agent_id)
        for name, seconds in (("wait", wait), ("deadline_seconds", deadline_seconds)):
            if seconds is not None and (
                isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                or not 0 <= seconds < float("inf") or (name == "deadline_seconds" and not seconds)
            ):
                raise ConfigError(name, f"must be a finite number of seconds, got {seconds!r}")
        if deadline_seconds is not None and deadline_seconds > MAX_DEADLINE_MS / 1000:
            raise ConfigError(  # holding a claim while retrying is bounded (durabilis._limits)
                "deadline_seconds",
                f"must be at most {MAX_DEADLINE_MS // 1000} (one day), got {deadline_seconds!r}",
            )
        envelope = bytes(self._idem.pack_value(
            {
                "agent_id": agent_id,
                "operation_type": operation_type,
                "payload": payload,
                "dependency": dep,
                "task_id": task_id,
                "phase": phase,
                # A caller key's own fingerprint: recovery parks the operation with
                # it, so a replay claims the key exactly as the caller did.
                "fingerprint": key.fingerprint,
            },
            "payload",
        ))
        # The DLQ record of a failure is built only when the operation is parked
        # (from the envelope: the payload as it was before fn ran). Checked here
        # is that it can be: its names (once per pair), and its size. The record
        # keeps the payload as JSON text, or as msgpack when that is smaller or
        # the JSON does not fit: never more bytes than the payload's msgpack,
        # which the envelope holds. So an envelope that fits the record's room
        # needs nothing more; a larger one is prepared now (it may not fit).
        if known is None:
            self._dlq.name("agent_id", agent_id)
            self._dlq.name("operation_type", operation_type)
        meta = self._metadata(key.value, dep, task_id, phase, key.fingerprint)
        park = None
        if len(envelope) > self._park_room(meta):
            park = self._dlq.prepare(
                agent_id, operation_type, payload, meta, spare_bytes=_REASON_ROOM
            )
        aliases = self._aliases(
            agent_id, operation_type, payload, key, idempotency_key, replay
        ) if replay or self._previous_secrets else ()
        if known is None and idempotency_key is None:
            self._remember(pair, key)
        return _Request(
            agent_id, operation_type, payload, key, dep, task_id, phase, wait,
            park_on_open, deadline_seconds, replay, envelope, park, aliases=aliases,
        )

    def _common_request(  # noqa: PLR0917  (request's arguments, as they came)
        self, agent_id: str, operation_type: str, payload: Any, known: str,
        dependency: str | None, park_on_open: bool,
    ) -> _Request:
        """:meth:`request` in its common case (a content key of a pair seen
        before; no task, ``wait``, deadline or replay; no previous key secret):
        the same checks and encodings, without those of the options not given
        (tests/unit/test_layer_requests.py: the two give equal requests)."""
        key = IdempotencyKey(known + content_digest(payload, self._key_secret))
        dep = dependency if dependency is not None else self.config.dependencies.get(
            operation_type
        )
        if dep is not None:
            self._breakers.ops.entry(dep)  # DependencyNotFound before any I/O
        envelope = bytes(self._idem.pack_value(
            {
                "agent_id": agent_id, "operation_type": operation_type, "payload": payload,
                "dependency": dep, "task_id": None, "phase": None, "fingerprint": None,
            },
            "payload",
        ))
        # The DLQ record's room (see request): its metadata are the key and the
        # dependency (a content key has no fingerprint), sized as _park_room does.
        room = int(self._dlq.config.max_payload_bytes) - _REASON_ROOM - 15 - _size(key.value)
        if dep:
            room -= 10 + _size(dep)
        park = None
        if len(envelope) > room:
            park = self._dlq.prepare(
                agent_id, operation_type, payload, self._metadata(key.value, dep, None, None),
                spare_bytes=_REASON_ROOM,
            )
        return _Request(
            agent_id, operation_type, payload, key, dep, None, None, None, park_on_open, None,
            False, envelope, park,
        )

    def _remember(self, pair: tuple[str, str], key: IdempotencyKey) -> None:
        """Keep what a pair's checked key parts give (``<agent>:<operation>:``,
        escaped): a later request of the pair checks and escapes nothing again.
        What the checks depend on is the pair and the frozen config only (a
        content key's length is its parts' plus 32). Bounded: past
        ``_KNOWN_PAIRS`` pairs, the oldest is forgotten."""
        if type(pair[0]) is not str or type(pair[1]) is not str:
            return
        known = self._known
        if len(known) >= _KNOWN_PAIRS:
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                del known[next(iter(known))]
        known[pair] = key.value[:-32]

    def _park_room(self, meta: Mapping[str, str]) -> int:
        """The bytes a DLQ record has for its payload, with these metadata."""
        size = _REASON_ROOM
        for name, value in meta.items():
            size += len(name.encode("utf-8", "replace")) + len(value.encode("utf-8", "replace"))
        return int(self._dlq.config.max_payload_bytes) - size

    def _park_record(self, req: _Request) -> Prepared:
        """The DLQ record of ``req``'s failure, built now (see :meth:`request`)."""
        if req.park is not None:
            return req.park
        meta = self._metadata(req.key.value, req.dependency, req.task_id, req.phase,
                              req.key.fingerprint)
        try:  # the payload as it was claimed (fn may have changed the object since)
            payload = _codec.unpack(req.envelope, key=req.key.value)["payload"]
        except (DurabilisError, KeyError, TypeError):  # (never: the layer's own envelope)
            payload = req.payload
        prepared: Prepared = self._dlq.prepare(
            req.agent_id, req.operation_type, payload, meta, spare_bytes=_REASON_ROOM
        )
        return prepared

    def _aliases(  # noqa: PLR0917  (the request's parts, one by one)
        self, agent_id: str, operation_type: str, payload: Any, key: IdempotencyKey,
        given: IdempotencyKey | str | None, replay: bool,
    ) -> tuple[IdempotencyKey, ...]:
        """The operation's content key under the other secrets configured (no I/O).

        Only content keys have aliases (a caller's key does not depend on the
        secret). A delivery's key is the current secret's: its aliases are the
        previous secrets' keys, and without previous secrets there are none
        (nothing derived, nothing read: the steady state's cost). A replay's key
        is the one its record was parked under: its aliases are the current
        secret's key and the previous ones', so that the replay of a record
        parked under an old secret sees the operation completed under the new
        one (derived from the record's agent, operation type and payload).
        """
        if not self.config.idempotency.enabled or key.is_caller_key:
            return ()
        if replay:
            secrets: tuple[str | None, ...] = (self._key_secret, *self._previous_secrets)
        elif given is None and self._previous_secrets:
            secrets = self._previous_secrets
        else:
            return ()
        out: dict[str, IdempotencyKey] = {}
        for secret in secrets:
            try:
                alias = IdempotencyKey.new(agent_id, operation_type, payload, secret=secret)
            except DurabilisError:  # a payload no content key is made of: no alias
                return ()
            # (a replay's stored key that is not a content key of this operation,
            # a record parked by hand, has no alias)
            if alias.value.rpartition(":")[0] != key.value.rpartition(":")[0]:
                return ()
            if alias.value != key.value:
                out[alias.value] = self._idem.validate_key(alias)
        return tuple(out.values())

    @staticmethod
    def _metadata(
        key: str, dependency: str | None, task_id: str | None, phase: str | None,
        fingerprint: str | None = None,
    ) -> dict[str, str]:
        meta = {"idempotency_key": key}
        for name, value in (("dependency", dependency), ("task_id", task_id), ("phase", phase),
                            ("fingerprint", fingerprint)):
            if value:
                meta[name] = value
        return meta

    # -- small call builders --

    def member(self, key: str, nonce: str) -> str:
        return f"{key}|{nonce}"

    def _note(
        self, mode: str, members: Sequence[str | bytes] = (), *, at: int | None = None,
        **counts: int,
    ) -> ScriptCall:
        """A note on the in-flight index (and its counters). On Cluster, an
        owner's removal (``rem``, ``leave``) marks its members settled, and the
        keep-alive's put-back (``back``) adds none of those again."""
        return self._index_note(mode, members, at, counts, settles=True)

    def _found_note(
        self, mode: str, members: Sequence[str | bytes] = (), *, at: int | None = None,
        **counts: int,
    ) -> ScriptCall:
        """Recovery's note on an entry it found: its removals mark nothing (it
        drops entries it found no live claim for, which a put-back restores)."""
        return self._index_note(mode, members, at, counts, settles=False)

    def _index_note(
        self, mode: str, members: Sequence[str | bytes], at: int | None,
        counts: Mapping[str, int], *, settles: bool,
    ) -> ScriptCall:
        args: list[Any] = [mode, self._lease_ms if at is None else at, len(members), *members]
        for name, n in counts.items():
            if n:
                args += [name, n]
        keys = [self._index, self._stats]
        if not self.fuses and members and (
            mode == "back" or (settles and mode in ("rem", "leave"))
        ):
            keys.append(self._settled)
        return ScriptCall("layer_note", keys, args)

    def _bucket(self, key: str) -> str:
        """The birth-index bucket of ``key``'s claims (its hash slot's, on Cluster)."""
        n = self._buckets
        return self._keys.inflight_bucket(bucket_tag(hash_slot(self._keys.idem(key)) % n, n))

    def _birth(
        self, mode: str, index: str, members: Sequence[str | bytes], *, at: int | None = None
    ) -> ScriptCall:
        """A note on one birth-index bucket: entries only, never counts (the
        counters live in another slot)."""
        args: list[Any] = [mode, self._lease_ms if at is None else at, len(members), *members]
        return ScriptCall("layer_note", [index, index], args)

    def _birth_gone(self, key: str, nonce: str) -> ScriptCall:
        """The removal of the birth entry of ``key``'s claim ``nonce``."""
        return self._birth("rem", self._bucket(key), [self.member(key, nonce)])

    def _merge_key(self, key: str) -> str | None:
        """Parkings of one operation share a DLQ record (when operations have keys)."""
        return key if self.config.idempotency.enabled else None
