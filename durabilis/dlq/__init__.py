"""Dead-letter queue: the returns warehouse where failed operations wait, never lost.

An operation that exhausted its retries is parked here with everything needed
to understand and re-ship it. Storage (all keys of a namespace share the hash
tag ``{dlq}``, so every script runs on Redis Cluster):

- ``<ns>:dlq:{dlq}:stream`` - a Redis Stream, the ordered append-only log of
  failures, readable with ``redis-cli XRANGE``: plain text fields ``dlq_id``,
  ``agent_id``, ``operation_type``, ``retry_count``, ``last_error``,
  ``failed_at`` / ``expires_at`` (ISO-8601 UTC), ``original_operation`` (JSON
  text; ``original_operation_msgpack`` when the value is not JSON-compatible)
  and ``meta:<name>`` for caller metadata;
- ``<ns>:dlq:{dlq}:rec:<dlq_id>`` - a hash per record with its mutable state
  (status, replay attempts, replay error, claim), with a TTL = its expiry;
- ``expiry`` / ``pending`` / ``pending-by-op`` sorted sets and a ``counts`` hash,
  the indexes behind cleanup, listing and stats.

Every state change (enqueue, claim, finish, failed replay, cleanup) is ONE Lua
script. Replays claim a record first (a lease with a fencing token), so
replicas replaying at once never run one record twice; a dead replayer's claim
expires after ``claim_ttl_seconds``.

Round trips: ``enqueue``, ``get``, ``mark_replayed``, ``abandon``, ``stats``
and ``pending_count`` are one each; ``replay`` is three (claim, handler,
finish); listings are two per page of up to 100 records; ``cleanup_expired``
is two per batch; ``cleanup_due`` one for its lease, then as ``cleanup_expired``.

Nothing leaves silently: a record that reaches its TTL while pending is
reported by the cleanup that removes it (event ``durability_dlq_expired``, an
``expired`` log entry, ``DlqStats.expired``), exactly once.

The I/O-free part lives in :mod:`durabilis.core.dlq` (no redis, asyncio or
threading): ``types`` (the public values), ``records`` (the record codec),
``plan`` (how a replay runs a handler), and the call builders, decoders and
plans built in layers (``base`` <- ``enqueue`` <- ``calls`` <- ``listing``
<- ``replay``; events go to the log each is handed). Here: :class:`DlqOps`
(``_replay``: the core's ``ReplayPlans`` handed the package's logger), and
the two shells (``_sync``, ``_async``) over the state they share
(``_shell``). ``_types``, ``_records``, ``_plan``, ``_base``, ``_enqueue``,
``_calls`` and ``_listing`` re-export the core's names for existing imports.
"""

from __future__ import annotations

from durabilis.core.dlq.plan import ANSWERED as ANSWERED
from durabilis.core.dlq.plan import CONFIG_ERROR_QUIET_SECONDS as CONFIG_ERROR_QUIET_SECONDS
from durabilis.core.dlq.plan import FINISHED as FINISHED
from durabilis.core.dlq.plan import Handle as Handle
from durabilis.core.dlq.plan import ReplayDeclined as ReplayDeclined
from durabilis.core.dlq.plan import handler_plan as handler_plan
from durabilis.core.dlq.records import KEEP_MS as KEEP_MS
from durabilis.core.dlq.records import MAX_METADATA_FIELDS as MAX_METADATA_FIELDS
from durabilis.core.dlq.records import Claimed, encode_operation
from durabilis.core.dlq.records import Prepared as Prepared
from durabilis.core.dlq.records import record_id_for as record_id_for
from durabilis.core.dlq.records import sort_key as sort_key
from durabilis.core.dlq.records import stream_id_of as stream_id_of
from durabilis.core.dlq.types import (
    CleanupReport,
    DlqConfig,
    DlqListing,
    DlqRecord,
    DlqScan,
    DlqStats,
    DlqStatus,
    ReplayOutcome,
    ReplayResult,
    ReplaySummary,
    RequeueResult,
)

# (`X as X`: public names outside __all__, as before the package.)
from durabilis.dlq._async import AsyncDeadLetterQueue
from durabilis.dlq._replay import DlqOps
from durabilis.dlq._replay import _Pacer as _Pacer
from durabilis.dlq._replay import _Tally as _Tally
from durabilis.dlq._sync import DeadLetterQueue
from durabilis.events import error_text as error_text

# Their names before the package (tests/unit/test_dlq.py, tests/integration/test_dlq*.py).
_DlqOps = DlqOps
_Claimed = Claimed
_encode_operation = encode_operation

__all__ = [
    "AsyncDeadLetterQueue",
    "CleanupReport",
    "DeadLetterQueue",
    "DlqConfig",
    "DlqListing",
    "DlqRecord",
    "DlqScan",
    "DlqStats",
    "DlqStatus",
    "ReplayOutcome",
    "ReplayResult",
    "ReplaySummary",
    "RequeueResult",
]

