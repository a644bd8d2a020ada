"""``config check`` / ``show`` / ``publish`` / ``unpublish``: config files
and the fleet config."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from durabilis.cli._base import ENV_CONFIG, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError
from durabilis.cli._output import cell, print_json, print_table, printable
from durabilis.cli._session import Session, operator_name


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _config_check(s: Session) -> int:
    from durabilis.config import config_to_dict, load_config  # noqa: PLC0415
    from durabilis.errors import ConfigError  # noqa: PLC0415

    path = s.args.file or s.config_path
    if path is None:
        raise CliError(EXIT_USAGE, f"config check: give a FILE, --config FILE or ${ENV_CONFIG}")
    try:
        config = load_config(path)
    except ConfigError as exc:
        if s.json:
            print_json({"ok": False, "error": str(exc), "path": getattr(exc, "path", None),
                        "section": getattr(exc, "section", None), "field": exc.field})
        else:
            print(f"durabilis: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    doc = config_to_dict(config)
    warnings = config.warnings()
    # Counted from the config, not from doc["retry"] (which also holds the
    # include_defaults flag that makes the printed config read back as itself).
    policies, breakers = len(config.policies), len(config.breaker_configs)
    if s.json:
        print_json({"ok": True, "retry_policies": policies, "breakers": breakers,
                    "config": doc, "warnings": warnings})
    else:
        print(f"{printable(path)}: ok ({_plural(policies, 'retry policy', 'retry policies')}, "
              f"{_plural(breakers, 'breaker', 'breakers')})")
        for warning in warnings:
            print(f"warning: {printable(warning)}")
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    return EXIT_OK


def _fleet_sync(s: Session) -> Any:
    from durabilis.config import ConfigSync  # noqa: PLC0415

    return ConfigSync(s.store(), replica_id=f"cli:{operator_name()}")


def _unpublish_command(shown: str) -> str:
    """The command that removes a fleet config entry, from its name as printed."""
    import shlex  # noqa: PLC0415

    kind, sep, name = shown.partition(":")
    if sep and name and kind in ("retry", "breaker"):
        return f"durabilis config unpublish {kind} {shlex.quote(name)}"
    return f"durabilis config unpublish entry {shlex.quote(shown)}"


def _config_show(s: Session) -> int:
    from durabilis.config import (  # noqa: PLC0415
        breaker_to_dict,
        policy_to_dict,
        printable_entry,
    )

    fleet = _fleet_sync(s).fleet_config()
    # A rejected entry may be named by anyone's bytes: shown escaped (\xNN), never raw.
    rejected = {printable_entry(k, None): v for k, v in fleet.rejected.items()}
    for name, reason in rejected.items():
        print(f"durabilis: warning: fleet config entry {printable_entry(name)} is rejected by "
              f"every replica ({reason}); remove it: {_unpublish_command(name)}",
              file=sys.stderr)
    doc = {
        "version": fleet.version,
        "updated_at": fleet.updated_at,
        "retry": {k: policy_to_dict(v) for k, v in sorted(fleet.retry_policies.items())},
        "circuit_breaker": {k: breaker_to_dict(v) for k, v in sorted(fleet.breakers.items())},
        "rejected": rejected,
    }
    if s.json:
        print_json(doc)
        return EXIT_OK
    print(f"fleet config version {fleet.version}, updated {cell(fleet.updated_at)}")
    # Names as stored: the table escapes them (printable), and `config unpublish`
    # takes that form back.
    rows = [("retry", k, json.dumps(v, sort_keys=True)) for k, v in doc["retry"].items()]
    rows += [("breaker", k, json.dumps(v, sort_keys=True))
             for k, v in doc["circuit_breaker"].items()]
    rows += [("rejected", k, v) for k, v in sorted(fleet.rejected.items())]
    print_table(("KIND", "NAME", "CONFIG"), rows, "nothing published")
    return EXIT_OK


def _config_publish(s: Session) -> int:
    from durabilis.config import declared_entries, load_config  # noqa: PLC0415

    config = load_config(s.args.file)
    policies, breakers = declared_entries(s.args.file)
    if s.args.retry is not None or s.args.breaker is not None:
        wanted_p, wanted_b = set(s.args.retry or ()), set(s.args.breaker or ())
        missing = sorted((wanted_p - set(policies)) | (wanted_b - set(breakers)))
        if missing:
            raise CliError(EXIT_USAGE, f"{s.args.file} declares no {', '.join(missing)}")
        policies = [p for p in policies if p in wanted_p]
        breakers = [b for b in breakers if b in wanted_b]
    by_type = {p.operation_type: p for p in config.retry_policies or ()}
    by_name = {b.name: b for b in config.breakers or ()}
    sync = _fleet_sync(s)
    done = []
    for op in policies:
        done.append({"entry": f"retry:{op}", "version": sync.publish_policy(by_type[op])})
    for name in breakers:
        done.append({"entry": f"breaker:{name}", "version": sync.publish_breaker(by_name[name])})
    if not done:
        raise CliError(EXIT_NOT_FOUND, f"{s.args.file} declares no [retry.*] or "
                       "[circuit_breaker.*] section to publish")
    version = max(d["version"] for d in done)
    if s.json:
        print_json({"published": done, "version": version})
    else:
        for d in done:
            print(f"published {d['entry']} (fleet config version {d['version']})")
    return EXIT_OK


def _published_field(fleet: Any, kind: str, name: str) -> str | None:
    """The field of the fleet config hash ``config unpublish KIND NAME`` names, if any.

    NAME as the shell passed it (its raw bytes: Python keeps those that are not
    UTF-8 as lone surrogates, as the fleet config does) or as ``config show``
    prints it (``\\xNN`` for such a byte). ``entry``: NAME is the whole field.
    """
    from durabilis.config import printable_entry  # noqa: PLC0415

    wanted = name if kind == "entry" else f"{kind}:{name}"
    fields = {*fleet.rejected, *(f"retry:{n}" for n in fleet.retry_policies),
              *(f"breaker:{n}" for n in fleet.breakers)}
    if wanted in fields:
        return wanted
    shown = sorted(f for f in fields
                   if wanted in (printable_entry(f, None), printable(f)))
    if len(shown) > 1:
        raise CliError(EXIT_USAGE, f"{printable_entry(wanted)} names {len(shown)} fleet "
                       "config entries: pass its raw bytes (e.g. bash's $'\\xff')")
    return shown[0] if shown else None


def _config_unpublish(s: Session) -> int:
    from durabilis.config import printable_entry  # noqa: PLC0415

    sync = _fleet_sync(s)
    fleet = sync.fleet_config()  # whatever the entries hold: a bad one is in .rejected
    field = _published_field(fleet, s.args.kind, s.args.name)
    if field is None:
        wanted = s.args.name if s.args.kind == "entry" else f"{s.args.kind}:{s.args.name}"
        raise CliError(EXIT_NOT_FOUND, f"{printable_entry(wanted)} is not published")
    version = sync.remove_entry(field)
    shown = printable_entry(field, None)
    if s.json:
        print_json({"entry": shown, "version": version})
    else:
        print(f"unpublished {printable_entry(shown)} (fleet config version {version})")
    return EXIT_OK


COMMANDS: dict[tuple[str, str | None], Callable[[Session], int]] = {
    ("config", "check"): _config_check,
    ("config", "show"): _config_show,
    ("config", "publish"): _config_publish,
    ("config", "unpublish"): _config_unpublish,
}
