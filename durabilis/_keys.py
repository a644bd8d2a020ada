"""The ONLY place that builds Redis key names.

Rules (DESIGN §3):
- every key starts with the namespace, so an ACL user can be limited to
  ``<namespace>:*`` and two apps can share one Redis;
- all keys one script touches share ONE hash tag (the ``{...}`` part), so
  every script runs on Redis Cluster. One exception, by construction: a
  claim's birth-index bucket (:meth:`KeySpace.inflight_bucket`) has a tag of
  its own chosen to hash to the claim's slot, which is what Cluster requires;
- names are readable in ``redis-cli``: ``durabilis:cb:{memory_service}``.

Free-form parts (task ids, agent ids) are percent-escaped so that ``:`` inside
a part can never make two different tuples build the same key.
"""

from __future__ import annotations

import binascii
import re

from durabilis.core.keyparts import escape_part as escape_part  # noqa: PLC0414  (re-exported)
from durabilis.errors import ConfigError

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def escape_tag(text: str) -> str:
    """Percent-escape ``%``, ``{`` and ``}`` only: safe inside a hash tag, ``:`` kept readable."""
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


_TAG_ESCAPES = re.compile("%(25|7B|7D)")
_TAG_CHARS_BY_CODE = {"25": "%", "7B": "{", "7D": "}"}


def unescape_tag(text: str) -> str:
    """Inverse of :func:`escape_tag`."""
    return _TAG_ESCAPES.sub(lambda m: _TAG_CHARS_BY_CODE[m.group(1)], text)


