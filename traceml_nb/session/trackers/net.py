"""Whether a tracker's server answers, asked once, briefly, before a run is started there: a
TCP connection to the host and port the user configured, and nothing sent. Without it an
unreachable server makes the client retry for minutes at the end of the user's cell."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

#: seconds to wait for the server's TCP handshake
CONNECT_TIMEOUT_S = 3.0


def unreachable(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why the server of the http(s) ``url`` cannot be reached (``"cannot be reached
    (ConnectionRefusedError: ...)"``), or None when it answers or ``url`` is not http(s)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"has a bad port ({exc})"
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"cannot be reached ({type(exc).__name__}: {exc})"
