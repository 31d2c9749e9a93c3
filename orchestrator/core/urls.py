"""URLs as messages may show them (pure)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def shown(url: str) -> str:
    """`url` with its password (if any) replaced by `***`: what messages and logs may carry."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
