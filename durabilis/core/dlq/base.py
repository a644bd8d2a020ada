"""The DLQ's keys and the checks every call builder makes (no I/O)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from durabilis.core.dlq.records import ID_RE
from durabilis.core.dlq.types import MAX_TTL_SECONDS, DlqConfig
from durabilis.core.steps import Log, SilentLog
from durabilis.errors import (
    ConfigError,
    InvalidKey,
    InvalidTtl,
)

if TYPE_CHECKING:
    from durabilis._keys import KeySpace


class OpsBase:
    """The DLQ's keys, and the checks every call builder makes (no I/O)."""

    __slots__ = ("_backoff", "config", "keys", "log", "owner")

    def __init__(
        self, keys: KeySpace, config: DlqConfig, owner: str, *, log: Log | None = None
    ) -> None:
        self.keys = keys
        self.config = config
        self.owner = owner
        # Where events go: the shells hand in the package's logger.
        self.log: Log = SilentLog() if log is None else log
        # Requeued records this replica met a config error on: dlq_id -> when
        # (monotonic) its requeue passes may claim it again.
        self._backoff: dict[str, float] = {}

    # keys ------------------------------------------------------------------

    @property
    def stream_key(self) -> str:
        return self.keys.dlq("stream")

    @property
    def expiry_key(self) -> str:
        return self.keys.dlq("expiry")

    @property
    def pending_key(self) -> str:
        return self.keys.dlq("pending")

    @property
    def pending_by_op_key(self) -> str:
        return self.keys.dlq("pending-by-op")

    @property
    def counts_key(self) -> str:
        return self.keys.dlq("counts")

    def record_key(self, dlq_id: str) -> str:
        return self.keys.dlq("rec", dlq_id)

    @property
    def bykey_key(self) -> str:
        """Hash: an operation's idempotency key -> the id of its current record."""
        return self.keys.dlq("bykey")

    def status_keys(self, dlq_id: str) -> list[str]:
        """The keys a record's status lives in, in the order ``dlq_enqueue``
        (after the stream) and ``dlq_finish`` take them: expiry, pending,
        pending-by-op, counts, the record, the by-key index."""
        return [
            self.expiry_key, self.pending_key, self.pending_by_op_key, self.counts_key,
            self.record_key(dlq_id), self.bykey_key,
        ]

    @property
    def requeue_key(self) -> str:
        """Lex zset: the records marked for redelivery by the fleet
        (``<op>\\0<sortkey(sid)>|<dlq_id>``, as ``pending-by-op``)."""
        return self.keys.dlq("requeued")

    @property
    def lease_key(self) -> str:
        """The scheduled cleanup's lease: one replica per period (``layer_lease``)."""
        return self.keys.dlq("lease", "cleanup")

    @property
    def log_key(self) -> str:
        """Capped stream of every state change (parked, parked_again, filled_in, replay_failed,
        replayed, abandoned, expired), in order."""
        return self.keys.dlq("log")

    # validation ------------------------------------------------------------

    def name(self, what: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise InvalidKey(str(value), f"{what} must be a non-empty string")
        if "\x00" in value:
            raise InvalidKey(value, f"{what} must not contain NUL characters")
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise InvalidKey(value, f"{what} is not valid UTF-8 text") from exc
        if size > self.config.max_name_bytes:
            raise InvalidKey(
                value, f"{what} is {size} bytes, over max_name_bytes={self.config.max_name_bytes}"
            )
        return value

    @staticmethod
    def known_id(dlq_id: Any) -> bool:
        """Whether ``dlq_id`` could name a record (malformed ids are simply unknown).

        Raises:
            InvalidKey: ``dlq_id`` is not a string at all.
        """
        if not isinstance(dlq_id, str):
            raise InvalidKey(repr(dlq_id), "a dlq_id must be a string")
        return ID_RE.fullmatch(dlq_id) is not None

    def ttl_ms(self, ttl_seconds: float | None) -> int:
        ttl = self.config.default_ttl_seconds if ttl_seconds is None else ttl_seconds
        if (
            not isinstance(ttl, (int, float))
            or isinstance(ttl, bool)
            or not math.isfinite(ttl)
            or ttl <= 0
        ):
            raise InvalidTtl(ttl)
        if ttl > MAX_TTL_SECONDS:
            raise ConfigError("ttl_seconds", f"must be at most {MAX_TTL_SECONDS}")
        return max(1, int(ttl * 1000))

    def hold_ms(self) -> int:
        """How long the composed layer holds a parked operation's idempotency key
        (so that a later success of the operation settles its record), in ms.

        As long as the record can live pending: ``default_ttl_seconds``; with
        ``keep_pending`` (a record that may never expire while pending), the
        longest TTL there is, ``MAX_STORED_TTL_SECONDS`` (366 days). A kept
        record older than that is no longer settled by its operation's success:
        replay or abandon it before.
        """
        if self.config.keep_pending:
            return int(MAX_TTL_SECONDS * 1000)
        return self.ttl_ms(None)
