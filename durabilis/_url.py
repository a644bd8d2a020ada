"""Checks a connection URL before any client is built (``connect``, ``connect_async``).

redis-py raises a bare ``ValueError`` for some malformed URLs (a port out of
range, an unclosed ``[``, ``?db=x``) and silently ignores others (``/x`` as the
database, an unknown ``?option=`` handed to the connection as a string, query
options of the cluster and Sentinel forms). :func:`check_url` refuses all of
them with :class:`~durabilis.errors.UnsupportedUrl` naming the problem, before any I/O.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

from durabilis.errors import UnsupportedUrl

__all__ = ["check_url"]

_HOST = re.compile(r"^[A-Za-z0-9._~%-]*$")
_MAX_DB = 2**31 - 1
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})

# The query options redis-py reads from a redis://, rediss:// or unix:// URL,
# by kind of value (``redis.connection.URL_QUERY_ARGUMENT_PARSERS``, plus the
# string-valued connection arguments). Anything else would reach the
# connection as an unexpected keyword and fail at the first command.
_SECONDS = frozenset({"socket_timeout", "socket_connect_timeout", "timeout"})
_COUNTS = frozenset({"socket_read_size", "max_connections"})
_NATURALS = frozenset({"db", "health_check_interval", "ssl_min_version"})
_BOOLS = frozenset({
    "socket_keepalive", "retry_on_timeout", "ssl_check_hostname", "ssl_validate_ocsp",
    "ssl_validate_ocsp_stapled", "legacy_responses",
})
_PARSED_BY_REDIS = frozenset({
    "retry_on_error", "ssl_include_verify_flags", "ssl_exclude_verify_flags",
})
_TEXTS = frozenset({"client_name", "lib_name", "lib_version"})
_TLS_TEXTS = frozenset({
    "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_ca_path", "ssl_ca_data",
    "ssl_password", "ssl_ciphers",
})
_CERT_REQS = frozenset({"none", "optional", "required"})
QUERY_OPTIONS = frozenset({
    *_SECONDS, *_COUNTS, *_NATURALS, *_BOOLS, *_PARSED_BY_REDIS, *_TEXTS, *_TLS_TEXTS,
    "protocol", "ssl_cert_reqs",
})
"""Every query option a ``redis://``, ``rediss://`` or ``unix://`` URL may carry."""


def check_url(url: str) -> None:
    """Refuse a malformed connection URL, naming what is wrong (no I/O).

    Known schemes are checked in full: host, port (1..65535), database, query
    options (known names, each given once, with a valid value); the cluster and
    Sentinel forms take no query option (pass ``connect()`` keyword arguments).
    An unknown scheme is left to the caller (it names the schemes it knows).

    Raises:
        UnsupportedUrl: What is wrong with ``url`` (its password masked).
    """
    if not isinstance(url, str):
        raise UnsupportedUrl(repr(url), f"the URL must be a string, not {type(url).__name__}")
    if url != url.strip():
        raise UnsupportedUrl(url, "the URL starts or ends with white space")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise UnsupportedUrl(url, "the URL holds a control character (percent-encode it)")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in ("redis", "rediss", "unix", "redis+cluster", "redis+sentinel"):
        return
    if "#" in url:
        # An unescaped '#' ends the URL there: a password holding one would be cut.
        # (Shown without its credentials: the '#' may sit inside the password.)
        shown = f"{scheme}://***@{url.rpartition('@')[2]}" if "@" in url else url
        raise UnsupportedUrl(
            shown, "a '#' in the URL (percent-encode it as %23, e.g. in a password)"
        )
    parts = _split(url)
    if scheme in ("redis", "rediss"):
        _host_port(url, _hosts(parts), scheme)
        _query(url, parts.query, scheme, path_db=_path_db(url, parts.path))
    elif scheme == "unix":
        if not parts.path or parts.path == "/":
            raise UnsupportedUrl(url, "unix:// needs a socket path (unix:///path/to/redis.sock)")
        _query(url, parts.query, scheme, path_db=None)
    else:
        _check_nodes_form(url, parts, scheme)


def _check_nodes_form(url: str, parts: SplitResult, scheme: str) -> None:
    """``redis+cluster://`` and ``redis+sentinel://``: hosts, path, no query."""
    hosts = _hosts(parts)
    if not hosts.strip():
        raise UnsupportedUrl(url, f"{scheme}:// needs host:port[,host:port...]")
    for node in hosts.split(","):
        _host_port(url, node.strip(), scheme, port_required=True)
    if parts.query:
        raise UnsupportedUrl(
            url, f"bad query option: {scheme}:// takes none (pass connect() keyword "
            "arguments instead)",
        )
    if scheme == "redis+cluster":
        if parts.path not in ("", "/", "/0"):
            raise UnsupportedUrl(url, f"bad db {parts.path!r}: Redis Cluster has only database 0")
        return
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise UnsupportedUrl(
            url, "redis+sentinel:// needs host:port[,host:port...]/service_name[/db]"
        )
    if len(path) == 2:
        _path_db(url, "/" + path[1])


