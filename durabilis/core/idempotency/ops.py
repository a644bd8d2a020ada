"""Idempotency's script calls and reply decoders (no I/O): :class:`IdemOps`
builds each ``idem_*`` call and decodes its reply, for both shells and the layer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from durabilis import _codec
from durabilis._scripts import ScriptCall
from durabilis.core.idempotency.types import (
    CALLER_SCOPE_MAX_BYTES,
    CheckResult,
    Duplicate,
    IdempotencyConfig,
    IdempotencyKey,
    New,
    _is_unicode,
)
from durabilis.errors import (
    CorruptData,
    InvalidKey,
    KeyReuseMismatch,
    LeaseLost,
)

if TYPE_CHECKING:
    from durabilis._keys import KeySpace


class IdemOps:
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
        keep_taken: bool = False, hold_ms: int = 0, touched: bool = False, late: bool = False,
    ) -> ScriptCall:
        """The ``idem_release`` call: by the claim's token, or by its nonce.

        ``keep_taken``: a claim taken over from a dead owner is not released
        (reply 2): its operation may have run, the caller parks it.
        ``hold_ms``: keep the tombstone at least this long (a parked operation).
        ``late`` (a layer parking, with ``hold_ms``): the claim no longer held,
        the hold is left on whatever holds the key (see ``idem_release``).
        ``touched``: ``fn`` had started (an interrupted run, a dead worker's
        claim): the next claim is told an earlier run may have had its effect.
        """
        if token or not nonce:
            _check_token(token)
        return ScriptCall(
            "idem_release", [self.keys.idem(key.value)],
            [token or "", nonce, "1" if keep_taken else "", hold_ms or "",
             "1" if touched else "", key.fingerprint or "", "late" if late else ""],
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

    def parking_guard(self, key: IdempotencyKey, *, wait: bool) -> ScriptCall:
        """The ``idem_check`` guard of a parking: gated in front of its enqueue,
        it refuses (nothing of the step written) once the operation's record is
        completed (``{"done"}``) and, with ``wait`` (a parking without a claim
        of its own), while another delivery holds a live claim (``{"held"}``);
        anything else (a record of another payload fingerprint too) lets the parking go
        (``{"open"}``)."""
        return ScriptCall(
            "idem_check", [self.keys.idem(key.value)], ["G" if wait else "g", key.fingerprint or ""]
        )

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


def _check_token(token: Any) -> None:
    if not isinstance(token, str) or not token or not _is_unicode(token):
        raise InvalidKey(repr(token), "a token must be the non-empty str returned by the claim")


_tag = _codec.reply_tag


def _corrupt(rkey: str, reply: Any) -> CorruptData:
    detail = reply[1] if len(reply) > 1 else reply[0]
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", "replace")
    return CorruptData(rkey, str(detail))
