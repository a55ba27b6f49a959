"""Whether a server can be reached at all, asked once before a one-shot command's first
request: a TCP connection within a few seconds. A server that is not there (refused, no route,
a name that does not resolve, no answer to the connection) is then said at once, naming it,
instead of after every request's retries have run out."""

from __future__ import annotations

import socket
import urllib.request
from urllib.parse import urlsplit

from defrag.redact import redact_url

CONNECT_TIMEOUT_S = 3.0
"""How long a connection may take before the server counts as unreachable: well above a
connection's round trip across a cluster, well below the retries' ~10 s."""


class ServerUnreachable(ConnectionError):
    """No TCP connection could be made to the server; the message names it (no credentials)
    and says why."""


def unreachable_reason(
    url: str, timeout_s: float = CONNECT_TIMEOUT_S, proxy: str | None = None
) -> str | None:
    """Why no TCP connection to ``url``'s host and port can be made within ``timeout_s``; None
    when one can — or when a proxy (``proxy``, or the environment's for the URL's scheme) would
    carry the request, since only the proxy's own connection could say."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        return None
    if proxy or (
        parts.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(host)
    ):
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return str(exc)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except TimeoutError:
        return f"no answer to a connection within {timeout_s:g} s"
    except OSError as exc:
        return str(exc)
    return None


def check_reachable(
    url: str,
    what: str,
    *,
    named_by: str = "",
    timeout_s: float = CONNECT_TIMEOUT_S,
    proxy: str | None = None,
) -> None:
    """Raise :class:`ServerUnreachable` ("<what> at <url> <named_by> is unreachable (<why>)")
    when :func:`unreachable_reason` has a reason."""
    reason = unreachable_reason(url, timeout_s, proxy)
    if reason is not None:
        named = f" {named_by}" if named_by else ""
        raise ServerUnreachable(f"{what} at {redact_url(url)}{named} is unreachable ({reason})")


__all__ = ["CONNECT_TIMEOUT_S", "ServerUnreachable", "check_reachable", "unreachable_reason"]
