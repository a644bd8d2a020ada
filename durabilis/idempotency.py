"""Idempotency: the tracking number that stops the same parcel shipping twice.

``check_and_record`` is ONE Lua script: exactly one of any number of
concurrent callers, in any number of processes, gets :class:`New` (with a
fencing token); everybody else gets :class:`Duplicate`. Claims are leases: a
claim whose owner died is taken over after ``in_progress_ttl_seconds``.

Round trips: ``check_and_record``, ``record``, ``release`` and ``check`` are
one round trip each (one EVALSHA); ``record_count`` is a SCAN.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from durabilis import _codec
from durabilis._keys import KeySpace
from durabilis._limits import MAX_DEDUP_WINDOW_SECONDS, MAX_STORED_BYTES, check_limits
from durabilis._scripts import ScriptCall
from durabilis._store import AsyncStore, Store
from durabilis._validate import positive_number as _positive_number
from durabilis.errors import (
    ConfigError,
    CorruptData,
    InvalidKey,
    InvalidPayload,
    KeyReuseMismatch,
    LeaseLost,
)

__all__ = [
    "AsyncIdempotencyGuard",
    "CheckResult",
    "Duplicate",
    "IdempotencyConfig",
    "IdempotencyGuard",
    "IdempotencyKey",
    "New",
]


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
        key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        return hmac.new(key, data, hashlib.sha256).hexdigest()[:32]
    return hashlib.sha256(data).hexdigest()[:32]


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


# --- pure operations: build calls, decode replies (no I/O) --------------------


class _IdemOps:
    """Builds each script call and decodes its reply; shared by both twins."""

    __slots__ = ("config", "keys")

    def __init__(self, keys: KeySpace, config: IdempotencyConfig) -> None:
        self.keys = keys
        self.config = config

    def validate_key(self, key: IdempotencyKey | str) -> IdempotencyKey:
        if isinstance(key, str):
            key = IdempotencyKey.from_raw(key)
        elif not isinstance(key, IdempotencyKey):
            raise InvalidKey(repr(key), "expected an IdempotencyKey or str")
        if not isinstance(key.value, str) or not key.value:
            raise InvalidKey(str(key.value), "an idempotency key must be a non-empty string")
        if not _is_unicode(key.value):
            raise InvalidKey(key.value, "an idempotency key must be valid Unicode")
        limit = self.config.max_key_length
        given = key.caller_key
        if given is None:
            if len(key) > limit:
                raise InvalidKey(
                    key.value, f"idempotency key is {len(key)} bytes, over max_key_length={limit}"
                )
            return key
        # A caller key as the layer stores it: the caller's key is what the
        # limit counts (the user never sees the ``%raw:<agent>:`` scope); the
        # stored form has a cap of its own.
        size = len(given.encode("utf-8", errors="surrogatepass"))
        if size > limit:
            raise InvalidKey(
                given,
                f"idempotency key is {size} bytes, over max_key_length={limit} (the key as "
                "given is counted, not the layer's %raw:<agent>: scope)",
            )
        if len(key) > limit + CALLER_SCOPE_MAX_BYTES:
            raise InvalidKey(
                key.value,
                f"the stored form %raw:<agent>:<key> is {len(key)} bytes, over its cap of "
                f"max_key_length + {CALLER_SCOPE_MAX_BYTES} = {limit + CALLER_SCOPE_MAX_BYTES}"
                " (the agent id is too long)",
            )
        return key

    @property
    def window_ms(self) -> int:
        return max(1, int(self.config.dedup_window_seconds * 1000))

    @property
    def lease_ms(self) -> int:
        return max(1, int(self.config.in_progress_ttl_seconds * 1000))

    def pack_value(self, value: Any, what: str) -> bytes:
        return _codec.pack(value, what=what, limit=self.config.max_value_bytes)

    def claim(
        self,
        key: IdempotencyKey,
        placeholder: Any,
        payload: bytes = b"",
        nonce: str = "",
        lease_ms: int | None = None,
    ) -> ScriptCall:
        """The ``idem_claim`` call; ``nonce`` names this claim (sent again after a
        lost reply, the same nonce gets the same claim back)."""
        packed = b"" if placeholder is None else self.pack_value(placeholder, "placeholder")
        return ScriptCall(
            "idem_claim",
            [self.keys.idem(key.value)],
            [
                self.window_ms, self.lease_ms if lease_ms is None else lease_ms, packed,
                key.fingerprint or "", payload, nonce,
            ],
        )

    def decode_claim(
        self, key: IdempotencyKey, reply: Any, *, times: bool = True
    ) -> CheckResult:
        """A claim's reply. ``times=False``: a ``New`` without its timestamps
        (the layer reads only its token and flag: nothing decoded it never uses)."""
        if not times and type(reply) is list and len(reply) >= 5 and reply[0] == b"new":
            token = reply[1]
            if type(token) is bytes and token.isascii():
                try:
                    return New(token=token.decode(), taken_over=bool(int(reply[4])))
                except (TypeError, ValueError):
                    pass  # (foreign data: named below)
        rkey = self.keys.idem(key.value)
        tag = _tag(reply, rkey)
        if tag == "new":
            return New(
                token=_codec.as_text(reply[1], key=rkey, field="tok"),
                claimed_at=_codec.as_datetime(reply[2], key=rkey, field="ts"),
                dedup_window_expires_at=_codec.as_datetime(reply[3], key=rkey, field="w"),
                taken_over=bool(int(reply[4])),
            )
        if tag == "dup":
            return self._duplicate(rkey, reply[1:6], lease_expired=False)
        if tag == "mismatch":
            raise KeyReuseMismatch(key.value)
        raise _corrupt(rkey, reply)

    def _duplicate(self, rkey: str, parts: Any, *, lease_expired: bool) -> Duplicate:
        state = _codec.as_text(parts[0], key=rkey, field="s")
        raw = parts[1]
        value = _codec.unpack(raw, key=rkey) if raw else None
        reason = _codec.as_text(parts[4], key=rkey, field="ns") if len(parts) > 4 else ""
        return Duplicate(
            original_result=value,
            original_timestamp=_codec.as_datetime(parts[2], key=rkey, field="ts"),
            dedup_window_expires_at=_codec.as_datetime(parts[3], key=rkey, field="w"),
            in_progress=state == "p",
            lease_expired=lease_expired,
            not_stored=reason or None,
        )

    def record(self, key: IdempotencyKey, result: Any, token: str | None) -> ScriptCall:
        return self.record_packed(key, self.pack_value(result, "result"), token)

    def record_packed(
        self, key: IdempotencyKey, packed: bytes, token: str | None, not_stored: str = "",
        nonce: str = "", *, hold_ms: int = 0, orphan: bool = False,
    ) -> ScriptCall:
        """The ``idem_record`` call of an encoded result, or of "completed,
        result not stored" (``not_stored``: why); ``nonce`` also names the owner.
        ``hold_ms``: the done record lives at least this long. ``orphan``: record
        onto a claim whose lease has run out, whoever held it (``token`` unused)."""
        if token:  # "" or None: record without fencing, as before
            _check_token(token)
        args: list[Any] = [
            b"" if not_stored else packed, token or "", self.window_ms, not_stored, nonce,
        ]
        if hold_ms or orphan:
            args += [hold_ms or "", "orphan" if orphan else ""]
        return ScriptCall("idem_record", [self.keys.idem(key.value)], args)

    def decode_record(self, key: IdempotencyKey, reply: Any) -> None:
        rkey = self.keys.idem(key.value)
        tag = _tag(reply, rkey)
        if tag == "ok":
            return
        if tag == "lost":
            raise LeaseLost(key.value)
        raise _corrupt(rkey, reply)

    def release(
        self, key: IdempotencyKey, token: str | None, nonce: str = "", *,
        keep_taken: bool = False, hold_ms: int = 0, touched: bool = False,
    ) -> ScriptCall:
        """The ``idem_release`` call: by the claim's token, or by its nonce.

        ``keep_taken``: a claim taken over from a dead owner is not released
        (reply 2): its operation may have run, the caller parks it.
        ``hold_ms``: keep the tombstone at least this long (a parked operation).
        ``touched``: ``fn`` had started (an interrupted run, a dead worker's
        claim): the next claim is told an earlier run may have had its effect.
        """
        if token or not nonce:
            _check_token(token)
        return ScriptCall(
            "idem_release", [self.keys.idem(key.value)],
            [token or "", nonce, "1" if keep_taken else "", hold_ms or "",
             "1" if touched else ""],
        )

    def tombstone(self, key: IdempotencyKey, hold_ms: int) -> ScriptCall:
        """The ``idem_tombstone`` call: mark a key whose operation was parked
        without a claim, for ``hold_ms`` (a later delivery then settles it)."""
        return ScriptCall(
            "idem_tombstone", [self.keys.idem(key.value)], [key.fingerprint or "", hold_ms]
        )

    def renew(self, key: IdempotencyKey, token: str, lease_ms: int) -> ScriptCall:
        """The ``idem_renew`` call extending one claim's lease (reply ``[1]``: still held)."""
        return ScriptCall("idem_renew", [self.keys.idem(key.value)], [token, lease_ms, "token"])

    def decode_renew(self, key: IdempotencyKey, reply: Any) -> bool:
        try:
            return bool(int(reply[0]))
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise CorruptData(self.keys.idem(key.value),
                              f"unexpected script reply {reply!r}") from exc

    def reclaim(self, key: str, lease_ms: int, nonce: str) -> ScriptCall:
        """The ``idem_reclaim`` call taking an orphaned claim over for recovery."""
        return ScriptCall("idem_reclaim", [self.keys.idem(key)], [lease_ms, nonce])

    def check(self, key: IdempotencyKey, *, tombstones: bool = False) -> ScriptCall:
        """The ``idem_check`` call; ``tombstones``: a released claim answers ``{"x"}``
        (see :meth:`decode_alias`), not ``{"none"}``."""
        return ScriptCall("idem_check", [self.keys.idem(key.value)], ["x"] if tombstones else [])

    def decode_alias(
        self, key: IdempotencyKey, reply: Any
    ) -> Duplicate | Literal["released", "touched"] | None:
        """A ``check(key, tombstones=True)`` reply: the record as a :class:`Duplicate`;
        ``"released"`` for a released claim's tombstone, ``"touched"`` when that
        release said an earlier run may have had its effect; ``None`` for none."""
        rkey = self.keys.idem(key.value)
        if _tag(reply, rkey) == "x":
            touched = len(reply) > 1 and _codec.as_text(reply[1], key=rkey, field="reply") == "1"
            return "touched" if touched else "released"
        return self.decode_check(key, reply)

    def decode_check(self, key: IdempotencyKey, reply: Any) -> Duplicate | None:
        rkey = self.keys.idem(key.value)
        tag = _tag(reply, rkey)
        if tag == "none":
            return None
        if tag == "dup":
            parts = [*reply[1:5], reply[6] if len(reply) > 6 else ""]
            return self._duplicate(rkey, parts, lease_expired=bool(int(reply[5])))
        raise _corrupt(rkey, reply)


