"""One duration grammar for flags, settings and rule files (``defrag.model.units``)."""

from __future__ import annotations

import pytest

from defrag.cli.app import UserError, parse_duration
from defrag.detectors.rulemodel import parse_duration as rule_duration
from defrag.model.units import duration_seconds
from defrag.settings import load_settings


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("15m", 900.0),
        ("1h30m", 5400.0),  # 3600 + 30 × 60
        ("2d", 172800.0),  # 2 × 86400
        ("1w", 604800.0),  # 7 × 86400: refused as a flag and a setting before
        ("250ms", 0.25),
    ],
)
def test_flags_settings_and_rule_files_read_a_duration_alike(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds
    assert parse_duration(text, "--min-age") == seconds
    assert rule_duration(text) == seconds
    assert load_settings(None, {"planner.min_pod_age_s": text}).planner.min_pod_age_s == seconds


@pytest.mark.parametrize("text", ["", "15", "1x", "m15", "1h 30m", "-5m"])
def test_what_none_of_them_reads(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration such as"):
        duration_seconds(text)
    if text and text.lstrip("-").isdigit():
        return  # a bare number is each caller's own unit
    with pytest.raises(UserError, match="--min-age"):
        parse_duration(text, "--min-age")
    with pytest.raises(ValueError, match="bad duration"):
        rule_duration(text)


def test_a_rule_duration_past_ten_years_says_so() -> None:
    with pytest.raises(ValueError, match="longer than ten years"):
        rule_duration("99999999d")
