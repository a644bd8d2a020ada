"""Loading a :class:`~durabilis.DurabilityConfig`: a TOML file in the seed's layout,
``DURABILIS__<SECTION>__<FIELD>`` environment overrides, presets; and back to a dict."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

from durabilis._acks import DEFAULT_ACKS_TIMEOUT
from durabilis._retry_core import RetryBudget, RetryPolicy
from durabilis.breaker import CircuitBreakerConfig
from durabilis.checkpoint import CheckpointConfig
from durabilis.config._layer import DurabilityConfig
from durabilis.config._model import breaker_to_dict, dataclass_fields, plain, policy_to_dict
from durabilis.dlq import DlqConfig
from durabilis.errors import ConfigError, ConfigFileError
from durabilis.idempotency import IdempotencyConfig

ENV_PREFIX: Final = "DURABILIS__"
"""Environment overrides: ``DURABILIS__<SECTION>__<FIELD>`` (``__`` between parts)."""

ENVIRONMENT: Final = "environment"
"""The ``path`` of a :class:`ConfigFileError` raised for an environment override."""

_SECTIONS = (
    "idempotency", "retry", "circuit_breaker", "checkpoint", "dlq", "dependencies", "layer",
)
_INCLUDE_DEFAULTS = "include_defaults"

_T = TypeVar("_T")


def _tomllib() -> Any:
    """``tomllib``, imported when a file is read (not with durabilis)."""
    return importlib.import_module("tomllib")


def _read_toml(path: Path) -> dict[str, Any]:
    toml = _tomllib()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(str(path), "", "", f"cannot read the file: {exc}") from exc
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ConfigFileError(str(path), "", "", f"not valid TOML: {exc}") from exc
    return dict(data)


def _env_value(text: str) -> Any:
    """An override's value: a TOML value when it parses as one, else the text itself."""
    toml = _tomllib()
    try:
        return toml.loads(f"v = {text}")["v"]
    except toml.TOMLDecodeError:
        return text


class _Source:
    """Where the values came from, to name the file or variable in errors."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.origins: dict[tuple[str, str], str] = {}  # (section, field) -> variable

    def error(self, section: str, field_name: str, message: str) -> ConfigFileError:
        variable = self.origins.get((section, field_name))
        if variable is not None:
            return ConfigFileError(ENVIRONMENT, section, field_name, message, variable=variable)
        return ConfigFileError(self.path, section, field_name, message)

    def wrap(self, section: str, exc: ConfigError) -> ConfigFileError:
        text = str(exc)
        prefix = f"{exc.field}: "
        message = text[len(prefix):] if text.startswith(prefix) else text
        return self.error(section, exc.field, message)


def _apply_env(data: dict[str, Any], environ: Mapping[str, str], source: _Source) -> None:
    for variable in sorted(environ):
        if not variable.upper().startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in variable[len(ENV_PREFIX):].split("__")]
        if len(parts) < 2 or not all(parts):
            raise ConfigFileError(
                ENVIRONMENT, "", "",
                "an override is named DURABILIS__<SECTION>__<FIELD> (parts joined by '__')",
                variable=variable,
            )
        *tables, name = parts
        section = ".".join(tables)
        node = data
        for depth, table in enumerate(tables):
            child = node.setdefault(table, {})
            if not isinstance(child, dict):
                raise ConfigFileError(
                    ENVIRONMENT, ".".join(tables[:depth]), table,
                    "is a value in the file, not a section", variable=variable,
                )
            node = child
        node[name] = _env_value(environ[variable])
        source.origins[(section, name)] = variable


def _table(data: Mapping[str, Any], name: str, source: _Source) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise source.error("", name, "must be a section ([name]), not a value")
    return value


def _check_fields(
    values: Mapping[str, Any], allowed: Iterable[str], section: str, source: _Source
) -> None:
    known = set(allowed)
    for name in values:
        if name not in known:
            raise source.error(
                section, name, f"unknown field (known: {', '.join(sorted(known))})"
            )


def _replace(
    base: Any, values: Mapping[str, Any], section: str, source: _Source, *, named_by: str = ""
) -> Any:
    _check_fields(values, dataclass_fields(type(base)) - {named_by}, section, source)
    try:
        return dataclasses.replace(base, **values)
    except ConfigError as exc:
        raise source.wrap(section, exc) from exc
    except TypeError as exc:
        raise source.error(section, "", str(exc)) from exc


def _made(
    cls: Any, name: str, values: Mapping[str, Any], section: str, source: _Source, *,
    named_by: str, required: tuple[str, ...] = (),
) -> Any:
    """A new ``cls(name, **values)`` of section ``[<section>]``: its fields
    checked (``required`` present), its errors named after the section."""
    _check_fields(values, dataclass_fields(cls) - {named_by}, section, source)
    for field in required:
        if field not in values:
            raise source.error(section, field, "is required for a new policy")
    try:
        return cls(name, **values)
    except ConfigError as exc:
        raise source.wrap(section, exc) from exc


def _include_defaults(table: dict[str, Any], section: str, source: _Source) -> bool:
    flag = table.pop(_INCLUDE_DEFAULTS, True)
    if not isinstance(flag, bool):
        raise source.error(section, _INCLUDE_DEFAULTS, f"must be true or false, got {flag!r}")
    return flag


def _opened(data: Mapping[str, Any], kind: str, source: _Source) -> tuple[bool, dict[str, Any]]:
    """``(include_defaults, the [<kind>] table without that flag)``."""
    table = dict(_table(data, kind, source))
    return _include_defaults(table, kind, source), table


def _subtables(table: dict[str, Any], section: str, source: _Source) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, value in table.items():
        if not isinstance(value, dict):
            raise source.error(
                section, name,
                f"must be a section [{section}.{name}] (or {_INCLUDE_DEFAULTS} = true/false)",
            )
        out[name] = dict(value)
    return out


def _named(
    table: dict[str, Any], kind: str, field: str, source: _Source
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(name, "<kind>.<name>", values)`` of each ``[<kind>.<name>]`` section; the
    section's name is its ``field`` (``operation_type``, ``name``): never a key in it."""
    for name, values in _subtables(table, kind, source).items():
        section = f"{kind}.{name}"
        if field in values:
            raise source.error(section, field, "is the section's name: leave it out")
        yield name, section, values


