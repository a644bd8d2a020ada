"""``acks`` is one typed value, parsed once (``durabilis._acks.Acks``): the
config, ``connect`` and ``Store.with_acks`` take the text, the store and
``doctor`` read the value. No server: a store is built without connecting."""

from __future__ import annotations

from typing import Any

import pytest

import durabilis
from durabilis._acks import DEFAULT_ACKS_TIMEOUT, PRIMARY, Acks, as_acks
from durabilis.layer import DurabilityConfig


@pytest.mark.parametrize(("text", "replicas", "fsync"), [
    ("primary", 0, False), ("primary+fsync", 0, True), ("replicas:1", 1, False),
    ("replicas:64+fsync", 64, True),
])
def test_a_valid_level_parses_to_its_parts(text: str, replicas: int, fsync: bool) -> None:
    level = Acks.parse(text, 0.25)
    assert (level.text, level.replicas, level.fsync, level.timeout) == (text, replicas, fsync, 0.25)
    assert level.wait_ms == 250 and str(level) == text
    assert level.waits is (replicas > 0 or fsync)


@pytest.mark.parametrize("bad", [
    "", "replicas", "replicas:", "replicas:0", "replicas:65", "replicas:-1", "replicas:1.5",
    "replica:1", "Primary", "primary+", "primary+sync", "replicas:1+fsync+fsync", " primary",
    None, 1, b"primary",
])
def test_a_bad_level_is_a_config_error_naming_acks(bad: Any) -> None:
    with pytest.raises(durabilis.ConfigError) as caught:
        Acks.parse(bad)
    assert caught.value.field == "acks"


@pytest.mark.parametrize("timeout", [0, 0.0009, 60.5, -1, True, "1", None, float("nan")])
def test_a_bad_timeout_is_a_config_error_naming_acks_timeout(timeout: Any) -> None:
    with pytest.raises(durabilis.ConfigError) as caught:
        Acks.parse("replicas:1", timeout)
    assert caught.value.field == "acks_timeout"


def test_a_parsed_level_passes_through_and_carries_its_timeout() -> None:
    level = Acks.parse("replicas:2", 0.5)
    assert as_acks(level) is level
    assert as_acks("replicas:2") == Acks.parse("replicas:2", DEFAULT_ACKS_TIMEOUT)
    with pytest.raises(durabilis.ConfigError, match="carries its own timeout"):
        as_acks(level, 0.5)
    assert Acks.parse("primary") == PRIMARY and not PRIMARY.waits


def test_the_config_parses_its_level_once_and_the_store_takes_it() -> None:
    cfg = DurabilityConfig(acks="replicas:2+fsync", acks_timeout_seconds=0.25)
    assert cfg.acks_level == Acks.parse("replicas:2+fsync", 0.25)
    assert DurabilityConfig().acks_level is None  # the store's own level
    assert DurabilityConfig(acks_timeout_seconds=0.5).acks_level is None
    with pytest.raises(durabilis.ConfigError):
        DurabilityConfig(acks_timeout_seconds=0)
    with pytest.raises(durabilis.ConfigError):
        DurabilityConfig(acks="replicas:0")

    store = durabilis.connect("redis://127.0.0.1:1/0")  # (no I/O until first use)
    assert store.acks == "primary" and store.acks_level is PRIMARY
    assert cfg.acks_level is not None
    twin = store.with_acks(cfg.acks_level)
    assert twin.acks == "replicas:2+fsync" and twin.acks_level is cfg.acks_level
    assert store.with_acks("replicas:1").acks_level == Acks.parse("replicas:1")
    with pytest.raises(durabilis.ConfigError) as caught:
        store.with_acks("replicas:0")
    assert caught.value.field == "acks"
    with pytest.raises(durabilis.ConfigError) as caught:
        durabilis.connect("redis://127.0.0.1:1/0", acks="replicas:1", acks_timeout=99)
    assert caught.value.field == "acks_timeout"
