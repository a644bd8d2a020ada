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

The package: ``_types`` (the public values), ``_records`` (the record codec),
``_plan`` (how a replay runs a handler), the call builders, decoders and plans
both twins share (``_base`` <- ``_enqueue`` <- ``_calls`` <- ``_listing`` <-
``_replay``: one class, :class:`DlqOps`, built in layers), and the two shells
(``_sync``, ``_async``) over the state they share (``_shell``).
"""

from __future__ import annotations

# (`X as X`: public names outside __all__, as before the package.)
from durabilis.dlq._async import AsyncDeadLetterQueue
from durabilis.dlq._plan import ANSWERED as ANSWERED
from durabilis.dlq._plan import CONFIG_ERROR_QUIET_SECONDS as CONFIG_ERROR_QUIET_SECONDS
from durabilis.dlq._plan import FINISHED as FINISHED
from durabilis.dlq._plan import Handle as Handle
from durabilis.dlq._plan import ReplayDeclined as ReplayDeclined
from durabilis.dlq._plan import handler_plan as handler_plan
from durabilis.dlq._records import KEEP_MS as KEEP_MS
from durabilis.dlq._records import MAX_METADATA_FIELDS as MAX_METADATA_FIELDS
from durabilis.dlq._records import Claimed, encode_operation
from durabilis.dlq._records import Prepared as Prepared
from durabilis.dlq._records import record_id_for as record_id_for
from durabilis.dlq._records import sort_key as sort_key
from durabilis.dlq._records import stream_id_of as stream_id_of
from durabilis.dlq._replay import DlqOps
from durabilis.dlq._replay import _Pacer as _Pacer
from durabilis.dlq._replay import _Tally as _Tally
from durabilis.dlq._sync import DeadLetterQueue
from durabilis.dlq._types import (
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

