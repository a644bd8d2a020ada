"""Hostile input against checkpoints: ids and states of any shape, garbage at every key.

Task ids, agent ids, phases and checkpoint ids of any Unicode and length,
states of any msgpack shape (and of none), TTLs and configs with NaN /
negative / huge values, and foreign data planted at every key the pillar
keeps. It works, or raises a ``DurabilisError``; Redis is left consistent.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import durabilis
from durabilis import CheckpointConfig, ConfigError, DurabilisError
from durabilis.checkpoint import CheckpointManager
from durabilis.errors import CheckpointNotFound, InvalidKey, InvalidPayload
from tests.support.garbage import (
    KINDS,
    as_the_pillar_wrote_it,
    keys_of_namespace,
    no_ttl_lost,
    outcomes,
    plant,
    shape_of,
    snapshot,
    untouched_or_valid,
)
from tests.support.hypo import (
    any_text,
    garbage_bytes,
    hostile,
    hostile_numbers,
    hostile_or,
    msgpack_values,
    normalised,
    pick,
    plant_drawn_garbage,
    same,
    unencodable,
)

pytestmark = pytest.mark.topologies("cluster")

_fresh = itertools.count()


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@hostile(60)
@given(task=any_text, agent=any_text, phase=any_text)
@example(task="\ud800", agent="a", phase="p")
@example(task="{ckpt}:x%3A", agent="a:b", phase="{}")
@example(task="t" * 5000, agent="a", phase="p")
def test_any_task_agent_and_phase_save_and_restore_or_raise_invalid_key_before_any_write(
    store: durabilis.Store, raw: Any, namespace: str, task: str, agent: str, phase: str
) -> None:
    manager = CheckpointManager(store)
    task = f"{next(_fresh)}:{task}"  # fresh per example
    before = keys_of_namespace(raw, namespace)
    try:
        saved = manager.save(task, agent, phase, {"n": 1})
    except InvalidKey:
        assert keys_of_namespace(raw, namespace) == before  # refused before any write
        return
    assert is_unicode(task) and is_unicode(agent) and is_unicode(phase)
    got = manager.restore(task, agent, phase)
    assert got.checkpoint_id == saved.checkpoint_id and got.state == {"n": 1}
    assert manager.get_by_id(saved.checkpoint_id).task_id == task
    assert [c.checkpoint_id for c in manager.history(task, agent)] == [saved.checkpoint_id]
    forked = manager.fork(saved.checkpoint_id, task + ":fork")
    assert forked.parent_checkpoint_id == saved.checkpoint_id
    assert manager.clear_task(task) == 1 and manager.clear_task(task + ":fork") == 1


@hostile(60)
@given(checkpoint_id=any_text | st.text(alphabet="0123456789abcdef-", max_size=40))
@example(checkpoint_id="\udfff")
@example(checkpoint_id="")
def test_any_checkpoint_id_is_found_or_not_found_or_an_invalid_key(
    store: durabilis.Store, checkpoint_id: str
) -> None:
    manager = CheckpointManager(store)
    for call in (
        lambda: manager.get_by_id(checkpoint_id),
        lambda: manager.fork(checkpoint_id, f"fork-{next(_fresh)}"),
        lambda: manager.rewind(f"task-{next(_fresh)}", checkpoint_id),
        lambda: manager.save("t", "a", "p", 1, expected_checkpoint_id=checkpoint_id),
    ):
        with contextlib.suppress(
            CheckpointNotFound, InvalidKey, durabilis.errors.CheckpointConflict
        ):
            call()


@hostile(60)
@given(state=msgpack_values | unencodable)
@example(state={(1, (2, b"x")): "a tuple as a map key", "nan": float("nan")})
def test_any_state_round_trips_or_is_refused_before_any_write(
    store: durabilis.Store, raw: Any, namespace: str, state: Any
) -> None:
    manager = CheckpointManager(store)
    task = f"state-{next(_fresh)}"
    before = keys_of_namespace(raw, namespace)
    try:
        saved = manager.save(task, "agent", "phase", state)
    except InvalidPayload:
        assert keys_of_namespace(raw, namespace) == before
        return
    assert same(saved.state, normalised(state))
    assert same(manager.restore(task, "agent").state, normalised(state))


@hostile(80)
@given(ttl=st.none() | hostile_numbers,
       config=st.fixed_dictionaries({}, optional={
           "default_ttl_seconds": hostile_or(st.floats(0.001, 1e9)),
           "max_checkpoints": hostile_or(st.integers(1, 10**9)),
           "max_state_bytes": hostile_or(st.integers(1, 10**9)),
       }))
@example(ttl=1e300, config={})
@example(ttl=float("nan"), config={})
@example(ttl=None, config={"default_ttl_seconds": 1e-300})
def test_any_ttl_and_config_are_refused_as_typed_errors_or_saved_with_a_ttl(
    store: durabilis.Store, raw: Any, namespace: str, ttl: Any, config: dict[str, Any]
) -> None:
    try:
        manager = CheckpointManager(store, CheckpointConfig(**config))
    except ConfigError as exc:
        assert exc.field in ("default_ttl_seconds", "max_checkpoints", "max_state_bytes")
        return
    task = f"ttl-{next(_fresh)}"
    try:
        saved = manager.save(task, "agent", "phase", "s", ttl)
    except (ConfigError, durabilis.errors.PayloadTooLarge):
        return
    assert saved.expires_at >= saved.created_at
    keys = [k for k in keys_of_namespace(raw, namespace) if task in k or "rec" in k]
    assert no_ttl_lost(raw, {k: ("?", True) for k in keys if "rec" in k}) == []


# --- foreign data at the keys -----------------------------------------------------------------


def populated(store: durabilis.Store) -> tuple[CheckpointManager, str]:
    """A task with current and replaced checkpoints, a fork, and every index key."""
    manager = CheckpointManager(store)
    first = manager.save("victim", "agent", "plan", {"step": 1})
    manager.save("victim", "agent", "plan", {"step": 2})
    manager.save("victim", "agent", "act", [1, 2])
    manager.fork(first.checkpoint_id, "victim-fork")
    return manager, first.checkpoint_id


def exercise(manager: CheckpointManager, checkpoint_id: str) -> list[Any]:
    """Every public call; each returns or raises a DurabilisError."""
    def resume() -> Any:
        with manager.task("victim", "agent", exclusive=False) as run:
            return run.phase("plan", lambda: {"step": 3})

    return outcomes([
        lambda: manager.restore("victim", "agent"),
        lambda: manager.restore("victim", "agent", "plan"),
        lambda: manager.get_by_id(checkpoint_id),
        lambda: manager.history("victim", "agent"),
        lambda: manager.list_current("victim"),
        manager.count,
        lambda: manager.save("victim", "agent", "plan", {"step": 4}),
        lambda: manager.save("other", "agent", "plan", 1),
        lambda: manager.fork(checkpoint_id, "victim-fork-2"),
        lambda: manager.rewind("victim", checkpoint_id),
        resume,
        lambda: manager.clear_task("victim-fork"),
        lambda: manager.clear_task("victim"),
    ], DurabilisError)


@pytest.mark.parametrize("kind", KINDS)
def test_every_redis_type_at_every_checkpoint_key_is_a_durabilis_error_and_redis_stays_consistent(
    store: durabilis.Store, raw: Any, namespace: str, kind: str
) -> None:
    manager, checkpoint_id = populated(store)
    keys = keys_of_namespace(raw, namespace)
    shape = shape_of(raw, keys)
    for key in keys:
        plant(raw, key, kind)
    before = snapshot(raw, keys)
    seen = exercise(manager, checkpoint_id)
    assert any(isinstance(o, DurabilisError) for o in seen)
    assert untouched_or_valid(raw, before, as_the_pillar_wrote_it(shape)) == []


@hostile(80)
@given(data=st.data())
def test_garbage_in_any_field_of_any_checkpoint_key_works_or_raises_and_keeps_every_ttl(
    store: durabilis.Store, raw: Any, namespace: str, data: st.DataObject
) -> None:
    store = durabilis.connect(store.url, namespace=f"{namespace}-{next(_fresh)}")
    try:
        manager, checkpoint_id = populated(store)
        keys = keys_of_namespace(raw, store.namespace)
        shape = shape_of(raw, keys)
        key = pick(data, keys)
        kind = shape[key][0]
        blob = data.draw(garbage_bytes)
        plant_drawn_garbage(raw, data, key, kind, blob)
        exercise(manager, checkpoint_id)
        assert no_ttl_lost(raw, shape) == []
    finally:
        store.close()
