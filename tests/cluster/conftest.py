"""Cluster faults share the session cluster: each test starts and leaves it healthy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import LocalCluster


@pytest.fixture
def cluster(redis_cluster: LocalCluster, redis_url: str) -> Iterator[LocalCluster]:
    """The session cluster (the one ``redis_url`` points at), healthy before and after."""
    redis_cluster.wait_healthy(30)
    yield redis_cluster
    redis_cluster.wait_healthy(30)
