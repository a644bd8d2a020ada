"""The acknowledgement level of a store (``acks``): one typed value, parsed once.

A config, ``connect(acks=...)`` and ``Store.with_acks`` all take the text
(``"primary"``, ``"replicas:N"``, either with ``"+fsync"``); :meth:`Acks.parse`
turns it into an :class:`Acks` once, and everything after (the store's
``WAIT``/``WAITAOF``, ``durabilis doctor``'s replica check) reads that value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from durabilis.errors import ConfigError

DEFAULT_ACKS_TIMEOUT = 1.0
"""How long (seconds) ``acks="replicas:N"`` waits for the replicas' confirmations."""

MAX_REPLICAS = 64


@dataclass(frozen=True, slots=True)
class Acks:
    """When a write counts as done (build it with :meth:`parse`).

    Attributes:
        text: The level as given (``"replicas:2+fsync"``).
        replicas: Replicas that must confirm each script's writes (``WAIT``); 0
            with ``"primary"``.
        fsync: The AOF's fsync is awaited too (``WAITAOF``, Redis >= 7.2).
        timeout: Seconds a ``WAIT`` waits for the confirmations.
    """

    text: str = "primary"
    replicas: int = 0
    fsync: bool = False
    timeout: float = DEFAULT_ACKS_TIMEOUT
    waits: bool = field(init=False, repr=False, compare=False)
    """Whether a write script is followed by ``WAIT`` (or ``WAITAOF``): a field,
    not a property, as the store reads it before every script."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "waits", self.replicas > 0 or self.fsync)

    @classmethod
    def parse(cls, acks: str, timeout: float = DEFAULT_ACKS_TIMEOUT) -> Acks:
        """The level ``acks`` with ``timeout`` seconds for its confirmations.

        ``"primary"``: a write counts once the primary ran it. ``"replicas:N"``:
        once N >= 1 replicas confirmed it within ``timeout`` seconds (``WAIT``).
        Either with ``"+fsync"``: once the primary (and those replicas) also wrote
        it to their AOF with fsync (``WAITAOF``, Redis >= 7.2, AOF on).

        Raises:
            ConfigError: Any other level (field ``acks``), or a timeout outside
                [0.001, 60] seconds (field ``acks_timeout``).
        """
        if not isinstance(acks, str):
            raise ConfigError("acks", f"must be 'primary' or 'replicas:N', not {acks!r}")
        level, plus, option = acks.partition("+")
        kind, sep, n = level.partition(":")
        if plus and option != "fsync":
            raise ConfigError("acks", f"the only option is '+fsync', not {acks!r}")
        if level == "primary":
            replicas = 0
        elif kind == "replicas" and sep and n.isdigit() and 1 <= int(n) <= MAX_REPLICAS:
            replicas = int(n)
        else:
            raise ConfigError(
                "acks", f"must be 'primary' or 'replicas:N' (1 <= N <= {MAX_REPLICAS}), "
                f"optionally '+fsync', not {acks!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            0.001 <= timeout <= 60
        ):
            raise ConfigError("acks_timeout", f"must be seconds in [0.001, 60], not {timeout!r}")
        return cls(acks, replicas, bool(plus), float(timeout))

    @property
    def wait_ms(self) -> int:
        """The timeout as ``WAIT`` takes it (milliseconds, at least 1)."""
        return max(1, round(self.timeout * 1000))

    def __str__(self) -> str:
        return self.text


PRIMARY = Acks()
"""The default level: a write counts once the primary ran it."""


def as_acks(acks: str | Acks, timeout: float | None = None) -> Acks:
    """``acks`` as a value: a text parsed (``timeout``: seconds, default 1), an
    :class:`Acks` as it is (it carries its own timeout).

    Raises:
        ConfigError: An invalid level or timeout, or a timeout given with an Acks.
    """
    if isinstance(acks, Acks):
        if timeout is not None:
            raise ConfigError("acks_timeout", (
                "an Acks carries its own timeout: give it to Acks.parse, not here"))
        return acks
    return Acks.parse(acks, DEFAULT_ACKS_TIMEOUT if timeout is None else timeout)
