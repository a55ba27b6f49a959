"""defrag.model.utc: the one place a naive moment is given a zone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from defrag.model.utc import utc

EAST = timezone(timedelta(hours=2))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # naive: taken to be UTC already, the wall-clock fields kept
        (datetime(2026, 3, 2, 12, 0), datetime(2026, 3, 2, 12, 0, tzinfo=UTC)),
        # aware UTC: unchanged
        (datetime(2026, 3, 2, 12, 0, tzinfo=UTC), datetime(2026, 3, 2, 12, 0, tzinfo=UTC)),
        # +02:00 14:00 is 12:00 UTC: the same instant, told in UTC
        (datetime(2026, 3, 2, 14, 0, tzinfo=EAST), datetime(2026, 3, 2, 12, 0, tzinfo=UTC)),
        # across midnight: +02:00 01:00 on the 3rd is 23:00 UTC on the 2nd
        (datetime(2026, 3, 3, 1, 0, tzinfo=EAST), datetime(2026, 3, 2, 23, 0, tzinfo=UTC)),
    ],
)
def test_utc_is_aware_and_in_utc(given: datetime, expected: datetime) -> None:
    got = utc(given)
    assert got == expected
    assert got.utcoffset() == timedelta(0)
    assert (got.year, got.month, got.day, got.hour) == (
        expected.year,
        expected.month,
        expected.day,
        expected.hour,
    )