def glob_escape(text: str) -> str:
    """``text`` matched literally in a Redis glob (SCAN MATCH, HSCAN MATCH)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def validate_namespace(namespace: str) -> str:
    """Return ``namespace`` if it is 1-64 chars of ``[A-Za-z0-9_.-]``.

    Raises:
        ConfigError: Otherwise (field ``namespace``).
    """
    if not isinstance(namespace, str) or not _NAMESPACE_RE.fullmatch(namespace):
        raise ConfigError(
            "namespace", f"must be 1-64 characters of [A-Za-z0-9_.-], got {namespace!r}"
        )
    return namespace


class KeySpace:
    """Builds every key of one namespace."""

    __slots__ = ("namespace",)

    def __init__(self, namespace: str) -> None:
        self.namespace = validate_namespace(namespace)

    def pattern(self) -> str:
        """Glob matching every key of this namespace (for SCAN and ACLs)."""
        return f"{self.namespace}:*"

    # --- idempotency: one key per record, the record key is its own tag -----

    def idem(self, key: str) -> str:
        """The hash holding one idempotency record."""
        return f"{self.namespace}:idem:{{{escape_tag(key)}}}"

    def idem_pattern(self) -> str:
        return f"{self.namespace}:idem:*"

    def idem_pattern_around(self, head: str, tail: str) -> str:
        """Glob (for an operator's SCAN) matching the records of every key that
        starts with ``head`` and ends with ``tail``: ``idem_pattern_around("%raw:",
        ":order-1")`` finds caller key ``order-1`` of every agent."""
        return (f"{self.namespace}:idem:{{{glob_escape(escape_tag(head))}*"
                f"{glob_escape(escape_tag(tail))}}}")

    def idem_key_of(self, name: str) -> str | None:
        """The idempotency key whose record is ``name`` (inverse of :meth:`idem`);
        ``None`` for a name :meth:`idem` never builds."""
        head = f"{self.namespace}:idem:{{"
        if not (name.startswith(head) and name.endswith("}")):
            return None
        tagged = name[len(head):-1]
        if "{" in tagged or "}" in tagged:
            return None
        return unescape_tag(tagged)

    # --- circuit breaker: every key of one breaker tagged by its name -------

    def breaker(self, name: str) -> str:
        """The hash holding a breaker's state."""
        return f"{self.namespace}:cb:{{{escape_part(name)}}}"

    def breaker_window(self, name: str) -> str:
        """The sorted set holding a breaker's sliding window of results."""
        return f"{self.breaker(name)}:window"

    def breaker_probes(self, name: str) -> str:
        """The hash of in-flight probe permits of a breaker."""
        return f"{self.breaker(name)}:probes"

    def breaker_events(self, name: str) -> str:
        """The capped stream of a breaker's state transitions."""
        return f"{self.breaker(name)}:events"

    def breaker_config(self, name: str) -> str:
        """The hash holding a breaker's config (shared by the fleet)."""
        return f"{self.breaker(name)}:config"

    def breaker_reporters(self, name: str) -> str:
        """The sorted set of distinct replicas that reported failures recently."""
        return f"{self.breaker(name)}:reporters"

    def breaker_names(self) -> str:
        """The set of every breaker name that has state in this namespace."""
        return f"{self.namespace}:cb-names"

    # --- retry budget: one tag per operation type ---------------------------

    def retry_budget(self, operation_type: str) -> str:
        """The hash of bucketed call/retry counts (and the settings seen) of an
        operation type's retry budget (``budget2``: the layout of 0.x kept
        ``budget``, which replicas of both versions must not share)."""
        return f"{self.namespace}:retry:{{{escape_part(operation_type)}}}:budget2"

    # --- checkpoints: one tag for the namespace's checkpoints ---------------
    # One slot holds them all so the fleet-wide ``max_checkpoints`` cap is one
    # atomic step (evicting the oldest of ANY task) even on Cluster.

    def ckpt(self, *parts: str) -> str:
        """A checkpoint-pillar key: ``<ns>:ckpt:{ckpt}:<part>:<part>...``."""
        tail = ":".join(escape_part(p) for p in parts)
        base = f"{self.namespace}:ckpt:{{ckpt}}"
        return f"{base}:{tail}" if tail else base

    # --- dead-letter queue: one tag for the namespace's DLQ -----------------

    def dlq(self, *parts: str) -> str:
        """A DLQ key: ``<ns>:dlq:{dlq}:<part>...`` (the stream is ``dlq("stream")``)."""
        tail = ":".join(escape_part(p) for p in parts)
        return f"{self.namespace}:dlq:{{dlq}}:{tail}" if tail else f"{self.namespace}:dlq:{{dlq}}"

    # --- the composed layer --------------------------------------------------

    def layer(self, *parts: str) -> str:
        """A key of the composed layer: ``<ns>:layer:{layer}:<part>...``."""
        tail = ":".join(escape_part(p) for p in parts)
        return f"{self.namespace}:layer:{{layer}}:{tail}"

    def inflight_bucket(self, tag: str) -> str:
        """One bucket of the in-flight "birth" index (unfused stores, i.e. Cluster):
        ``<ns>:layer:inflight:{<tag>}``, the tag chosen to share its hash slot
        with the claims it lists (see :func:`bucket_tag`)."""
        return f"{self.namespace}:layer:inflight:{{{tag}}}"

    def inflight_bucket_pattern(self) -> str:
        return f"{self.namespace}:layer:inflight:{{*"

    def config(self, *parts: str) -> str:
        """A key of the fleet-wide configuration: ``<ns>:config:{config}:<part>...``."""
        tail = ":".join(escape_part(p) for p in parts)
        return f"{self.namespace}:config:{{config}}:{tail}"


CLUSTER_SLOTS = 16384
"""Redis Cluster's hash slots."""


def hash_slot(key: str) -> int:
    """The Redis Cluster hash slot of ``key``: the CRC16 (XMODEM) of its hash tag
    (the first ``{...}`` with something inside), else of the whole key, as the
    cluster spec says and ``redis.crc.key_slot`` computes (no redis import: the
    core's plans name slots too)."""
    raw = key.encode("utf-8", "surrogatepass")
    start = raw.find(b"{")
    if start > -1:
        end = raw.find(b"}", start + 1)
        if end > -1 and end != start + 1:
            raw = raw[start + 1 : end]
    return binascii.crc_hqx(raw, 0) % CLUSTER_SLOTS


_TAG_CHARS = 5  # (on 4 characters the low nibbles reach only part of the CRC values)


def _slot_basis() -> list[tuple[int, int, int]]:
    """CRC16 (XMODEM, Cluster's) of a tag of :data:`_TAG_CHARS` characters of
    ``@A-O`` is an affine function of their low-nibble bits: a basis (pivot bit,
    CRC part, tag bits) to solve for the tag of any slot in 16 steps."""
    base = bytes([0x40] * _TAG_CHARS)
    c0 = binascii.crc_hqx(base, 0)
    basis: dict[int, tuple[int, int]] = {}
    for j in range(4 * _TAG_CHARS):
        bits = bytearray(base)
        bits[j // 4] |= 1 << (j % 4)
        image, pre = binascii.crc_hqx(bytes(bits), 0) ^ c0, 1 << j
        for bit in sorted(basis, reverse=True):
            if image >> bit & 1:
                image ^= basis[bit][0]
                pre ^= basis[bit][1]
        if image:
            basis[image.bit_length() - 1] = (image, pre)
    if len(basis) != 16:  # (it is: checked by tests/unit/test_cluster_slots.py)
        raise RuntimeError("CRC16 does not reach every value on these tags")
    return [(bit, image, pre) for bit, (image, pre) in sorted(basis.items(), reverse=True)]


_BASIS = _slot_basis()
_BASE_CRC = binascii.crc_hqx(bytes([0x40] * _TAG_CHARS), 0)


def bucket_tag(index: int, buckets: int) -> str:
    """The hash tag of bucket ``index`` of the in-flight birth index.

    With :data:`CLUSTER_SLOTS` buckets (Cluster), bucket ``s``'s tag hashes to
    slot ``s`` (five characters of ``@A-O``, solved for, not searched), so a
    claim's entry lives in its claim's own slot and one script writes both.
    With fewer (the fault simulator's unfused standalone store), the tags are
    plain names: ``b0``, ``b1``...
    """
    if buckets != CLUSTER_SLOTS:
        return f"b{index}"
    want, tag = (index % CLUSTER_SLOTS) ^ _BASE_CRC, 0
    for bit, image, pre in _BASIS:
        if want >> bit & 1:
            want ^= image
            tag ^= pre
    return bytes(0x40 | (tag >> 4 * i & 0xF) for i in range(_TAG_CHARS)).decode()
