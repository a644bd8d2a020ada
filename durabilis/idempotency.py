"""Idempotency: the tracking number that stops the same parcel shipping twice.

``check_and_record`` is ONE Lua script: exactly one of any number of
concurrent callers, in any number of processes, gets :class:`New` (with a
fencing token); everybody else gets :class:`Duplicate`. Claims are leases: a
claim whose owner died is taken over after ``in_progress_ttl_seconds``.

Round trips: ``check_and_record``, ``record``, ``release`` and ``check`` are
one round trip each (one EVALSHA); ``record_count`` is a SCAN.

The I/O-free part (the key, the config, the outcomes, each script's call
builder and decoder) lives in :mod:`durabilis.core.idempotency`; here: the two
shells, build -> run -> decode.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from durabilis._store import AsyncStore, Store
from durabilis.core.idempotency.ops import IdemOps

# Moved to durabilis.core.idempotency.types, every public name re-exported for
# existing imports (the layer, the HTTP middleware, the CLI, users' code).
from durabilis.core.idempotency.types import *  # noqa: F403
from durabilis.core.idempotency.types import (
    CheckResult,
    Duplicate,
    IdempotencyConfig,
    IdempotencyKey,
    New,
)

_IdemOps = IdemOps
"""(The name the layer and the tests use: the core's :class:`IdemOps`.)"""

__all__ = [
    "AsyncIdempotencyGuard",
    "CheckResult",
    "Duplicate",
    "IdempotencyConfig",
    "IdempotencyGuard",
    "IdempotencyKey",
    "New",
]


_LIVE = ("s", frozenset((b"p", b"d")))  # released claims stay as tombstones ("x")


# --- the twins: thin I/O shells ------------------------------------------------

S = TypeVar("S", Store, AsyncStore)


class _GuardBase(Generic[S]):
    """What both guards share: the store, the config, the ops (no I/O)."""

    def __init__(self, store: S, config: IdempotencyConfig | None = None) -> None:
        self.store: S = store
        self.config = config or IdempotencyConfig()
        self._ops = _IdemOps(store.keys, self.config)

    @property
    def ops(self) -> _IdemOps:
        """The guard's script-call builders and decoders (no I/O): what the
        durability layer composes into its plans."""
        return self._ops

    def _live(self, key: IdempotencyKey | str) -> IdempotencyKey | None:
        """The checked key (raises on a bad one, before any I/O), or ``None``
        when idempotency is disabled (nothing to send)."""
        checked = self._ops.validate_key(key)
        return checked if self.config.enabled else None


class IdempotencyGuard(_GuardBase[Store]):
    """Deduplicates operations across every process sharing the store.

    Args:
        store: From :func:`durabilis.connect`.
        config: Settings; the seed's defaults when omitted.
    """

    def check_and_record(
        self, key: IdempotencyKey | str, placeholder: Any = None
    ) -> CheckResult:
        """Claim ``key`` atomically: :class:`New` for exactly one caller.

        Args:
            key: The idempotency key (a ``str`` is taken as a raw key).
            placeholder: Shown to duplicates as ``original_result`` while in progress.

        Returns:
            :class:`New` (run the operation, then ``record`` or ``release``) or
            :class:`Duplicate`.

        Raises:
            InvalidKey: Empty or longer than ``max_key_length`` (before any I/O).
            KeyReuseMismatch: A raw key reused with another payload fingerprint.
            CorruptData: Foreign data at the key. StorageUnavailable: Redis down.
        """
        if (k := self._live(key)) is None:
            return New(token=None)
        return self._ops.decode_claim(k, self.store.run(self._ops.claim(k, placeholder)))

    def record(self, key: IdempotencyKey | str, result: Any, token: str | None = None) -> None:
        """Store the real result (the window still counts from the claim).

        Raises:
            LeaseLost: ``token`` no longer holds the claim; nothing was written.
        """
        if (k := self._live(key)) is not None:
            self._ops.decode_record(k, self.store.run(self._ops.record(k, result, token)))

    def release(self, key: IdempotencyKey | str, token: str) -> bool:
        """Give an in-progress claim back so a later retry can run.

        Returns:
            ``True`` if released; ``False`` if ``token`` did not hold an
            in-progress claim (already recorded, taken over or expired).
        """
        k = self._live(key)
        return k is not None and bool(self.store.run(self._ops.release(k, token)))

    def renew(self, key: IdempotencyKey | str, token: str) -> bool:
        """Keep an in-progress claim: its lease runs ``in_progress_ttl_seconds``
        from now. An owner whose operation may outlast the lease calls it
        (say, every third of it): a claim whose lease ran out is taken over by
        the next caller, which then runs the operation too. (The layer's
        keep-alive does this for its operations.)

        Returns:
            ``True`` if ``token`` still holds the claim; ``False`` if not
            (recorded, released, taken over or expired): another caller may
            run the operation now.
        """
        if (k := self._live(key)) is None:
            return False
        reply = self.store.run(self._ops.renew(k, token, self._ops.lease_ms))
        return self._ops.decode_renew(k, reply)

    def check(self, key: IdempotencyKey | str) -> Duplicate | None:
        """Read-only look-up: the existing record as a :class:`Duplicate`, or ``None``."""
        if (k := self._live(key)) is None:
            return None
        return self._ops.decode_check(k, self.store.run(self._ops.check(k)))

    def record_count(self) -> int:
        """How many records (in progress or done) are live in this namespace.

        A SCAN of the namespace, reading each record's state: an operator's tool,
        not for hot paths. Released claims (tombstones keeping their last
        fencing token until the record's TTL) are not counted.
        """
        return int(self.store.scan_count(self.store.keys.idem_pattern(), _LIVE))


class AsyncIdempotencyGuard(_GuardBase[AsyncStore]):
    """The asyncio twin of :class:`IdempotencyGuard` (same methods, awaited)."""

    async def check_and_record(
        self, key: IdempotencyKey | str, placeholder: Any = None
    ) -> CheckResult:
        """See :meth:`IdempotencyGuard.check_and_record`."""
        if (k := self._live(key)) is None:
            return New(token=None)
        return self._ops.decode_claim(k, await self.store.run(self._ops.claim(k, placeholder)))

    async def record(
        self, key: IdempotencyKey | str, result: Any, token: str | None = None
    ) -> None:
        """See :meth:`IdempotencyGuard.record`."""
        if (k := self._live(key)) is not None:
            self._ops.decode_record(k, await self.store.run(self._ops.record(k, result, token)))

    async def release(self, key: IdempotencyKey | str, token: str) -> bool:
        """See :meth:`IdempotencyGuard.release`."""
        k = self._live(key)
        return k is not None and bool(await self.store.run(self._ops.release(k, token)))

    async def renew(self, key: IdempotencyKey | str, token: str) -> bool:
        """See :meth:`IdempotencyGuard.renew`."""
        if (k := self._live(key)) is None:
            return False
        reply = await self.store.run(self._ops.renew(k, token, self._ops.lease_ms))
        return self._ops.decode_renew(k, reply)

    async def check(self, key: IdempotencyKey | str) -> Duplicate | None:
        """See :meth:`IdempotencyGuard.check`."""
        if (k := self._live(key)) is None:
            return None
        return self._ops.decode_check(k, await self.store.run(self._ops.check(k)))

    async def record_count(self) -> int:
        """See :meth:`IdempotencyGuard.record_count`."""
        return int(await self.store.scan_count(self.store.keys.idem_pattern(), _LIVE))
