"""Counts, index notes and the keep-alive's plan: what waits in the process."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durabilis import _codec
from durabilis._scripts import Replies, ScriptCall
from durabilis.core import logsink
from durabilis.core.breaker import Permit
from durabilis.core.layer.base import (
    DUPLICATES_FLUSH_SECONDS,
    PUT_BACK_WITHIN_SECONDS,
    _log_guard_refusal,
    _renewed,
)
from durabilis.core.layer.requests import _Requests
from durabilis.core.layer.types import LayerStats
from durabilis.core.steps import IO, Batch, Plan
from durabilis.errors import CorruptData, DurabilisError, StorageUnavailable

if TYPE_CHECKING:  # (the lease book is the driver's, handed in)
    from durabilis._steps import Deferred, LeaseBook


def _landed(partial: Replies | None) -> int:
    """How many calls of a failed step landed before the first that did not."""
    if partial is None:
        return 0
    status = partial.status
    n = 0
    while n < len(status) and status[n] == "c":
        n += 1
    return n


def _lost(item: Deferred) -> DurabilisError:
    return StorageUnavailable(
        f"the outcome of {item.step.key} was not recorded this time (its call failed)"
    )


class _Notes(_Requests):
    """What waits in the process (duplicates' counts, Cluster index removals),
    the keep-alive's plan, the stats."""

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
            except self.stopped_by:
                self._unsent(gone, counts)  # may have landed: apart
                for never, was_unsure in batches[i + 1:]:  # not sent: wait as they did
                    if was_unsure:
                        self._unsent(*never)
                    else:
                        self._leave(*never)
                raise

    def keep_alive_plan(self, leases: LeaseBook) -> Plan[None]:
        """One renewal of the keep-alive (both twins drive it at each
        ``renew_interval``): the leases of the claims ``leases`` holds and their
        in-flight entries renewed, on Cluster the entries of those still ours
        put back, then each outcome deferred to the keep-alive sent once more.

        The renewals are independent calls (:class:`Batch`, never one script):
        a claim whose key fails (foreign data, its node down) stops none of
        the others, and the entries of the others renewed still go back (the
        batch's error tells what each call replied). A failed batch is logged
        (``durability_lease_renew_failed``: the next tick renews again); a
        deferred outcome that fails is handed to :meth:`deferred_failed` and
        the next one is sent. No storage failure is raised; an interruption
        (the task cancelled) is.
        """
        held = leases.held()
        began = self.clock()
        try:
            if calls := self.renew_calls(held):
                try:
                    replies: Sequence[Any] | None = yield Batch(calls)
                except DurabilisError as exc:
                    logsink.SINK.warning("durability_lease_renew_failed",
                                         error=f"{type(exc).__name__}: {exc}")
                    # What the others replied: those renewed still go back.
                    replies = exc.partial
                if self.clock() - began > PUT_BACK_WITHIN_SECONDS:
                    replies = None  # (stale: the next tick's renewal puts them back)
                if replies is not None and (back := self.reindex_calls(held, replies)):
                    yield Batch(back)
        except DurabilisError as exc:
            logsink.SINK.warning(
                "durability_lease_renew_failed", error=f"{type(exc).__name__}: {exc}"
            )
        # The deferred outcomes, one step each, for half a renew_interval at most
        # (one at least): a node that hangs costs each of its outcomes a socket
        # timeout, and the next renewal waits for the tick to end. The rest go at
        # the next tick, which starts where this one stopped (no outcome waits
        # behind a sick node's).
        waiting = leases.deferred()
        if waiting:
            turn = self._deferred_turn % len(waiting)
            self._deferred_turn = turn + 1
            waiting = waiting[turn:] + waiting[:turn]
        began = self.clock()  # (their time counts from here: renewals may have taken theirs)
        if len(waiting) > 1 and not self.fuses:
            yield from self._deferred_together(leases, waiting, began)
            return
        for n, item in enumerate(waiting):
            if n and self.clock() - began > self.config.renew_interval / 2:
                break  # (one at least each tick: the turn moves on)
            try:
                sent = yield IO(item.step.calls, item.step.gates)
            except DurabilisError as exc:  # (its calls that landed stay sent)
                self.deferred_failed(leases, leases.rest(item, _landed(exc.partial)), exc)
                continue
            self.deferred_sent(leases, item, sent)

    def _deferred_together(
        self, leases: LeaseBook, waiting: Sequence[Deferred], began: float
    ) -> Plan[None]:
        """Unfused (Cluster): the deferred outcomes' steps side by side, in rounds.
        A round sends the next call of every step still going as one
        :class:`Batch` (on Cluster: concurrently, each to its node, one wave's
        time). A step goes on to its next call once this one replied (a gated
        refusal or a failure ends it, as a wave does), so each step's calls still
        go one after another; the steps are independent claims. So a node that
        hangs costs a round one wave's time, not a socket timeout per outcome
        on it, and an outcome on a healthy node never waits ticks behind those
        of a hung one. Rounds stop once half a ``renew_interval`` has gone (one
        at least; a parking whose guard landed gets one more, for its enqueue);
        what a step sent stays sent (:meth:`LeaseBook.rest`): the next tick
        goes on with its next call, so each outcome moves by a call a tick at
        least and no call that landed is sent again."""
        # Each step still going: its item, its replies so far, their status.
        going: list[tuple[Deferred, list[Any], list[str]]] = []
        for item in waiting:
            if item.step.calls:
                going.append((item, [], []))
            else:  # (nothing to send: settled)
                self.deferred_sent(leases, item, Replies([], ""))
        while going:
            calls = [item.step.calls[len(replies)] for item, replies, _ in going]
            try:
                outcomes: Sequence[Any] = yield Batch(calls)
                told = "c" * len(calls)
            except DurabilisError as exc:  # (each failed call's own error, if known)
                outcomes = exc.partial if exc.partial is not None else [exc] * len(calls)
                told = exc.partial.status if exc.partial is not None else "?" * len(calls)
            except BaseException:  # interrupted: what earlier rounds landed stays sent
                for item, replies, _ in going:
                    leases.rest(item, len(replies))
                raise
            going = self._round_done(leases, going, outcomes, told)
            if self.clock() - began > self.config.renew_interval / 2:
                # The rest at the next tick; but a parking's guard that landed
                # goes on with its enqueue first (kept whole, it would send only
                # its guard at every tick while rounds are slow: stuck).
                paired = []
                for item, replies, status in going:
                    if item.step.guarded and len(replies) == 1:
                        paired.append((item, replies, status))
                    else:
                        leases.rest(item, len(replies))
                if not paired:
                    return
                going = paired

    def _round_done(
        self, leases: LeaseBook, going: list[tuple[Deferred, list[Any], list[str]]],
        outcomes: Sequence[Any], told: str,
    ) -> list[tuple[Deferred, list[Any], list[str]]]:
        """One round's replies taken (:meth:`_deferred_together`): the steps that
        failed or ended are handed back to the lease book; those still going."""
        after = []
        for (item, replies, status), out, did in zip(going, outcomes, told, strict=True):
            if did != "c":  # (what it sent before stays sent; this one again)
                error = out if isinstance(out, DurabilisError) else _lost(item)
                self.deferred_failed(leases, leases.rest(item, len(replies)), error)
                continue
            gates = item.step.gates
            refused = bool(gates and len(replies) in gates and gates[len(replies)](out))
            replies.append(out)
            status.append("r" if refused else "c")
            if refused or len(replies) == len(item.step.calls):
                unsent = len(item.step.calls) - len(replies)  # (after a refusal)
                self.deferred_sent(leases, item, Replies(
                    [*replies, *[None] * unsent], "".join(status) + "n" * unsent
                ))
            else:
                after.append((item, replies, status))
        return after

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

        A claim may settle between its renewal and this (its removal sent in
        its own step, or waiting in the process, or taken by another's): the
        put-back (``back``) adds no member its owner removed lately. Redis
        decides, in the index's own slot, whatever order the two land in.
        """
        if self.fuses:
            return []
        back = []
        for (_, _, member), reply in zip(held, replies, strict=False):
            if member and _renewed(reply):
                back.append(member)
        return [self._note("back", back)] if back else []

    def deferred_sent(self, leases: LeaseBook, item: Deferred, replies: Replies) -> None:
        """The keep-alive sent a deferred outcome: it landed (or the claim is gone)."""
        leases.settle(item)
        if item.step.guarded and replies.status[:1] == "r":
            _log_guard_refusal(item.step.key, replies[0])
            return
        if "r" in replies.status:  # a gated refusal ended it (the keep-alive decodes none)
            # A record refused: the claim was taken over (its new owner records).
            # An enqueue refused ("miss": the operation's record is another): the
            # claim lapses and recovery parks it there.
            logsink.SINK.warning(
                "durability_outcome_refused_late", idempotency_key=item.step.key,
                status=replies.status, then="the claim's new owner, or recovery, settles it",
            )
            return
        logsink.SINK.warning(
            "durability_outcome_recorded_late", idempotency_key=item.step.key,
            status=replies.status,
        )

    def deferred_failed(self, leases: LeaseBook, item: Deferred, exc: DurabilisError) -> None:
        """A deferred outcome did not land this time; give up once its time ran out."""
        if isinstance(exc, CorruptData) or time.monotonic() >= item.until:
            leases.settle(item)
            logsink.SINK.error(
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
            logsink.SINK.error(event, idempotency_key=key, error=f"{type(exc).__name__}: {exc}")
            return False
        return True

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
