"""The whole logic of the layer, as plans of steps (``durabilis._steps``). No I/O here.

The rules that make the core promise hold (``docs/layer.md``):

- **Check before the effect.** Everything checkable (the payload in the
  encoding of every pillar that may store it, every key part against every
  cap, checkpoint ids) is checked in :meth:`_LayerCore.request`, before the
  claim. That a failure can be parked in the DLQ is checked there too (its
  names, and its size: bounded by the envelope's); the record itself is built
  only when the operation is parked, from the envelope.
- **The lean path.** The common case (standalone, a new key, ``fn`` succeeds)
  runs as one flat plan (:meth:`_LayerCore._lean_plan`) whose steps are those
  the plans send for it; at the first reply that is not the common case the
  plans take over from where it stands.
- **After the effect, record first.** Once ``fn`` returned, nothing raises
  before the outcome is recorded: an unstorable result is recorded as
  "completed, result not stored"; a record step that fails is sent again
  (shielded, with backoff) while the claim's lease lasts.
- **Steps are all-or-nothing.** The claim step gates on the claim and the
  breaker: a refusal by either writes nothing (standalone) or is compensated
  (Cluster). Every claim carries a nonce, so it can be released, and its
  probe slot freed, even when the reply that named them was lost.
- **Entries are owned.** An in-flight index entry is ``<key>|<nonce>``: only
  its own claim removes it, recovery drops it once another claim holds the key.
- **Interruptions.** A cancellation (or ``KeyboardInterrupt``) before the
  outcome releases the claim and the probe slot (shielded) and re-raises.
  Once ``fn`` has started, the claim goes back *touched*: the next delivery
  runs with ``ctx.recovered`` (same key, higher token), never as if untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from durabilis import _codec, _fork, otel
from durabilis._fork import reset_in_child
from durabilis._keys import CLUSTER_SLOTS, KeySpace, bucket_tag, hash_slot
from durabilis._log import get_logger
from durabilis._retry_core import (
    EXHAUSTED,
    MAX_DEADLINE_MS,
    NON_RETRYABLE,
    TESTING,
    RetryDecision,
    decide,
    error_code,
)
from durabilis._scripts import Replies, ScriptCall, fuse
from durabilis._steps import INTERRUPTS, Deferred, LeaseBook
from durabilis.core.breaker import BreakerBook, Permit
from durabilis.core.checkpoint import part
from durabilis.core.retry import BudgetOps, RetryPolicy
from durabilis.core.steps import IO, Defer, Hold, Plan, Run, Sleep
from durabilis.dlq import (
    ANSWERED,
    FINISHED,
    DlqRecord,
    DlqStatus,
    Prepared,
    ReplayDeclined,
    record_id_for,
)
from durabilis.errors import (
    CircuitOpen,
    ConfigError,
    CorruptData,
    DurabilisError,
    InvalidPayload,
    LeaseLost,
    OperationInProgress,
    OutcomeUnrecorded,
    ResultNotStored,
    RetryExhausted,
)
from durabilis.events import error_text, exception_str
from durabilis.idempotency import (
    RAW_PREFIX,
    Duplicate,
    IdempotencyKey,
    New,
    content_digest,
    payload_fingerprint,
)
from durabilis.layer._config import (
    CIRCUIT_OPEN,
    WORKER_LOST,
    DurabilityConfig,
    LayerStats,
    OperationContext,
)
from durabilis.retry import emit_retry_attempt, emit_retry_stop

_log = get_logger()


class StoreShape(Protocol):
    """What the plans read of the store the shells hand them (no I/O):
    :class:`durabilis._store.Store` and its asyncio twin have these."""

    @property
    def keys(self) -> KeySpace: ...  # every key's name
    @property
    def fuses(self) -> bool: ...  # a step's scripts run as one (standalone)
    @property
    def is_cluster(self) -> bool: ...  # Redis Cluster: the birth index has a bucket per slot


class Policies(Protocol):
    """Where the plans find an operation's retry policy: the retry engines
    (sync and asyncio) have it."""

    def get_policy(self, operation_type: str) -> RetryPolicy | None: ...

_STOPPED: tuple[type[BaseException], ...] = (DurabilisError, *INTERRUPTS)
"""A step failed, or the plan was interrupted: nothing more will run."""
_CLAIM_AGAIN = object()
_SETTLED_BY = "a later delivery"  # who finished a parked record its operation completed
_GIVE_UP = object()
DUPLICATES_FLUSH_SECONDS = 1.0  # how long a duplicate's count may wait in its process
SIM_BUCKETS = 16  # birth-index buckets of an unfused standalone store (the fault simulator)
_WALK = 32  # birth-index buckets recovery reads at once (one wave)
_WALK_PER_PASS = 512  # birth-index buckets one recovery pass reads (Cluster: a 32nd of them)
_WALK_KEEP_MS = 7 * 24 * 3600 * 1000  # the fleet's walk counter lasts a week after a pass
_REASON_ROOM = 96  # bytes kept in the DLQ payload cap for metadata added when parking
_RECORD_BACKOFF = (0.05, 1.0)  # first and longest pause between tries of a record step
_LATE_TRIES = 3  # tries of a record step after its lease's time ran out, before giving up
_KNOWN_PAIRS = 1024  # (agent, operation) pairs whose checked key parts a layer keeps


def _nonce() -> str:
    return os.urandom(8).hex()  # (secrets.token_hex(8), one call less)


def dlq_id_for(key: str, nonce: str) -> str:
    """The DLQ id of one claim's failure: the worker and a recoverer parking the
    same claim write one record; two claims (or no idempotency) never share one."""
    return hashlib.sha256(f"{key}\x00{nonce}".encode()).hexdigest()[:32]


def _had_previous(claim_reply: Any) -> bool:
    """Whether a new claim's reply names a previous token (a tombstone or a dead owner)."""
    try:
        return bool(claim_reply[5])
    except (TypeError, IndexError, KeyError):
        return False


def _tag(reply: Any) -> str:
    try:
        head = reply[0]
    except (TypeError, IndexError, KeyError):
        return ""
    if isinstance(head, bytes):
        return head.decode("utf-8", "replace")
    return head if isinstance(head, str) else ""


# Gates: does this reply refuse (abort the step)? Each matches the script's
# own "returned before ready()" (see durabilis/_scripts.py).
def _claim_refused(reply: Any) -> bool:
    return _tag(reply) != "new"


def _born_claim_refused(reply: Any) -> bool:
    """The claim fused with its birth entry (unfused stores): refused as the claim."""
    try:
        inner = reply[2]
    except (TypeError, IndexError, KeyError):
        return False  # garbage: decoded (and refused) by the plan
    return _claim_refused(inner)


def _unwrap_born_claim(replies: Replies, i: int) -> Replies:
    """The step's replies with call ``i`` (the claim fused with its birth entry)
    answering as the claim alone."""
    if replies.status[i] not in "cr":
        return replies
    try:
        inner = replies[i][2]
    except (TypeError, IndexError, KeyError):
        return replies  # garbage: decode_claim names it
    out = Replies(replies, replies.status)
    out[i] = inner
    return out


def _breaker_refused(reply: Any) -> bool:
    return type(reply) is not int and _tag(reply) != "ok"


def _record_refused(reply: Any) -> bool:
    return _tag(reply) != "ok"


def _missed(reply: Any) -> bool:
    """An enqueue refused because the operation's record is another (see dlq_enqueue)."""
    return _tag(reply) == "miss"


def _not_released(reply: Any) -> bool:
    try:
        return int(reply) != 1
    except (TypeError, ValueError):
        return True


def _save_refused(reply: Any) -> bool:
    return _tag(reply) not in ("ok", "exists")


def _renewed(reply: Any) -> bool:
    try:
        return int(reply[0]) == 1
    except (TypeError, IndexError, ValueError):
        return False


def _unknown(n: int) -> Replies:
    """The replies of a step of ``n`` calls that failed in flight: each may have run."""
    return Replies([None] * n, "?" * n)


# The lean path's claim step (the in-flight entry, then the claim, gated) and
# its record step: as _claim_and_run and _succeeded build them for its case.
_LEAN_AT: Mapping[str, int] = {"note": 0, "claim": 1}
_LEAN_GATES: Mapping[int, Callable[[Any], bool]] = {1: _claim_refused}
_LEAN_WAVES = (0, 1)
_LEAN_RECORD_GATES: Mapping[int, Callable[[Any], bool]] = {0: _record_refused}
_LEAN_RECORD_WAVES = (1, 1)  # the record, and a breaker's report beside it
# With a breaker: its admission (gated), and its registration the first time.
_LEAN_CB_AT: Mapping[str, int] = {"note": 0, "claim": 1, "cb": 2}
_LEAN_CB_GATES: Mapping[int, Callable[[Any], bool]] = {1: _claim_refused, 2: _breaker_refused}
_LEAN_CB_WAVES = (0, 1, 2)
_LEAN_CB_REG_AT: Mapping[str, int] = {"note": 0, "claim": 1, "cb": 2, "register": 3}
_LEAN_CB_REG_WAVES = (0, 1, 2, 0)


@dataclass(frozen=True, slots=True)
class _Request:
    """One durable operation, validated and encoded before any I/O."""

    agent_id: str
    operation_type: str
    payload: Any
    key: IdempotencyKey
    dependency: str | None
    task_id: str | None
    phase: str | None
    wait: float | None
    park_on_open: bool
    deadline: float | None
    replay: bool
    envelope: bytes  # what the claim keeps for recovery (msgpack)
    # The DLQ record of a failure, when prepared before the claim (a large
    # payload); None: built from the envelope if parked (_LayerCore._park_record).
    park: Prepared | None
    # A replay's DLQ claim: its success step finishes the record, fenced by it.
    replay_claim: _ReplayClaim | None = None
    # The operation's content key under the other secrets configured (a key
    # secret's rotation): read after the claim, see _LayerCore._aliases.
    aliases: tuple[IdempotencyKey, ...] = ()


class _ReplayClaim:
    """The DLQ record a replay runs, and whether its success step finished it."""

    __slots__ = ("dlq_id", "finished", "ran", "token", "trace")

    def __init__(
        self, dlq_id: str, token: str, trace: tuple[str, str | None] | None = None
    ) -> None:
        self.dlq_id = dlq_id
        self.token = token
        self.trace = trace  # the parked call's (traceparent, tracestate): its replay links to it
        self.ran = False  # fn ran and succeeded in this replay (else: answered by the record)
        self.finished = False

    def answer(self) -> object | None:
        """What the replay handler tells the DLQ after a success: the record
        finished with the outcome, in one step (else the DLQ finishes it now),
        or the operation had completed before (answered by its record)."""
        if self.finished:
            return FINISHED
        return None if self.ran else ANSWERED


@dataclass(frozen=True, slots=True)
class _Claim:
    """What one run of the operation holds."""

    nonce: str
    member: str  # its in-flight index entry, "" when not listed
    token: str | None  # None: no claim (idempotency disabled, or not claimed)
    taken_over: bool = False
    # The key had an earlier claim (released, or its owner died): that
    # operation may be parked in the DLQ; this run's success settles it.
    settle: bool = False
    # Aliases of the key found released (a parking under a previous secret):
    # this run's success settles their DLQ records too.
    settle_aliases: tuple[IdempotencyKey, ...] = ()
    # Aliases found claimed by a dead worker (lease run out): this run's success
    # records there too, so recovery never parks them for a replay to run again.
    orphaned_aliases: tuple[IdempotencyKey, ...] = ()
    # The process that claimed: a child forked inside fn sends nothing for it.
    pid: int = dataclasses.field(default_factory=_fork.pid)


