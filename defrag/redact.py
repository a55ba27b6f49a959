"""Secrets out of URLs, wherever a URL is printed: logs, CLI messages, metric labels.

One helper for the whole project. :func:`redact_url` takes one URL and drops its
``user:password@`` and the values of query parameters that carry credentials (``token``,
``access_token``, ``password``, ``api_key``, ``X-Amz-Signature``…). :func:`redact_text` does the
same to every URL found in free text — an exception message from requests or urllib3 names
the URL it failed on, query string included — and to ``Authorization``/``Bearer`` values.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "REDACTED"

_SECRET_PARAM = re.compile(
    r"^(?:.*token.*|.*secret.*|.*passw(?:or)?d.*|pass|pwd|.*api[-_]?key.*|key|auth.*|"
    r"credentials?|sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|"
    r"client_secret|session)$",
    re.IGNORECASE,
)
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{}]+")
_USERINFO = re.compile(r"(?<=://)[^/@\s'\"]+@")
_QUERY_SECRET = re.compile(
    r"(?P<name>[?&](?:[A-Za-z0-9_.-]*(?:token|secret|passw(?:or)?d|api[-_]?key|signature|"
    r"credential)[A-Za-z0-9_.-]*|pass|pwd|key|sig|auth))=(?P<value>[^&\s'\"#]*)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")


def redact_url(url: str) -> str:
    """``url`` with no user name, password or credential-carrying query value."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:  # not a URL we can take apart (bad port…): mask by pattern
        return redact_text(url)
    netloc = parts.netloc
    if parts.username is not None or parts.password is not None:
        netloc = (f"[{host}]" if host and ":" in host else host or "") + (
            f":{port}" if port else ""
        )
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_PARAM.match(k) for k, _ in pairs):
            query = urlencode(
                [(k, MASK if _SECRET_PARAM.match(k) else v) for k, v in pairs], safe="/:"
            )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str) -> str:
    """``text`` with every URL's credentials masked, and any ``Bearer …`` value too."""
    if not text:
        return text
    out = _URL.sub(lambda m: _mask_in_url(m.group(0)), text)
    out = _QUERY_SECRET.sub(lambda m: f"{m.group('name')}={MASK}", out)  # paths without a host
    return _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", out)


def _mask_in_url(url: str) -> str:
    url = _USERINFO.sub("", url)
    return _QUERY_SECRET.sub(lambda m: f"{m.group('name')}={MASK}", url)
