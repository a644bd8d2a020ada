"""Exception classification, and the retry core's names where the shells import them.

Policies, backoff, decisions, the budget's calls and the retry plan live in
:mod:`durabilis.core.retry` (no I/O) and are re-exported here unchanged. What
stays here is the part that needs the process: :func:`error_code`'s class
table (asyncio's and concurrent.futures' timeouts), its per-class cache and
the lock that guards it, and :func:`decide`, which classifies the exception
and hands the code to :func:`durabilis.core.retry.decide_coded`. A retry loop
(the engines in :mod:`durabilis.retry`, or the composed layer's own attempt
loop) acts on the :class:`RetryDecision` it returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import random
import socket
import threading
from collections.abc import Callable
from enum import Enum

from durabilis._fork import on_fork_in_child

# The core's names, re-exported unchanged (listed in the core's __all__).
from durabilis.core.retry import *  # noqa: F403
from durabilis.core.retry import __all__ as _CORE_NAMES
from durabilis.core.retry.plans import decide_coded
from durabilis.core.retry.types import *  # noqa: F403  (the same names: mypy follows one star)
from durabilis.core.retry.types import (
    NETWORK_TIMEOUT,
    PERMISSION_DENIED,
    RATE_LIMITED,
    SERVICE_UNAVAILABLE,
    RetryDecision,
    RetryPolicy,
)
from durabilis.errors import ConfigError

__all__ = [*_CORE_NAMES, "decide", "error_code", "register_error_code"]  # noqa: PLE0604

# --- error classification ------------------------------------------------------


_BUILTIN_CODES: dict[type[BaseException], str] = {
    TimeoutError: NETWORK_TIMEOUT,
    # Distinct classes on Python 3.10 (aliases of TimeoutError from 3.11 on).
    asyncio.TimeoutError: NETWORK_TIMEOUT,
    concurrent.futures.TimeoutError: NETWORK_TIMEOUT,
    socket.timeout: NETWORK_TIMEOUT,  # an alias of TimeoutError from 3.10 on
    ConnectionError: SERVICE_UNAVAILABLE,  # refused, reset, aborted, broken pipe
    socket.gaierror: SERVICE_UNAVAILABLE,  # name resolution failed
    PermissionError: PERMISSION_DENIED,
}
"""The built-in class table: the nearest class of the exception's MRO found here wins."""

_USER_CODES: dict[type[BaseException], str] = {}
"""``register_error_code``'s table: consulted before every built-in rule."""


def _errno_codes() -> dict[int, str]:
    # A plain OSError (or a subclass the class table does not know) whose errno says
    # the network failed. OSError(errno, ...) builds ConnectionRefusedError & co. by
    # itself for most of these; the table catches the others (unreachable hosts and
    # networks) and OSError subclasses of other libraries. The WSAE* names exist on
    # Windows only.
    codes: dict[int, str] = {}
    for names, code in (
        (("ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EHOSTUNREACH", "ENETUNREACH",
          "ENETDOWN", "EHOSTDOWN", "ENETRESET", "EPIPE"), SERVICE_UNAVAILABLE),
        (("ETIMEDOUT",), NETWORK_TIMEOUT),
    ):
        for name in names:
            for prefix in ("", "WSA"):
                number = getattr(errno, prefix + name, None)
                if isinstance(number, int):
                    codes[number] = code
    return codes


_ERRNO_CODES = _errno_codes()

_HTTPX_NAMES = {
    "TimeoutException": NETWORK_TIMEOUT,
    "ConnectTimeout": NETWORK_TIMEOUT,
    "ReadTimeout": NETWORK_TIMEOUT,
    "WriteTimeout": NETWORK_TIMEOUT,
    "PoolTimeout": NETWORK_TIMEOUT,
    "ConnectError": SERVICE_UNAVAILABLE,
    "NetworkError": SERVICE_UNAVAILABLE,
    "ReadError": SERVICE_UNAVAILABLE,
    "WriteError": SERVICE_UNAVAILABLE,
    "RemoteProtocolError": SERVICE_UNAVAILABLE,
    "CloseError": SERVICE_UNAVAILABLE,
}

