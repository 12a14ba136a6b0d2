"""A store given as a URL: which values are URLs, which of them name a PostgreSQL server, and a
URL as it may be shown (its password hidden, :func:`redacted`).

A store is a file path or ``postgresql://user@host:port/db`` (``postgres://`` too), the URL as
libpq reads it: a password in it, in ``PGPASSWORD`` or in ``~/.pgpass``; ``?host=/dir`` for a
Unix socket. Nothing here connects or imports a driver.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit

#: The URL schemes of a PostgreSQL server store.
SERVER_SCHEMES = ("postgresql", "postgres")
#: What a hidden password is shown as.
HIDDEN = "***"

_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
#: ``user:password@`` after the scheme: what hides a password where the URL does not parse.
_USERINFO_PASSWORD = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@?#]*:)[^@/?#]*@")
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)[^&#]*", re.IGNORECASE)


def is_url(value: str) -> bool:
    """``value`` is a URL (``scheme://...``), not a file path."""
    return _URL.match(value.strip()) is not None


def scheme_of(value: str) -> str | None:
    """The scheme of the URL ``value`` in lower case; None for a file path."""
    found = _URL.match(value.strip())
    return found.group("scheme").lower() if found else None


def is_server_url(value: str) -> bool:
    """``value`` names a PostgreSQL server store (a ``postgresql://`` or ``postgres://`` URL)."""
    return scheme_of(value) in SERVER_SCHEMES


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a store (one line, its password hidden); None when it can be
    tried (libpq has the last word on the rest)."""
    scheme = scheme_of(url)
    if scheme is None:
        return f"{redacted(url)} is not a URL"
    if scheme not in SERVER_SCHEMES:
        return (
            f"the store URL {redacted(url)} has the scheme {scheme!r}; a store is a file path "
            "or a postgresql://user@host:port/database URL"
        )
    parts = _split(url)
    try:
        if parts is None:
            raise ValueError("its host does not parse")
        parts.port  # noqa: B018 (reading it is the check: a port that is not a number raises)
    except ValueError as exc:
        return f"the store URL {redacted(url)} is malformed: {exc}"
    return None


def _split(url: str) -> SplitResult | None:
    try:
        return urlsplit(url.strip())
    except ValueError:  # an IPv6 host with unbalanced brackets
        return None


def password_of(url: str) -> str | None:
    """The password written in ``url`` (in its user part or a ``password=`` parameter), decoded;
    None when it has none."""
    parts = _split(url)
    if parts is None:
        match = _USERINFO_PASSWORD.match(url.strip())
        return unquote(url.strip()[match.end("head") : match.end() - 1]) if match else None
    if parts.password:
        return unquote(parts.password)
    for key, value in parse_qsl(parts.query):
        if key.lower() == "password" and value:
            return value
    return None


def redacted(url: str) -> str:
    """``url`` as it may be shown: any password replaced by :data:`HIDDEN`
    (``postgresql://ann:***@db:5432/runs``); a file path is returned as it is."""
    text = url.strip()
    if not is_url(text):
        return url
    parts = _split(text)
    if parts is None:  # a URL that does not parse: hide what looks like a password
        text = _USERINFO_PASSWORD.sub(lambda m: f"{m.group('head')}{HIDDEN}@", text)
        return _QUERY_PASSWORD.sub(lambda m: f"{m.group('head')}{HIDDEN}", text)
    netloc, query = parts.netloc, parts.query
    if parts.password is not None:
        user, host = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}:{HIDDEN}@{host}"
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(k.lower() == "password" for k, _ in pairs):
        pairs = [(k, HIDDEN if k.lower() == "password" else v) for k, v in pairs]
        query = urlencode(pairs, safe="/*")
    if (netloc, query) == (parts.netloc, parts.query):
        return text
    return (
        f"{parts.scheme}://{netloc}{parts.path}"
        + (f"?{query}" if query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
    )