class _LayerCore:
    """The whole logic of the layer, as plans of steps. No I/O here.

    Attributes:
        clock: Monotonic seconds (the simulator replaces it with its own).
    """

    def __init__(  # noqa: PLR0917  (the pillars, built by the twins)
        self,
        store: StoreShape,
        config: DurabilityConfig,
        idem_ops: Any,
        retry: Policies,
        breakers: BreakerBook,
        checkpoint_ops: Any,
        dlq_ops: Any,
    ) -> None:
        self.config = config
        self.fuses = store.fuses
        self.clock: Callable[[], float] = time.monotonic
        # What waits in the process (counts, Cluster index removals) goes by this
        # clock; a test freezes it so that the keep-alive's tick cannot race it.
        self.waits_clock: Callable[[], float] = time.monotonic
        self._keys = store.keys
        self._idem = idem_ops
        self._retry = retry
        self._breakers = breakers
        self._ckpt = checkpoint_ops
        self._dlq = dlq_ops
        self._budget = BudgetOps(store.keys)
        self._index = store.keys.layer("inflight")
        # Unfused stores (Cluster): a claim's "birth" entry, written by the
        # claim's own script in an index bucket of the claim's hash slot, lists
        # it until its entry in the index above is known to have landed (the
        # two go in one wave: a claim step of one round trip).
        self._buckets = 0 if store.fuses else (
            CLUSTER_SLOTS if store.is_cluster else SIM_BUCKETS
        )
        self._walk = store.keys.layer("walk")  # whose slice of the birth index is next
        self._stats = store.keys.layer("stats")
        self._key_secret = config.idempotency.content_key_secret
        # A rotation's previous secrets (usually none: then no alias is derived or read)
        self._previous_secrets = config.idempotency.content_key_previous_secrets
        self._lease_s = float(config.idempotency.in_progress_ttl_seconds)
        self._lease_ms = max(1, int(self._lease_s * 1000))
        # (agent_id, operation_type) -> the content key's checked, escaped head
        self._known: dict[tuple[str, str], str] = {}
        # Duplicates answered on standalone are counted here and carried by a
        # later note (see count_duplicate): a duplicate is one round trip.
        self._dups_lock = threading.Lock()
        self._dups = 0
        self._dups_since = 0.0
        # Cluster: index entries of settled claims, and their counts, waiting
        # to be removed (see _leave); guarded by the same lock.
        self._gone: list[str] = []
        self._gone_counts: dict[str, int] = {}
        self._gone_since = 0.0
        # Removals sent once whose outcome is unknown: each goes again alone,
        # never merged with newer ones (its counts go only with a removal).
        self._unsure: list[tuple[list[str], dict[str, int]]] = []
        # Called when counts or removals start waiting in this process: the
        # twins start their keep-alive (which sends them), if not running.
        self.on_wait: Callable[[], None] | None = None
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """What waits in the parent is the parent's to send: a forked child never
        sends the parent's counts (or index removals) a second time."""
        self._dups_lock = threading.Lock()
        with self._dups_lock:
            self._dups, self._dups_since = 0, 0.0
            self._gone, self._gone_counts, self._gone_since = [], {}, 0.0
            self._unsure = []

    # -- request building: every check before any I/O --

    def request(  # noqa: PLR0912  (every check, in the order a caller meets them)
        self,
        agent_id: str,
        operation_type: str,
        payload: Any,
        *,
        dependency: str | None,
        idempotency_key: IdempotencyKey | str | None,
        task_id: str | None,
        phase: str | None,
        wait: float | None,
        park_on_open: bool,
        deadline_seconds: float | None,
        replay: bool = False,
    ) -> _Request:
        """Validate and encode an operation (no I/O).

        Raises:
            InvalidKey: A key part empty, over a cap of a pillar that stores it,
                or not valid text.
            InvalidPayload, PayloadTooLarge: The payload cannot be kept with the
                claim or parked in the DLQ, in the encoding each uses.
            DependencyNotFound: No breaker of that name.
            ConfigError: ``task_id`` without ``phase`` (or the reverse), a bad
                ``wait`` / ``deadline_seconds``.
        """
        # The key parts of a pair seen before (both exactly str) were checked
        # and escaped then: what they give is reused (see _remember).
        pair = (agent_id, operation_type)
        known = (self._known.get(pair) if type(agent_id) is str and type(operation_type) is str
                 else None)
        if idempotency_key is None and known is not None:
            key = IdempotencyKey(known + content_digest(payload, self._key_secret))
        else:
            if idempotency_key is None:
                made = IdempotencyKey.new(agent_id, operation_type, payload,
                                          secret=self._key_secret)
            elif replay:  # the key as stored (a caller key already scoped)
                made = (idempotency_key if isinstance(idempotency_key, IdempotencyKey)
                        else IdempotencyKey(idempotency_key))
            else:  # a caller's key: scoped to its agent, bound to the payload
                made = IdempotencyKey.caller(agent_id, idempotency_key, payload)
            key = self._idem.validate_key(made)
        dep = dependency if dependency is not None else self.config.dependencies.get(
            operation_type
        )
        if dep is not None:
            self._breakers.ops.entry(dep)  # DependencyNotFound before any I/O
        if (task_id is None) != (phase is None):
            raise ConfigError("phase", "task_id and phase go together")
        if task_id is not None and phase is not None:
            part("task_id", task_id)
            part("phase", phase)
            part("agent_id", agent_id)
        for name, seconds in (("wait", wait), ("deadline_seconds", deadline_seconds)):
            if seconds is not None and (
                isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                or not 0 <= seconds < float("inf") or (name == "deadline_seconds" and not seconds)
            ):
                raise ConfigError(name, f"must be a finite number of seconds, got {seconds!r}")
        if deadline_seconds is not None and deadline_seconds > MAX_DEADLINE_MS / 1000:
            raise ConfigError(  # holding a claim while retrying is bounded (durabilis._limits)
                "deadline_seconds",
                f"must be at most {MAX_DEADLINE_MS // 1000} (one day), got {deadline_seconds!r}",
            )
        envelope = bytes(self._idem.pack_value(
            {
                "agent_id": agent_id,
                "operation_type": operation_type,
                "payload": payload,
                "dependency": dep,
                "task_id": task_id,
                "phase": phase,
                # A caller key's own fingerprint: recovery parks the operation with
                # it, so a replay claims the key exactly as the caller did.
                "fingerprint": key.fingerprint,
            },
            "payload",
        ))
        # The DLQ record of a failure is built only when the operation is parked
        # (from the envelope: the payload as it was before fn ran). Checked here
        # is that it can be: its names (once per pair), and its size. The record
        # keeps the payload as JSON text, or as msgpack when that is smaller or
        # the JSON does not fit: never more bytes than the payload's msgpack,
        # which the envelope holds. So an envelope that fits the record's room
        # needs nothing more; a larger one is prepared now (it may not fit).
        if known is None:
            self._dlq.name("agent_id", agent_id)
            self._dlq.name("operation_type", operation_type)
        meta = self._metadata(key.value, dep, task_id, phase, key.fingerprint)
        park = None
        if len(envelope) > self._park_room(meta):
            park = self._dlq.prepare(
                agent_id, operation_type, payload, meta, spare_bytes=_REASON_ROOM
            )
        aliases = self._aliases(
            agent_id, operation_type, payload, key, idempotency_key, replay
        ) if replay or self._previous_secrets else ()
        if known is None and idempotency_key is None:
            self._remember(pair, key)
        return _Request(
            agent_id, operation_type, payload, key, dep, task_id, phase, wait,
            park_on_open, deadline_seconds, replay, envelope, park, aliases=aliases,
        )

    def _remember(self, pair: tuple[str, str], key: IdempotencyKey) -> None:
        """Keep what a pair's checked key parts give (``<agent>:<operation>:``,
        escaped): a later request of the pair checks and escapes nothing again.
        What the checks depend on is the pair and the frozen config only (a
        content key's length is its parts' plus 32). Bounded: past
        ``_KNOWN_PAIRS`` pairs, the oldest is forgotten."""
        if type(pair[0]) is not str or type(pair[1]) is not str:
            return
        known = self._known
        if len(known) >= _KNOWN_PAIRS:
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                del known[next(iter(known))]
        known[pair] = key.value[:-32]

    def _park_room(self, meta: Mapping[str, str]) -> int:
        """The bytes a DLQ record has for its payload, with these metadata."""
        size = _REASON_ROOM
        for name, value in meta.items():
            size += len(name.encode("utf-8", "replace")) + len(value.encode("utf-8", "replace"))
        return int(self._dlq.config.max_payload_bytes) - size

    def _park_record(self, req: _Request) -> Prepared:
        """The DLQ record of ``req``'s failure, built now (see :meth:`request`)."""
        if req.park is not None:
            return req.park
        meta = self._metadata(req.key.value, req.dependency, req.task_id, req.phase,
                              req.key.fingerprint)
        try:  # the payload as it was claimed (fn may have changed the object since)
            payload = _codec.unpack(req.envelope, key=req.key.value)["payload"]
        except (DurabilisError, KeyError, TypeError):  # (never: the layer's own envelope)
            payload = req.payload
        prepared: Prepared = self._dlq.prepare(
            req.agent_id, req.operation_type, payload, meta, spare_bytes=_REASON_ROOM
        )
        return prepared

    def _aliases(  # noqa: PLR0917  (the request's parts, one by one)
        self, agent_id: str, operation_type: str, payload: Any, key: IdempotencyKey,
        given: IdempotencyKey | str | None, replay: bool,
    ) -> tuple[IdempotencyKey, ...]:
        """The operation's content key under the other secrets configured (no I/O).

        Only content keys have aliases (a caller's key does not depend on the
        secret). A delivery's key is the current secret's: its aliases are the
        previous secrets' keys, and without previous secrets there are none
        (nothing derived, nothing read: the steady state's cost). A replay's key
        is the one its record was parked under: its aliases are the current
        secret's key and the previous ones', so that the replay of a record
        parked under an old secret sees the operation completed under the new
        one (derived from the record's agent, operation type and payload).
        """
        if not self.config.idempotency.enabled or key.is_caller_key:
            return ()
        if replay:
            secrets: tuple[str | None, ...] = (self._key_secret, *self._previous_secrets)
        elif given is None and self._previous_secrets:
            secrets = self._previous_secrets
        else:
            return ()
        out: dict[str, IdempotencyKey] = {}
        for secret in secrets:
            try:
                alias = IdempotencyKey.new(agent_id, operation_type, payload, secret=secret)
            except DurabilisError:  # a payload no content key is made of: no alias
                return ()
            # (a replay's stored key that is not a content key of this operation,
            # a record parked by hand, has no alias)
            if alias.value.rpartition(":")[0] != key.value.rpartition(":")[0]:
                return ()
            if alias.value != key.value:
                out[alias.value] = self._idem.validate_key(alias)
        return tuple(out.values())

    @staticmethod
    def _metadata(
        key: str, dependency: str | None, task_id: str | None, phase: str | None,
        fingerprint: str | None = None,
    ) -> dict[str, str]:
        meta = {"idempotency_key": key}
        for name, value in (("dependency", dependency), ("task_id", task_id), ("phase", phase),
                            ("fingerprint", fingerprint)):
            if value:
                meta[name] = value
        return meta

    # -- small call builders --

    def member(self, key: str, nonce: str) -> str:
        return f"{key}|{nonce}"

    def _note(
        self, mode: str, members: Sequence[str | bytes] = (), *, at: int | None = None,
        **counts: int,
    ) -> ScriptCall:
        args: list[Any] = [mode, self._lease_ms if at is None else at, len(members), *members]
        for name, n in counts.items():
            if n:
                args += [name, n]
        return ScriptCall("layer_note", [self._index, self._stats], args)

    def _bucket(self, key: str) -> str:
        """The birth-index bucket of ``key``'s claims (its hash slot's, on Cluster)."""
        n = self._buckets
        return self._keys.inflight_bucket(bucket_tag(hash_slot(self._keys.idem(key)) % n, n))

    def _birth(
        self, mode: str, index: str, members: Sequence[str | bytes], *, at: int | None = None
    ) -> ScriptCall:
        """A note on one birth-index bucket: entries only, never counts (the
        counters live in another slot)."""
        args: list[Any] = [mode, self._lease_ms if at is None else at, len(members), *members]
        return ScriptCall("layer_note", [index, index], args)

    def _birth_gone(self, key: str, nonce: str) -> ScriptCall:
        """The removal of the birth entry of ``key``'s claim ``nonce``."""
        return self._birth("rem", self._bucket(key), [self.member(key, nonce)])

    def _count_duplicate(self) -> int:
        """Count a duplicate in this process; how many to send now (0: they ride later).

        The fleet's ``duplicates`` counter is not worth a round trip per
        duplicate: the count rides on this process's next completed operation
        (its record step's note), on ``stats()`` and ``close()``, or goes by
        itself once the oldest waiting count is DUPLICATES_FLUSH_SECONDS old.
        A process killed meanwhile loses those counts (never a record).
        """
        now = self.waits_clock()
        with self._dups_lock:
            first = self._dups == 0
            if first:
                self._dups_since = now
            self._dups += 1
            if now - self._dups_since < DUPLICATES_FLUSH_SECONDS:
                n = 0
            else:
                n, self._dups = self._dups, 0
        if first and n == 0 and self.on_wait is not None:
            self.on_wait()
        return n

    def _take_duplicates(self) -> int:
        with self._dups_lock:
            n, self._dups = self._dups, 0
            return n

    def _leave(self, members: Sequence[str], counts: Mapping[str, int]) -> None:
        """Cluster: remove the index entries of settled claims later, with their counts.

        A claim's entry may go only once its outcome is written (an entry
        removed first would leave a dead worker's claim unlisted), so on
        Cluster its removal would be a round trip of its own after the record.
        It waits in this process instead and goes beside this process's next
        claim step (same wave as its index entry: no round trip of its own), or
        with the keep-alive's tick once a second old, ``stats()`` or
        ``close()``. A process killed meanwhile leaves entries of recorded
        claims, which ``recover_orphans`` drops once their lease has passed,
        and loses those counts (never a record).
        """
        with self._dups_lock:
            first = not self._gone and not self._gone_counts
            if first:
                self._gone_since = self.waits_clock()
            self._gone.extend(m for m in members if m)
            for name, n in counts.items():
                self._gone_counts[name] = self._gone_counts.get(name, 0) + n
        if first and self.on_wait is not None:
            self.on_wait()

    def _take_gone(self) -> tuple[list[str], dict[str, int]]:
        """The waiting removals and their counts, taken from the queue."""
        with self._dups_lock:
            taken = self._gone, self._gone_counts
            self._gone, self._gone_counts = [], {}
        return taken

    def _gone_note(
        self, gone: list[str], counts: dict[str, int], *, again: bool = False
    ) -> ScriptCall | None:
        """Removals and counts as one note. First sent (``leave``), the counts go
        whatever recovery removed meanwhile; sent ``again`` (it may have landed),
        they go only with a removal that happens now (``rem``)."""
        if not gone and not any(counts.values()):
            return None
        return self._note(("rem" if again else "leave") if gone else "none", gone, **counts)

    def _unsent(self, gone: list[str], counts: dict[str, int]) -> None:
        """A batch of removals that may not have landed waits apart; counts alone
        (no removal to tell whether they landed) are dropped, never sent twice."""
        if gone:
            with self._dups_lock:
                self._unsure.append((gone, counts))
            if self.on_wait is not None:
                self.on_wait()

    def waiting(self) -> bool:
        """Counts or index removals wait in this process: the keep-alive has work."""
        with self._dups_lock:
            return bool(
                self._dups or self._gone or self._unsure or any(self._gone_counts.values())
            )

    def flush_plan(self, *, due_only: bool = False) -> Plan[None]:
        """Send the counts (and, on Cluster, the index removals) waiting in this
        process: the keep-alive's tick (``due_only``: only those whose oldest is
        DUPLICATES_FLUSH_SECONDS old), ``stats()`` and ``close()``. A batch that
        fails or is interrupted waits again (``_unsent``), then the step raises."""
        now = self.waits_clock()
        with self._dups_lock:
            n = 0
            if not due_only or now - self._dups_since >= DUPLICATES_FLUSH_SECONDS:
                n, self._dups = self._dups, 0
            unsure, self._unsure = self._unsure, []
        fresh: list[tuple[list[str], dict[str, int]]] = []
        if not due_only or now - self._gone_since >= DUPLICATES_FLUSH_SECONDS:
            fresh.append(self._take_gone())
        if n:
            fresh.append(([], {"duplicates": n}))
        batches = [(b, True) for b in unsure] + [(b, False) for b in fresh]
        for i, ((gone, counts), again) in enumerate(batches):
            if (call := self._gone_note(gone, counts, again=again)) is None:
                continue
            try:  # not shielded: an interruption goes through at once (removals wait)
                yield IO([call])
            except _STOPPED:
                self._unsent(gone, counts)  # may have landed: apart
                for never, was_unsure in batches[i + 1:]:  # not sent: wait as they did
                    if was_unsure:
                        self._unsent(*never)
                    else:
                        self._leave(*never)
                raise

    def renew_calls(self, held: Sequence[tuple[str, str, str]]) -> list[ScriptCall]:
        """The keep-alive's calls for the claims held (key, nonce, member): their leases
        and in-flight entries."""
        if not held:
            return []
        members = [m for _, _, m in held if m]
        note = self._note("renew", members)
        if not self.fuses:  # one key per script: every record is its own slot
            calls = [
                ScriptCall("idem_renew", [self._keys.idem(k)], [n, self._lease_ms, "nonce"])
                for k, n, _ in held
            ]
            return [*calls, note]
        renew = ScriptCall(
            "idem_renew",
            [self._keys.idem(k) for k, _, _ in held],
            [*(n for _, n, _ in held), self._lease_ms, "nonce"],
        )
        return [renew, note]

    def reindex_calls(
        self, held: Sequence[tuple[str, str, str]], replies: Sequence[Any]
    ) -> list[ScriptCall]:
        """After :meth:`renew_calls` on Cluster: put back the in-flight entries of
        the claims just renewed (still ours).

        There the entry is written before the claim, not with it: a claim step
        delayed past the lease lets recovery look at the entry, find no claim
        and drop it; the claim then lands unindexed. Renewing puts it back.
        """
        if self.fuses:
            return []
        back = []
        for (_, _, member), reply in zip(held, replies, strict=False):
            if member and _renewed(reply):
                back.append(member)
        return [self._note("add", back)] if back else []

    def deferred_sent(self, leases: LeaseBook, item: Deferred, replies: Replies) -> None:
        """The keep-alive sent a deferred outcome: it landed (or the claim is gone)."""
        leases.settle(item)
        _log.warning(
            "durability_outcome_recorded_late", idempotency_key=item.step.key,
            status=replies.status,
        )

    def deferred_failed(self, leases: LeaseBook, item: Deferred, exc: DurabilisError) -> None:
        """A deferred outcome did not land this time; give up once its time ran out."""
        if isinstance(exc, CorruptData) or time.monotonic() >= item.until:
            leases.settle(item)
            _log.error(
                "durability_outcome_abandoned", idempotency_key=item.step.key,
                error=f"{type(exc).__name__}: {exc}",
            )

    def _decode_permit(self, dep: str, reply: Any) -> Permit:
        """Decode an admission; fire its transition; note it for the registry's cache."""
        return self._breakers.admit(dep, reply)

    def _best_effort(
        self, calls: list[ScriptCall], event: str, key: str,
        gates: Mapping[int, Callable[[Any], bool]] | None = None,
        waves: Sequence[int] | None = None,
    ) -> Plan[bool]:
        """Run a compensating step, shielded; a storage failure is logged, not raised
        (what it leaves behind is found by recovery or expires: see docs/layer.md)."""
        if not calls:
            return True
        try:
            yield IO(calls, gates or {}, shield=True, waves=waves)
        except DurabilisError as exc:
            _log.error(event, idempotency_key=key, error=f"{type(exc).__name__}: {exc}")
            return False
        return True

    # -- the durable operation --

    def execute_plan(self, req: _Request, fn: Callable[[OperationContext], Any]) -> Plan[Any]:
        # otel hook (start and end of a call): the plan, run inside the call's span
        # when tracing is on (otel.begin is None when it is off: the plan as is).
        traced = otel.begin(req)
        plan = self._execute_plan(req, fn)
        return plan if traced is None else traced.run(plan)

    def _execute_plan(self, req: _Request, fn: Callable[[OperationContext], Any]) -> Plan[Any]:
        wait_until = None if req.wait is None else self.clock() + req.wait
        policy = self._retry.get_policy(req.operation_type)
        if self._lean(req, policy):
            outcome = yield from self._lean_plan(req, fn, policy, wait_until)
            if outcome is not _CLAIM_AGAIN:
                return outcome
        while True:
            outcome = yield from self._claim_and_run(req, fn, wait_until)
            if outcome is not _CLAIM_AGAIN:
                return outcome

    # -- the lean success path --

    def _lean(self, req: _Request, policy: RetryPolicy | None) -> bool:
        """Whether the operation can take the lean path: standalone (one fused
        claim step), a claim, no retry budget, no checkpoint, no key aliases,
        not a replay (a breaker or none). Its steps are those of the plans below."""
        return (
            self.fuses and req.task_id is None and not req.aliases
            and not req.replay and req.replay_claim is None
            and self.config.idempotency.enabled
            and (policy is None or policy.budget is None)
        )

    def _lean_plan(  # noqa: PLR0912, PLR0915  (the common case reads best as one piece)
        self, req: _Request, fn: Callable[[OperationContext], Any], policy: RetryPolicy | None,
        wait_until: float | None,
    ) -> Plan[Any]:
        """The common case straight-line: a new key, ``fn`` succeeds, its outcome
        recorded. The steps, their order, gates and shields are those of
        :meth:`_claim_and_run`, :meth:`_attempts` and :meth:`_succeeded` for such
        an operation (so every fault the simulator injects between them is met
        as there); at the first reply that is not the common case, those plans
        take over from where it stands."""
        key = req.key.value
        dep = req.dependency
        nonce = _nonce()
        member = f"{key}|{nonce}"
        probe = f"{nonce}.0"
        calls = [self._note("add", [member]), self._idem.claim(req.key, None, req.envelope, nonce)]
        at, gates = _LEAN_AT, _LEAN_GATES
        waves: Sequence[int] = _LEAN_WAVES
        register = None
        if dep is not None:  # the breaker's admission, and its registration the first time
            calls.append(self._breakers.ops.before_call(dep, probe_id=probe))
            at, gates, waves = _LEAN_CB_AT, _LEAN_CB_GATES, _LEAN_CB_WAVES
            register = self._breakers.registration_call(dep)
            if register is not None:
                calls.append(register)
                at, waves = _LEAN_CB_REG_AT, _LEAN_CB_REG_WAVES
        yield Hold(key, nonce, member)
        try:
            replies = yield IO(calls, gates, waves=waves)
        except DurabilisError as exc:
            yield from self._undo_begin(
                req, nonce, member, probe, exc.partial or _unknown(len(calls)), at
            )
            raise
        except INTERRUPTS:
            yield from self._undo_begin(req, nonce, member, probe, _unknown(len(calls)), at)
            raise
        if register is not None and dep is not None and replies.status[3] == "c":
            self._breakers.mark_registered(dep)
        reply = replies[1]
        token = None
        if (replies.status[:2] == "cc" and type(reply) is list and len(reply) >= 6
                and reply[0] == b"new" and reply[4] == 0 and not reply[5]
                and type(reply[1]) is bytes and reply[1].isascii()
                and (dep is None or replies.status[2] == "c")):
            token = reply[1].decode()
        if not token:  # a duplicate, a takeover, an earlier claim to settle, foreign data
            return (yield from self._claimed(
                req, fn, policy, wait_until, replies, at, nonce, member, probe, None, None,
            ))
        cl = _Claim(nonce, member, token)
        permit = None
        if dep is not None:
            permit = yield from self._admission(req, cl, replies, at, probe)
        start = self.clock()
        ctx = OperationContext(
            req.agent_id, req.operation_type, req.payload, key, token, 0, dep, None, None,
            False, False, req.key.caller_key,
        )
        try:
            ok, value = yield Run(fn, ctx, ctx)
        except GeneratorExit:
            raise  # the plan abandoned (its process died, in the simulator)
        except BaseException:
            if cl.pid != _fork.pid():
                raise  # (see _attempts)
            yield from self._abandon(req, cl, permit, None, touched=True, started=1)
            raise
        if cl.pid != _fork.pid():
            if ok:
                return value
            raise value
        took_ms = (self.clock() - start) * 1000.0
        if not ok:  # the retry loop, from its first attempt's failure
            return (yield from self._attempts(
                req, fn, policy, cl, permit, first=(value, start, took_ms)
            ))
        return (yield from self._lean_record(req, cl, permit, value, took_ms))

    def _lean_record(
        self, req: _Request, cl: _Claim, permit: Permit | None, value: Any, took_ms: float,
    ) -> Plan[Any]:
        """The lean path's record step (as :meth:`_succeeded` sends it for its
        case); any reply but the common one hands it to :meth:`_succeeded`."""
        key, dep, token = req.key.value, req.dependency, cl.token
        assert token is not None
        packed, _, not_stored = self._encode_result(req, value)
        record = [self._idem.record_packed(req.key, packed, token, not_stored, cl.nonce)]
        if dep is not None:  # (its report beside the record: one step, as _succeeded's)
            record.append(self._breakers.ops.after_call(dep, True, permit, took_ms))
        try:
            done = yield IO(
                record, _LEAN_RECORD_GATES, shield=True, waves=_LEAN_RECORD_WAVES[:len(record)],
            )
        except DurabilisError as exc:
            return (yield from self._succeeded(req, cl, permit, value, took_ms, first=exc))
        reply = done[0]
        if (done.status != "cc"[:len(record)] or type(reply) is not list or not reply
                or reply[0] != b"ok"):
            return (yield from self._succeeded(req, cl, permit, value, took_ms, first=done))
        if dep is not None:
            self._breakers.reported(dep, permit, done[1], took_ms)  # fires; notes the cache
        self._leave([cl.member], {"started": 1, "succeeded": 1})
        if not_stored:
            _log.error(
                "durability_result_not_stored", idempotency_key=key,
                operation_type=req.operation_type, reason=not_stored,
            )
            raise ResultNotStored(key, not_stored, result=value)
        return value

    def _claim_and_run(  # noqa: PLR0912, PLR0915  (the claim step reads best as one piece)
        self, req: _Request, fn: Callable[[OperationContext], Any], wait_until: float | None
    ) -> Plan[Any]:
        policy = self._retry.get_policy(req.operation_type)
        budget = policy.budget if policy is not None else None
        dep = req.dependency
        dedup = self.config.idempotency.enabled
        nonce = _nonce()
        member = self.member(req.key.value, nonce) if dedup else ""
        probe = f"{nonce}.0"
        # On Cluster these go in waves (Store.run_step), and no wave is sent
        # after a refusal. First the index entry (an entry without its claim
        # is dropped by recover_orphans), the breaker's registration and the
        # claim, fused with its birth entry in its own slot's index bucket: a
        # worker killed just after its claim is listed there even if the
        # index entry beside it never landed (a duplicate writes neither, and
        # asks nothing else: it gets its result while the circuit is open, and
        # never takes a probe slot); then the breaker and the budget (charged
        # only for a new claim). A healthy breaker admits from its cache
        # without a call (CircuitBreakerRegistry cached_admission_seconds):
        # then the claim's is the only wave.
        calls: list[ScriptCall] = []
        at: dict[str, int] = {}
        gates: dict[int, Callable[[Any], bool]] = {}
        waves: list[int] = []
        gone: tuple[list[str], dict[str, int]] = ([], {})
        if dedup:
            at["note"] = len(calls)
            calls.append(self._note("add", [member]))
            waves.append(0)
            if not self.fuses:
                gone = self._take_gone()
                if (note := self._gone_note(*gone)) is not None:
                    at["gone"] = len(calls)  # settled claims' entries: beside ours (_leave)
                    calls.append(note)
                    waves.append(0)
            at["claim"] = len(calls)
            claim_call = self._idem.claim(req.key, None, req.envelope, nonce)
            if self._buckets:  # with its birth entry, beside the index entry
                gates[len(calls)] = _born_claim_refused
                birth = self._birth("add", self._bucket(req.key.value), [member])
                calls.append(fuse([birth, claim_call], [False, True]))
                waves.append(0)
            else:
                gates[len(calls)] = _claim_refused
                calls.append(claim_call)
                waves.append(1)
        if dedup and req.aliases:
            # A rotation of the key secret: the operation's key under each other
            # secret (its aliases) may hold it, completed, in progress or parked.
            # Aliases live in other hash slots, so they are never in the claim's
            # script: the claim of the current key comes first, then the aliases
            # are read (read-only). Standalone: in the claim's own atomic script,
            # after it; Cluster: in the wave after the claim's (with the
            # breaker's admission). Two replicas of a rolling rotation, one with
            # current=old and one with current=new (each knowing the other's
            # secret), can then never both run it: each writes its own key and
            # then reads the other's. Every key is linearizable, so order the
            # four operations: if A's read of B's key comes before B's claim of
            # it, then A's claim (before A's read) comes before B's claim, which
            # comes before B's read of A's key: B sees A's claim. So at least
            # one sees the other in progress (or done) and gives its claim back
            # (both may, and both then wait or answer OperationInProgress: never
            # both run). See _alias_holder for what each answer means.
            at["aliases"] = len(calls)
            for alias in req.aliases:
                calls.append(self._idem.check(alias, tombstones=True))
                waves.append(2)
        cached = None if self.fuses or dep is None else self._breakers.cached(dep)
        if dep is not None and cached is None:
            at["cb"] = len(calls)
            gates[len(calls)] = _breaker_refused
            calls.append(self._breakers.ops.before_call(dep, probe_id=probe))
            waves.append(2)
        if budget is not None:  # after the breaker: a refused call is not charged
            at["budget"] = len(calls)
            calls.append(self._budget.record_call(req.operation_type, budget))
            waves.append(3 if "cb" in at else 2)
        register = self._breakers.registration_call(dep) if dep is not None else None
        if register is not None:
            at["register"] = len(calls)
            calls.append(register)
            waves.append(0)
        unknown = Replies([None] * len(calls), "?" * len(calls))
        if dedup:
            # The keep-alive holds the claim from before it exists: between
            # the claim and its compensation (or the first attempt) it is
            # renewed like any other.
            yield Hold(req.key.value, nonce, member)
        try:
            replies = (yield IO(calls, gates, waves=waves)) if calls else Replies([], "")
        except DurabilisError as exc:
            if "gone" in at and (exc.partial or unknown).status[at["gone"]] != "c":
                self._unsent(*gone)  # not surely removed: again later, alone
            yield from self._undo_begin(req, nonce, member, probe, exc.partial or unknown, at)
            raise
        except INTERRUPTS:
            if "gone" in at:
                self._unsent(*gone)
            yield from self._undo_begin(req, nonce, member, probe, unknown, at)
            raise
        if "claim" in at and self._buckets:
            replies = _unwrap_born_claim(replies, at["claim"])
        if register is not None and dep is not None and replies.status[at["register"]] == "c":
            self._breakers.mark_registered(dep)
        return (yield from self._claimed(
            req, fn, policy, wait_until, replies, at, nonce, member, probe, cached, budget,
        ))

    def _claimed(  # noqa: PLR0917  (what the claim step held, one by one)
        self, req: _Request, fn: Callable[[OperationContext], Any], policy: RetryPolicy | None,
        wait_until: float | None, replies: Replies, at: Mapping[str, int], nonce: str,
        member: str, probe: str, cached: Permit | None, budget: Any,
    ) -> Plan[Any]:
        """What follows a claim step that ran: its replies decoded (a duplicate,
        the aliases, the breaker's answer, the budget), then the attempts."""
        dep = req.dependency
        dedup = self.config.idempotency.enabled
        claim: New | Duplicate | None = New(token=None)
        if dedup:
            claim = None
            if replies.status[at["claim"]] != "n":  # "n": the breaker refused, nothing ran
                try:
                    claim = self._idem.decode_claim(req.key, replies[at["claim"]], times=False)
                except DurabilisError:  # KeyReuseMismatch, CorruptData
                    yield from self._undo_begin(req, nonce, member, probe, replies, at)
                    raise
        listed = dedup and replies.ran(at["note"])
        if isinstance(claim, Duplicate):
            return (yield from self._duplicate(req, claim, member if listed else "", wait_until))
        orphaned = False
        dead: tuple[IdempotencyKey, ...] = ()
        parked: tuple[IdempotencyKey, ...] = ()
        if "aliases" in at:
            try:
                holder, orphaned, dead, parked = self._alias_holder(
                    req, replies, at["aliases"]
                )
            except DurabilisError:  # CorruptData at an alias
                yield from self._undo_begin(req, nonce, member, probe, replies, at)
                raise
            if holder is not None:
                # The operation is another key's (completed or running under
                # another secret): this claim goes back, the answer is that key's.
                yield from self._undo_begin(req, nonce, member, probe, replies, at)
                return (yield from self._duplicate(req, holder[1], "", wait_until, holder[0]))

        token = claim.token if claim is not None else None
        cl = _Claim(
            nonce, member if listed else "", token,
            taken_over=bool(claim is not None and claim.taken_over) or orphaned,
            settle=dedup and token is not None and _had_previous(replies[at["claim"]]),
            settle_aliases=parked if token is not None else (),
            orphaned_aliases=dead if token is not None else (),
        )
        permit: Permit | None = cached
        if dep is not None and cached is None:
            permit = yield from self._admission(req, cl, replies, at, probe)
        if budget is not None and replies.status[at["budget"]] == "c":
            try:
                self._budget.decode(req.operation_type, replies[at["budget"]])
            except CorruptData:
                _log.exception("durability_retry_budget_corrupt", operation_type=req.operation_type)
        return (yield from self._attempts(req, fn, policy, cl, permit))

    def _admission(
        self, req: _Request, cl: _Claim, replies: Replies, at: Mapping[str, int], probe: str,
    ) -> Plan[Permit]:
        """The breaker's answer in a claim step: its permit (its transition fired,
        noted for the registry). Refused: the claim goes back and CircuitOpen is
        raised, or, with ``park_on_open``, the operation is parked."""
        assert req.dependency is not None
        try:
            return self._decode_permit(req.dependency, replies[at["cb"]])
        except CircuitOpen as exc:
            if not req.park_on_open:
                yield from self._undo_begin(req, cl.nonce, cl.member, probe, replies, at)
                raise
            yield from self._park(
                req, cl, attempts=0, error=CIRCUIT_OPEN, reason=CIRCUIT_OPEN, cause=exc,
            )
            raise  # (_park raises: RetryExhausted, or OutcomeUnrecorded)
        except DurabilisError:
            yield from self._undo_begin(req, cl.nonce, cl.member, probe, replies, at)
            raise

    def _undo_begin(  # noqa: PLR0917  (what the claim step held, one by one)
        self, req: _Request, nonce: str, member: str, probe: str, replies: Replies,
        at: Mapping[str, int],
    ) -> Plan[None]:
        """Give back what a claim step that will not go on may have taken.

        A claim taken over from a dead owner is not simply given back: that
        owner's operation may have run, and this claim is now the only trace
        of it. It is parked (``WORKER_LOST``), as recovery would have done.
        """
        claimed = "claim" in at and replies.ran(at["claim"])
        listed = "note" in at and replies.ran(at["note"])
        first: list[ScriptCall] = []
        if claimed:
            first.append(self._idem.release(req.key, None, nonce, keep_taken=True))
        if "cb" in at and replies.ran(at["cb"]) and req.dependency is not None:
            first.append(self._breakers.ops.release_probe(req.dependency, probe))
        if first:
            try:  # Cluster: at once (one failing never holds back the other)
                done = yield IO(first, shield=True, waves=[0] * len(first))
            except DurabilisError as exc:  # what is left is settled by recovery
                _log.error("durability_claim_undo_failed", idempotency_key=req.key.value,
                           error=f"{type(exc).__name__}: {exc}")
                return
            if claimed and done[0] == 2:
                yield from self._park_inherited(req, nonce, member if listed else "")
                return
        gone = [self._note("rem", [member])] if listed else []
        if claimed and self._buckets:  # its birth entry (recovery drops it otherwise)
            gone.append(self._birth_gone(req.key.value, nonce))
        if gone:
            yield from self._best_effort(gone, "durability_claim_undo_failed", req.key.value,
                                         waves=[0] * len(gone))

    def _merge_key(self, key: str) -> str | None:
        """Parkings of one operation share a DLQ record (when operations have keys)."""
        return key if self.config.idempotency.enabled else None

    def _park_inherited(self, req: _Request, nonce: str, member: str) -> Plan[None]:
        """Park an inherited orphan (a taken-over claim this call will not run), as
        a compensating step: shielded, a storage failure logged (what it leaves
        behind is found by recovery). ``parked`` is counted from the enqueue's
        reply: only a new record is a new operation parked (not one merged into
        the operation's pending record)."""
        dlq_id = dlq_id_for(req.key.value, nonce)
        _log.warning("durability_orphan_recovered", idempotency_key=req.key.value,
                     dlq_id=dlq_id, operation_type=req.operation_type, agent_id=req.agent_id)
        calls = [
            self._dlq.enqueue_prepared(
                self._park_record(req), 0, WORKER_LOST, dlq_id=dlq_id,
                metadata={"reason": WORKER_LOST, "claim": nonce},
                merge_key=self._merge_key(req.key.value),
            ),
            self._idem.release(req.key, None, nonce, hold_ms=self._dlq.hold_ms(),
                               touched=True),
            self._note("rem", [member] if member else [], recovered=1, parkings=1),
            *([self._birth_gone(req.key.value, nonce)] if self._buckets else []),
        ]
        try:
            out = yield IO(calls, {0: _missed}, shield=True)
        except DurabilisError as exc:
            _log.error("durability_claim_undo_failed", idempotency_key=req.key.value,
                       error=f"{type(exc).__name__}: {exc}")
            return
        if out.status[0] != "c":
            return
        try:
            made = self._dlq.decode_enqueue(calls[0], out[0])
        except DurabilisError as exc:  # (CorruptData: nothing to count)
            _log.error("durability_claim_undo_failed", idempotency_key=req.key.value,
                       error=f"{type(exc).__name__}: {exc}")
            return
        if made.new_record:
            self._leave([], {"parked": 1})

    def _abandon(
        self, req: _Request, cl: _Claim, permit: Permit | None, probe: str | None,
        *, touched: bool = False, **counts: int,
    ) -> Plan[bool]:
        """The operation stops without an outcome to record: release claim and probe slot.

        ``touched``: interrupted once ``fn`` had started: the claim is given back
        as a touched tombstone, so the next delivery runs with ``ctx.recovered``
        (an earlier run may have had its effect), never as if untouched.
        """
        if req.dependency is not None:
            self._breakers.forget(req.dependency)  # no report confirms the cache (Cluster)
        calls: list[ScriptCall] = []
        if cl.token or cl.member:
            # A run flagged recovered passes the mark on (its own key may hold it
            # only through an alias, under another secret, that expires sooner).
            calls.append(self._idem.release(
                req.key, cl.token, cl.nonce, touched=touched or cl.taken_over,
            ))
        dep = req.dependency
        if dep is not None:
            if permit is not None and permit.is_probe:
                calls.append(self._breakers.ops.release(dep, permit))
            elif probe is not None:
                calls.append(self._breakers.ops.release_probe(dep, probe))
        released = len(calls)
        calls.append(self._note("rem", [cl.member] if cl.member else [], **counts))
        if self._buckets and cl.token and self.config.idempotency.enabled:
            calls.append(self._birth_gone(req.key.value, cl.nonce))
        # Cluster: the releases at once (one failing never holds back the other),
        # the index entries only after them (a claim whose release failed stays
        # listed, so recovery finds it).
        waves = [0] * released + [1] * (len(calls) - released)
        return (yield from self._best_effort(
            calls, "durability_release_failed", req.key.value, waves=waves,
        ))

    def _alias_holder(
        self, req: _Request, replies: Replies, first: int
    ) -> tuple[
        tuple[IdempotencyKey, Duplicate] | None,
        bool,
        tuple[IdempotencyKey, ...],
        tuple[IdempotencyKey, ...],
    ]:
        """What the claim step read at the key's aliases: the alias holding the
        operation (completed, else in progress with a live lease) and its record;
        whether an alias is in progress with its lease run out (a dead owner: this
        claim runs it, told an earlier run may have had its effect, as a takeover
        of its own key would be; recovery parks the dead claim, whose replay then
        finds this key's outcome; or released "touched", after an interruption
        once fn had started there); the aliases released (their operation may be
        parked: this run's success settles those records).

        Raises:
            CorruptData: Foreign data at an alias.
        """
        done: tuple[IdempotencyKey, Duplicate] | None = None
        running: tuple[IdempotencyKey, Duplicate] | None = None
        orphaned = False
        dead: list[IdempotencyKey] = []
        parked: list[IdempotencyKey] = []
        for i, alias in enumerate(req.aliases):
            if replies.status[first + i] not in "rc":  # not read: the step was refused
                continue
            seen = self._idem.decode_alias(alias, replies[first + i])
            if seen == "touched":  # released after fn started there: it may have run
                orphaned = True
                parked.append(alias)
            elif seen == "released":
                parked.append(alias)
            elif isinstance(seen, Duplicate):
                if not seen.in_progress:
                    done = done or (alias, seen)
                elif seen.lease_expired:
                    # A dead claim: recovery may park it (before or after this
                    # run's success): settled if parked first, recorded done here.
                    orphaned = True
                    dead.append(alias)
                    parked.append(alias)
                else:
                    running = running or (alias, seen)
        return done or running, orphaned, tuple(dead), tuple(parked)

    def _duplicate(
        self, req: _Request, dup: Duplicate, member: str, wait_until: float | None,
        alias: IdempotencyKey | None = None,
    ) -> Plan[Any]:
        """Answer as a duplicate of the key's record (of ``alias``'s: the key under
        another secret), waiting while it is in progress, up to ``wait_until``."""
        # Counting must not fail the call: the answer is known. Standalone: the
        # claim step wrote nothing, the count waits for a note sent anyway.
        # Cluster: its index entry (no claim of it exists) goes with its count
        # later (_leave).
        if member and not self.fuses:
            self._leave([member], {"duplicates": 1})
            member, n = "", 0
        else:
            n = self._take_duplicates() + 1 if member else self._count_duplicate()
        if member or n:
            calls = [self._note("rem" if member else "none", [member] if member else [],
                                duplicates=n)]
            yield from self._best_effort(calls, "durability_duplicate_note_failed",
                                         req.key.value)
        while dup.in_progress:
            now = self.clock()
            if wait_until is None or now >= wait_until:
                raise OperationInProgress(req.key.value, dup.original_timestamp)
            yield Sleep(min(0.05, max(0.0, wait_until - now)))
            watched = alias or req.key
            replies = yield IO([self._idem.check(watched)])
            seen = self._idem.decode_check(watched, replies[0])
            if seen is None or seen.lease_expired:
                if alias is not None:
                    # Two replicas of a rotation that each gave their claim back
                    # on seeing the other's: they do not claim again in step.
                    yield Sleep(random.uniform(0.0, 0.05))
                return _CLAIM_AGAIN  # released or its worker died: claim it ourselves
            dup = seen
        otel.answered_duplicate()  # otel hook: the answer is the record's, nothing ran
        if dup.not_stored:
            raise ResultNotStored(req.key.value, dup.not_stored)
        return dup.original_result

    def _attempts(  # noqa: PLR0912, PLR0915  (the retry loop reads best as one piece)
        self,
        req: _Request,
        fn: Callable[[OperationContext], Any],
        policy: RetryPolicy | None,
        cl: _Claim,
        permit: Permit | None,
        *,
        first: tuple[BaseException, float, float] | None = None,
    ) -> Plan[Any]:
        """The attempts, retried as the policy says. ``first``: the lean path's
        first attempt failed (its error, when the attempts started, how long it
        took in ms): the loop goes on from there."""
        dep = req.dependency
        budget = policy.budget if policy is not None else None
        deadline = req.deadline
        if deadline is None and policy is not None:
            deadline = policy.deadline_seconds
        start = self.clock() if first is None else first[1]
        confirmed = start  # when this claim was last known to be ours
        failed: tuple[BaseException, RetryDecision] | None = None  # the last attempt's failure
        slept = 0.0
        attempt = 0
        while True:
            probe: str | None = None
            if (first is None and cl.token
                    and self.clock() - confirmed >= self.config.renew_interval):
                # A long pause (a backoff, or a stalled process): before the next
                # effect, make sure the lease did not lapse and pass to another
                # worker, who may have completed the operation meanwhile.
                try:
                    held = yield IO([self._idem.renew(req.key, cl.token, self._lease_ms)])
                except INTERRUPTS:
                    yield from self._abandon(req, cl, None, None, touched=attempt > 0, started=1)
                    raise
                except DurabilisError as broke:
                    return (yield from self._park_failed(req, cl, failed, broke))
                if not _renewed(held[0]):
                    # Its index entry stays: if recovery reclaimed the claim (same
                    # nonce), the entry is how a crashed recoverer is recovered in
                    # turn; otherwise recover_orphans drops it.
                    raise LeaseLost(req.key.value)
                confirmed = self.clock()
            if attempt > 0 and dep is not None:
                probe = f"{cl.nonce}.{attempt}"
                try:
                    admit = yield IO([self._breakers.ops.before_call(dep, probe_id=probe)])
                    permit = self._decode_permit(dep, admit[0])
                except CircuitOpen as refused:
                    return (yield from self._park(
                        req, cl, attempts=attempt, error=CIRCUIT_OPEN, reason=CIRCUIT_OPEN,
                        cause=refused, started=1,
                    ))
                except INTERRUPTS:
                    yield from self._abandon(req, cl, None, probe, touched=True, started=1)
                    raise
                except DurabilisError as broke:
                    yield from self._best_effort(
                        [self._breakers.ops.release_probe(dep, probe)],
                        "durability_release_failed", req.key.value,
                    )
                    return (yield from self._park_failed(req, cl, failed, broke))
            if attempt > 0 and self._past(deadline, start, slept):
                # The round trips after the backoff (renewal, admission) ran
                # into the deadline: no attempt starts past it.
                if probe is not None:
                    assert dep is not None
                    yield from self._best_effort(
                        [self._breakers.ops.release_probe(dep, probe)],
                        "durability_release_failed", req.key.value,
                    )
                assert failed is not None
                failed = (failed[0], failed[1].deny_deadline())
                return (yield from self._park_failed(req, cl, failed, None))
            if attempt > 0:
                # Counted and announced as it starts (never one denied after its
                # decision: a cancellation held back until the backoff, a lease
                # lost, a breaker opened or the deadline reached meanwhile), in
                # this process's batch of counts, like the other counters.
                assert failed is not None
                announced = failed[1]
                emit_retry_attempt(req.operation_type, announced, agent_id=req.agent_id)
                otel.retried(  # otel hook
                    announced.attempts, announced.delay, announced.error_code)
                self._leave([], {"retries": 1})
            if first is not None:  # (attempt 0, run by the lean path)
                ok, value, took_ms, first = False, first[0], first[2], None
            else:
                ctx = OperationContext(
                    req.agent_id, req.operation_type, req.payload, req.key.value, cl.token,
                    attempt, dep, req.task_id, req.phase, req.replay, cl.taken_over,
                    req.key.caller_key,
                )
                began = self.clock()
                ok, value = yield from self._attempt(req, fn, cl, permit, probe=probe, ctx=ctx)
                if cl.pid != _fork.pid():
                    # A child forked inside fn that returned: it records, releases
                    # and retries nothing (its parent does); its fn's outcome is its own.
                    if ok:
                        return value
                    raise value
                took_ms = (self.clock() - began) * 1000.0
            if ok:
                return (yield from self._succeeded(req, cl, permit, value, took_ms))
            exc: BaseException = value
            try:
                decision = decide(
                    policy, attempt, exc, elapsed=self.clock() - start + slept, deadline=deadline,
                )
            except Exception as bug:  # a policy's own code raised (a subclass's bug)
                # An attempt ran: park it (never hold the claim for the lease).
                with contextlib.suppress(Exception):
                    _log.error("durability_retry_decision_failed", agent_id=req.agent_id,
                               operation_type=req.operation_type, error=type(bug).__qualname__)
                decision = RetryDecision(
                    False, 0.0, attempt, attempt + 1, error_code(exc), EXHAUSTED,
                )
            if decision.stop_reason == NON_RETRYABLE:
                # Not a dependency failure: free a probe slot without a verdict.
                yield from self._abandon(req, cl, permit, probe, started=1, non_retryable=1)
                emit_retry_stop(
                    req.operation_type, decision, agent_id=req.agent_id,
                    last_error=error_text(exc),
                )
                raise exc
            calls: list[ScriptCall] = []
            if dep is not None:
                calls.append(self._breakers.ops.after_call(dep, False, permit, took_ms))
            if decision.retry and budget is not None:
                calls.append(self._budget.spend_retry(req.operation_type, budget))
            failed = (exc, decision)
            try:  # the report and the budget are independent: at once
                replies = (yield IO(calls, waves=[0] * len(calls))) if calls else Replies([], "")
            except INTERRUPTS:
                yield from self._abandon(req, cl, permit, probe, touched=True, started=1)
                raise
            except DurabilisError as broke:
                if dep is not None:
                    self._breakers.forget(dep)  # a report that did not reach Redis
                return (yield from self._park_failed(req, cl, failed, broke))
            if dep is not None:
                self._breakers.reported(dep, permit, replies[0], took_ms)  # fires; notes the cache
            if decision.retry and budget is not None:
                try:
                    state = self._budget.decode(req.operation_type, replies[-1])
                except DurabilisError as broke:  # foreign data at the budget's key
                    return (yield from self._park_failed(req, cl, failed, broke))
                if not state.allowed:
                    decision = decision.deny_budget()
            if decision.retry and self._past(deadline, start, slept, decision.delay):
                # The round trip itself (the breaker's report, the budget's
                # answer) took the time left: the retry is not made (a budget
                # stays spent: a retry charged, never run).
                decision = decision.deny_deadline()
            failed = (exc, decision)
            if not decision.retry:
                return (yield from self._park_failed(req, cl, failed, None))
            try:
                yield Sleep(decision.delay)
            except INTERRUPTS:
                yield from self._abandon(req, cl, None, None, touched=True, started=1)
                raise
            slept += decision.delay if TESTING.instant else 0.0
            attempt += 1

    def _attempt(
        self, req: _Request, fn: Callable[[OperationContext], Any], cl: _Claim,
        permit: Permit | None, *, probe: str | None, ctx: OperationContext,
    ) -> Plan[tuple[bool, Any]]:
        """Run ``fn`` once: ``(True, result)`` or ``(False, its error)``."""
        try:
            outcome: tuple[bool, Any] = yield Run(fn, ctx, ctx)
        except GeneratorExit:
            raise  # the plan abandoned (its process died, in the simulator)
        except BaseException:
            if cl.pid != _fork.pid():
                # A child forked inside fn leaving by an exception (sys.exit
                # is the usual way): the claim is its parent's, still running.
                raise
            # Interrupted while fn ran (a cancellation, a timeout, SystemExit,
            # KeyboardInterrupt, any BaseException not fn's ordinary error):
            # nothing to record, but its effect may have happened. Give the
            # probe slot back and the claim as touched (the next delivery
            # runs with ctx.recovered), then re-raise.
            yield from self._abandon(req, cl, permit, probe, touched=True, started=1)
            raise
        return outcome

    def _past(
        self, deadline: float | None, start: float, slept: float, delay: float = 0.0
    ) -> bool:
        """Whether ``delay`` more seconds reach the attempts' deadline."""
        return deadline is not None and self.clock() - start + slept + delay >= deadline

    def _park_failed(
        self, req: _Request, cl: _Claim, failed: tuple[BaseException, RetryDecision] | None,
        broke: DurabilisError | None,
    ) -> Plan[Any]:
        """Park an operation whose last attempt failed: retries ran out, or Redis
        failed before the next one (then ``broke``: an attempt ran, so the
        operation is parked, never silently given back)."""
        if failed is None:  # nothing ran since the claim was confirmed: nothing to park
            assert broke is not None
            yield from self._abandon(req, cl, None, None)
            raise broke
        exc, decision = failed
        text = error_text(exc)
        error = text if text.startswith(decision.error_code) else f"{decision.error_code}: {text}"
        reason = (
            str(decision.stop_reason) if broke is None
            else "CORRUPT_DATA" if isinstance(broke, CorruptData) else "STORAGE_UNAVAILABLE"
        )
        return (yield from self._park(
            req, cl, attempts=decision.attempts if broke is None else decision.attempt + 1,
            error=error, reason=reason, cause=broke or exc,
            decision=decision if broke is None else None, started=1,
        ))

    def _persist(  # noqa: PLR0912, PLR0917  (a step's calls, their order, waves, gates, decoding)
        self, key: str, calls: dict[str, ScriptCall], order: Sequence[str],
        gates: Mapping[str, Callable[[Any], bool]], on_reply: Callable[[str, Any], Any],
        waves: Mapping[str, int] | None = None, *, first: Replies | DurabilisError | None = None,
    ) -> Plan[None]:
        """Send a step until every call of it is settled, shielded, while the lease lasts.

        ``on_reply(name, reply)`` decodes a call's reply (committed or refused)
        and returns ``None`` (settled), a call to send instead (a checkpoint save
        whose eviction hints were stale), or ``_GIVE_UP`` (settled, and the
        other gated calls and the index note are dropped: the claim was lost). A step that fails is
        sent again, less the calls that committed, with backoff; once the
        lease's time has run out it is given up after ``_LATE_TRIES`` more
        failures (after a long pause, the process tries again before it gives up).
        """
        pending = dict(calls)
        retry_until: float | None = None
        late = 0  # failures since the lease's time ran out (a paused process tries again first)
        delay = _RECORD_BACKOFF[0]
        while pending:
            names = [n for n in order if n in pending]
            step_gates = {i: gates[n] for i, n in enumerate(names) if n in gates}
            try:
                if first is not None:  # (the lean path sent this step once already)
                    outcome, first = first, None
                    if isinstance(outcome, DurabilisError):
                        raise outcome
                    replies = outcome
                else:
                    replies = yield IO(
                        [pending[n] for n in names], step_gates, shield=True,
                        waves=[waves[n] for n in names] if waves else None,
                    )
            except CorruptData:
                raise
            except DurabilisError as exc:
                # A birth entry's removal goes once, whatever came of it: left
                # behind, recovery drops it with one look; it never holds back
                # (nor fails) the outcome's record.
                pending.pop("birth", None)
                if exc.partial is not None:
                    for i, name in enumerate(names):
                        if exc.partial.status[i] == "c":
                            _settle(name, exc.partial[i], pending, gates, on_reply)
                now = self.clock()
                if retry_until is None:
                    retry_until = now + self._lease_s
                late += now >= retry_until
                if late >= _LATE_TRIES:
                    names = [n for n in order if n in pending]
                    raise _Unsent(exc, [pending[n] for n in names], {
                        i: gates[n] for i, n in enumerate(names) if n in gates
                    }) from exc
                _log.warning(
                    "durability_record_retry", idempotency_key=key,
                    error=f"{type(exc).__name__}: {exc}", delay_seconds=round(delay, 3),
                )
                yield Sleep(delay * (0.5 + random.random() / 2), shield=True)
                delay = min(delay * 2, _RECORD_BACKOFF[1])
                continue
            pending.pop("birth", None)  # (once, as above)
            for i, name in enumerate(names):
                if replies.status[i] != "n":  # "n": aborted by another's refusal: again
                    _settle(name, replies[i], pending, gates, on_reply)

    def _encode_result(
        self, req: _Request, result: Any
    ) -> tuple[bytes, ScriptCall | None, str]:
        """The result encoded for every pillar that stores it; never raises.

        After the effect, nothing may raise before the outcome is recorded: a
        result some pillar cannot keep is recorded as "completed, result not
        stored" (the third value says why; no checkpoint then).
        """
        try:
            packed = bytes(self._idem.pack_value(result, "result"))
            save = None
            if req.task_id is not None and req.phase is not None:
                save = self._ckpt.save(req.task_id, req.agent_id, req.phase, result)
        except Exception as exc:
            return b"", None, f"{type(exc).__name__}: {exception_str(exc)}"[:500]
        return packed, save, ""

    def _succeeded(  # noqa: PLR0912, PLR0915  (the record step reads best as one piece)
        self, req: _Request, cl: _Claim, permit: Permit | None, result: Any, took_ms: float,
        *, first: Replies | DurabilisError | None = None,
    ) -> Plan[Any]:
        """Record the outcome of ``fn``'s success. ``first``: what the lean
        path's first sending of this very step gave (its replies, or its
        failure): the step goes on from there."""
        packed, save, not_stored = self._encode_result(req, result)
        calls: dict[str, ScriptCall] = {}
        if cl.token:
            # An operation parked, or claimed by a dead worker, under another
            # secret's key: its DLQ record is settled in a later wave on Cluster
            # (a crash between the waves leaves it pending), or recovery may
            # park the dead claim after this success: the record outlives any
            # such DLQ record, so its replay finds the operation done.
            aliased = cl.orphaned_aliases or cl.settle_aliases
            calls["record"] = self._idem.record_packed(
                req.key, packed, cl.token, not_stored, cl.nonce,
                hold_ms=self._dlq.hold_ms() * 2 if aliased else 0,
            )
        # The dead claims themselves are recorded done (never parked, then).
        for i, alias in enumerate(cl.orphaned_aliases):
            calls[f"orphan.{i}"] = self._idem.record_packed(
                alias, packed, None, not_stored, orphan=True
            )
        if save is not None:
            calls["save"] = save
        if req.dependency is not None:
            calls["report"] = self._breakers.ops.after_call(
                req.dependency, True, permit, took_ms
            )
        if (settle := self._settle_call(req, cl)) is not None:
            calls["settle"] = settle
        # A rotation: the operation parked under another secret's key (a
        # released alias) is settled too (DLQ keys share one slot: same wave).
        for i, alias in enumerate(cl.settle_aliases):
            calls[f"settle.{i}"] = self._dlq.finish(
                record_id_for(alias.value), DlqStatus.REPLAYED, by=_SETTLED_BY,
                merge_key=alias.value,
            )
        if self._buckets and cl.member and cl.token:
            # The birth entry is no longer needed once the index entry landed
            # (cl.member): beside the record, no round trip of its own. (Not
            # listed there, it stays until recovery finds the record done.)
            calls["birth"] = self._birth_gone(req.key.value, cl.nonce)
        counts = {"started": 1, "succeeded": 1}
        # Standalone: one atomic step; the record goes first, its first write
        # frees memory, so maxmemory never refuses it. Cluster, in waves: the
        # checkpoint first (a checkpoint without its record is saved again by a
        # re-run; a record without its checkpoint would never get one); the
        # record and the breaker's report at once; the DLQ record settled once
        # the outcome is recorded. On both, the index entry is removed later,
        # with the counts, in a batch (_leave): three commands fewer per call.
        order = ("record", "save", "settle", "report") if self.fuses else (
            "save", "record", "report", "birth", "settle"
        )
        waves = {"save": 0, "record": 1, "report": 1, "birth": 1, "settle": 2}
        if cl.settle_aliases:
            named = [f"settle.{i}" for i in range(len(cl.settle_aliases))]
            order = (*order, *named)
            waves.update((n, 2) for n in named)
        if cl.orphaned_aliases:
            named = [f"orphan.{i}" for i in range(len(cl.orphaned_aliases))]
            order = (*order, *named)
            waves.update((n, 2) for n in named)
        lost = False
        misses: dict[str, list[str]] = {}

        def on_reply(name: str, reply: Any) -> Any:
            nonlocal lost
            if name == "record":
                try:
                    self._idem.decode_record(req.key, reply)
                except LeaseLost:
                    lost = True  # taken over: the new owner records (and saves)
                    return _GIVE_UP
                return None
            if name == "save":
                if _tag(reply) == "exists":  # ours, sent again after a lost reply
                    return None
                try:
                    out = self._ckpt.decode_save(calls["save"], reply)
                except DurabilisError as exc:
                    # Refused for good (foreign data at a checkpoint key): the
                    # outcome is recorded all the same, without its checkpoint
                    # (a gated refusal wrote nothing; the record is sent again alone).
                    _log.error(
                        "durability_checkpoint_not_saved", idempotency_key=req.key.value,
                        task_id=req.task_id, error=f"{type(exc).__name__}: {exc}",
                    )
                    return None
                if isinstance(out, ScriptCall):
                    calls["save"] = out
                return out if isinstance(out, ScriptCall) else None
            if name == "report" and req.dependency is not None:
                self._breakers.reported(req.dependency, permit, reply, took_ms)
            if name == "settle":
                return self._settle_again(req, reply, misses.setdefault(name, []),
                                          req.key.value, own=True)
            if name.startswith("orphan."):
                # "lost": no longer a dead claim (recovery reclaimed or parked
                # it first: the settle above, and this record's hold, cover it).
                return None
            if name.startswith("settle."):  # a record parked under an alias
                alias = cl.settle_aliases[int(name[len("settle."):])].value
                return self._settle_again(req, reply, misses.setdefault(name, []), alias,
                                          own=False)
            return None

        gates: dict[str, Callable[[Any], bool]] = {"record": _record_refused}
        if save is not None:
            gates["save"] = _save_refused
        try:
            yield from self._persist(
                req.key.value, calls, order, gates, on_reply, waves, first=first
            )
        except _Unsent as unsent:
            if req.dependency is not None:
                self._breakers.forget(req.dependency)  # its report did not land (yet)
            # After the record, by the keep-alive.
            unsent.calls.append(self._note("rem", [cl.member] if cl.member else [], **counts))
            yield from self._defer(req, cl, unsent)
            raise OutcomeUnrecorded(
                req.key.value, succeeded=True, result=result
            ) from unsent.cause
        except DurabilisError as exc:  # foreign data at a key: nothing to retry
            _log.error(
                "durability_outcome_unrecorded", idempotency_key=req.key.value,
                operation_type=req.operation_type, error=f"{type(exc).__name__}: {exc}",
            )
            raise OutcomeUnrecorded(req.key.value, succeeded=True, result=result) from exc
        if lost:
            # The index entry stays (see _attempts): recovery settles it.
            _log.error(
                "durability_lease_lost", idempotency_key=req.key.value,
                operation_type=req.operation_type,
            )
            raise LeaseLost(req.key.value)
        self._leave([cl.member] if cl.member else [], counts)
        if not_stored:
            _log.error(
                "durability_result_not_stored", idempotency_key=req.key.value,
                operation_type=req.operation_type, reason=not_stored,
            )
            raise ResultNotStored(req.key.value, not_stored, result)
        return result

    def _settle_call(self, req: _Request, cl: _Claim) -> ScriptCall | None:
        """Finishing the key's parked DLQ record, when an earlier delivery may
        have been parked: the success of a later one settles it, so that no
        replay runs it again (after the dedup window, when the record that
        would answer it is gone). A replay finishes its own record."""
        if req.replay_claim is not None:  # a replay: its own record, by its claim
            req.replay_claim.ran = True
            mine: ScriptCall = self._dlq.finish(
                req.replay_claim.dlq_id, DlqStatus.REPLAYED, req.replay_claim.token,
                self._dlq.owner,
            )
            return mine
        mkey = self._merge_key(req.key.value)
        if not (cl.settle and mkey and not req.replay):
            return None
        call: ScriptCall = self._dlq.finish(
            record_id_for(mkey), DlqStatus.REPLAYED, by=_SETTLED_BY, merge_key=mkey
        )
        return call

    def _settle_again(
        self, req: _Request, reply: Any, misses: list[str], merge_key: str, *, own: bool,
    ) -> ScriptCall | None:
        """The settle call to send again when the key's record has another id
        (``merge_key``: the key settled; ``own``: the request's own key's record)."""
        other = self._dlq.settle_miss(reply)
        if other is not None and len(misses) < _LATE_TRIES:
            misses.append(other)
            call: ScriptCall = self._dlq.finish(
                other, DlqStatus.REPLAYED, by=_SETTLED_BY, merge_key=merge_key
            )
            return call
        if _tag(reply) == "ok":
            if own and req.replay_claim is not None:
                req.replay_claim.finished = True
            else:
                _log.info("durability_dlq_settled", idempotency_key=merge_key,
                          operation_type=req.operation_type)
        return None

    def _park(
        self,
        req: _Request,
        cl: _Claim,
        *,
        attempts: int,
        error: str,
        reason: str,
        cause: BaseException,
        decision: RetryDecision | None = None,
        **counts: int,
    ) -> Plan[Any]:
        """Park the failed operation in the DLQ (unless replaying) and release its claim."""
        calls: dict[str, ScriptCall] = {}
        dlq_id = None
        if not req.replay:
            dlq_id = dlq_id_for(req.key.value, cl.nonce)
            record, meta = self._park_record(req), {"reason": reason, "claim": cl.nonce}
            # otel hook: the call's trace context kept with the record, in the bytes
            # the payload cap leaves it ({}: off, or no room)
            meta.update(otel.parking_fields(self._dlq.room(record, meta)))
            calls["enqueue"] = self._dlq.enqueue_prepared(
                record, attempts, error, dlq_id=dlq_id, metadata=meta,
                merge_key=self._merge_key(req.key.value),
            )
        if cl.token or cl.member:
            calls["release"] = self._idem.release(
                req.key, cl.token, cl.nonce,
                hold_ms=self._dlq.hold_ms(),  # the record is pending (a replay's too)
                touched=cl.taken_over,  # (a mark held only by an alias passes on)
            )
        elif self.config.idempotency.enabled and not req.replay:
            # Parked before any claim (open breaker): nothing at the key says it
            # was delivered; a tombstone does, so a later success settles it.
            calls["release"] = self._idem.tombstone(req.key, self._dlq.hold_ms())
        calls["note"] = self._note(
            "rem", [cl.member] if cl.member else [], parkings=0 if req.replay else 1, **counts
        )
        if self._buckets and cl.token and self.config.idempotency.enabled:
            calls["birth"] = self._birth_gone(req.key.value, cl.nonce)

        def on_reply(name: str, reply: Any) -> Any:
            nonlocal dlq_id
            if name == "enqueue":
                again = self._dlq.enqueue_again(calls["enqueue"], reply)
                if again is not None:  # the operation's record is another: park there
                    calls["enqueue"] = again
                    return again
                made = self._dlq.decode_enqueue(calls["enqueue"], reply)
                dlq_id = made.dlq_id
                if made.new_record:  # an operation parked, not a re-parking
                    self._leave([], {"parked": 1})
            return None

        try:
            yield from self._persist(
                req.key.value, calls, ("enqueue", "release", "note", "birth"),
                {"enqueue": _missed} if "enqueue" in calls else {}, on_reply,
                {"enqueue": 0, "release": 1, "note": 2, "birth": 2},
            )
        except _Unsent as unsent:
            yield from self._defer(req, cl, unsent)
            raise OutcomeUnrecorded(req.key.value, succeeded=False) from unsent.cause
        except DurabilisError as exc:
            _log.error(
                "durability_park_failed", idempotency_key=req.key.value,
                operation_type=req.operation_type, error=f"{type(exc).__name__}: {exc}",
            )
            raise OutcomeUnrecorded(req.key.value, succeeded=False) from exc
        if decision is not None:
            emit_retry_stop(
                req.operation_type, decision, agent_id=req.agent_id, dlq_id=dlq_id,
                last_error=error,
            )
        code = decision.error_code if decision is not None else reason
        raise RetryExhausted(req.operation_type, attempts, code, dlq_id) from cause

    def _defer(self, req: _Request, cl: _Claim, unsent: _Unsent) -> Plan[None]:
        """Leave what could not be recorded to the process's keep-alive: it keeps the
        claim and sends it until it lands (an outcome recorded late beats a re-run)."""
        _log.error(
            "durability_outcome_unrecorded", idempotency_key=req.key.value,
            operation_type=req.operation_type,
            error=f"{type(unsent.cause).__name__}: {unsent.cause}",
        )
        yield Defer(
            req.key.value, cl.nonce, cl.member, unsent.calls, unsent.gates,
            self.config.idempotency.dedup_window_seconds,
        )

    # -- crash recovery --

    def recover_plan(self, limit: int) -> Plan[list[str]]:
        """Park every operation whose lease ended (its worker died), at most ``limit``.

        Unfused stores (Cluster) also read a slice of the birth index per pass
        (:meth:`_walk_births`): a claim listed only there is found within a
        cycle of passes (32 on Cluster), fleet-wide."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError("limit", f"must be an integer >= 1, got {limit!r}")
        parked: list[str] = []
        seen = 0
        while seen < limit:
            batch = min(limit - seen, 100)
            replies = yield IO([ScriptCall("layer_orphans", [self._index], [batch])])
            members = list(replies[0] or ())
            for raw in members:
                seen += 1
                dlq_id = yield from self._recover_one(raw, self._index)
                if dlq_id is not None:
                    parked.append(dlq_id)
            if len(members) < batch:
                break
        if seen < limit:
            yield from self._walk_births(limit - seen, parked)
        return parked

    def _walk_births(self, room: int, parked: list[str]) -> Plan[None]:
        """Recovery's look at the birth index (unfused stores), at most ``room`` entries."""
        # Unfused stores: then a slice of _WALK_PER_PASS buckets of the birth
        # index, handed out in turn fleet-wide (layer_walk: on Cluster every
        # bucket once in 32 passes), _WALK per wave. An entry found only there
        # is a claim whose worker died before its index entry landed, hence
        # before fn (fn runs only once both are written): it is parked
        # (WORKER_LOST) all the same, to be replayed. The rest are birth
        # entries left by settled claims: dropped, one look each. A bucket
        # whose node does not answer is read again next cycle.
        n = self._buckets
        if not n:
            return
        seen = 0
        span = min(n, _WALK_PER_PASS)
        reply = (yield IO([ScriptCall("layer_walk", [self._walk], [_WALK_KEEP_MS])]))[0]
        start = (_codec.as_int(reply, key=self._walk, field="pass") - 1) * span % n
        buckets = [self._keys.inflight_bucket(bucket_tag((start + i) % n, n))
                   for i in range(span)]
        for first in range(0, len(buckets), _WALK):
            if seen >= room:
                break
            chunk = buckets[first:first + _WALK]
            batch = min(room - seen, 100)
            calls = [ScriptCall("layer_orphans", [b], [batch]) for b in chunk]
            try:
                replies = yield IO(calls, waves=[0] * len(chunk))
            except DurabilisError as exc:
                _log.warning("durability_birth_index_unread", buckets=len(chunk),
                             error=f"{type(exc).__name__}: {exc}")
                replies = exc.partial or Replies([None] * len(chunk), "?" * len(chunk))
            for i, index in enumerate(chunk):
                if replies.status[i] != "c":
                    continue
                for raw in list(replies[i] or ())[:max(0, room - seen)]:
                    seen += 1
                    dlq_id = yield from self._recover_one(raw, index)
                    if dlq_id is not None:
                        parked.append(dlq_id)

    def _entry_note(
        self, index: str, mode: str, members: Sequence[str | bytes], *, at: int | None = None,
        **counts: int,
    ) -> list[ScriptCall]:
        """A note on the entry recovery found in ``index`` (the in-flight index or a
        birth-index bucket, whose notes carry no counts: they go by the batch)."""
        if index == self._index:
            return [self._note(mode, members, at=at, **counts)]
        return [self._birth(mode, index, members, at=at)]

    def _recover_one(self, raw: Any, index: str) -> Plan[str | None]:
        try:
            member = _codec.as_text(raw, key=index, field="member")
        except CorruptData:
            member = ""
        key, sep, nonce = member.rpartition("|")
        if not sep or not key or not nonce:  # foreign data in the index: drop it
            _log.error("durability_orphan_index_corrupt", member=repr(raw)[:200])
            yield IO(self._entry_note(index, "rem", [raw]))
            return None
        rkey = self._keys.idem(key)
        reply = (yield IO([self._idem.reclaim(key, self._lease_ms, nonce)]))[0]
        tag = _tag(reply)
        if tag != "reclaimed":
            why = _codec.as_text(reply[1], key=rkey, field="reason") if tag == "skip" else "?"
            if why == "alive":  # its lease was renewed: look again when it ends
                at = _codec.as_int(reply[2], key=rkey, field="le")
                yield IO(self._entry_note(index, "at", [member], at=at))
                return None
            if why == "corrupt":
                _log.error("durability_orphan_record_corrupt", idempotency_key=key)
            yield IO(self._entry_note(index, "rem", [member]))
            return None
        token = _codec.as_text(reply[1], key=rkey, field="tok")
        env: dict[str, Any] = {}
        try:
            unpacked = _codec.unpack(reply[2], key=rkey) if reply[2] else {}
            if not isinstance(unpacked, dict):
                raise CorruptData(rkey, "the claim's payload is not a mapping")
            env = unpacked
        except CorruptData:
            # Parked without it, saying why: a replay must never run fn with a
            # payload it made up (None, under the original key).
            _log.exception("durability_orphan_payload_unreadable", idempotency_key=key)
            if len(reply) > 5 and reply[5]:  # kept apart from it: the parked record's
                # fingerprint, so the operation's later parkings fill that record in
                with contextlib.suppress(CorruptData):
                    env = {"fingerprint": _codec.as_text(reply[5], key=rkey, field="fp")}
        return (yield from self._park_orphan(key, nonce, token, member, env, index))

    def _park_orphan(  # noqa: PLR0917  (what recovery found, one by one)
        self, key: str, nonce: str, token: str, member: str, env: Mapping[str, Any],
        index: str,
    ) -> Plan[str | None]:
        """Park a reclaimed orphan and release its claim, as one step."""
        prepared = self._prepare_orphan(key, env)
        calls = [
            self._dlq.enqueue_prepared(
                prepared, 0, WORKER_LOST, dlq_id=dlq_id_for(key, nonce),
                metadata={"reason": WORKER_LOST, "claim": nonce},
                merge_key=self._merge_key(key),
            ),
            # (touched: a later delivery is told the dead worker may have had its effect)
            self._idem.release(IdempotencyKey(key), token, hold_ms=self._dlq.hold_ms(),
                               touched=True),
            *self._entry_note(index, "rem", [member], recovered=1, parkings=1),
        ]
        # The release is gated: if the claim is no longer the one reclaimed (its
        # worker came back and recorded the outcome by its nonce, or another
        # process took it over), nothing is parked. Standalone: one atomic step,
        # the enqueue is not written either. Cluster: the enqueue ran first (a
        # crash between the two leaves the claim, and recovery parks again under
        # the same parking id); a record it created is finished when the
        # operation completed. The enqueue is gated too: the operation's record
        # may be another than expected ("miss": sent again naming it).
        for _ in range(3):
            out = yield IO(calls, {0: _missed, 1: _not_released})
            again = self._dlq.enqueue_again(calls[0], out[0]) if out.status[0] == "r" else None
            if again is None:
                break
            calls[0] = again
        else:
            return None  # the key's record keeps moving: the next recovery pass parks it
        if out.status[1] == "r":
            if out.status[0] == "c":
                made = self._dlq.decode_enqueue(calls[0], out[0])
                state = (yield IO([self._idem.check(IdempotencyKey(key))]))[0]
                dup = self._idem.decode_check(IdempotencyKey(key), state)
                if made.created and dup is not None and not dup.in_progress:
                    yield IO([self._dlq.finish(made.dlq_id, DlqStatus.REPLAYED, by="its worker")])
            yield IO(self._entry_note(index, "rem", [member]))
            return None
        made = self._dlq.decode_enqueue(calls[0], out[0])
        dlq_id: str = made.dlq_id
        parked = {"parked": 1} if made.new_record else {}  # an operation, not a re-parking
        if index != self._index:  # (a bucket's note carries no counts)
            self._leave([], {"recovered": 1, "parkings": 1, **parked})
        elif parked:
            self._leave([], parked)
        _log.warning(
            "durability_orphan_recovered", idempotency_key=key, dlq_id=dlq_id,
            operation_type=prepared.operation_type, agent_id=prepared.agent_id,
        )
        return dlq_id

    def _prepare_orphan(self, key: str, env: Mapping[str, Any]) -> Prepared:
        """The DLQ record of an orphan; never raises (recovery must reach every orphan).

        An orphan whose envelope holds no payload (unreadable, or not a
        durabilis envelope) is parked without one, saying why, like one whose
        payload cannot be parked: its replay is refused, never run with a
        payload of ``None`` under the original key.
        """
        agent = str(env.get("agent_id") or "unknown")
        op = str(env.get("operation_type") or "unknown")
        missing = None if "payload" in env else "CorruptData"
        if missing is None:
            meta = self._metadata(
                key, *(str(env[f]) if env.get(f) else None
                       for f in ("dependency", "task_id", "phase", "fingerprint"))
            )
            try:
                prepared: Prepared = self._dlq.prepare(
                    agent, op, env.get("payload"), meta, spare_bytes=_REASON_ROOM
                )
                return prepared
            except DurabilisError as exc:
                # Written by an older config or another version: park it
                # anyway, saying why its payload is missing.
                _log.error("durability_orphan_payload_not_parkable", idempotency_key=key,
                           error=f"{type(exc).__name__}: {exc}")
                missing = type(exc).__name__
        note = {"idempotency_key": key, "payload_error": missing}
        if env.get("fingerprint"):
            note["fingerprint"] = str(env["fingerprint"])
        try:
            fallback: Prepared = self._dlq.prepare(agent, op, None, note)
        except DurabilisError:
            fallback = self._dlq.prepare("unknown", "unknown", None, note)
        return fallback

    # -- replay --

    def replay_request(self, record: DlqRecord, wait: float | None = None) -> _Request:
        meta = record.metadata or {}
        key = meta.get("idempotency_key")
        return self.request(
            record.agent_id,
            record.operation_type,
            record.original_operation,
            dependency=meta.get("dependency") or None,
            idempotency_key=self._stored_key(key, record) if key else None,
            task_id=meta.get("task_id") or None,
            phase=meta.get("phase") or None,
            wait=self._replay_wait(wait),
            park_on_open=False,
            deadline_seconds=None,
            replay=True,
        )

    @staticmethod
    def _stored_key(key: str, record: DlqRecord) -> IdempotencyKey:
        """A parked operation's key, bound again to its payload when a caller gave it."""
        if not key.startswith(RAW_PREFIX):
            return IdempotencyKey(key)
        fp = (record.metadata or {}).get("fingerprint")
        return IdempotencyKey(key, fp or payload_fingerprint(record.original_operation))

    def _replay_wait(self, wait: float | None) -> float:
        """How long a replay waits for the operation in progress elsewhere (a live
        delivery, another replayer): ``None`` is the claim's lease, time enough
        for a live worker to finish or a dead one's lease to end."""
        if wait is None:
            return float(self.config.idempotency.in_progress_ttl_seconds)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0:
            raise ConfigError("wait", f"must be a number of seconds >= 0 or None, got {wait!r}")
        return float(wait)

    def _payloadless_replay(self, record: DlqRecord, missing: str) -> Plan[BaseException | object]:
        """The replay of a record parked without its payload: nothing can run.

        Once its key has completed (a later delivery succeeded, or the
        operation's other record was replayed), the record is settled
        (``ANSWERED``: marked replayed, nothing ran); while the key is in
        progress, the replay is deferred; otherwise it fails, asking for a hand.
        """
        key = (record.metadata or {}).get("idempotency_key")
        if key and self.config.idempotency.enabled:
            try:
                ikey = IdempotencyKey(key)
                dup = self._idem.decode_check(ikey, (yield IO([self._idem.check(ikey)]))[0])
            except DurabilisError as exc:
                return exc
            if dup is not None:
                return OperationInProgress(key) if dup.in_progress else ANSWERED
        return InvalidPayload(
            f"parked without its payload ({missing}): handle it by hand, then "
            "abandon or mark it replayed"
        )

    def replay_plan(
        self, fn: Callable[[OperationContext], Any], wait: float | None = None
    ) -> Callable[[DlqRecord, str], Plan[BaseException | object | None]]:
        """The DLQ replay handler (a plan): the record's operation through the layer."""
        seconds = self._replay_wait(wait)
        # A fn may say which records are its own (``fn.accepts_record(record)``):
        # another's is deferred before its key is claimed (nothing counted).
        accepts = getattr(fn, "accepts_record", None)

        def handle(record: DlqRecord, token: str) -> Plan[BaseException | object | None]:
            if callable(accepts) and not accepts(record):
                return ReplayDeclined(
                    f"not this replayer's record ({getattr(fn, '__qualname__', fn)!r} "
                    "declined it): left for its own")
            missing = (record.metadata or {}).get("payload_error")
            if missing:  # parked by recovery without its payload: nothing to replay
                return (yield from self._payloadless_replay(record, missing))
            claim = _ReplayClaim(record.dlq_id, token, record.trace_context)  # (otel hook: link)
            try:
                request = self.replay_request(record, seconds)
            except DurabilisError as exc:
                # A record this layer cannot turn into a request (a payload no
                # key can be made of, a dependency renamed since, a payload over
                # today's limits): a failed replay, noted on the record and its
                # claim released, never an error that stops a pass at it.
                return exc
            req = dataclasses.replace(request, replay_claim=claim)
            try:
                yield from self.execute_plan(req, fn)
            except ResultNotStored:
                # It ran and completed (now or before): recorded as "completed,
                # result not stored". That is the replay's success: a record left
                # pending would run it again once the dedup window is over.
                return claim.answer()
            except Exception as exc:  # the replay failed: the DLQ notes it
                return exc
            return claim.answer()

        return handle

    def stats_call(self) -> ScriptCall:
        """The counters and the in-flight index's live and lease-ended counts
        (``layer_stats``: one read-only script, the server's clock)."""
        return ScriptCall("layer_stats", [self._index, self._stats], [])

    def decode_stats_reply(self, reply: Any) -> LayerStats:
        """A ``layer_stats`` reply as :class:`LayerStats`."""
        if not isinstance(reply, (list, tuple)) or len(reply) != 3:
            raise CorruptData(self._stats, f"unexpected layer_stats reply {reply!r}")
        flat, live, ended = reply
        flat = list(flat or ())
        raw = dict(zip(flat[0::2], flat[1::2], strict=False))
        return self.decode_stats(
            raw, _codec.as_int(live, key=self._index, field="in_flight"),
            _codec.as_int(ended, key=self._index, field="lease_ended"),
        )

    def decode_stats(
        self, raw: Mapping[Any, Any], in_flight: int, lease_ended: int = 0
    ) -> LayerStats:
        values = {}
        counters = LayerStats.__dataclass_fields__
        gauges = ("in_flight", "lease_ended")  # from the index, never from the hash
        for k, v in (raw or {}).items():
            name = k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
            if name in counters and name not in gauges:  # (a field not ours is no counter)
                values[name] = _codec.as_int(v, key=self._stats, field=name)
        known = {f: values.get(f, 0) for f in counters if f not in gauges}
        return LayerStats(**known, in_flight=in_flight, lease_ended=lease_ended)


class _Unsent(Exception):
    """A step that could not be sent within the lease: what was left of it."""

    def __init__(self, cause: DurabilisError, calls: list[ScriptCall], gates: Any) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.calls = calls
        self.gates = gates


def _settle(
    name: str, reply: Any, pending: dict[str, ScriptCall],
    gates: Mapping[str, Callable[[Any], bool]], on_reply: Callable[[str, Any], Any],
) -> None:
    out = on_reply(name, reply)
    if isinstance(out, ScriptCall):
        pending[name] = out
        return
    pending.pop(name, None)
    if out is _GIVE_UP:  # the claim is not ours any more: write nothing of it
        for other in (*gates, "note", *(n for n in list(pending) if n.startswith("settle"))):
            pending.pop(other, None)