def _budget(section: str, values: dict[str, Any], source: _Source) -> None:
    """A ``[retry.<op>.budget]`` subsection, made a :class:`RetryBudget` in place."""
    budget = values.pop("budget", None)
    if budget is not None:
        if not isinstance(budget, dict):
            raise source.error(section, "budget", f"must be a section [{section}.budget]")
        _check_fields(budget, dataclass_fields(RetryBudget), f"{section}.budget", source)
        try:
            values["budget"] = RetryBudget(**budget)
        except ConfigError as exc:
            raise source.wrap(f"{section}.budget", exc) from exc


def _merged(
    data: Mapping[str, Any], source: _Source, kind: str, cls: type[_T], base: Iterable[_T], *,
    named_by: str, required: tuple[str, ...] = (),
    prepare: Callable[[str, dict[str, Any], _Source], None] | None = None,
) -> tuple[_T, ...]:
    """The ``[<kind>.<name>]`` sections over ``base`` (kept unless
    ``include_defaults = false``): a known name's section replaces the fields
    it gives, a new name's makes a new ``cls`` (``required`` fields present)."""
    keep, table = _opened(data, kind, source)
    found = {getattr(item, named_by): item for item in base} if keep else {}
    for name, section, values in _named(table, kind, named_by, source):
        if prepare is not None:
            prepare(section, values, source)
        known = found.get(name)
        if known is not None:
            found[name] = _replace(known, values, section, source, named_by=named_by)
        else:
            found[name] = _made(
                cls, name, values, section, source, named_by=named_by, required=required
            )
    return tuple(found.values())


def _dependencies(
    data: Mapping[str, Any], breakers: Iterable[CircuitBreakerConfig], source: _Source,
    base: DurabilityConfig,
) -> dict[str, str]:
    keep, table = _opened(data, "dependencies", source)
    deps = dict(base.dependencies) if keep else {}
    for op_type, name in table.items():
        if not isinstance(name, str):
            raise source.error(
                "dependencies", op_type, f"must be a breaker name (text), got {name!r}"
            )
        if name:
            deps[op_type] = name
        else:  # "" removes a default: the operation type runs without a breaker
            deps.pop(op_type, None)
    known = {b.name for b in breakers}
    for op_type, name in deps.items():
        if name not in known:
            raise source.error(
                "dependencies", op_type,
                f"names breaker {name!r}, which is not configured: add "
                f"[circuit_breaker.{name}] or set {op_type} = \"\" (no breaker)",
            )
    return deps


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str = "<config>",
    environ: Mapping[str, str] | None = None,
) -> DurabilityConfig:
    """Build a :class:`~durabilis.DurabilityConfig` from parsed TOML data (see :func:`load_config`).

    Args:
        data: The TOML document as a mapping.
        source: How to name it in errors (the file's path).
        environ: Environment overrides to apply (``os.environ`` when ``None``).

    Raises:
        ConfigFileError: Naming the source (or variable), section and field.
    """
    src = _Source(source)
    doc: dict[str, Any] = json.loads(json.dumps(data, default=str))  # a deep, plain copy
    _apply_env(doc, os.environ if environ is None else environ, src)
    for name in doc:
        if name not in _SECTIONS:
            raise src.error(name, "", f"unknown section (known: {', '.join(_SECTIONS)})")
    layer = dict(_table(doc, "layer", src))
    preset = layer.pop("preset", "gateway")
    if preset not in PRESETS:
        raise src.error("layer", "preset", f"must be one of {', '.join(PRESETS)}, got {preset!r}")
    base = DurabilityConfig.seed() if preset == "seed" else DurabilityConfig()
    idem: IdempotencyConfig = _replace(
        base.idempotency, _table(doc, "idempotency", src), "idempotency", src
    )
    ckpt: CheckpointConfig = _replace(
        base.checkpoint, _table(doc, "checkpoint", src), "checkpoint", src
    )
    dlq: DlqConfig = _replace(base.dlq, _table(doc, "dlq", src), "dlq", src)
    policies = _merged(
        doc, src, "retry", RetryPolicy, base.policies, named_by="operation_type",
        required=("max_attempts", "initial_delay_ms", "max_delay_ms"), prepare=_budget,
    )
    breakers = _merged(
        doc, src, "circuit_breaker", CircuitBreakerConfig, base.breaker_configs, named_by="name"
    )
    deps = _dependencies(doc, breakers, src, base)
    _check_fields(
        layer, ("renew_every_seconds", "acks", "acks_timeout_seconds"), "layer", src
    )
    try:
        return DurabilityConfig(
            idempotency=idem, retry_policies=policies, breakers=breakers, checkpoint=ckpt,
            dlq=dlq, dependencies=deps, renew_every_seconds=layer.get("renew_every_seconds"),
            acks=layer.get("acks"),
            acks_timeout_seconds=layer.get("acks_timeout_seconds", DEFAULT_ACKS_TIMEOUT),
        )
    except ConfigError as exc:
        raise src.wrap("layer", exc) from exc


