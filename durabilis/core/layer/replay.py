"""Replays of parked DLQ records: the request rebuilt from the record, then executed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from durabilis.core.dlq import ANSWERED, DlqRecord, ReplayDeclined
from durabilis.core.dlq.plan import UNSETTLED
from durabilis.core.idempotency import RAW_PREFIX, IdempotencyKey, payload_fingerprint
from durabilis.core.layer.base import _ReplayClaim, _Request
from durabilis.core.layer.lean import _LeanPath
from durabilis.core.layer.types import OperationContext
from durabilis.core.steps import IO, Plan
from durabilis.errors import (
    ConfigError,
    DurabilisError,
    InvalidPayload,
    OperationInProgress,
    OutcomeUnrecorded,
    ResultNotStored,
)


class _Replays(_LeanPath):
    """Replays of parked records: the request rebuilt, run as an execution."""

    # -- replay --

    def replay_request(self, record: DlqRecord, wait: float | None = None) -> _Request:
        meta = record.metadata or {}
        key = meta.get("idempotency_key")
        return self.request(
            record.agent_id,
            record.operation_type,
            record.original_operation,
            dependency=meta.get("dependency") or None,
            idempotency_key=self._stored_key(key, record) if key else None,
            task_id=meta.get("task_id") or None,
            phase=meta.get("phase") or None,
            wait=self._replay_wait(wait),
            park_on_open=False,
            deadline_seconds=None,
            replay=True,
        )

    @staticmethod
    def _stored_key(key: str, record: DlqRecord) -> IdempotencyKey:
        """A parked operation's key, bound again to its payload when a caller gave it."""
        if not key.startswith(RAW_PREFIX):
            return IdempotencyKey(key)
        fp = (record.metadata or {}).get("fingerprint")
        return IdempotencyKey(key, fp or payload_fingerprint(record.original_operation))

    def _replay_wait(self, wait: float | None) -> float:
        """How long a replay waits for the operation in progress elsewhere (a live
        delivery, another replayer): ``None`` is the claim's lease, time enough
        for a live worker to finish or a dead one's lease to end."""
        if wait is None:
            return float(self.config.idempotency.in_progress_ttl_seconds)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0:
            raise ConfigError("wait", f"must be a number of seconds >= 0 or None, got {wait!r}")
        return float(wait)

    def _payloadless_replay(self, record: DlqRecord, missing: str) -> Plan[BaseException | object]:
        """The replay of a record parked without its payload: nothing can run.

        Once its key has completed (a later delivery succeeded, or the
        operation's other record was replayed), the record is settled
        (``ANSWERED``: marked replayed, nothing ran); while the key is in
        progress, the replay is deferred; otherwise it fails, asking for a hand.
        """
        key = (record.metadata or {}).get("idempotency_key")
        if key and self.config.idempotency.enabled:
            try:
                ikey = IdempotencyKey(key)
                dup = self._idem.decode_check(ikey, (yield IO([self._idem.check(ikey)]))[0])
            except DurabilisError as exc:
                return exc
            if dup is not None:
                return OperationInProgress(key) if dup.in_progress else ANSWERED
        return InvalidPayload(
            f"parked without its payload ({missing}): handle it by hand, then "
            "abandon or mark it replayed"
        )

    def replay_plan(
        self, fn: Callable[[OperationContext], Any], wait: float | None = None
    ) -> Callable[[DlqRecord, str], Plan[BaseException | object | None]]:
        """The DLQ replay handler (a plan): the record's operation through the layer."""
        seconds = self._replay_wait(wait)
        # A fn may say which records are its own (``fn.accepts_record(record)``):
        # another's is deferred before its key is claimed (nothing counted).
        accepts = getattr(fn, "accepts_record", None)

        def handle(record: DlqRecord, token: str) -> Plan[BaseException | object | None]:
            if callable(accepts) and not accepts(record):
                return ReplayDeclined(
                    f"not this replayer's record ({getattr(fn, '__qualname__', fn)!r} "
                    "declined it): left for its own")
            missing = (record.metadata or {}).get("payload_error")
            if missing:  # parked by recovery without its payload: nothing to replay
                return (yield from self._payloadless_replay(record, missing))
            claim = _ReplayClaim(record.dlq_id, token, record.trace_context)  # (otel hook: link)
            try:
                request = self.replay_request(record, seconds)
            except DurabilisError as exc:
                # A record this layer cannot turn into a request (a payload no
                # key can be made of, a dependency renamed since, a payload over
                # today's limits): a failed replay, noted on the record and its
                # claim released, never an error that stops a pass at it.
                return exc
            req = dataclasses.replace(request, replay_claim=claim)
            try:
                yield from self.execute_plan(req, fn)
            except OutcomeUnrecorded as exc:
                if not claim.unsettled:  # (failed, foreign data, or fn's own: a failure)
                    return exc
                # It ran and succeeded; its outcome step (finishing the record,
                # fenced by this claim) goes on in the keep-alive: the claim
                # stays, else that finish would be refused (the record left
                # pending once the operation completed).
                return UNSETTLED
            except ResultNotStored:
                # It ran and completed (now or before): recorded as "completed,
                # result not stored". That is the replay's success: a record left
                # pending would run it again once the dedup window is over.
                return claim.answer()
            except Exception as exc:  # the replay failed: the DLQ notes it
                return exc
            return claim.answer()

        return handle
