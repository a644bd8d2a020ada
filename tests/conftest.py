"""The real-Redis harness.

The session starts its own ``redis-server`` on a free loopback port (or uses
``DURABILIS_TEST_REDIS_URL``) and every test gets a fresh namespace. A missing
redis-server fails loudly with the install hint: it is never a skip.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import durabilis
from durabilis.testing import INSTALL_HINT, RedisServer, find_redis_server, isolated_namespace


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of the session's real Redis server."""
    given = os.environ.get("DURABILIS_TEST_REDIS_URL")
    if given:
        yield given
        return
    if find_redis_server() is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    with tempfile.TemporaryDirectory(prefix="durabilis-test-") as tmp:
        server = RedisServer(tmp).start()
        try:
            yield server.url
        finally:
            server.stop()


@pytest.fixture
def namespace() -> str:
    return isolated_namespace()


@pytest.fixture
def store(redis_url: str, namespace: str) -> Iterator[durabilis.Store]:
    s = durabilis.connect(redis_url, namespace=namespace)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain redis-py client on the same server (to plant data, inspect keys)."""
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (appendonly, fsync always): may be killed."""
    if find_redis_server() is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    server = RedisServer(tmp_path / "redis", appendonly=True, appendfsync="always").start()
    try:
        yield server
    finally:
        server.stop(kill=True)
