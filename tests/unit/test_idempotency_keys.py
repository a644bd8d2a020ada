"""IdempotencyKey and IdempotencyConfig: pure behaviour, no Redis."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

import durabilis
from durabilis import ConfigError, IdempotencyConfig, IdempotencyKey
from durabilis.errors import InvalidKey, InvalidPayload


def test_seed_vector_for_bytes_content() -> None:
    key = IdempotencyKey.new("agent-1", "wiki_write", b"hello")
    assert str(key) == "agent-1:wiki_write:2cf24dba5fb0a30e26e83b2ac5b9e29e"


def test_str_content_hashes_as_its_utf8_bytes() -> None:
    assert IdempotencyKey.new("a", "op", "héllo") == IdempotencyKey.new(
        "a", "op", "héllo".encode()
    )


def test_json_content_is_canonical_whatever_the_key_order() -> None:
    one = IdempotencyKey.new("a", "op", {"b": 1, "a": [1, 2, {"y": None, "x": True}]})
    two = IdempotencyKey.new("a", "op", {"a": [1, 2, {"x": True, "y": None}], "b": 1})
    assert one == two
    expected = hashlib.sha256(b'{"a":[1,2,{"x":true,"y":null}],"b":1}').hexdigest()[:32]
    assert str(one).endswith(":" + expected)


def test_colon_and_percent_in_parts_are_escaped_so_parts_never_collide() -> None:
    one = IdempotencyKey.new("a:b", "c", b"x")
    two = IdempotencyKey.new("a", "b:c", b"x")
    assert one != two
    assert str(one).startswith("a%3Ab:c:")
    assert str(IdempotencyKey.new("100%", "op", b"x")).startswith("100%25:op:")
    # A literal escape sequence never collides with the escaped character.
    assert IdempotencyKey.new("a%3Ab", "c", b"x") != one


def test_len_counts_utf8_bytes() -> None:
    key = IdempotencyKey.from_raw("é" * 10)
    assert len(key) == 20


def test_empty_parts_and_keys_are_rejected() -> None:
    with pytest.raises(InvalidKey):
        IdempotencyKey.new("", "op", b"x")
    with pytest.raises(InvalidKey):
        IdempotencyKey.new("a", "", b"x")
    with pytest.raises(InvalidKey):
        IdempotencyKey.from_raw("")


def test_non_json_content_is_a_typed_error() -> None:
    with pytest.raises(InvalidPayload):
        IdempotencyKey.new("a", "op", {"x": object()})
    with pytest.raises(InvalidPayload):
        IdempotencyKey.new("a", "op", float("nan"))


def test_from_raw_binds_the_payload_fingerprint() -> None:
    a = IdempotencyKey.from_raw("req-1", payload={"amount": 5})
    b = IdempotencyKey.from_raw("req-1", payload={"amount": 6})
    assert a.fingerprint and b.fingerprint and a.fingerprint != b.fingerprint
    assert IdempotencyKey.from_raw("req-1").fingerprint is None


def test_seed_defaults() -> None:
    cfg = IdempotencyConfig()
    assert cfg.enabled is True
    assert cfg.dedup_window_seconds == 3600
    assert cfg.max_key_length == 256


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dedup_window_seconds", 0),
        ("dedup_window_seconds", -1),
        ("dedup_window_seconds", float("nan")),
        ("max_key_length", 0),
        ("max_key_length", 2.5),
        ("in_progress_ttl_seconds", float("inf")),
        ("max_value_bytes", -5),
        ("enabled", "yes"),
    ],
)
def test_invalid_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        IdempotencyConfig(**{field: value})  # type: ignore[arg-type]
    assert info.value.field == field


def test_overlong_key_is_rejected_before_any_redis_call() -> None:
    # Port 1 on loopback has no server: any I/O would raise StorageUnavailable.
    store = durabilis.connect("redis://127.0.0.1:1/0", namespace="t", socket_connect_timeout=0.2)
    guard = durabilis.idempotency.IdempotencyGuard(store, IdempotencyConfig(max_key_length=16))
    with pytest.raises(InvalidKey):
        guard.check_and_record("k" * 17)
    with pytest.raises(durabilis.StorageUnavailable):
        guard.check_and_record("k" * 16)


def test_unknown_url_scheme_and_bad_sentinel_urls_are_clear_errors() -> None:
    for bad in ("redis+sentinel://127.0.0.1:26379", "redis+sentinel://127.0.0.1:26379/",
                "redis+sentinel://127.0.0.1:26379/mymaster/x",
                "redis+sentinel://127.0.0.1:26379/mymaster/0/1",
                "redis+sentinel://127.0.0.1/mymaster"):
        with pytest.raises(durabilis.errors.UnsupportedUrl, match="redis\\+sentinel://"):
            durabilis.connect(bad)
    with pytest.raises(durabilis.errors.UnsupportedUrl, match="unknown scheme"):
        durabilis.connect("postgres://x")


def test_a_sentinel_url_names_its_sentinels_service_db_and_credentials() -> None:
    # No I/O: redis-py asks the Sentinels for the primary on the first command.
    store = durabilis.connect(
        "redis+sentinel://app:s%40cret@127.0.0.1:26379,[::1]:26380/cache/3", namespace="t"
    )
    pool = store.client.connection_pool
    assert pool.service_name == "cache"
    assert pool.connection_kwargs["db"] == 3
    assert (pool.connection_kwargs["username"], pool.connection_kwargs["password"]) == (
        "app", "s@cret")
    sentinels = pool.sentinel_manager.sentinels
    assert [(s.connection_pool.connection_kwargs["host"],
             s.connection_pool.connection_kwargs["port"]) for s in sentinels] == [
        ("127.0.0.1", 26379), ("::1", 26380)]
    # the Sentinels get the socket timeouts, never the data nodes' password
    assert sentinels[0].connection_pool.connection_kwargs["socket_timeout"] == 5.0
    assert sentinels[0].connection_pool.connection_kwargs.get("password") is None
    assert "s@cret" not in repr(store)
    store.close()


@pytest.mark.parametrize(
    ("acks", "timeout"),
    [("replicas", 1.0), ("replicas:0", 1.0), ("replicas:x", 1.0), ("all", 1.0),
     ("replicas:65", 1.0), ("replicas:1", 0.0), ("replicas:1", 61.0), (1, 1.0),
     ("replicas:1+aof", 1.0), ("primary+", 1.0), ("fsync", 1.0)],
)
def test_an_invalid_acks_level_is_a_config_error(acks: Any, timeout: float) -> None:
    with pytest.raises(ConfigError) as info:
        durabilis.connect("redis://127.0.0.1:1/0", acks=acks, acks_timeout=timeout)
    assert info.value.field in ("acks", "acks_timeout")
    with pytest.raises(ConfigError):
        durabilis.DurabilityConfig(acks=acks, acks_timeout_seconds=timeout)


def test_invalid_namespace_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        durabilis.connect("memory://", namespace="bad ns with spaces")
    assert info.value.field == "namespace"


def test_an_acks_timeout_must_be_shorter_than_the_socket_timeout() -> None:
    """A WAIT outlasting the socket timeout would end as a lost connection."""
    with pytest.raises(ConfigError) as info:
        durabilis.connect("redis://127.0.0.1:1/0", acks="replicas:1", acks_timeout=5.0)
    assert info.value.field == "acks_timeout" and "socket_timeout" in str(info.value)
    store = durabilis.connect("redis://127.0.0.1:1/0", acks="replicas:1", acks_timeout=5.0,
                              socket_timeout=10)
    assert store.acks == "replicas:1"
    plain = durabilis.connect("redis://127.0.0.1:1/0", socket_timeout=0.5)
    with pytest.raises(ConfigError):
        durabilis.DurabilityLayer(plain, durabilis.DurabilityConfig(acks="replicas:1"))
    store.close()
    plain.close()


@pytest.mark.parametrize(
    "secret",
    ["s", "k" * 64, "long-" * 40, "clé-ü", b"\x00\xffbytes", bytearray(b"mutable"), b"k" * 65],
)
@pytest.mark.parametrize("content", [b"", b"hello", "text", {"b": 1, "a": [1, None]}])
def test_a_keyed_digest_is_hmac_sha256_of_the_content(secret: Any, content: Any) -> None:
    """The content key's keyed hash is RFC 2104's HMAC-SHA-256 (the padded key's
    states are kept per secret: the same digest, asked twice)."""
    from durabilis._codec import content_bytes
    from durabilis.core.idempotency import content_digest

    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    expected = hmac.new(raw, content_bytes(content), hashlib.sha256).hexdigest()[:32]
    assert content_digest(content, secret) == expected
    assert content_digest(content, secret) == expected  # (from the kept states)
    assert content_digest(content, None) == hashlib.sha256(content_bytes(content)).hexdigest()[:32]
