"""The layer plans' shared ground: what they read of the shells (typed), constants,
reply predicates, the request and claim records, and the state (:class:`_Base`)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from durabilis import _fork
from durabilis._fork import reset_in_child
from durabilis._keys import CLUSTER_SLOTS, KeySpace
from durabilis._scripts import Replies, ScriptCall
from durabilis.core import logsink
from durabilis.core.breaker import BreakerBook
from durabilis.core.dlq import ANSWERED, FINISHED, Prepared
from durabilis.core.idempotency import IdempotencyKey
from durabilis.core.retry import BudgetOps, RetryPolicy
from durabilis.errors import DurabilisError

if TYPE_CHECKING:  # (the config's model imports the pillars' shells)
    from durabilis.config._layer import DurabilityConfig


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


class Tracing(Protocol):
    """The tracing hooks the plans call (:mod:`durabilis.otel` is one: the shells
    hand it in; each is a no-op while tracing is off)."""

    def begin(self, call: Any) -> Any: ...  # a traced call's wrapper, None when off
    def retried(self, attempts: int, delay: float, error_code: str) -> None: ...
    def answered_duplicate(self) -> None: ...
    def parking_fields(self, room: int | None = None) -> dict[str, str]: ...


@dataclass(frozen=True, slots=True)
class Runtime:
    """What the plans take from the process, handed in by the shells (the core
    imports no asyncio, threading or logging).

    Attributes:
        interrupts: What a plan treats as "stop now": compensate, re-raise
            (``durabilis._steps.INTERRUPTS``: asyncio's cancellation among them).
        classify: An exception's error code (``durabilis.retry.error_code``:
            the process's registrations and class cache).
        tracing: The tracing hooks (``durabilis.otel``).
    """

    interrupts: tuple[type[BaseException], ...]
    classify: Callable[[BaseException], str]
    tracing: Tracing

_CLAIM_AGAIN = object()
_SETTLED_BY = "a later delivery"  # who finished a parked record its operation completed
_GIVE_UP = object()
_VOID = object()  # (a step's reply: the operation completed elsewhere, nothing of it goes)
DUPLICATES_FLUSH_SECONDS = 1.0  # how long a duplicate's count may wait in its process
# Cluster: the keep-alive puts back the entries it renewed only if its renewals
# took at most this long: less than layer_note keeps an owner's removal marked
# (MARK_MS, 10 s), so no put-back lands after the mark that refuses it ends, and
# more than a wave that waited one default socket timeout (5 s) on a node that
# hangs (the claims on healthy nodes still go back then).
PUT_BACK_WITHIN_SECONDS = 7.5
SIM_BUCKETS = 16  # birth-index buckets of an unfused standalone store (the fault simulator)
_WALK = 32  # birth-index buckets recovery reads at once (one wave)
_WALK_PER_PASS = 512  # birth-index buckets one recovery pass reads (Cluster: a 32nd of them)
_WALK_KEEP_MS = 7 * 24 * 3600 * 1000  # the fleet's walk counter lasts a week after a pass
_REASON_ROOM = 96  # bytes kept in the DLQ payload cap for metadata added when parking
_RECORD_BACKOFF = (0.05, 1.0)  # first and longest pause between tries of a record step
_LATE_TRIES = 3  # tries of a record step after its lease's time ran out, before giving up
_KNOWN_PAIRS = 1024  # (agent, operation) pairs whose checked key parts a layer keeps


def nonce() -> str:
    """A claim's nonce, 16 hex digits. The one place the plans draw one: the
    fault simulator replaces it with a seeded draw."""
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


_GUARD_REFUSALS = {
    "done": "the operation completed meanwhile",
    "held": "another delivery holds the operation",
}


def _guard_refused(reply: Any) -> bool:
    """A parking's guard refused: the operation's record is completed, or (a
    parking without a claim) another holds a live claim (see idem_check)."""
    return _tag(reply) in _GUARD_REFUSALS


def _log_guard_refusal(key: str, reply: Any) -> None:
    """``durability_parking_dropped`` (a warning): the operation completed, or
    another delivery holds it."""
    tag = _tag(reply)
    logsink.SINK.warning("durability_parking_dropped", idempotency_key=key, refusal=tag,
                         reason=_GUARD_REFUSALS.get(str(tag), "?"))


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




@dataclass(slots=True, eq=False)
class _Request:
    """One durable operation, validated and encoded before any I/O. Not changed
    once built (a replay's is copied with ``dataclasses.replace``); not frozen:
    a frozen dataclass's ``__init__`` costs ~1 us more per durable call."""

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

    __slots__ = ("dlq_id", "finished", "ran", "token", "trace", "unsettled")

    def __init__(
        self, dlq_id: str, token: str, trace: tuple[str, str | None] | None = None
    ) -> None:
        self.dlq_id = dlq_id
        self.token = token
        self.trace = trace  # the parked call's (traceparent, tracestate): its replay links to it
        self.ran = False  # fn ran and succeeded in this replay (else: answered by the record)
        self.finished = False
        # Its success's outcome step (finishing the record, fenced by this
        # claim) was left to the keep-alive: the claim is kept for it.
        self.unsettled = False

    def answer(self) -> object | None:
        """What the replay handler tells the DLQ after a success: the record
        finished with the outcome, in one step (else the DLQ finishes it now),
        or the operation had completed before (answered by its record)."""
        if self.finished:
            return FINISHED
        return None if self.ran else ANSWERED


@dataclass(slots=True, eq=False)
class _Claim:
    """What one run of the operation holds (not changed once built; not frozen,
    as :class:`_Request`)."""

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


class _Base:
    """The layer's state, set once by the shells: the pillars' call builders, the
    keys, the lease, and what waits in the process (counts, index removals)."""

    def __init__(  # noqa: PLR0917  (the pillars, built by the twins)
        self,
        store: StoreShape,
        config: DurabilityConfig,
        idem_ops: Any,
        retry: Policies,
        breakers: BreakerBook,
        checkpoint_ops: Any,
        dlq_ops: Any,
        *,
        new_lock: Callable[[], AbstractContextManager[Any]],
        runtime: Runtime,
    ) -> None:
        self.config = config
        self.interrupts = runtime.interrupts
        # A step failed, or the plan was interrupted: nothing more will run.
        self.stopped_by: tuple[type[BaseException], ...] = (DurabilisError, *runtime.interrupts)
        self.classify = runtime.classify
        self.tracing = runtime.tracing
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
        # Cluster: the members the owners removed lately (layer_note "back"
        # puts none of them back into the index); same hash slot as the index.
        self._settled = store.keys.layer("settled")
        self._key_secret = config.idempotency.content_key_secret
        # A rotation's previous secrets (usually none: then no alias is derived or read)
        self._previous_secrets = config.idempotency.content_key_previous_secrets
        self._lease_s = float(config.idempotency.in_progress_ttl_seconds)
        self._lease_ms = max(1, int(self._lease_s * 1000))
        self._late_tries = _LATE_TRIES  # (the simulator defers outcomes sooner)
        # (agent_id, operation_type) -> the content key's checked, escaped head
        self._known: dict[tuple[str, str], str] = {}
        # Duplicates answered on standalone are counted here and carried by a
        # later note (see count_duplicate): a duplicate is one round trip.
        self._new_lock = new_lock  # (the shells' threading.Lock: the plans start no thread)
        self._dups_lock = new_lock()
        self._dups = 0
        self._dups_since = 0.0
        # Cluster: index entries of settled claims, and their counts, waiting
        # to be removed (see _leave); guarded by the same lock.
        self._gone: list[str] = []
        self._gone_counts: dict[str, int] = {}
        self._gone_since = 0.0
        self._deferred_turn = 0  # where the keep-alive's next pass over deferred outcomes starts
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
        self._dups_lock = self._new_lock()
        with self._dups_lock:
            self._dups, self._dups_since = 0, 0.0
            self._gone, self._gone_counts, self._gone_since = [], {}, 0.0
            self._unsure = []


class _ClaimAgain(Exception):
    """A parking its guard dropped (the operation completed elsewhere, or another
    delivery holds it): the call claims again and gets a duplicate's answer."""


class _Unsent(Exception):
    """A step that could not be sent within the lease: what was left of it."""

    def __init__(
        self, cause: DurabilisError, calls: list[ScriptCall], gates: Any, *,
        guarded: bool = False,
    ) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.calls = calls
        self.gates = gates
        self.guarded = guarded  # calls[0] is the guard of calls[1] (see Defer)


def _settle(
    name: str, reply: Any, pending: dict[str, ScriptCall],
    gates: Mapping[str, Callable[[Any], bool]], on_reply: Callable[[str, Any], Any],
) -> None:
    out = on_reply(name, reply)
    if isinstance(out, ScriptCall):
        pending[name] = out
        return
    pending.pop(name, None)
    if out is _VOID:
        pending.clear()
        return
    if out is _GIVE_UP:  # the claim is not ours any more: write nothing of it
        for other in (*gates, "note", *(n for n in list(pending) if n.startswith("settle"))):
            pending.pop(other, None)
