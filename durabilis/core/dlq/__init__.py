"""The DLQ's I/O-free core: types, records and their encodings, the keys and
checks every call builder makes, the enqueue call and its plan, the other
script calls and their decoding, the listing/requeue/purge/abandon/cleanup
plans, and the replay plans and their vocabulary. Events go to the log each
is handed (``durabilis.core.steps.SilentLog`` unless told).

The layers, each a subclass of the one before: ``base.OpsBase`` (keys,
checks) <- ``enqueue.EnqueueOps`` <- ``calls.DlqCalls`` <-
``listing.ListingPlans`` <- ``replay.ReplayPlans``. The shells' ``DlqOps``
(``durabilis.dlq``) is ``ReplayPlans`` handed the package's logger.
"""

from __future__ import annotations

from durabilis.core.dlq.base import OpsBase
from durabilis.core.dlq.calls import DlqCalls
from durabilis.core.dlq.enqueue import EnqueueOps
from durabilis.core.dlq.listing import ListingPlans
from durabilis.core.dlq.plan import (
    ANSWERED,
    FINISHED,
    UNSETTLED,
    Handle,
    ReplayDeclined,
    TypeChanged,
    handler_plan,
)
from durabilis.core.dlq.records import Enqueued, Prepared, record_id_for
from durabilis.core.dlq.replay import ReplayPlans
from durabilis.core.dlq.types import DlqConfig, DlqRecord, DlqStatus

__all__ = [
    "ANSWERED",
    "FINISHED",
    "UNSETTLED",
    "DlqCalls",
    "DlqConfig",
    "DlqRecord",
    "DlqStatus",
    "EnqueueOps",
    "Enqueued",
    "Handle",
    "ListingPlans",
    "OpsBase",
    "Prepared",
    "ReplayDeclined",
    "ReplayPlans",
    "TypeChanged",
    "handler_plan",
    "record_id_for",
]
