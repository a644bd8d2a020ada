"""Isolation and access: namespaces, an ACL user limited to one namespace, TLS."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import durabilis
from durabilis import DurabilisError, StorageUnavailable
from durabilis.idempotency import Duplicate, IdempotencyGuard, New
from durabilis.testing import RedisServer, free_port, isolated_namespace
from tests.support.acl import rules_for

pytestmark = pytest.mark.topologies("cluster")


def each_node(raw: Any) -> Iterator[Any]:
    """A plain client per node (the one client on a standalone server)."""
    if isinstance(raw, redis.cluster.RedisCluster):
        for node in raw.get_nodes():
            yield raw.get_redis_connection(node)
    else:
        yield raw


def idempotency_flow(store: durabilis.Store) -> None:
    guard = IdempotencyGuard(store)
    claim = guard.check_and_record("order-1", placeholder="pending")
    assert isinstance(claim, New) and claim.token
    dup = guard.check_and_record("order-1")
    assert isinstance(dup, Duplicate) and dup.in_progress
    guard.record("order-1", {"charged": 10}, token=claim.token)
    done = guard.check("order-1")
    assert done is not None and done.original_result == {"charged": 10}
    other = guard.check_and_record("order-2")
    assert isinstance(other, New) and other.token
    assert guard.release("order-2", other.token) is True
    run_many = store.run_many([guard._ops.check(guard._ops.validate_key(k))
                               for k in ("order-1", "order-2")])
    assert len(run_many) == 2
    assert store.ping()


def layer_flow(store: durabilis.Store) -> None:
    """The layer's whole life under the application's user: no SCAN needed."""
    from durabilis import OperationError
    from durabilis.layer import DurabilityConfig, DurabilityLayer
    from durabilis.testing import instant_retries

    layer = DurabilityLayer(store, DurabilityConfig())

    def down(ctx: Any) -> Any:
        raise OperationError("NETWORK_TIMEOUT", "down")

    assert layer.execute("a1", "job", {"n": 1}, lambda ctx: "ok") == "ok"
    with instant_retries(), pytest.raises(durabilis.RetryExhausted):
        layer.execute("a1", "job", {"n": 2}, down, idempotency_key="k-2")
    assert layer.recover_orphans() == []
    assert layer.replay_pending(lambda ctx: "replayed").replayed == 1
    assert layer.stats().parked == 1
    layer.close()


def claim_error(url: str, namespace: str, **options: Any) -> DurabilisError:
    """The error a first claim through ``url`` raises (the test fails if it succeeds)."""
    store = durabilis.connect(url, namespace=namespace, **options)
    try:
        with pytest.raises(DurabilisError) as info:
            IdempotencyGuard(store).check_and_record("k")
        return info.value
    finally:
        store.close()


# --- namespaces -------------------------------------------------------------------------------


def test_two_namespaces_never_see_each_others_data(redis_url: str, raw: Any) -> None:
    first = isolated_namespace("tenant")
    # A second namespace that starts like the first: its keys must not match "<first>:*".
    second = first + "-2"
    with durabilis.connect(redis_url, namespace=first) as a, \
            durabilis.connect(redis_url, namespace=second) as b:
        ga, gb = IdempotencyGuard(a), IdempotencyGuard(b)
        ca, cb = ga.check_and_record("same-key"), gb.check_and_record("same-key")
        assert isinstance(ca, New) and isinstance(cb, New)  # each its own claim
        ga.record("same-key", "A's result", token=ca.token)
        assert gb.check("same-key") is not None and gb.check("same-key").in_progress
        gb.record("same-key", "B's result", token=cb.token)
        assert ga.check("same-key").original_result == "A's result"
        assert gb.check("same-key").original_result == "B's result"
        assert ga.record_count() == 1 and gb.record_count() == 1
        assert ga.release("same-key", str(cb.token)) is False  # another tenant's token
    names = sorted(k.decode() for k in raw.scan_iter(match=f"{first}:*"))
    assert names == [f"{first}:idem:{{same-key}}"]


# --- ACL --------------------------------------------------------------------------------------


@pytest.fixture
def acl_user(raw: Any, namespace: str) -> Iterator[tuple[str, str]]:
    """The user docs/operations.md tells operators to create, for this namespace."""
    name, password = f"durabilis-{namespace}", "s3cret-for-tests"
    for node in each_node(raw):
        node.execute_command("ACL", "SETUSER", name, *rules_for(namespace, password))
        node.execute_command("ACL", "LOG", "RESET")
    try:
        yield name, password
    finally:
        for node in each_node(raw):
            node.execute_command("ACL", "DELUSER", name)


def test_everything_works_under_the_documented_acl_user_limited_to_the_namespace(
    redis_url: str, raw: Any, namespace: str, acl_user: tuple[str, str]
) -> None:
    user, password = acl_user
    url = redis_url.replace("://", f"://{user}:{password}@", 1)
    with durabilis.connect(url, namespace=namespace) as store:
        idempotency_flow(store)
        layer_flow(store)

    async def async_flow() -> None:
        store = durabilis.aio.connect(url, namespace=namespace)
        try:
            guard = durabilis.aio.IdempotencyGuard(store)
            claim = await guard.check_and_record("async-order")
            assert isinstance(claim, New)
            await guard.record("async-order", "ok", token=claim.token)
            assert (await guard.check("async-order")).original_result == "ok"
        finally:
            await store.close()

    asyncio.run(async_flow())
    # redis-py's connection handshake sends CLIENT SETINFO (and, from redis-py 8,
    # CLIENT MAINT_NOTIFICATIONS) best-effort and ignores a refusal; on a server that
    # does not know the subcommand the ACL log names it just "client". durabilis
    # itself never sends CLIENT.
    denied = [(entry.get("reason"), entry.get("object"))
              for node in each_node(raw) for entry in node.acl_log()
              if entry.get("username") == user
              and str(entry.get("object")).split("|")[0] != "client"]
    assert denied == []  # not a single command or key refused
    with durabilis.connect(url, namespace=namespace) as store, \
            pytest.raises(durabilis.DurabilisError, match="ACL"):
        IdempotencyGuard(store).record_count()  # an operator's task (SCAN)


def test_the_acl_user_is_refused_outside_its_namespace_with_a_typed_error(
    redis_url: str, raw: Any, namespace: str, acl_user: tuple[str, str]
) -> None:
    user, password = acl_user
    url = redis_url.replace("://", f"://{user}:{password}@", 1)
    error = claim_error(url, namespace + "-other")
    assert not isinstance(error, StorageUnavailable)  # a config error, not an outage
    assert "ACL" in str(error)
    assert raw.exists(f"{namespace}-other:idem:{{k}}") == 0


# --- TLS --------------------------------------------------------------------------------------


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1/localhost and its key, made with the openssl CLI."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=30,
    )
    return cert, key


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A redis-server speaking only TLS on a loopback port: ``(port, its certificate)``."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make a test certificate")
    cert, key = self_signed(tmp_path, "redis-test")
    port = free_port()
    server = RedisServer(
        tmp_path / "tls", port=0, unix_socket=str(tmp_path / "tls.sock"),
        extra=["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
               "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"],
    )
    try:
        server.start()
    except RuntimeError as exc:
        if "tls" in str(exc).lower():
            pytest.skip(f"this redis-server was built without TLS: {exc}")
        raise
    try:
        yield port, cert
    finally:
        server.stop(kill=True)


def test_rediss_works_with_a_verified_certificate_and_fails_closed_otherwise(
    tls_server: tuple[int, Path], tmp_path: Path
) -> None:
    port, cert = tls_server
    url = f"rediss://127.0.0.1:{port}/0"
    with durabilis.connect(url, namespace=isolated_namespace(), ssl_ca_certs=str(cert)) as store:
        idempotency_flow(store)
    stranger, _ = self_signed(tmp_path, "stranger")
    # A server whose certificate the client does not trust, and plain text to the TLS port.
    untrusted = claim_error(url, "t", ssl_ca_certs=str(stranger), socket_connect_timeout=2)
    assert isinstance(untrusted, StorageUnavailable) and "certificate" in str(untrusted).lower()
    plain = claim_error(f"redis://127.0.0.1:{port}/0", "t", socket_timeout=1,
                        socket_connect_timeout=1)
    assert isinstance(plain, StorageUnavailable)
