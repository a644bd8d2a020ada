"""No module reaches into another module's private names (STYLE habit 13).

What a neighbour needs is public within the package: a documented method or
property on the module that owns it, or a call builder in the core. Read
from the source (no import): an attribute ``obj._name`` is another module's
private name when the module reading it defines no ``_name`` itself (as
``self._name = ...``, a ``def``, a class attribute or a module global) and
reads it on another object than ``self``/``cls`` (a subclass uses its base's
state); an
import ``from durabilis.x import _name`` is one when ``_name`` is not a module
and ``durabilis.x`` is not inside the importer's own package.

The layer (its plans and its shells) is held to the same rule: it composes
the pillars through their public accessors (``ops``, ``BreakerBook.admit``,
``core.checkpoint.part``, ``core.retry.BudgetOps``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import durabilis

PACKAGE = Path(durabilis.__file__).parent

NOT_YET: set[str] = set()
"""Modules left out, with the reason in the module docstring (none now)."""

FOREIGN = {
    # Not durabilis's: redis-py's connection and cluster internals (the store
    # talks to them on its hot path), and the standard library's.
    "_sock", "_command_packer", "_initialize", "_getframe", "_replace",
    "_current_tasks",  # (asyncio's, read on 3.11 only: its current_task is Python there)
    # (redis-py's asyncio connection and hiredis parser, and asyncio's StreamReader
    # buffer: the ready check of the asyncio pool, as redis-py's own can_read)
    "_parser", "_connected", "_buffer",
}


def _modules() -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in NOT_YET:
            found.append((rel, ast.parse(path.read_text("utf-8"))))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries, object.__setattr__(self, "_x", ...)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.partition(".")[0] for a in node.names)
    return names


def test_no_module_reads_a_private_attribute_another_module_defines() -> None:
    reaches = []
    for rel, tree in _modules():
        own = _defined(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and node.attr not in own
                and node.attr not in FOREIGN
                # a class's own or inherited state (a shell over its base)
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                reaches.append(f"{rel}:{node.lineno}: .{node.attr}")
    assert not reaches, "\n".join(reaches)


def test_no_module_imports_a_private_name_from_outside_its_own_package() -> None:
    reaches = []
    for rel, tree in _modules():
        home = "durabilis." + rel.removesuffix(".py").replace("/", ".")
        package = home.rpartition(".")[0] if not rel.endswith("__init__.py") else home[:-9]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "durabilis"
            ):
                continue
            source = node.module or ""
            inside = source == package or source.startswith(package + ".")
            for alias in node.names:
                as_module = PACKAGE.joinpath(*source.split(".")[1:], alias.name)
                is_module = as_module.with_suffix(".py").exists() or as_module.is_dir()
                if _private(alias.name) and not is_module and not (
                    inside and package != "durabilis"
                ):
                    reaches.append(f"{rel}:{node.lineno}: from {source} import {alias.name}")
    assert not reaches, "\n".join(reaches)


def test_outer_rooms_build_no_script_call_of_another_module() -> None:
    # The HTTP middleware, the CLI and the doctor ask the module that owns a
    # script for its call (the web console builds its own console_sample).
    rooms = [PACKAGE / "metrics.py", PACKAGE / "testing.py"]
    for room in ("cli", "http", "doctor"):  # a package (or, before a split, a module)
        rooms += [*sorted((PACKAGE / room).rglob("*.py")), PACKAGE / f"{room}.py"]
    built = []
    for path in rooms:
        if not path.exists():
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ScriptCall":
                built.append(f"{rel}:{node.lineno}")
    assert not built, built


def test_the_layer_is_held_to_the_same_rule() -> None:
    # Its plans and shells were left out while they read the pillars' private
    # names (_ops, _admit, checkpoint._part, retry._BudgetOps): no longer.
    checked = {rel for rel, _ in _modules()}
    layer = {p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "layer").rglob("*.py")}
    assert layer and layer <= checked


def test_the_layers_plans_import_no_store_registry_or_engine() -> None:
    # What the plans read of the store, the breakers and the retry engines is
    # typed (StoreShape, BreakerBook, Policies); the shells hand them in, and
    # their lock (new_lock) and Runtime. The plans are in the core, so
    # test_core_purity.py also refuses anything that imports redis, asyncio or
    # threading on the way; this names the line of a direct import.
    shells = {
        "Store", "AsyncStore", "CircuitBreakerRegistry", "AsyncCircuitBreakerRegistry",
        "RetryEngine", "AsyncRetryEngine",
    }
    found = []
    plans = sorted((PACKAGE / "core" / "layer").rglob("*.py"))
    assert len(plans) >= 10, plans  # (the plans are where this test looks)
    for path in plans:
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "durabilis._store":
                found.append(f"{rel}:{node.lineno}: from durabilis._store")
            elif isinstance(node, ast.ImportFrom):
                found += [f"{rel}:{node.lineno}: {a.name}" for a in node.names if a.name in shells]
            elif isinstance(node, ast.Import):
                found += [f"{rel}:{node.lineno}: import {a.name}" for a in node.names
                          if a.name == "durabilis._store"
                          or a.name.partition(".")[0] in ("redis", "asyncio", "threading")]
    assert not found, found
