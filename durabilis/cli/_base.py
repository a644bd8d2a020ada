"""Exit codes, where the CLI finds its settings, and :class:`CliError`."""

from __future__ import annotations

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_ERROR = 4
EXIT_WRONG_NAMESPACE = 5
EXIT_DEFERRED = 6

DEFAULT_NAMESPACE = "durabilis"
ENV_URL = "DURABILIS_REDIS_URL"
ENV_NAMESPACE = "DURABILIS_NAMESPACE"
ENV_CONFIG = "DURABILIS_CONFIG"

RESOLUTION_HELP = f"""\
where the Redis, namespace and config come from (a flag wins over the environment):
  Redis      --url, then ${ENV_URL}, then $REDIS_URL, then the embedded server
             under ./.durabilis/
  namespace  --namespace, then ${ENV_NAMESPACE}, then "{DEFAULT_NAMESPACE}"
  config     --config FILE, then ${ENV_CONFIG}, then the library's defaults
             ($DURABILIS__<SECTION>__<FIELD> overrides apply on top)


exit codes:
  0 ok   1 not found / not done / checks failed   2 usage   3 Redis unavailable
  4 other durabilis error   5 wrong or empty namespace (others exist; named on stderr)
  6 dlq replay: records deferred (breaker open, or still in progress): none failed
"""
DEFAULT_TIMEOUT = 5.0
MAX_TIMEOUT = 86400.0
MAX_PINGS = 10_000
DEMO_MAX_WORKERS = 64


class CliError(Exception):
    """Ends the command with ``code`` and ``message`` on stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
