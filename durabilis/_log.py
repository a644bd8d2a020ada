"""Where durabilis's events go: the application's logging decides.

A library does not configure output. Every event (``durability_*``, with its
fields) goes through ONE gate, the standard library logger ``"durabilis"``:

- an event below that logger's effective level is dropped before anything is
  formatted. With nothing configured the level is ``WARNING`` (the root
  logger's default): warnings and errors are seen, the per-operation INFO
  events (a checkpoint saved, a DLQ record enqueued or replayed) are not;
- an event that passes goes to structlog when the application configured
  structlog (its processors and renderer decide the format), else to the
  ``"durabilis"`` logger itself (``"<event> key=value ..."``, with the event
  name and fields on the record as ``durabilis_event`` / ``durabilis_fields``
  for a JSON formatter). With no handler anywhere, Python's last-resort
  handler prints warnings and errors to stderr.

Taps (:func:`add_tap`; :class:`durabilis.metrics.DurabilisMetrics` installs one)
see every event, whatever the level: metrics count what happened, not what
was logged. See docs/production.md for recipes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import structlog

from durabilis.core import logsink

__all__ = ["LOGGER_NAME", "EventLogger", "Tap", "add_tap", "get_logger", "remove_tap"]

LOGGER_NAME = "durabilis"

Tap = Callable[[str, str, dict[str, Any]], None]
"""``tap(event, level_name, fields)``: called for every event (keep it cheap)."""

_TAPS: list[Tap] = []
_STDLIB = logging.getLogger(LOGGER_NAME)


def add_tap(tap: Tap) -> None:
    """Call ``tap`` for every durabilis event from now on (once, however often added)."""
    if tap not in _TAPS:
        _TAPS.append(tap)


def remove_tap(tap: Tap) -> None:
    """Stop calling ``tap`` (no error if it was not added)."""
    if tap in _TAPS:
        _TAPS.remove(tap)


def _render(value: Any) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in "\"=" for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


class EventLogger:
    """The logger of every durabilis module: ``_log.info("durability_x", field=value)``."""

    __slots__ = ()

    def _emit(self, level: int, method: str, event: str, fields: dict[str, Any],
              exc_info: bool = False) -> None:
        for tap in _TAPS:
            try:
                tap(event, method, fields)
            except Exception:  # a broken tap must not break a durable write
                _STDLIB.debug("a durabilis event tap raised", exc_info=True)
        if not _STDLIB.isEnabledFor(level):
            return
        if structlog.is_configured():
            bound = structlog.get_logger(LOGGER_NAME)
            if exc_info:
                fields = {**fields, "exc_info": True}
            getattr(bound, method)(event, **fields)
            return
        text = " ".join([event, *(f"{k}={_render(v)}" for k, v in fields.items())])
        _STDLIB.log(level, "%s", text, exc_info=exc_info, stacklevel=3,
                    extra={"durabilis_event": event, "durabilis_fields": fields})

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, "error", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._emit(logging.CRITICAL, "critical", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error with the exception being handled (its traceback)."""
        self._emit(logging.ERROR, "error", event, fields, exc_info=True)


_LOGGER = EventLogger()


def get_logger() -> EventLogger:
    """The one event logger (stateless: the gate and the routes are read per event)."""
    return _LOGGER


logsink.install(_LOGGER)  # the core's plans log through it too
