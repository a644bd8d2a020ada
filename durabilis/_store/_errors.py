"""redis-py's errors mapped to durabilis errors, in one place (:func:`map_error`)."""

from __future__ import annotations

import redis

from durabilis._scripts import ScriptCall
from durabilis.errors import (
    CorruptData,
    DurabilisError,
    StorageUnavailable,
)

_TRANSIENT_MARKERS = ("LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "BUSY")
# The same refusals met by a redis.call inside a script: "Error running script
# (call to f_…): @user_script:345: @user_script: 35: -OOM command not allowed …".
# Redis refuses a denied write only when it is the script's first write (a script
# that already wrote is let through, to stay atomic), so nothing was written.
_SCRIPT_TRANSIENT = tuple(f": -{marker}" for marker in (*_TRANSIENT_MARKERS, "OOM"))

# redis-py strips the error code from the message of these (CLUSTERDOWN, OOM,
# ...), so they are recognised by class. Each means "not executed, try later":
# a cluster mid-failover or mid-resharding (a redirect still unresolved after
# redis-py's 16 hops), a replica that was demoted, a full server.
_TRANSIENT_RESPONSES: tuple[type[Exception], ...] = (
    redis.exceptions.ClusterDownError,  # also MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # also MovedError
    redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError,
)
# Raised by redis-py's cluster client when no node answers or a slot has no
# node; not RedisError subclasses.
_CLUSTER_UNREACHABLE: tuple[type[Exception], ...] = (
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.RedisClusterException,
)
_CLUSTER_MISUSE: tuple[type[Exception], ...] = (
    redis.exceptions.CrossSlotTransactionError,
    redis.exceptions.InvalidPipelineStack,
)

def map_error(exc: Exception, call: ScriptCall | None = None) -> DurabilisError:
    """Translate a redis-py error into the durabilis hierarchy (caller raises ``from``)."""
    if isinstance(exc, DurabilisError):
        return exc
    where = f" (script {call.name})" if call is not None else ""
    if isinstance(exc, redis.exceptions.ResponseError):
        text = str(exc)
        if "WRONGTYPE" in text:
            key = str(call.keys[0]) if call is not None and call.keys else "?"
            return CorruptData(key, f"a key holds a value of the wrong type{where}")
        if isinstance(exc, redis.exceptions.NoPermissionError):
            return DurabilisError(
                f"Redis refused by its ACL{where}: {text} (the user needs the key pattern "
                "and commands listed in docs/operations.md)"
            )
        if (isinstance(exc, _TRANSIENT_RESPONSES) or text.startswith(_TRANSIENT_MARKERS)
                or any(marker in text for marker in _SCRIPT_TRANSIENT)):
            return StorageUnavailable(
                f"Redis refused the command{where}: {type(exc).__name__}: {text}"
            )
        return DurabilisError(f"Redis error{where}: {type(exc).__name__}: {text}")
    if isinstance(exc, redis.exceptions.DataError):
        return DurabilisError(f"invalid command arguments{where}: {exc}")
    if isinstance(exc, (redis.exceptions.RedisError, OSError)):
        return StorageUnavailable(f"Redis unavailable{where}: {type(exc).__name__}: {exc}")
    if isinstance(exc, _CLUSTER_UNREACHABLE) and not isinstance(exc, _CLUSTER_MISUSE):
        return StorageUnavailable(f"Redis Cluster unavailable{where}: {type(exc).__name__}: {exc}")
    if isinstance(exc, AttributeError) and _raised_inside_redis_py(exc):
        # redis-py's async cluster client closes every connection when it
        # re-reads the slot map (after CLUSTERDOWN, a dead node, every few
        # MOVED), under the feet of commands in flight: they die writing to a
        # socket that is gone, i.e. before anything was sent.
        return StorageUnavailable(f"Redis connection lost{where}: {type(exc).__name__}: {exc}")
    return DurabilisError(f"unexpected error{where}: {type(exc).__name__}: {exc}")


def _raised_inside_redis_py(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith("redis.")