PRESETS = ("gateway", "seed")
"""``[layer] preset``: what a file starts from. ``gateway`` (default): one ``"*"``
retry policy, no breaker, no dependency. ``seed``: the seed's five policies,
three breakers and their dependencies (:meth:`DurabilityConfig.seed`)."""


def load_config(
    path: str | os.PathLike[str] | None, *, environ: Mapping[str, str] | None = None
) -> DurabilityConfig:
    """Load a :class:`~durabilis.DurabilityConfig` from a TOML file and the environment.

    Sections: ``[idempotency]``, ``[retry.<operation_type>]`` (with an optional
    ``[retry.<operation_type>.budget]``), ``[circuit_breaker.<name>]``,
    ``[checkpoint]``, ``[dlq]``, ``[dependencies]`` (operation type -> breaker
    name, ``""`` for none) and ``[layer]`` (``renew_every_seconds``, ``acks``,
    ``acks_timeout_seconds``, ``preset``).
    A file starts from its preset (:data:`PRESETS`): by default
    :class:`~durabilis.DurabilityConfig`'s one ``"*"`` retry policy, no breaker,
    no dependency; ``preset = "seed"``: the seed's setup (spelled out in
    ``examples/seed.toml``). A section of an entry of the preset overrides only
    the fields it lists; a new name defines a new one. ``include_defaults =
    false`` in ``[retry]``, ``[circuit_breaker]`` or ``[dependencies]`` drops the
    preset's entries.

    Args:
        path: The TOML file; ``None``: the defaults plus the environment.
        environ: Where to read ``DURABILIS__...`` overrides (``os.environ`` when ``None``).

    Raises:
        ConfigFileError: Unreadable file, invalid TOML, unknown section or
            field, or an invalid value: naming the file (or the variable),
            the section and the field.
    """
    data = {} if path is None else _read_toml(Path(path))
    return parse_config(data, source="<defaults>" if path is None else str(path), environ=environ)


def declared_entries(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """The retry policies and breakers a file (plus overrides) declares by name.

    What ``durabilis config publish FILE`` publishes: the ``[retry.<type>]``
    and ``[circuit_breaker.<name>]`` sections, not the seed defaults.

    Returns:
        ``(operation types, breaker names)``, in file order.
    """
    data = _read_toml(Path(path))
    _apply_env(data, os.environ if environ is None else environ, _Source(str(path)))
    names: list[list[str]] = []
    for section in ("retry", "circuit_breaker"):
        table = data.get(section, {})
        names.append(
            [k for k, v in table.items() if isinstance(v, dict)] if isinstance(table, dict)
            else []
        )
    return names[0], names[1]


def config_to_dict(config: DurabilityConfig) -> dict[str, Any]:
    """The effective settings as a JSON-compatible dict, in the file's layout."""
    policies = config.policies
    breakers = config.breaker_configs
    return {
        "idempotency": plain(config.idempotency),
        # Every policy in effect, spelled out: read back, it gives this config.
        "retry": {
            _INCLUDE_DEFAULTS: False, **{p.operation_type: policy_to_dict(p) for p in policies}
        },
        "circuit_breaker": {b.name: breaker_to_dict(b) for b in breakers},
        "checkpoint": plain(config.checkpoint),
        "dlq": plain(config.dlq),
        "dependencies": dict(config.dependencies),
        "layer": {
            "renew_every_seconds": config.renew_every_seconds,
            "acks": config.acks,
            "acks_timeout_seconds": config.acks_timeout_seconds,
        },
    }
