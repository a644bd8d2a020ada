"""The test helper ``own_logs`` keeps what another thread logs out of a capture."""

from __future__ import annotations

import threading

from durabilis._log import get_logger
from tests.support.logs import own_logs


def test_own_logs_keeps_this_thread_s_events_and_drops_another_thread_s() -> None:
    log = get_logger()
    with own_logs() as logs:
        other = threading.Thread(target=lambda: log.warning("from_a_keep_alive_thread"))
        other.start()
        other.join()
        log.info("from_this_thread")
    assert [e["event"] for e in logs] == ["from_this_thread"]
