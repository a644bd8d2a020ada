"""The session: a command's store, config and layer, built on first use."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from durabilis.cli._base import (
    DEFAULT_NAMESPACE,
    DEFAULT_TIMEOUT,
    ENV_CONFIG,
    ENV_NAMESPACE,
    EXIT_USAGE,
    EXIT_WRONG_NAMESPACE,
    MAX_TIMEOUT,
    CliError,
)


def operator_name() -> str:
    user = os.environ.get("USER") or os.environ.get("USERNAME") or "operator"
    return f"{user}@{socket.gethostname()}"


def _setting(flag: str | None, variable: str) -> tuple[str | None, str | None]:
    """``(value, where it came from)``: the flag, else the environment variable
    (an empty one counts as unset), else ``(None, None)``."""
    if flag is not None:
        return flag, None
    value = os.environ.get(variable) or None
    return value, (variable if value is not None else None)


class Session:
    """The command's store, config and layer, built on first use.

    Every command resolves its Redis, namespace and config the same way
    (``RESOLUTION_HELP``): a flag, else the environment, else the default.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.json = bool(getattr(args, "json", False))
        namespace, self.namespace_from = _setting(getattr(args, "namespace", None),
                                                  ENV_NAMESPACE)
        self.namespace: str = namespace or DEFAULT_NAMESPACE
        self.config_path, self.config_from = _setting(getattr(args, "config", None), ENV_CONFIG)
        self.timeout: float = getattr(args, "timeout", DEFAULT_TIMEOUT)
        self._store: Any = None
        self._layer: Any = None
        self._config: Any = None

    def config(self) -> Any:
        if self._config is None:
            from durabilis.config import load_config  # noqa: PLC0415  (keeps --help fast)
            from durabilis.errors import ConfigError  # noqa: PLC0415

            try:
                self._config = load_config(self.config_path)
            except ConfigError as exc:
                if self.config_from is None:
                    raise
                raise CliError(EXIT_USAGE, f"{exc} (the file named by ${self.config_from})"
                               ) from exc
        return self._config

    def store(self) -> Any:
        if self._store is None:
            import durabilis  # noqa: PLC0415
            from durabilis.errors import ConfigError  # noqa: PLC0415

            if not (isinstance(self.timeout, (int, float))
                    and 0 < self.timeout <= MAX_TIMEOUT):
                raise CliError(
                    EXIT_USAGE, f"--timeout must be a finite number > 0 and at most "
                    f"{MAX_TIMEOUT:g} (seconds), got {self.timeout!r}"
                )
            try:
                self._store = durabilis.connect(
                    getattr(self.args, "url", None), namespace=self.namespace,
                    socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
                )
            except ConfigError as exc:
                if self.namespace_from is None or exc.field != "namespace":
                    raise
                raise CliError(EXIT_USAGE, f"${self.namespace_from}: {exc}") from exc
        return self._store

    def layer(self) -> Any:
        """A layer with the fleet's configs: ``--config`` (or defaults), then what is published."""
        if self._layer is None:
            from durabilis.config import ConfigSync  # noqa: PLC0415
            from durabilis.layer import DurabilityLayer  # noqa: PLC0415

            config = self.config()
            store = self.store()
            self._layer = DurabilityLayer(store, config, replica_id=f"cli:{operator_name()}")
            from durabilis.errors import CorruptData  # noqa: PLC0415

            try:
                ConfigSync(self._layer).refresh()
            except CorruptData as exc:  # the fleet config hash itself is unreadable
                print(f"durabilis: warning: the published fleet config is unreadable "
                      f"({exc}); using the local config only (repair the hash with "
                      "redis-cli: docs/production.md)", file=sys.stderr)
        return self._layer

    def check_namespace(self) -> None:
        """Exit 5 when the namespace holds no key but other durabilis namespaces exist.

        Called by read commands whose result was empty (nothing listed, nothing
        found, all zero), where "nothing" may only mean a wrong ``--namespace``
        or ``DURABILIS_NAMESPACE``. Commands that create state never call it.
        """
        from durabilis.doctor import hide_password, survey_namespaces  # noqa: PLC0415
        from durabilis.errors import DurabilisError, StorageUnavailable  # noqa: PLC0415

        store = self.store()
        try:
            survey = survey_namespaces(store)
        except StorageUnavailable:
            raise
        except DurabilisError:  # SCAN refused by an ACL: the empty answer stands
            return
        if not survey.wrong:
            return
        where = f" (from ${self.namespace_from})" if self.namespace_from else (
            " (the default)" if getattr(self.args, "namespace", None) is None else "")
        raise CliError(
            EXIT_WRONG_NAMESPACE,
            f"namespace {self.namespace!r}{where} holds no key in {hide_password(store.url)}, "
            f"which holds other durabilis namespaces: {survey.found_text()}. Pass "
            f"--namespace NS or set ${ENV_NAMESPACE}.",
        )

    def close(self) -> None:
        if self._layer is not None:
            self._layer.close()
        if self._store is not None:
            self._store.close()
