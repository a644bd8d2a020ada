"""Fleet-wide hot reload: :class:`ConfigSync` and :class:`AsyncConfigSync` (the
pollers) over the core they share."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from durabilis._fork import reset_in_child
from durabilis._log import get_logger
from durabilis._retry_core import RetryPolicy
from durabilis._scripts import ScriptCall
from durabilis._store import AsyncStore, Store
from durabilis.breaker import CircuitBreakerConfig, default_replica_id
from durabilis.config._apply import Applier, ReloadCallback
from durabilis.config._model import (
    BREAKER,
    RETRY,
    FleetConfig,
    Reload,
    breaker_to_dict,
    clip,
    policy_to_dict,
    printable_entry,
)
from durabilis.config._ops import ConfigOps
from durabilis.errors import ConfigError, DurabilisError

_log = get_logger()


class _SyncCore:
    """What both twins share: the ops, the applier, callbacks and events (no I/O)."""

    def __init__(
        self,
        source: Any,
        *,
        retry: Any,
        breakers: Any,
        interval_seconds: float,
        replica_id: str | None,
        log_maxlen: int,
    ) -> None:
        store = getattr(source, "store", source)
        if retry is None and breakers is None and store is not source:
            retry, breakers = source.retry, source.breakers
        if isinstance(interval_seconds, bool) or not isinstance(interval_seconds, (int, float)) or (
            not 0.01 <= interval_seconds <= 3600
        ):
            raise ConfigError(
                "interval_seconds", f"must be between 0.01 and 3600, got {interval_seconds!r}"
            )
        if isinstance(log_maxlen, bool) or not isinstance(log_maxlen, int) or log_maxlen < 1:
            raise ConfigError("log_maxlen", f"must be an integer >= 1, got {log_maxlen!r}")
        self.store = store
        self.interval = float(interval_seconds)
        self.replica_id = replica_id or getattr(breakers, "replica_id", None) or (
            default_replica_id()
        )
        self.ops = ConfigOps(store, self.replica_id, log_maxlen)
        self.applier = Applier(retry, breakers)
        self.callbacks: list[ReloadCallback] = []
        self.failing = False
        self.poll_error: str | None = None

    def publish_call(self, kind: str, name: str, config: Any) -> tuple[ScriptCall, str | None]:
        """Validate (before any I/O) and build the publish call; also returns the JSON text."""
        if kind == RETRY:
            if not isinstance(config, RetryPolicy):
                raise ConfigError("policy", f"must be a RetryPolicy, got {config!r}")
            config.validate()
            data = policy_to_dict(config)
        else:
            if not isinstance(config, CircuitBreakerConfig):
                raise ConfigError("config", f"must be a CircuitBreakerConfig, got {config!r}")
            config.validate()
            data = breaker_to_dict(config)
        call = self.ops.publish(kind, name, data)
        return call, str(call.args[2])

    def published(self, kind: str, name: str, config: Any, text: str | None, reply: Any) -> int:
        entry = self.ops.entry(kind, name)
        if config is None:
            return self.removed(entry, reply)
        changed, version = self.ops.decode_publish(reply)
        self.applier.published_here(entry, config, text, changed=changed)
        _log.info(
            "durability_config_published",
            kind=kind, name=name, version=version, removed=False, changed=changed,
            replica_id=self.replica_id,
        )
        return version

    def removed(self, entry: str, reply: Any) -> int:
        changed, version = self.ops.decode_publish(reply)
        self.applier.published_here(entry, None, None, changed=changed)
        kind, _, name = entry.partition(":")
        _log.info(
            "durability_config_published",
            kind=printable_entry(kind), name=printable_entry(name), version=version,
            removed=True, changed=changed, replica_id=self.replica_id,
        )
        return version

    def moved(self, reply: Any) -> bool:
        """Whether the fleet config changed since the snapshot applied here
        (the reply of ``version_command``)."""
        return self.ops.decode_version(reply) != self.applier.mark

    def reloaded(self, reply: Any, read_at: int | None = None) -> Reload | None:
        version, at, entries = self.ops.decode_entries(reply)
        result = self.applier.apply(version, entries, at, read_at)
        for name, reason in result.rejected.items():
            _log.warning(
                "durability_config_entry_rejected", entry=printable_entry(name), reason=reason,
                version=version, replica_id=self.replica_id,
            )
        if not result.changed and not result.initial:
            return None
        if result.changed:
            _log.info(
                "durability_config_reloaded",
                version=version, retry_policies=list(result.retry_policies),
                breakers=list(result.breakers), removed=list(result.removed),
                initial=result.initial, replica_id=self.replica_id,
            )
        for callback in list(self.callbacks):
            try:
                callback(result)
            except Exception:
                _log.exception(
                    "durability_config_callback_failed",
                    callback=getattr(callback, "__qualname__", repr(callback)),
                )
        return result

    def failed(self, exc: DurabilisError) -> None:
        if not self.failing:  # once per outage, not once per poll
            self.failing = True
            _log.warning(
                "durability_config_sync_failed", error=f"{type(exc).__name__}: {exc}",
                replica_id=self.replica_id,
            )

    def poll_failed(self, exc: Exception) -> None:
        """Not Redis, not an entry (those are handled): a bug. Logged, the poller goes on."""
        error = clip(f"{type(exc).__name__}: {exc}")
        if error != self.poll_error:  # once per distinct failure, not once per poll
            self.poll_error = error
            _log.warning(
                "durability_config_poll_failed", error=error, replica_id=self.replica_id,
            )

    def recovered(self) -> None:
        self.poll_error = None
        if self.failing:
            self.failing = False
            _log.info("durability_config_sync_recovered", replica_id=self.replica_id)


class _Poller:
    """What both twins share that does no I/O: construction (the arguments: see
    :class:`ConfigSync`) and the accessors of the applied config."""

    store: Any

    def __init__(
        self,
        source: Any,
        *,
        retry: Any = None,
        breakers: Any = None,
        interval_seconds: float = 1.0,
        replica_id: str | None = None,
        log_maxlen: int = 1000,
    ) -> None:
        self._core = _SyncCore(
            source, retry=retry, breakers=breakers, interval_seconds=interval_seconds,
            replica_id=replica_id, log_maxlen=log_maxlen,
        )
        self.store = self._core.store
        self._idle()
        reset_in_child(self)

    def _idle(self) -> None:
        """Sets the twin's poller state to "not started" (a new or forked one)."""
        raise NotImplementedError

    def after_fork_in_child(self) -> None:  # each twin's own
        raise NotImplementedError

    @property
    def interval_seconds(self) -> float:
        return self._core.interval

    @property
    def version(self) -> int | None:
        """The fleet config version this replica has applied (``None`` before the first refresh)."""
        return self._core.applier.version

    def on_reload(self, callback: ReloadCallback) -> ReloadCallback:
        """Call ``callback(reload)`` after each refresh that applied something (and the first)."""
        self._core.callbacks.append(callback)
        return callback

    @property
    def rejected(self) -> dict[str, str]:
        """Entries of the fleet config this replica refused to apply: field -> reason.

        Each was logged once (``durability_config_entry_rejected``); the
        replica keeps its config for it (its own, or the last valid one).
        """
        return self._core.applier.rejections()


