"""The front door: ``durabilis`` exports about 20 names, ``durabilis.aio`` the async
face; the 0.1 names that moved still import for one release, with a
``DeprecationWarning`` that names where they live now (docs/api.md)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from typing import Any

import pytest

import durabilis
import durabilis.aio

FRONT_DOOR = {
    "__version__",
    "connect", "Store",
    "DurabilityLayer", "DurabilityConfig", "OperationContext", "current_operation",
    "IdempotencyKey",
    "IdempotencyConfig", "RetryPolicy", "CircuitBreakerConfig", "CheckpointConfig", "DlqConfig",
    "DurabilisError", "OperationError", "ConfigError", "StorageUnavailable", "RetryExhausted",
    "CircuitOpen", "OperationInProgress", "ResultNotStored", "OutcomeUnrecorded",
}

# Every name durabilis 0.1 exported that is not in the front door -> where it lives now.
MOVED = {
    # the async face
    "connect_async": ("durabilis.aio", "connect"),
    "AsyncStore": ("durabilis.aio", "Store"),
    "AsyncDurabilityLayer": ("durabilis.aio", "DurabilityLayer"),
    "AsyncIdempotencyGuard": ("durabilis.aio", "IdempotencyGuard"),
    "AsyncRetryEngine": ("durabilis.aio", "RetryEngine"),
    "AsyncCircuitBreakerRegistry": ("durabilis.aio", "CircuitBreakerRegistry"),
    "AsyncCheckpointManager": ("durabilis.aio", "CheckpointManager"),
    "AsyncTaskRun": ("durabilis.aio", "TaskRun"),
    "AsyncDeadLetterQueue": ("durabilis.aio", "DeadLetterQueue"),
    "AsyncConfigSync": ("durabilis.aio", "ConfigSync"),
    # the pillars' own modules
    "IdempotencyGuard": ("durabilis.idempotency", "IdempotencyGuard"),
    "CheckResult": ("durabilis.idempotency", "CheckResult"),
    "New": ("durabilis.idempotency", "New"),
    "Duplicate": ("durabilis.idempotency", "Duplicate"),
    "RetryEngine": ("durabilis.retry", "RetryEngine"),
    "RetryOutcome": ("durabilis.retry", "RetryOutcome"),
    "RetryBudget": ("durabilis.retry", "RetryBudget"),
    "error_code": ("durabilis.retry", "error_code"),
    "register_error_code": ("durabilis.retry", "register_error_code"),
    "CircuitBreakerRegistry": ("durabilis.breaker", "CircuitBreakerRegistry"),
    "BreakerInfo": ("durabilis.breaker", "BreakerInfo"),
    "BreakerState": ("durabilis.breaker", "BreakerState"),
    "Permit": ("durabilis.breaker", "Permit"),
    "StateTransition": ("durabilis.breaker", "StateTransition"),
    "DEFAULT_BREAKER_CONFIGS": ("durabilis.breaker", "DEFAULT_BREAKER_CONFIGS"),
    "Checkpoint": ("durabilis.checkpoint", "Checkpoint"),
    "CheckpointManager": ("durabilis.checkpoint", "CheckpointManager"),
    "TaskRun": ("durabilis.checkpoint", "TaskRun"),
    "NO_CHECKPOINT": ("durabilis.checkpoint", "NO_CHECKPOINT"),
    "DeadLetterQueue": ("durabilis.dlq", "DeadLetterQueue"),
    "DlqRecord": ("durabilis.dlq", "DlqRecord"),
    "DlqStatus": ("durabilis.dlq", "DlqStatus"),
    "DlqListing": ("durabilis.dlq", "DlqListing"),
    "DlqStats": ("durabilis.dlq", "DlqStats"),
    "ReplayOutcome": ("durabilis.dlq", "ReplayOutcome"),
    "ReplayResult": ("durabilis.dlq", "ReplayResult"),
    "ReplaySummary": ("durabilis.dlq", "ReplaySummary"),
    "LayerStats": ("durabilis.layer", "LayerStats"),
    "ConfigSync": ("durabilis.config", "ConfigSync"),
    "FleetConfig": ("durabilis.config", "FleetConfig"),
    "Reload": ("durabilis.config", "Reload"),
    "load_config": ("durabilis.config", "load_config"),
    "configure_logging": ("durabilis.events", "configure_logging"),
    **{name: ("durabilis.errors", name) for name in (
        "CheckpointConflict", "CheckpointNotFound", "ConfigFileError", "CorruptData",
        "DependencyNotFound", "InvalidKey", "InvalidPayload", "InvalidTtl",
        "KeyReuseMismatch", "LayerClosed", "LeaseLost", "NotReplicated", "PayloadTooLarge",
        "UnsupportedUrl", "WrongEventLoop",
    )},
}

OLD_EXPORTS_COUNT = 81  # durabilis 0.1's __all__ (with __version__)


def _caught(code: str) -> tuple[dict[str, Any], list[warnings.WarningMessage]]:
    """Run ``code`` as a user's module named ``user_code.py``; its names and warnings."""
    namespace: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(code, "user_code.py", "exec"), namespace)
    return namespace, [w for w in caught if issubclass(w.category, DeprecationWarning)]


