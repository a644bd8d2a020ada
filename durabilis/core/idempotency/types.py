"""Idempotency's values (no I/O): the key and how it is derived and checked, the
config, the claim's outcomes (:class:`New`, :class:`Duplicate`).

The shells (:mod:`durabilis.idempotency`) re-export them; call builders and
decoders are in :mod:`durabilis.core.idempotency.ops`.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durabilis import _codec
from durabilis._limits import MAX_DEDUP_WINDOW_SECONDS, MAX_STORED_BYTES, check_limits
from durabilis._validate import positive_number as _positive_number
from durabilis.errors import (
    ConfigError,
    InvalidKey,
    InvalidPayload,
)

MAX_WINDOW_SECONDS = MAX_DEDUP_WINDOW_SECONDS
"""Longest dedup window (366 days; the lease: ``MAX_LEASE_SECONDS``, one hour).
Every maximum lives in :mod:`durabilis._limits` (docs/production.md, Limits)."""

MAX_VALUE_BYTES = MAX_STORED_BYTES
"""Largest ``max_value_bytes``: what one Redis string can hold."""


KEY_SECRET_ENV = "DURABILIS_KEY_SECRET"
"""Environment variable holding the namespace's content-key secret."""

PREVIOUS_KEY_SECRETS_ENV = "DURABILIS_PREVIOUS_KEY_SECRETS"
"""Environment variable holding the secrets a rotation replaced (comma-separated)."""

MIN_SECRET_CHARS = 16
"""Shortest content-key secret (current or previous)."""

MAX_PREVIOUS_KEY_SECRETS = 8
"""Most previous secrets configured at once (each is one more read per claim)."""

RAW_PREFIX = "%raw:"
"""The key space of caller-supplied keys in the layer (content keys never start so)."""

CALLER_SCOPE_MAX_BYTES = 1024
"""Room for the scope ``%raw:<agent>:`` of a caller key as the layer stores it:
``max_key_length`` counts the caller's key alone, and the stored form
``%raw:<agent>:<key>`` is at most ``max_key_length + CALLER_SCOPE_MAX_BYTES``
bytes (an agent id of 256 bytes, escaped, always fits)."""


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace(":", "%3A")


_UNESCAPE = re.compile("%(25|3A)")


def _unescape(part: str) -> str:
    return _UNESCAPE.sub(lambda m: "%" if m.group(1) == "25" else ":", part)


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 form, Redis cannot store it
        return False
    return True


def fingerprint(payload: Any) -> str:
    """The payload fingerprint stored with caller-supplied keys (SHA-256 hex)."""
    return hashlib.sha256(_codec.content_bytes(payload)).hexdigest()


def payload_fingerprint(payload: Any) -> str:
    """:func:`fingerprint` of a JSON-compatible payload; of any other value the
    layer can store (``datetime``, ``Decimal``, tuples…), SHA-256 of its msgpack
    encoding (exact types; equal mappings built in another key order differ).

    Raises:
        InvalidPayload: A value msgpack cannot encode either.
    """
    try:
        return fingerprint(payload)
    except InvalidPayload:
        return "m" + hashlib.sha256(_codec.pack(payload, what="payload")).hexdigest()[1:]


def content_digest(content: Any, secret: str | bytes | None = None) -> str:
    """The ``hash32`` of a content key (see :meth:`IdempotencyKey.new`).

    Raises:
        InvalidPayload: Content that is not bytes, str or JSON-compatible.
    """
    data = _codec.content_bytes(content)
    if secret:
        pads = _PADS.get(secret) if type(secret) is str or type(secret) is bytes else None
        if pads is None:
            pads = _pads(secret)
        inner = pads[0].copy()
        inner.update(data)
        outer = pads[1].copy()
        outer.update(inner.digest())
        keyed: str = outer.hexdigest()
        return keyed[:32]
    return hashlib.sha256(data).hexdigest()[:32]


_PADS: dict[str | bytes, tuple[Any, Any]] = {}
"""Per secret, SHA-256 states that have taken HMAC's inner and outer padded key
(RFC 2104): a digest copies them rather than setting up the key each time
(0.6 us against 1.4 us here; tests/unit/test_idempotency_keys.py checks it
against :func:`hmac.new`). A few secrets at most (the current one and the
previous ones of a rotation): bounded all the same."""


