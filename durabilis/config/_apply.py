"""Applying fleet config entries to one replica's engine and registry (no I/O)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

from durabilis._fork import reset_in_child
from durabilis._retry_core import RetryPolicy
from durabilis.breaker import CircuitBreakerConfig
from durabilis.config._model import (
    KINDS,
    RETRY,
    Reload,
    as_bytes,
    decode_entry,
    rejection_reason,
)

ReloadCallback = Callable[[Reload], object]


class Applier:
    """Applies fleet config entries to one replica's engine and registry (no I/O).

    Remembers this replica's own configs, to go back to them when an entry is
    unpublished, and the JSON text of what it applied, to apply only changes
    (and a digest of what it rejected, to log a rejection once, not hold it).
    """

    def __init__(self, retry: Any, breakers: Any) -> None:
        self.retry = retry
        self.breakers = breakers
        self.own_policies: dict[str, RetryPolicy] = dict(retry.policies) if retry else {}
        self.own_breakers: dict[str, CircuitBreakerConfig] = (
            {n: breakers.get_config(n) for n in breakers.names()} if breakers else {}
        )
        self.applied: dict[str, bytes] = {}
        self.rejected: dict[str, tuple[bytes, str]] = {}  # name -> (digest of the value, why)
        # Entries this replica published itself, each with the number of this
        # replica's publish that made it (``seq`` counts them): a snapshot read
        # before that publish was done (by the polling thread while it ran)
        # must not put the previous value back. Local order, not versions or
        # server times: those restart or step back when the hash is lost.
        self.seq = 0
        self.pinned: dict[str, int] = {}
        self.version: int | None = None
        self.mark: tuple[int, int | None] | None = None  # (version, updated_ms) applied
        self.lock = threading.Lock()
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        # (the parent's poller may have held it at fork: locked for good in the child)
        self.lock = threading.Lock()

    def install(self, decoded: RetryPolicy | CircuitBreakerConfig) -> bool:
        if isinstance(decoded, RetryPolicy):
            if self.retry is None:
                return False
            self.retry.upsert_policy(decoded)
            return True
        if self.breakers is None:
            return False
        self.breakers.upsert_config(decoded)
        return True

    def published_here(
        self, entry: str, config: RetryPolicy | CircuitBreakerConfig | None, text: str | None,
        *, changed: bool,
    ) -> None:
        """This replica published ``entry`` (``config``; ``None``: removed it):
        applied here at once, in ONE step with the note of it (a poll applying
        an older snapshot in between would otherwise stay installed)."""
        with self.lock:
            if config is None:
                was = self.applied.pop(entry, None) is not None
                if changed or was:  # (gone already: another removed it, or our lost try)
                    self.restore_own(entry)
            else:
                self.install(config)
                self.applied[entry] = (text or "").encode("utf-8")
            self.rejected.pop(entry, None)
            self.seq += 1
            self.pinned[entry] = self.seq

    def rejections(self) -> dict[str, str]:
        with self.lock:
            return {name: why for name, (_, why) in sorted(self.rejected.items())}

    def apply(
        self, version: int, entries: Mapping[str, str | bytes], at: int | None = None,
        read_at: int | None = None,
    ) -> Reload:
        """Apply a snapshot's entries (raw values: each is decoded on its own).

        ``read_at``: :attr:`seq` when the snapshot was asked for (``None``: now);
        an entry this replica published since is left as published.

        Never raises for an entry: whatever goes wrong decoding or installing
        one (any exception) rejects that entry with a reason; the others apply.
        """
        with self.lock:
            initial = self.version is None
            policies: list[str] = []
            breakers: list[str] = []
            rejected: dict[str, str] = {}
            seen = self.seq if read_at is None else read_at
            stale = {name for name, pin in self.pinned.items() if pin > seen}
            self.pinned = {name: self.pinned[name] for name in stale}
            for name, value in sorted(entries.items()):
                if name in stale:
                    continue
                raw = as_bytes(value)
                if self.applied.get(name) == raw:  # back to what is applied: nothing to do
                    self.rejected.pop(name, None)
                    continue
                digest = hashlib.blake2b(raw, digest_size=16).digest()
                known = self.rejected.get(name)
                if known is not None and known[0] == digest:
                    continue  # the same bad value: rejected (and logged) already
                try:
                    decoded = decode_entry(name, raw)
                    installed = self.install(decoded)
                except Exception as exc:  # one entry, whatever it holds, spoils only itself
                    why = rejection_reason(exc)
                    self.rejected[name] = (digest, why)
                    rejected[name] = why
                    continue
                self.rejected.pop(name, None)
                self.applied[name] = raw
                if installed:
                    (policies if isinstance(decoded, RetryPolicy) else breakers).append(
                        name.partition(":")[2]
                    )
            removed = []
            for name in sorted(set(self.applied) - set(entries) - stale):
                del self.applied[name]
                removed.append(name)
                self.restore_own(name)
            for name in set(self.rejected) - set(entries):
                del self.rejected[name]
            self.version = version
            self.mark = (version, at)
            return Reload(
                version, tuple(policies), tuple(breakers), tuple(removed), rejected, initial
            )

    def restore_own(self, entry: str) -> None:
        kind, _, name = entry.partition(":")
        if kind not in KINDS:
            return  # a foreign field: nothing of ours was ever replaced by it
        own: RetryPolicy | CircuitBreakerConfig | None = (
            self.own_policies.get(name) if kind == RETRY else self.own_breakers.get(name)
        )
        if own is not None:  # else: no config of our own to go back to; keep the last one
            self.install(own)
