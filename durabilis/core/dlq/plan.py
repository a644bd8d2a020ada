"""The plan vocabulary of replays: how a handler runs a record, and its answers."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

from durabilis.core.dlq.types import DlqRecord
from durabilis.core.steps import Run

_T = TypeVar("_T")
Plan = Generator[Any, Any, _T]
Handle = Callable[[DlqRecord, str], "Plan[BaseException | object | None]"]
"""How a replay runs a record (with the replay's claim token): a plan returning
``None`` (done), :data:`FINISHED` (done, and the record already finished in the
handler's own step) or the failure."""


class TypeChanged(Exception):
    """A filtered replay pass claimed a record whose type changed since it was
    listed (a payload-less record filled in): deferred, not run."""

    reason = "operation_type_changed"  # (the deferral's log reason)

    def __init__(self, wanted: str, found: str) -> None:
        super().__init__(f"listed as {wanted!r}, now {found!r}: left for its own pass")


class ReplayDeclined(Exception):
    """A replay handler's answer before anything ran: the record is not this
    replayer's to replay (e.g. an HTTP request another middleware parked).
    Deferred: the claim released, no attempt counted, a requeue mark kept."""


FINISHED = object()
"""A handler's answer: it succeeded and finished the record itself, fenced by
the claim token, in the same atomic step as its outcome (the layer's replays)."""

ANSWERED = object()
"""A handler's answer: the operation had completed (its outcome is recorded),
so nothing ran; a record another finished meanwhile (a later delivery of the
operation settles it) is replayed, not a lost claim."""

UNSETTLED = object()
"""A handler's answer: the operation ran and succeeded, but its outcome step
(the record's finish with it, fenced by the claim token) could not be sent
within its lease and goes on in the process's keep-alive. The claim is left as
it is (released, that finish would be refused and the record left pending
once the operation completed): deferred, nothing counted. If the keep-alive
never lands it, the claim expires and a later replay finds the operation done
(or, its claim lapsed too, runs it with ``ctx.recovered``)."""


CONFIG_ERROR_QUIET_SECONDS = 600.0
"""After a config error on a requeued record, this replica's requeue passes
leave the record alone this long, and the same replica's same error is not
logged again (``replay_config_error``) within it."""


def handler_plan(handler: Callable[[DlqRecord], Any]) -> Handle:
    """The replay plan of a plain handler: run it (it fails by raising)."""

    def handle(record: DlqRecord, _token: str) -> Plan[BaseException | None]:
        ok, value = yield Run(handler, record)
        return None if ok else value

    return handle
