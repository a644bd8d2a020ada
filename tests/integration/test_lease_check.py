"""A lease too short for the socket timeout is said at once (Cluster).

On Cluster a hung node can hold the keep-alive's renewals of the claims on
healthy nodes for up to six socket timeouts (docs/layer.md, "Orphans"). A
lease shorter than that can run out under a live operation, which is then
taken over and run twice: the layer warns when it is built with such a lease.
Standalone has no such case (the server is the only node) and never warns.
"""

from __future__ import annotations

from typing import Any

import pytest

import durabilis
from durabilis import IdempotencyConfig
from durabilis.layer import DurabilityConfig, DurabilityLayer
from tests.support.logs import own_logs

pytestmark = pytest.mark.topologies("cluster")


def warnings_for(
    url: str, namespace: str, lease: float, socket_timeout: float
) -> list[dict[str, Any]]:
    store = durabilis.connect(url, namespace=namespace, socket_timeout=socket_timeout)
    config = DurabilityConfig(idempotency=IdempotencyConfig(in_progress_ttl_seconds=lease))
    try:
        with own_logs() as logs:
            DurabilityLayer(store, config).close()
        return [dict(e) for e in logs if e["event"] == "durability_lease_short_for_socket_timeout"]
    finally:
        store.close()


def test_a_lease_under_six_socket_timeouts_is_warned_of_on_cluster_only(
    redis_url: str, namespace: str, backend: str
) -> None:
    short = warnings_for(redis_url, namespace, lease=20, socket_timeout=5)
    if backend == "cluster":
        assert len(short) == 1
        assert short[0]["lease_seconds"] == 20 and short[0]["at_least"] == 30
    else:
        assert short == []
    assert warnings_for(redis_url, namespace, lease=30, socket_timeout=5) == []