_NAME_CODES: dict[str, dict[str, str]] = {
    # top-level package of the class's __module__ -> class __name__ -> code
    "httpx": _HTTPX_NAMES,
    "httpcore": _HTTPX_NAMES,
    "requests": {
        "Timeout": NETWORK_TIMEOUT,
        "ConnectTimeout": NETWORK_TIMEOUT,
        "ReadTimeout": NETWORK_TIMEOUT,
        "ConnectionError": SERVICE_UNAVAILABLE,
    },
    "aiohttp": {
        "ServerTimeoutError": NETWORK_TIMEOUT,
        "ConnectionTimeoutError": NETWORK_TIMEOUT,
        "SocketTimeoutError": NETWORK_TIMEOUT,
        "ClientConnectionError": SERVICE_UNAVAILABLE,
        "ClientConnectorError": SERVICE_UNAVAILABLE,
        "ServerDisconnectedError": SERVICE_UNAVAILABLE,
        "ClientOSError": SERVICE_UNAVAILABLE,
    },
}
"""Third-party transport errors, recognised by module and class name (never imported)."""

_STATUS_CODES = {
    429: RATE_LIMITED,
    502: SERVICE_UNAVAILABLE,
    503: SERVICE_UNAVAILABLE,
    504: SERVICE_UNAVAILABLE,
}
"""HTTP statuses of an error response that mean "try again later"."""

_Entry = tuple[str | None, bool, str]
# Per exception class: (code found by the class rules or None, whether the
# instance's errno is to be read first, the class name). The status rule is read
# from the instance each time.
_CLASS_CACHE: dict[type[BaseException], _Entry] = {}
_CLASS_CACHE_MAX = 1024  # classes made on the fly must not grow it without bound
_CACHE_LOCK = threading.Lock()


@on_fork_in_child
def _cache_lock_after_fork() -> None:
    global _CACHE_LOCK  # noqa: PLW0603  (held by another thread at fork: locked for good)
    _CACHE_LOCK = threading.Lock()


_GENERATION = [0]  # bumped by each registration: a classification begun before it is not cached


def register_error_code(exc_type: type[BaseException], code: str) -> None:
    """Map an exception class (and its subclasses) to an error code.

    A registration wins over every built-in rule (the class table, the errno
    rule, the recognition of httpx/requests/aiohttp errors, HTTP statuses), even
    when it names a base class: registering ``OSError`` reclassifies
    ``ConnectionResetError`` too. Among registrations the more specific one wins
    (the class's MRO is walked); a ``code`` attribute on the exception itself
    wins over all of them. Registering a class again replaces its code.

    Args:
        exc_type: An exception class, e.g. ``httpx.ReadTimeout``.
        code: The code policies list, e.g. ``"NETWORK_TIMEOUT"``.

    Raises:
        ConfigError: ``exc_type`` is not an exception class or ``code`` is empty.
    """
    if not isinstance(exc_type, type) or not issubclass(exc_type, BaseException):
        raise ConfigError("exc_type", f"must be an exception class, got {exc_type!r}")
    if not isinstance(code, str) or not code:
        raise ConfigError("code", f"must be a non-empty string, got {code!r}")
    with _CACHE_LOCK:
        _USER_CODES[exc_type] = code
        _GENERATION[0] += 1
        _CLASS_CACHE.clear()


def _by_name(klass: type) -> str | None:
    """The code of a third-party transport error class, judged by its module and name."""
    try:
        module = klass.__module__
        if not isinstance(module, str):
            return None
        names = _NAME_CODES.get(module.partition(".")[0])
        if names is None:
            return None
        name = klass.__name__
        return names.get(name) if isinstance(name, str) else None
    except Exception:  # a foreign metaclass may do anything
        return None


def _classify_class(cls: type[BaseException]) -> _Entry:
    """The part of the classification that depends on the class alone."""
    mro = cls.__mro__
    try:
        fallback = cls.__name__
    except Exception:  # pragma: no cover - a metaclass hiding __name__
        fallback = "Exception"
    for klass in mro:
        found = _USER_CODES.get(klass)
        if found is not None:
            return found, False, fallback
    for klass in mro:
        found = _BUILTIN_CODES.get(klass)
        if found is not None:
            return found, False, fallback
    named = None
    for klass in mro:
        named = _by_name(klass)
        if named is not None:
            break
    return named, issubclass(cls, OSError), fallback


def _errno_code(exc: BaseException) -> str | None:
    try:
        number = getattr(exc, "errno", None)
        if isinstance(number, int):
            return _ERRNO_CODES.get(number)
    except Exception:
        pass
    return None


def _status(value: object) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return _STATUS_CODES.get(int(value))
    return None


