"""What the two shells share: the store, the settings, who replays, and the ops."""

from __future__ import annotations

from typing import Generic, TypeVar

from durabilis._store import AsyncStore, Store
from durabilis.core.dlq.records import default_owner
from durabilis.core.dlq.types import DlqConfig
from durabilis.dlq._replay import DlqOps

S = TypeVar("S", Store, AsyncStore)


class DlqShell(Generic[S]):
    """The state of :class:`~durabilis.dlq.DeadLetterQueue` and of its asyncio
    twin; their methods only build (``_ops``), do the I/O, and decode.

    Args:
        store: From :func:`durabilis.connect` (or ``connect_async``).
        config: Settings; the seed's defaults when omitted.
        replayer_id: Who this instance is when it replays (claims and
            ``replayed_by``); ``host:pid:random`` when omitted.
    """

    def __init__(
        self,
        store: S,
        config: DlqConfig | None = None,
        *,
        replayer_id: str | None = None,
    ) -> None:
        self.store: S = store
        self.config = config or DlqConfig()
        self.replayer_id = replayer_id or default_owner()
        self._ops = DlqOps(store.keys, self.config, self.replayer_id)

    @property
    def ops(self) -> DlqOps:
        """The queue's script-call builders, decoders and plans (no I/O): what
        the durability layer composes into its plans (and its replays' steps)."""
        return self._ops

    @property
    def bykey_key(self) -> str:
        """The name of the DLQ's by-key index: a hash from an operation's stored
        idempotency key to the id of its current record (``<ns>:dlq:{dlq}:bykey``).

        For operators' tools that look a record up by the key its caller knows
        (``durabilis idem``: ``HGET`` one field, ``HSCAN`` a pattern).
        """
        return self._ops.bykey_key