_LIVE = ("s", frozenset((b"p", b"d")))  # released claims stay as tombstones ("x")


def _check_token(token: Any) -> None:
    if not isinstance(token, str) or not token or not _is_unicode(token):
        raise InvalidKey(repr(token), "a token must be the non-empty str returned by the claim")


def _tag(reply: Any, rkey: str) -> str:
    try:
        return _codec.as_text(reply[0], key=rkey, field="reply")
    except (TypeError, IndexError, KeyError) as exc:
        raise CorruptData(rkey, f"unexpected script reply {reply!r}") from exc


def _corrupt(rkey: str, reply: Any) -> CorruptData:
    detail = reply[1] if len(reply) > 1 else reply[0]
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", "replace")
    return CorruptData(rkey, str(detail))


# --- the twins: thin I/O shells ------------------------------------------------


class IdempotencyGuard:
    """Deduplicates operations across every process sharing the store.

    Args:
        store: From :func:`durabilis.connect`.
        config: Settings; the seed's defaults when omitted.
    """

    def __init__(self, store: Store, config: IdempotencyConfig | None = None) -> None:
        self.store = store
        self.config = config or IdempotencyConfig()
        self._ops = _IdemOps(store.keys, self.config)

    @property
    def ops(self) -> _IdemOps:
        """The guard's script-call builders and decoders (no I/O): what the
        durability layer composes into its plans."""
        return self._ops

    def check_and_record(
        self, key: IdempotencyKey | str, placeholder: Any = None
    ) -> CheckResult:
        """Claim ``key`` atomically: :class:`New` for exactly one caller.

        Args:
            key: The idempotency key (a ``str`` is taken as a raw key).
            placeholder: Shown to duplicates as ``original_result`` while in progress.

        Returns:
            :class:`New` (run the operation, then ``record`` or ``release``) or
            :class:`Duplicate`.

        Raises:
            InvalidKey: Empty or longer than ``max_key_length`` (before any I/O).
            KeyReuseMismatch: A raw key reused with another payload fingerprint.
            CorruptData: Foreign data at the key. StorageUnavailable: Redis down.
        """
        key = self._ops.validate_key(key)
        if not self.config.enabled:
            return New(token=None)
        return self._ops.decode_claim(key, self.store.run(self._ops.claim(key, placeholder)))

    def record(self, key: IdempotencyKey | str, result: Any, token: str | None = None) -> None:
        """Store the real result (the window still counts from the claim).

        Raises:
            LeaseLost: ``token`` no longer holds the claim; nothing was written.
        """
        key = self._ops.validate_key(key)
        if not self.config.enabled:
            return
        self._ops.decode_record(key, self.store.run(self._ops.record(key, result, token)))

    def release(self, key: IdempotencyKey | str, token: str) -> bool:
        """Give an in-progress claim back so a later retry can run.

        Returns:
            ``True`` if released; ``False`` if ``token`` did not hold an
            in-progress claim (already recorded, taken over or expired).
        """
        key = self._ops.validate_key(key)
        if not self.config.enabled:
            return False
        return bool(self.store.run(self._ops.release(key, token)))

    def renew(self, key: IdempotencyKey | str, token: str) -> bool:
        """Keep an in-progress claim: its lease runs ``in_progress_ttl_seconds``
        from now. An owner whose operation may outlast the lease calls it
        (say, every third of it): a claim whose lease ran out is taken over by
        the next caller, which then runs the operation too. (The layer's
        keep-alive does this for its operations.)

        Returns:
            ``True`` if ``token`` still holds the claim; ``False`` if not
            (recorded, released, taken over or expired): another caller may
            run the operation now.
        """
        key = self._ops.validate_key(key)
        if not self.config.enabled:
            return False
        reply = self.store.run(self._ops.renew(key, token, self._ops.lease_ms))
        return self._ops.decode_renew(key, reply)

    def check(self, key: IdempotencyKey | str) -> Duplicate | None:
        """Read-only look-up: the existing record as a :class:`Duplicate`, or ``None``."""
        key = self._ops.validate_key(key)
        if not self.config.enabled:
            return None
        return self._ops.decode_check(key, self.store.run(self._ops.check(key)))

    def record_count(self) -> int:
        """How many records (in progress or done) are live in this namespace.

        A SCAN of the namespace, reading each record's state: an operator's tool,
        not for hot paths. Released claims (tombstones keeping their last
        fencing token until the record's TTL) are not counted.
        """
        return int(self.store.scan_count(self.store.keys.idem_pattern(), _LIVE))