def _pads(secret: str | bytes) -> tuple[Any, Any]:
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if len(key) > _SHA256_BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_SHA256_BLOCK, b"\0")
    pads = (
        hashlib.sha256(key.translate(_IPAD)),
        hashlib.sha256(key.translate(_OPAD)),
    )
    if len(_PADS) >= 16:
        _PADS.clear()
    if type(secret) is str or type(secret) is bytes:
        _PADS[secret] = pads
    return pads


_SHA256_BLOCK = 64
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """A deterministic idempotency key: ``{agent_id}:{operation_type}:{hash32}``.

    Build it with :meth:`new` (content-addressed) or :meth:`from_raw`
    (caller-supplied, e.g. an HTTP ``Idempotency-Key`` header).

    Attributes:
        value: The key text.
        fingerprint: The payload's fingerprint for caller-supplied keys, checked
            on every claim (reuse with another payload raises
            :class:`~durabilis.errors.KeyReuseMismatch`); ``None`` for content keys.
    """

    value: str
    fingerprint: str | None = None

    @classmethod
    def new(
        cls, agent_id: str, operation_type: str, content: Any, *,
        secret: str | bytes | None = None,
    ) -> IdempotencyKey:
        """Content-addressed key.

        ``hash32`` is the first 32 hex chars of SHA-256 of the content (of its
        HMAC-SHA-256 keyed by ``secret`` when one is given: then a key name does
        not reveal a guessable payload): bytes as they are, ``str`` as UTF-8,
        anything else as sorted-key compact JSON.
        ``:`` and ``%`` in ``agent_id`` / ``operation_type`` are percent-escaped
        so parts never collide.

        Raises:
            InvalidKey: An empty ``agent_id`` or ``operation_type``.
            InvalidPayload: Content that is not bytes, str or JSON-compatible.
        """
        for name, part in (("agent_id", agent_id), ("operation_type", operation_type)):
            if not isinstance(part, str) or not part:
                raise InvalidKey(str(part), f"{name} must be a non-empty string")
            if not _is_unicode(part):
                raise InvalidKey(part, f"{name} must be valid Unicode (no lone surrogates)")
        digest = content_digest(content, secret)
        return cls(f"{_escape(agent_id)}:{_escape(operation_type)}:{digest}")

    @classmethod
    def from_raw(cls, key: str, *, payload: Any = None) -> IdempotencyKey:
        """A caller-supplied key, optionally bound to its payload's fingerprint.

        Raises:
            InvalidKey: An empty key or one that is not a string.
        """
        if not isinstance(key, str) or not key:
            raise InvalidKey(str(key), "an idempotency key must be a non-empty string")
        if not _is_unicode(key):
            raise InvalidKey(key, "an idempotency key must be valid Unicode (no lone surrogates)")
        return cls(key, None if payload is None else fingerprint(payload))

    @classmethod
    def caller(cls, agent_id: str, key: IdempotencyKey | str, payload: Any) -> IdempotencyKey:
        """A caller-supplied key as the layer stores it: ``%raw:<agent>:<key>``.

        Scoped to its agent (two agents' keys never meet) and in a key space of
        its own: a content key never starts with ``%raw:`` (``%`` is escaped in
        its parts), so a caller cannot name another's content key. Bound to the
        payload's fingerprint (the key's own, else ``payload``'s): reusing it with
        another payload raises :class:`~durabilis.errors.KeyReuseMismatch`.

        Raises:
            InvalidKey: An empty key or agent, or one that is not valid text.
        """
        raw = key if isinstance(key, IdempotencyKey) else cls.from_raw(key)
        if not isinstance(raw, IdempotencyKey):
            raise InvalidKey(repr(key), "expected an IdempotencyKey or str")
        if not isinstance(agent_id, str) or not agent_id or not _is_unicode(agent_id):
            raise InvalidKey(str(agent_id), "agent_id must be a non-empty string")
        if not isinstance(raw.value, str) or not raw.value:
            raise InvalidKey(str(raw.value), "an idempotency key must be a non-empty string")
        return cls(f"{RAW_PREFIX}{_escape(agent_id)}:{raw.value}",
                   raw.fingerprint or payload_fingerprint(payload))

    @property
    def is_caller_key(self) -> bool:
        """Whether this is a caller-supplied key as the layer stores it."""
        return self.value.startswith(RAW_PREFIX)

    @staticmethod
    def split_caller(stored: str) -> tuple[str, str] | None:
        """``(agent_id, key)`` of a caller key as the layer stores it
        (``%raw:<agent>:<key>``, the agent unescaped); ``None`` for any other key."""
        if not stored.startswith(RAW_PREFIX):
            return None
        agent, sep, key = stored[len(RAW_PREFIX):].partition(":")
        if not sep or not agent or not key:
            return None
        return _unescape(agent), key

    @property
    def caller_key(self) -> str | None:
        """The caller's key as given, for a caller key as the layer stores it
        (``order-1`` of ``%raw:gw-1:order-1``); ``None`` for any other key."""
        value = self.value
        if not value.startswith(RAW_PREFIX):  # (on every claim: no unescaping here)
            return None
        agent, sep, key = value[len(RAW_PREFIX):].partition(":")
        return key if sep and agent and key else None

    def __str__(self) -> str:
        return self.value

    def __len__(self) -> int:
        """Length in UTF-8 bytes of the whole key (``max_key_length`` limits it, or
        for a caller key as the layer stores it, the caller's key part alone)."""
        return len(self.value.encode("utf-8", errors="surrogatepass"))