def _status_code(exc: BaseException) -> str | None:
    """The code of an HTTP error status the exception carries (429, 502, 503, 504)."""
    try:  # httpx.HTTPStatusError, requests.HTTPError: exc.response.status_code
        response = getattr(exc, "response", None)
        if response is not None:
            found = _status(getattr(response, "status_code", None))
            if found is not None:
                return found
    except Exception:  # foreign properties may raise anything
        pass
    try:  # aiohttp.ClientResponseError: exc.status
        return _status(getattr(exc, "status", None))
    except Exception:
        return None


def error_code(exc: BaseException) -> str:
    """The classification code of an exception; never raises.

    In order, the first rule that gives a code wins:

    1. the exception's ``code`` attribute when it is a non-empty string or a
       string-valued ``Enum`` (:class:`~durabilis.OperationError` has one);
    2. a :func:`register_error_code` registration for the nearest class in its MRO;
    3. the built-in class table, nearest class first: ``TimeoutError`` (and
       asyncio's, concurrent.futures', ``socket.timeout``) → ``NETWORK_TIMEOUT``;
       ``ConnectionError`` and its subclasses, ``socket.gaierror`` →
       ``SERVICE_UNAVAILABLE``; ``PermissionError`` → ``PERMISSION_DENIED``;
    4. an ``OSError`` whose ``errno`` is a network failure (``ECONNREFUSED``,
       ``ECONNRESET``, ``ECONNABORTED``, ``EHOSTUNREACH``, ``ENETUNREACH``,
       ``ENETDOWN``, ``EHOSTDOWN``, ``ENETRESET``, ``EPIPE`` →
       ``SERVICE_UNAVAILABLE``; ``ETIMEDOUT`` → ``NETWORK_TIMEOUT``);
    5. the timeouts and connection errors of httpx/httpcore, requests and aiohttp,
       recognised by module and class name without importing them;
    6. an HTTP status on ``exc.response.status_code`` or ``exc.status``: 429 →
       ``RATE_LIMITED``; 502, 503, 504 → ``SERVICE_UNAVAILABLE``;
    7. the class name (``"ValueError"``, ``"OSError"``), which a policy may list too.

    Rules 2, 3 and 5 depend on the class alone and are cached per class; rules
    4 and 6 read the instance. Attributes are read defensively: a foreign
    property that raises (an ``Exception``) only makes its rule not apply. A
    ``code`` of a ``str`` subclass is used as a plain ``str`` (its own
    ``__len__``, ``__hash__`` or ``__eq__`` never run). Should anything else
    raise (a class whose metaclass is unhashable), the code is the class name,
    else ``"Exception"``.
    """
    try:
        return _error_code(exc)
    except Exception:  # a foreign class or attribute the rules could not read
        try:
            name = type(exc).__name__
        except Exception:  # a metaclass hiding __name__
            return "Exception"
        return name if type(name) is str and name else "Exception"


def _error_code(exc: BaseException) -> str:
    """:func:`error_code`'s rules (may raise on a hostile class: its caller catches)."""
    try:
        code = getattr(exc, "code", None)  # getattr's default: no AttributeError is built
    except Exception:  # a property that raised
        code = None
    if isinstance(code, Enum):
        code = code.value
    if isinstance(code, str):
        code = str.__str__(code)  # a plain copy of a str subclass: none of its methods run
        if code:
            return code
    cls = type(exc)
    entry = _CLASS_CACHE.get(cls)
    if entry is None:
        generation = _GENERATION[0]
        entry = _classify_class(cls)
        with _CACHE_LOCK:
            if generation == _GENERATION[0]:
                if len(_CLASS_CACHE) >= _CLASS_CACHE_MAX:
                    _CLASS_CACHE.clear()
                _CLASS_CACHE[cls] = entry
    found, check_errno, fallback = entry
    if check_errno:
        by_errno = _errno_code(exc)
        if by_errno is not None:
            return by_errno
    if found is not None:
        return found
    return _status_code(exc) or fallback



def decide(
    policy: RetryPolicy | None,
    attempt: int,
    exc: BaseException,
    *,
    elapsed: float = 0.0,
    deadline: float | None = None,
    rng: Callable[[], float] = random.random,
) -> RetryDecision:
    """Decide what follows failed attempt ``attempt``: :func:`error_code` of ``exc``,
    then :func:`durabilis.core.retry.decide_coded` (its docstring has the rules)."""
    return decide_coded(
        policy, attempt, exc, error_code(exc), elapsed=elapsed, deadline=deadline, rng=rng
    )
