"""One check for every URL a user passes (``--kev-url``, ``--exchange-url``, ``--ws-url``, ``--url``).

A URL without a scheme (``localhost:8080``) parses as scheme ``localhost``; left alone it fails deep in an
HTTP client after the work has started. Commands check their URLs first, with one message shape.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from engine.errors import DualhubError

HTTP = ("http", "https")
WS = ("ws", "wss")


def redact(url: str) -> str:
    """``url`` with any ``user:password@`` replaced: messages never carry credentials."""
    return re.sub(r"(^|/)[^/@\s]*@", r"\1***@", url)  # malformed ones too: over-redacting is fine


def check_url(url: str, flag: str, schemes: tuple[str, ...] = HTTP) -> str:
    """``url`` itself when it is ``scheme://host[:port][/path]`` with a scheme in ``schemes``; else a
    :class:`DualhubError` naming ``flag`` and the expected shape."""
    example = f"{schemes[0]}://127.0.0.1:8080"
    shown = redact(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parsing the port raises ValueError when it is not a number in range)
    except ValueError as e:
        raise DualhubError(f"{flag} {shown!r} is not a valid URL ({e}); expected e.g. {example}") from None
    if parts.scheme.lower() not in schemes or not parts.hostname or any(c.isspace() for c in url):
        want = " or ".join(f"{s}://" for s in schemes)
        raise DualhubError(f"{flag} {shown!r} is not a valid URL: expected {want}HOST[:PORT], e.g. {example}")
    return url