class ConfigSync(_Poller):
    """Fleet-wide hot reload of retry policies and breaker configs, through Redis.

    ``publish_policy`` / ``publish_breaker`` on one replica store the config
    in Redis (as JSON, readable with ``redis-cli HGETALL <ns>:config:{config}:fleet``)
    and bump the fleet config's version in ONE script; every replica running
    a started ``ConfigSync`` reads the version every ``interval_seconds`` and,
    when it moved, applies the changed entries to its layer's retry engine and
    breaker registry (``upsert_policy`` / ``upsert_config``) and logs
    ``durability_config_reloaded``. A change is thus applied fleet-wide within
    ``interval_seconds`` plus three round trips of the publish returning.

    Args:
        source: A :class:`~durabilis.DurabilityLayer` (its ``retry`` and
            ``breakers`` are kept in sync), or a :class:`~durabilis.Store` with
            ``retry=`` / ``breakers=``.
        retry: The retry engine to keep in sync (with a store).
        breakers: The breaker registry to keep in sync (with a store).
        interval_seconds: How often the version is checked (0.01 to 3600).
        replica_id: Who publishes, in the change log (the registry's by default).
        log_maxlen: Approximate cap of the change log stream.

    Raises:
        ConfigError: An invalid interval or cap.
    """

    store: Store

    def _idle(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def after_fork_in_child(self) -> None:
        """A forked child does not poll (the parent's thread is not copied) until
        :meth:`start` is called in it; it keeps the configs applied so far."""
        self._idle()

    def refresh(self) -> Reload | None:
        """Check the version now; apply what changed (1 round trip, 2 when it moved).

        An entry that cannot be applied (whatever it holds) is rejected with a
        reason, the others apply: see :func:`decode_entry`.

        Returns:
            What was applied, or ``None`` when the version had not moved.

        Raises:
            StorageUnavailable: Redis down. CorruptData: Foreign data at the key
                (not a hash, or a version ``v`` that is not a number).
        """
        core = self._core
        if not core.moved(self.store.command(*core.ops.version_command())):
            return None
        read_at = core.applier.seq  # before the read: a publish done after it is pinned
        return core.reloaded(self.store.command(*core.ops.snapshot_command()), read_at)

    def start(self) -> ConfigSync:
        """Apply what is published now, then keep polling in a daemon thread.

        A Redis failure is logged (``durability_config_sync_failed``, once per
        outage), never raised: the replica keeps its configs and catches up
        when Redis is back. A rejected entry is logged and skipped
        (:attr:`rejected`); any other error of a poll is logged
        (``durability_config_poll_failed``) and the poller goes on.
        """
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._poll_once()
        self._thread = threading.Thread(
            target=self._loop, name="durabilis-config-sync", daemon=True
        )
        self._thread.start()
        return self

    def _poll_once(self) -> None:
        try:
            self.refresh()
        except DurabilisError as exc:
            self._core.failed(exc)
        except Exception as exc:  # the poller must outlive anything: the fleet relies on it
            self._core.poll_failed(exc)
        else:
            self._core.recovered()

    def _loop(self) -> None:
        while not self._stop.wait(self._core.interval):
            with contextlib.suppress(Exception):  # only the logging of a failure can get here
                self._poll_once()

    def stop(self) -> None:
        """Stop polling (the applied configs stay)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._core.interval + 5.0)

    def __enter__(self) -> ConfigSync:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def publish_policy(self, policy: RetryPolicy) -> int:
        """Publish a retry policy to the fleet (and apply it here at once).

        Returns:
            The fleet config version after the change (unchanged when the same
            policy was already published).

        Raises:
            ConfigError: An invalid policy (before any I/O). StorageUnavailable.
        """
        call, text = self._core.publish_call(RETRY, getattr(policy, "operation_type", ""), policy)
        return self._core.published(
            RETRY, policy.operation_type, policy, text, self.store.run(call)
        )

    def publish_breaker(self, config: CircuitBreakerConfig) -> int:
        """Publish a breaker config to the fleet (see :meth:`publish_policy`)."""
        call, text = self._core.publish_call(BREAKER, getattr(config, "name", ""), config)
        return self._core.published(BREAKER, config.name, config, text, self.store.run(call))

    def unpublish(self, kind: str, name: str) -> int:
        """Remove a published entry (``kind`` ``"retry"`` or ``"breaker"``).

        Every replica goes back to its own config for it (the one it started
        with); one that had none keeps the last published one.

        Returns:
            The fleet config version after the change.
        """
        call = self._core.ops.publish(kind, name, None)
        return self._core.published(kind, name, None, None, self.store.run(call))

    def remove_entry(self, entry: str) -> int:
        """Remove one field of the fleet config, whatever it holds (not ``v`` / ``t``).

        The way out for an entry :attr:`FleetConfig.rejected` lists: ``entry`` is
        its field name as given there (``retry:<type>``, ``breaker:<name>``, or
        a foreign field written by hand; a name that is not UTF-8 as read back,
        with lone surrogates). For ``retry:`` / ``breaker:`` entries it is
        :meth:`unpublish`.

        Returns:
            The fleet config version after the change (unchanged when absent).
        """
        return self._core.removed(entry, self.store.run(self._core.ops.remove(entry)))

    def fleet_config(self) -> FleetConfig:
        """What is published now (1 round trip; nothing is applied).

        Never fails for an entry: one that cannot be decoded is in ``rejected``.
        """
        return self._core.ops.decode_snapshot(
            self.store.command(*self._core.ops.snapshot_command())
        )


class AsyncConfigSync(_Poller):
    """The asyncio twin of :class:`ConfigSync` (polls in a task; same methods, awaited).

    Args:
        source: An :class:`~durabilis.aio.DurabilityLayer`, or an
            :class:`~durabilis.aio.Store` with ``retry=`` / ``breakers=``.
    """

    store: AsyncStore

    def _idle(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._run = 0  # bumped by start() and stop(): a poller runs while it is its own

    def after_fork_in_child(self) -> None:
        """See :meth:`ConfigSync.after_fork_in_child` (the task is the parent loop's)."""
        self._task = None
        self._run += 1

    async def refresh(self) -> Reload | None:
        """See :meth:`ConfigSync.refresh`."""
        core = self._core
        if not core.moved(await self.store.command(*core.ops.version_command())):
            return None
        read_at = core.applier.seq  # before the read: a publish done after it is pinned
        return core.reloaded(await self.store.command(*core.ops.snapshot_command()), read_at)

    async def start(self) -> AsyncConfigSync:
        """See :meth:`ConfigSync.start` (the polling runs as a task of the running loop)."""
        if self._task is not None and not self._task.done():
            return self
        self._run += 1
        run = self._run
        await self._poll_once()
        if run == self._run:  # (not stopped, nor started again, meanwhile)
            self._task = asyncio.get_running_loop().create_task(self._loop(run))
        return self

    async def _poll_once(self) -> None:
        try:
            await self.refresh()
        except DurabilisError as exc:
            self._core.failed(exc)
        except Exception as exc:  # see ConfigSync._poll_once (cancellation passes through)
            self._core.poll_failed(exc)
        else:
            self._core.recovered()

    async def _loop(self, run: int) -> None:
        # Ends at its cancellation, or when it sees it is no longer the poller
        # (stop() stays final should a cancellation ever be lost on the way).
        while run == self._run:
            await asyncio.sleep(self._core.interval)
            with contextlib.suppress(Exception):  # only the logging of a failure can get here
                await self._poll_once()

    async def stop(self) -> None:
        """See :meth:`ConfigSync.stop`."""
        self._run += 1
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Its CancelledError is returned, not raised; the caller's own propagates.
            await asyncio.gather(task, return_exceptions=True)

    async def __aenter__(self) -> AsyncConfigSync:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def publish_policy(self, policy: RetryPolicy) -> int:
        """See :meth:`ConfigSync.publish_policy`."""
        call, text = self._core.publish_call(RETRY, getattr(policy, "operation_type", ""), policy)
        return self._core.published(
            RETRY, policy.operation_type, policy, text, await self.store.run(call)
        )

    async def publish_breaker(self, config: CircuitBreakerConfig) -> int:
        """See :meth:`ConfigSync.publish_breaker`."""
        call, text = self._core.publish_call(BREAKER, getattr(config, "name", ""), config)
        return self._core.published(
            BREAKER, config.name, config, text, await self.store.run(call)
        )

    async def unpublish(self, kind: str, name: str) -> int:
        """See :meth:`ConfigSync.unpublish`."""
        call = self._core.ops.publish(kind, name, None)
        return self._core.published(kind, name, None, None, await self.store.run(call))

    async def remove_entry(self, entry: str) -> int:
        """See :meth:`ConfigSync.remove_entry`."""
        return self._core.removed(entry, await self.store.run(self._core.ops.remove(entry)))

    async def fleet_config(self) -> FleetConfig:
        """See :meth:`ConfigSync.fleet_config`."""
        return self._core.ops.decode_snapshot(
            await self.store.command(*self._core.ops.snapshot_command())
        )