def _split(url: str) -> SplitResult:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (urlsplit checks brackets; .port checks the rest lazily)
    except ValueError as exc:
        text = str(exc)
        if "IPv6" in text:
            scheme, _, rest = url.partition("://")
            rest, _, query = rest.partition("?")
            netloc, slash, path = rest.partition("/")
            if "]" in netloc.rpartition("@")[2]:  # balanced, not an address: checked per host
                return SplitResult(scheme, netloc, slash + path, query, "")
            raise UnsupportedUrl(
                url, "bad host: an unclosed '[' (write an IPv6 address as [::1]:6379)"
            ) from None
        if "Port" in text or "port" in text:
            return urlsplit(url)  # a multi-host netloc, or a bad port: checked per host
        raise UnsupportedUrl(url, f"malformed URL: {text}") from None
    return parts


def _hosts(parts: SplitResult) -> str:
    """The netloc without its ``user:password@``."""
    return parts.netloc.rpartition("@")[2]


def _host_port(url: str, where: str, scheme: str, *, port_required: bool = False) -> None:
    """Check one ``host[:port]`` (IPv6 in brackets)."""
    if where.startswith("["):
        inner, close, rest = where[1:].partition("]")
        if not close:
            raise UnsupportedUrl(
                url, "bad host: an unclosed '[' (write an IPv6 address as [::1]:6379)"
            )
        try:
            ipaddress.IPv6Address(inner.split("%", 1)[0])
        except ValueError:
            raise UnsupportedUrl(url, f"bad host [{inner}]: not an IPv6 address") from None
        if rest and not rest.startswith(":"):
            raise UnsupportedUrl(url, f"bad host {where!r}: ':port' must follow ']'")
        port = rest[1:] if rest else None
    else:
        if where.count(":") > 1:
            raise UnsupportedUrl(
                url, f"bad host {where!r}: write an IPv6 address in brackets ([::1]:6379)"
            )
        host, colon, port_text = where.partition(":")
        port = port_text if colon else None
        if not _HOST.fullmatch(host):
            raise UnsupportedUrl(url, f"bad host {host!r}: not a host name or address")
        if port_required and not host:
            raise UnsupportedUrl(url, f"bad host: {scheme}:// needs host:port[,host:port...]")
    if port is None or port == "":
        if port_required or port == "":
            raise UnsupportedUrl(
                url, f"bad port: missing after {where!r} (a number in 1..65535)"
            )
        return
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UnsupportedUrl(url, f"bad port {port!r}: must be a number in 1..65535")


def _path_db(url: str, path: str) -> int | None:
    """The database number of a ``/<db>`` path (``None``: no path)."""
    if path in ("", "/"):
        return None
    db = path[1:]
    if not (db.isascii() and db.isdigit()) or int(db) > _MAX_DB:
        raise UnsupportedUrl(
            url, f"bad db {db!r}: the path is /<database number>, e.g. /0"
        )
    return int(db)


def _query(url: str, query: str, scheme: str, *, path_db: int | None) -> None:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise UnsupportedUrl(url, f"bad query {query!r}: not name=value[&name=value...]"
                             ) from None
    seen: set[str] = set()
    for name, value in pairs:
        if name not in QUERY_OPTIONS:
            raise UnsupportedUrl(url, f"unknown query option {name!r}")
        if name in seen:
            raise UnsupportedUrl(url, f"bad query option {name!r}: given more than once")
        seen.add(name)
        if name.startswith("ssl_") and scheme != "rediss":
            problem: str | None = "TLS options need rediss://"
        else:
            problem = _bad_value(name, value)
        if problem is not None:
            raise UnsupportedUrl(url, f"bad query option {name}={value!r}: {problem}")
        if name == "db" and path_db is not None and int(value) != path_db:
            raise UnsupportedUrl(url, f"bad db: /{path_db} in the path but db={value} in the query")


def _bad_value(name: str, value: str) -> str | None:
    """What is wrong with the value of query option ``name`` (``None``: nothing)."""
    whole = value.isascii() and value.isdigit()
    checks: list[tuple[frozenset[str], bool, str]] = [
        (_SECONDS, _number(value) and 0 < float(value) < math.inf, "must be seconds > 0"),
        (_COUNTS, whole and int(value) >= 1, "must be a whole number >= 1"),
        (_NATURALS, whole and int(value) <= _MAX_DB, "must be a whole number >= 0"),
        (_BOOLS, value.lower() in _TRUE | _FALSE, "must be true or false"),
        (frozenset({"protocol"}), value in ("2", "3"), "must be 2 or 3"),
        (frozenset({"ssl_cert_reqs"}), value.lower() in _CERT_REQS,
         "must be none, optional or required"),
        (_PARSED_BY_REDIS, _redis_parses(name, value), "not a valid value"),
    ]
    for names, ok, problem in checks:
        if name in names:
            return None if ok else problem
    return None if value else "empty"


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _redis_parses(name: str, value: str) -> bool:
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS  # noqa: PLC0415

    parser: Any = URL_QUERY_ARGUMENT_PARSERS.get(name)
    if parser is None:
        return name not in _PARSED_BY_REDIS  # (an older redis-py: not one it reads)
    try:
        parser(value)
    except (TypeError, ValueError):
        return False
    return True
