"""Moments in UTC: the one place a naive datetime is given a zone.

The model keeps aware datetimes. Kubernetes timestamps are RFC 3339 in UTC, but a test, a
trace or ``--at`` may hand over a naive one; every floor turns it into an aware UTC moment
here, so arithmetic between two moments never mixes naive and aware, and a moment formatted
with a ``Z`` is in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime


def utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime; a naive one is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


__all__ = ["utc"]
