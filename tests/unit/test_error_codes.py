"""error_code: transport errors of the standard library and of httpx, requests and
aiohttp are classified without registration (and without importing them)."""

from __future__ import annotations

import errno
import socket
from typing import Any

import pytest

from durabilis import OperationError
from durabilis._retry_core import _CLASS_CACHE, _USER_CODES, error_code, register_error_code


def _foreign(module: str, name: str, *bases: type[BaseException]) -> type[BaseException]:
    """A class that looks like it was defined in ``module`` (as the real one is)."""
    cls = type(name, bases or (Exception,), {})
    cls.__module__ = module
    return cls


@pytest.fixture(autouse=True)
def _clean_registrations() -> Any:
    saved = dict(_USER_CODES)
    yield
    _USER_CODES.clear()
    _USER_CODES.update(saved)
    _CLASS_CACHE.clear()


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (TimeoutError(), "NETWORK_TIMEOUT"),
        (ConnectionRefusedError(), "SERVICE_UNAVAILABLE"),
        (ConnectionResetError(), "SERVICE_UNAVAILABLE"),
        (BrokenPipeError(), "SERVICE_UNAVAILABLE"),
        (socket.gaierror(-2, "Name or service not known"), "SERVICE_UNAVAILABLE"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "SERVICE_UNAVAILABLE"),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "SERVICE_UNAVAILABLE"),
        (OSError(errno.ETIMEDOUT, "Connection timed out"), "NETWORK_TIMEOUT"),
        (OSError(errno.ENOENT, "No such file"), "FileNotFoundError"),
        (OSError(errno.EACCES, "denied"), "PERMISSION_DENIED"),
        (OSError("no errno"), "OSError"),
        (ValueError("x"), "ValueError"),
    ],
)
def test_standard_library_transport_errors(exc: BaseException, code: str) -> None:
    assert error_code(exc) == code


@pytest.mark.parametrize(
    ("module", "name", "code"),
    [
        ("httpx", "ReadTimeout", "NETWORK_TIMEOUT"),
        ("httpx", "ConnectTimeout", "NETWORK_TIMEOUT"),
        ("httpx", "PoolTimeout", "NETWORK_TIMEOUT"),
        ("httpx", "ConnectError", "SERVICE_UNAVAILABLE"),
        ("httpx", "RemoteProtocolError", "SERVICE_UNAVAILABLE"),
        ("httpcore", "ReadTimeout", "NETWORK_TIMEOUT"),
        ("requests.exceptions", "ReadTimeout", "NETWORK_TIMEOUT"),
        ("requests.exceptions", "ConnectionError", "SERVICE_UNAVAILABLE"),
        ("aiohttp.client_exceptions", "ServerTimeoutError", "NETWORK_TIMEOUT"),
        ("aiohttp.client_exceptions", "ClientConnectorError", "SERVICE_UNAVAILABLE"),
        ("aiohttp.client_exceptions", "ServerDisconnectedError", "SERVICE_UNAVAILABLE"),
        ("httpx", "InvalidURL", "InvalidURL"),  # not transport trouble: the class name
        ("myhttpx", "ReadTimeout", "ReadTimeout"),  # another package's namesake
    ],
)
def test_third_party_errors_by_module_and_name(module: str, name: str, code: str) -> None:
    assert error_code(_foreign(module, name)()) == code


def test_a_subclass_of_a_recognised_class_is_recognised_through_its_mro() -> None:
    base = _foreign("httpx", "ReadTimeout")

    class LedgerTimeout(base):  # type: ignore[misc, valid-type]
        pass

    assert error_code(LedgerTimeout()) == "NETWORK_TIMEOUT"


class _Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


@pytest.mark.parametrize(
    ("status", "code"), [(429, "RATE_LIMITED"), (503, "SERVICE_UNAVAILABLE"),
                         (504, "SERVICE_UNAVAILABLE"), (404, "HTTPStatusError"),
                         (500, "HTTPStatusError")],
)
def test_http_statuses_that_mean_try_later(status: int, code: str) -> None:
    cls = _foreign("httpx", "HTTPStatusError")
    exc = cls("bad status")
    exc.response = _Response(status)  # type: ignore[attr-defined]
    assert error_code(exc) == code
    aio = _foreign("aiohttp.client_exceptions", "ClientResponseError")()
    aio.status = status  # type: ignore[attr-defined]
    assert error_code(aio) == code.replace("HTTPStatusError", "ClientResponseError")


def test_precedence_code_attribute_then_registration_then_builtin_rules() -> None:
    read_timeout = _foreign("httpx", "ReadTimeout")
    assert error_code(read_timeout()) == "NETWORK_TIMEOUT"
    register_error_code(read_timeout, "LEDGER_SLOW")
    assert error_code(read_timeout()) == "LEDGER_SLOW"  # the cache was cleared
    register_error_code(OSError, "ANY_OS")
    assert error_code(ConnectionResetError()) == "ANY_OS"  # beats the class table
    assert error_code(OperationError("RATE_LIMITED")) == "RATE_LIMITED"
    coded = ConnectionResetError()
    coded.code = "OWN"  # type: ignore[attr-defined]
    assert error_code(coded) == "OWN"


def test_hostile_attributes_never_make_classification_raise() -> None:
    class Hostile(Exception):
        @property
        def code(self) -> str:
            raise RuntimeError("boom")

        @property
        def response(self) -> object:
            raise RuntimeError("boom")

        @property
        def status(self) -> int:
            raise RuntimeError("boom")

    assert error_code(Hostile()) == "Hostile"


def test_a_refusal_met_inside_a_script_is_storage_unavailable() -> None:
    import redis

    from durabilis import StorageUnavailable
    from durabilis._store import map_error

    oom = redis.exceptions.ResponseError(
        "Error running script (call to f_50b5): @user_script:345: @user_script: 35: "
        "-OOM command not allowed when used memory > 'maxmemory'."
    )
    assert isinstance(map_error(oom), StorageUnavailable)
    bug = redis.exceptions.ResponseError(
        "Error running script (call to f_50b5): @user_script:12: user_script:12: "
        "attempt to compare nil with number"
    )
    assert not isinstance(map_error(bug), StorageUnavailable)


class _UnhashableMeta(type):
    __hash__ = None  # type: ignore[assignment]

    def __eq__(cls, other: object) -> bool:
        return cls is other


class _LenRaises(str):
    def __len__(self) -> int:
        raise RuntimeError("len")

    def __hash__(self) -> int:
        raise RuntimeError("hash")


def test_error_code_never_raises_on_a_hostile_class_or_code() -> None:
    unhashable = _UnhashableMeta("Unhashable", (ConnectionError,), {})
    assert error_code(unhashable()) == "Unhashable"  # the class name: no rule could read it
    odd = type("Odd", (Exception,), {"code": _LenRaises("RATE_LIMITED")})
    code = error_code(odd())
    assert (code, type(code)) == ("RATE_LIMITED", str)  # a plain str: safe to hash and compare


def test_a_retry_after_too_large_for_a_float_is_the_largest_float() -> None:
    import sys

    from durabilis.retry import retry_after_of

    assert retry_after_of(OperationError("RATE_LIMITED", retry_after=10**400)) == sys.float_info.max
    assert retry_after_of(OperationError("RATE_LIMITED", retry_after=-(10**400))) is None