class AsyncIdempotencyGuard:
    """The asyncio twin of :class:`IdempotencyGuard` (same methods, awaited)."""

    def __init__(self, store: AsyncStore, config: IdempotencyConfig | None = None) -> None:
        self.store = store
        self.config = config or IdempotencyConfig()
        self._ops = _IdemOps(store.keys, self.config)

    @property
    def ops(self) -> _IdemOps:
        """The guard's script-call builders and decoders (no I/O): what the
        durability layer composes into its plans."""
        return self._ops

    async def check_and_record(
        self, key: IdempotencyKey | str, placeholder: Any = None
    ) -> CheckResult:
        """See :meth:`IdempotencyGuard.check_and_record`."""
        key = self._ops.validate_key(key)
        if not self.config.enabled:
            return New(token=None)
        return self._ops.decode_claim(
            key, await self.store.run(self._ops.claim(key, placeholder))
        )

    async def record(
        self, key: IdempotencyKey | str, result: Any, token: str | None = None
    ) -> None:
        """See :meth:`IdempotencyGuard.record`."""
        key = self._ops.validate_key(key)
        if not self.config.enabled:
            return
        self._ops.decode_record(key, await self.store.run(self._ops.record(key, result, token)))

    async def release(self, key: IdempotencyKey | str, token: str) -> bool:
        """See :meth:`IdempotencyGuard.release`."""
        key = self._ops.validate_key(key)
        if not self.config.enabled:
            return False
        return bool(await self.store.run(self._ops.release(key, token)))

    async def renew(self, key: IdempotencyKey | str, token: str) -> bool:
        """See :meth:`IdempotencyGuard.renew`."""
        key = self._ops.validate_key(key)
        if not self.config.enabled:
            return False
        reply = await self.store.run(self._ops.renew(key, token, self._ops.lease_ms))
        return self._ops.decode_renew(key, reply)

    async def check(self, key: IdempotencyKey | str) -> Duplicate | None:
        """See :meth:`IdempotencyGuard.check`."""
        key = self._ops.validate_key(key)
        if not self.config.enabled:
            return None
        return self._ops.decode_check(key, await self.store.run(self._ops.check(key)))

    async def record_count(self) -> int:
        """See :meth:`IdempotencyGuard.record_count`."""
        return int(await self.store.scan_count(self.store.keys.idem_pattern(), _LIVE))