@dataclass(frozen=True, slots=True)
class IdempotencyConfig:
    """Settings of the idempotency pillar.

    Attributes:
        enabled: ``False`` turns dedup off: every claim is :class:`New`, nothing
            is stored.
        dedup_window_seconds: How long a claim/result dedups, counted from the claim.
        max_key_length: Longest key in UTF-8 bytes; longer raises ``InvalidKey``
            (the seed silently turned dedup off instead). For a caller's key
            (the layer's ``idempotency_key=``, an HTTP ``Idempotency-Key``) it
            counts the key as given; the stored form ``%raw:<agent>:<key>`` may
            be up to :data:`CALLER_SCOPE_MAX_BYTES` (1024) bytes longer.
        in_progress_ttl_seconds: Lease of an in-progress claim (30 s, whatever
            builds the config); after it a dead owner's claim is taken over or
            recovered. A live owner renews it (the layer's keep-alive;
            ``IdempotencyGuard.renew`` used directly).
        max_value_bytes: Largest encoded placeholder/result stored.
        key_secret: The namespace's secret for content keys (HMAC-SHA-256 instead
            of SHA-256, so key names do not reveal guessable payloads); ``None``:
            ``$DURABILIS_KEY_SECRET`` if set, else none. Every replica of a
            namespace must use the same one (docs/production.md: rotation).
            Never printed (``repr``, ``config check``).
        previous_key_secrets: Secrets a rotation replaced (each at least 16
            characters); ``()``: ``$DURABILIS_PREVIOUS_KEY_SECRETS`` (comma-separated)
            if set, else none. While configured, claims, duplicate checks, DLQ
            settles and replays recognise an operation completed, in progress or
            parked under any of them (its content key under each: its aliases).
            Keep them until the DLQ's longest record TTL has passed since the
            rotation (docs/production.md, "Rotating the key secret"). Never printed.
    """

    enabled: bool = True
    dedup_window_seconds: float = 3600
    max_key_length: int = 256
    in_progress_ttl_seconds: float = 30
    max_value_bytes: int = 1024 * 1024
    key_secret: str | None = field(default=None, repr=False)
    previous_key_secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def content_key_secret(self) -> str | None:
        """The secret in effect (``key_secret``, else ``$DURABILIS_KEY_SECRET``)."""
        return self.key_secret or os.environ.get(KEY_SECRET_ENV) or None

    @property
    def content_key_previous_secrets(self) -> tuple[str, ...]:
        """The previous secrets in effect (``previous_key_secrets``, else
        ``$DURABILIS_PREVIOUS_KEY_SECRETS``), without the current one or repeats.

        Raises:
            ConfigError: A secret from the environment shorter than 16 characters.
        """
        found = self.previous_key_secrets
        if not found:
            text = os.environ.get(PREVIOUS_KEY_SECRETS_ENV) or ""
            found = tuple(part.strip() for part in text.split(",") if part.strip())
            _check_secrets(found)
        current = self.content_key_secret
        return tuple(dict.fromkeys(s for s in found if s != current))

    def __post_init__(self) -> None:
        if isinstance(self.previous_key_secrets, list):  # (TOML gives an array)
            object.__setattr__(self, "previous_key_secrets", tuple(self.previous_key_secrets))
        self.validate()

    def validate(self) -> None:
        """Raises ``ConfigError`` naming the first invalid field."""
        if not isinstance(self.enabled, bool):
            raise ConfigError("enabled", f"must be a bool, got {self.enabled!r}")
        _positive_number("dedup_window_seconds", self.dedup_window_seconds)
        _positive_number("max_key_length", self.max_key_length, integer=True)
        _positive_number("in_progress_ttl_seconds", self.in_progress_ttl_seconds)
        _positive_number("max_value_bytes", self.max_value_bytes, integer=True)
        check_limits(self)  # every maximum: durabilis._limits
        for name in ("dedup_window_seconds", "in_progress_ttl_seconds"):
            value = getattr(self, name)
            if value * 1000 < 1:
                raise ConfigError(name, f"must be at least 1 ms, got {value!r}")
            if value > MAX_WINDOW_SECONDS:
                raise ConfigError(name, f"must be at most {MAX_WINDOW_SECONDS}")
        if self.max_value_bytes > MAX_VALUE_BYTES:
            raise ConfigError(
                "max_value_bytes", f"must be at most {MAX_VALUE_BYTES} (a Redis string's limit)"
            )
        if self.key_secret is not None and (
            not isinstance(self.key_secret, str) or len(self.key_secret) < MIN_SECRET_CHARS
        ):
            raise ConfigError("key_secret", "must be a string of at least 16 characters, or None")
        _check_secrets(self.previous_key_secrets)


