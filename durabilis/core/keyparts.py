"""How one part of a key (or of an index field) is escaped (no I/O).

``durabilis._keys`` builds every key with it; the core's call builders use it
for the index fields they match.
"""

from __future__ import annotations


def escape_part(part: str) -> str:
    """Percent-escape ``%``, ``:``, ``{`` and ``}`` so parts never collide or split a tag."""
    return (
        part.replace("%", "%25").replace(":", "%3A").replace("{", "%7B").replace("}", "%7D")
    )
