"""Where the core's plans send their events: :data:`SINK`.

The core imports no logging (the standard library's ``logging`` imports
``threading``). :mod:`durabilis._log` installs the package's event logger here
when it is imported, which every shell does, so a plan's
``logsink.SINK.warning("durability_x", ...)`` reaches the application's logging
and the taps as any other event. Alone (the core's unit tests), the core's
events are dropped. Read ``SINK`` at each call (never bind it at import): the
logger is installed after the core's modules may have been imported.
"""

from __future__ import annotations

from durabilis.core.steps import Log, SilentLog

__all__ = ["SINK", "install"]

SINK: Log = SilentLog()
"""The installed event logger (``durabilis._log.get_logger()`` once the package is imported)."""


def install(log: Log) -> None:
    """Send the core's events to ``log`` from now on."""
    global SINK  # noqa: PLW0603  (one logger per process, installed by durabilis._log)
    SINK = log
