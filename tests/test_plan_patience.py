"""Make-room's patience under a packing scheduler (defrag.plan.patience), table-driven."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from defrag.detect.findings import Finding
from defrag.model.utc import UTC
from defrag.plan.patience import HELD_BACK, PackingPatience, held_back
from defrag.settings import SettingsError, load_settings

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
PACKS = Finding("packing", "cluster", "info", "the scheduler packs GPU pods: of 280 …")
H = timedelta(hours=1)


def starved(pod: str, pending_h: float) -> Finding:
    return Finding(
        "starvation", f"pod/{pod}", "warning", f"pod {pod} pending", since=NOW - pending_h * H,
        action="make-room",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("patience", "packing", "waited", "ok"),
    [
        (PackingPatience(24 * H), PACKS, 23.9 * H, False),  # packs, 23.9 h < 24 h: waits
        (PackingPatience(24 * H), PACKS, 24 * H, True),  # 24 h ≥ 24 h: room
        (PackingPatience(24 * H), None, 0.5 * H, True),  # no packing finding: as ever
        (PackingPatience(None), PACKS, 1000 * H, False),  # never while it packs
        (PackingPatience(None), None, 0.0 * H, True),
        (PackingPatience(timedelta(0)), PACKS, 0.0 * H, True),  # 0: patience off
        (PackingPatience(2 * H), PACKS, None, False),  # unknown wait: taken as just arrived
    ],
)
def test_admits(
    patience: PackingPatience, packing: Finding | None, waited: timedelta | None, ok: bool
) -> None:
    status = patience.admits(packing, waited)
    assert status.ok is ok
    if not ok:
        assert status.reasons[0].startswith(f"{HELD_BACK}: pending ")
        assert PACKS.summary in status.reasons[0]


def test_held_back_reads_the_findings() -> None:
    findings = [PACKS, starved("ml/a", 0.5), starved("ml/b", 30.0), starved("ml/c", 2.0)]
    held = held_back(findings, {"ml/a", "ml/b", "ml/c", "ml/d"}, PackingPatience(24 * H), NOW)
    # a (0.5 h) and c (2 h) wait; b (30 h ≥ 24 h) gets room; d has no starvation finding:
    # its wait is unknown, taken as just arrived
    assert sorted(held) == ["ml/a", "ml/c", "ml/d"]
    assert "pending 0.5 h; make-room waits 24 h before making room" in held["ml/a"]
    assert "pending 2 h" in held["ml/c"] and "pending 0 h" in held["ml/d"]


def test_nothing_is_held_back_without_the_packing_finding() -> None:
    findings = [starved("ml/a", 0.5)]
    assert held_back(findings, {"ml/a"}, PackingPatience(None), NOW) == {}


@pytest.mark.parametrize(
    ("text", "patience"),
    [
        ("", PackingPatience(None)),  # the default: never while the scheduler packs
        ("make_room_packing_patience_s: null\n", PackingPatience(None)),
        ("make_room_packing_patience_s: 86400\n", PackingPatience(24 * H)),
        ("make_room_packing_patience_s: 0\n", PackingPatience(timedelta(0))),  # off
        ("make_room_packing_patience_s: 7200\n", PackingPatience(2 * H)),
    ],
)
def test_the_setting(tmp_path: Path, text: str, patience: PackingPatience) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(text or "{}\n")
    assert load_settings(path).packing_patience() == patience


def test_a_negative_patience_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("make_room_packing_patience_s: -5\n")
    with pytest.raises(SettingsError, match="make_room_packing_patience_s"):
        load_settings(path)