def _check_secrets(secrets: Any) -> None:
    """``previous_key_secrets``: a tuple of strings of at least 16 characters each
    (never quoting one: the message may be logged)."""
    if not isinstance(secrets, tuple):
        raise ConfigError(
            "previous_key_secrets",
            f"must be a list of strings, got {type(secrets).__name__}",
        )
    if len(secrets) > MAX_PREVIOUS_KEY_SECRETS:
        raise ConfigError(
            "previous_key_secrets",
            f"must hold at most {MAX_PREVIOUS_KEY_SECRETS} secrets, got {len(secrets)}",
        )
    for i, secret in enumerate(secrets):
        if not isinstance(secret, str) or len(secret) < MIN_SECRET_CHARS:
            raise ConfigError(
                "previous_key_secrets",
                f"entry {i} must be a string of at least {MIN_SECRET_CHARS} characters",
            )


@dataclass(frozen=True, slots=True)
class New:
    """This caller won the claim and must run the operation.

    Attributes:
        token: Fencing token: pass it to ``record``/``release`` (and forward it
            downstream); ``None`` when idempotency is disabled. Tokens of
            successive claims of one key increase.
        claimed_at: When the claim was made (Redis server clock, UTC).
        dedup_window_expires_at: When the dedup window of this claim ends.
        taken_over: An earlier run may have had its effect: the key was held
            by a dead owner whose lease expired, or its last claim was given
            back after a run interrupted once the operation had started.
    """

    token: str | None
    claimed_at: datetime | None = None
    dedup_window_expires_at: datetime | None = None
    taken_over: bool = False

    @property
    def is_new(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The key is already claimed (in progress) or done.

    Attributes:
        original_result: The recorded result, or while ``in_progress`` the
            winner's placeholder (as in the seed).
        original_timestamp: When the original claim was made (UTC).
        dedup_window_expires_at: When the dedup window ends (UTC).
        in_progress: The original operation has not recorded its result yet.
        lease_expired: (``check`` only) the in-progress claim's lease has ended.
        not_stored: The operation completed but its result was not stored;
            why (``original_result`` is then ``None``).
    """

    original_result: Any
    original_timestamp: datetime
    dedup_window_expires_at: datetime
    in_progress: bool = False
    lease_expired: bool = field(default=False, compare=False)
    not_stored: str | None = field(default=None, compare=False)

    @property
    def is_new(self) -> bool:
        return False


CheckResult = New | Duplicate
"""What :meth:`IdempotencyGuard.check_and_record` returns."""
