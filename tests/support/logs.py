"""structlog's ``capture_logs``, kept to what the test's own thread logs."""

from __future__ import annotations

import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog
from structlog.testing import capture_logs


@contextmanager
def own_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """The events logged by this thread (and the event loops it runs) meanwhile.

    structlog's capture is process-wide: a layer that an earlier test left
    open logs from its keep-alive thread into any later capture (seen on CI:
    a ``durability_counts_not_sent`` for a stopped server inside a retry
    test's list). Tests that assert a whole list of events use this.
    """
    me = threading.get_ident()

    def this_thread(_: Any, __: str, event: MutableMapping[str, Any]) -> Any:
        if threading.get_ident() != me:
            raise structlog.DropEvent
        return event

    with capture_logs() as logs:
        structlog.get_config()["processors"].insert(0, this_thread)
        yield logs