def test_the_front_door_lists_about_twenty_names_and_dir_shows_only_them() -> None:
    assert set(durabilis.__all__) == FRONT_DOOR | {"aio"}
    assert sorted(durabilis.__all__) == durabilis.__all__
    assert dir(durabilis) == sorted(durabilis.__all__)


def test_the_front_door_and_the_moved_names_cover_every_old_export() -> None:
    # "retry", the decorator, shares its name with its module: the last test here
    assert not FRONT_DOOR & set(MOVED)
    assert "retry" not in FRONT_DOOR | set(MOVED)
    assert len(FRONT_DOOR | set(MOVED) | {"retry"}) == OLD_EXPORTS_COUNT


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_imports_the_same_object_with_a_warning_naming_its_new_import(
    old: str,
) -> None:
    module, name = MOVED[old]
    namespace, caught = _caught(f"from durabilis import {old}\n")

    assert namespace[old] is getattr(importlib.import_module(module), name)
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert f"from {module} import {name}" in message
    assert message.startswith(f"durabilis.{old} is deprecated")
    # stacklevel: the warning points at the user's import line, not at durabilis
    assert (caught[0].filename, caught[0].lineno) == ("user_code.py", 1)


def test_an_old_name_read_as_an_attribute_warns_at_the_reading_line() -> None:
    _, caught = _caught("import durabilis\n\nx = durabilis.DeadLetterQueue\n")

    assert [(w.filename, w.lineno) for w in caught] == [("user_code.py", 3)]
    assert "from durabilis.dlq import DeadLetterQueue" in str(caught[0].message)


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        durabilis.NoSuchThing  # noqa: B018
    with pytest.raises(ImportError):
        exec("from durabilis import NoSuchThing")


def test_the_front_door_names_import_without_a_warning() -> None:
    _, caught = _caught(
        "import durabilis\n"
        f"from durabilis import {', '.join(sorted(FRONT_DOOR))}\n"
        "from durabilis import *\n"
        "from durabilis import aio\n"
        "from durabilis.aio import *\n"
    )
    assert caught == []


def test_a_fresh_interpreter_imports_the_front_door_and_aio_with_deprecations_as_errors() -> None:
    code = (
        "import sys, durabilis\n"
        "assert 'durabilis.aio' not in sys.modules  # imported on first use\n"
        "import durabilis.aio\n"
        "from durabilis import *\n"
        "from durabilis.aio import *\n"
        "assert 'durabilis.cli' not in sys.modules and 'durabilis.http' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr


def test_aio_gives_the_async_classes_their_natural_names() -> None:
    from durabilis._store import AsyncStore, connect_async
    from durabilis.breaker import AsyncCircuitBreakerRegistry
    from durabilis.checkpoint import AsyncCheckpointManager, AsyncTaskRun
    from durabilis.config import AsyncConfigSync
    from durabilis.dlq import AsyncDeadLetterQueue
    from durabilis.idempotency import AsyncIdempotencyGuard
    from durabilis.layer import AsyncDurabilityLayer
    from durabilis.retry import AsyncRetryEngine

    expected = {
        "connect": connect_async, "Store": AsyncStore, "DurabilityLayer": AsyncDurabilityLayer,
        "IdempotencyGuard": AsyncIdempotencyGuard, "RetryEngine": AsyncRetryEngine,
        "CircuitBreakerRegistry": AsyncCircuitBreakerRegistry,
        "CheckpointManager": AsyncCheckpointManager, "TaskRun": AsyncTaskRun,
        "DeadLetterQueue": AsyncDeadLetterQueue, "ConfigSync": AsyncConfigSync,
    }
    assert {name: getattr(durabilis.aio, name) for name in durabilis.aio.__all__} == expected
    assert durabilis.aio is durabilis.__getattr__("aio")


def test_durabilis_retry_is_the_module_and_calling_it_as_the_old_decorator_warns() -> None:
    import durabilis.retry as retry_module

    namespace, caught = _caught(
        "from durabilis import retry\n"
        "\n"
        "@retry('mcp_call')\n"
        "def call() -> int:\n"
        "    return 7\n"
    )
    assert namespace["retry"] is retry_module
    assert retry_module.RetryEngine is durabilis.retry.RetryEngine
    assert namespace["call"]() == 7
    assert [(w.filename, w.lineno) for w in caught] == [("user_code.py", 3)]
    assert "from durabilis.retry import retry" in str(caught[0].message)


def test_durabilis_config_is_reachable_after_import_durabilis_as_in_0_1() -> None:
    # 0.1's front door imported durabilis.config; code reading durabilis.config.load_config
    # after a bare `import durabilis` keeps working (the module now loads on first use).
    code = (
        "import durabilis\n"
        "assert callable(durabilis.config.load_config)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr



def test_the_layer_s_values_resolve_their_type_hints_and_pickle() -> None:
    """``OperationContext`` and ``LayerStats`` live in the core now: frameworks
    that read their hints (``typing.get_type_hints``) and pickles (a
    multiprocessing pool's, within one version) work as before the move."""
    import pickle
    import typing

    from durabilis.layer import LayerStats, OperationContext

    assert typing.get_type_hints(OperationContext)["payload"] is typing.Any
    assert typing.get_type_hints(LayerStats)["started"] is int
    ctx = OperationContext("a", "op", {"x": 1}, "k", "1", 0)
    for value in (ctx, LayerStats(started=3)):
        assert pickle.loads(pickle.dumps(value)) == value
