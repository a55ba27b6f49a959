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
    pods = {"ml/a", "ml/b", "ml/c", "ml/d"}
    held = held_back(findings, pods, PackingPatience(24 * H), NOW, PACKS)
    # a (0.5 h) and c (2 h) wait; b (30 h ≥ 24 h) gets room; d has no starvation finding:
    # its wait is unknown, taken as just arrived
    assert sorted(held) == ["ml/a", "ml/c", "ml/d"]
    assert "pending 0.5 h; make-room waits 24 h before making room" in held["ml/a"]
    assert "pending 2 h" in held["ml/c"] and "pending 0 h" in held["ml/d"]


def test_nothing_is_held_back_without_the_packing_finding() -> None:
    findings = [starved("ml/a", 0.5)]
    assert held_back(findings, {"ml/a"}, PackingPatience(None), NOW, None) == {}


def packs_at(hours_ago: float) -> Finding:
    return Finding("packing", "cluster", "info", "packs", since=NOW - hours_ago * H)


SPREADS = Finding("spreading", "cluster", "info", "spreads", since=NOW)


@pytest.mark.parametrize(
    ("memory", "found", "last", "stands"),
    [
        (24 * H, [PACKS], None, PACKS),  # found this cycle: it stands
        (24 * H, [PACKS], packs_at(1), PACKS),  # this cycle's, not the older one
        (24 * H, [], packs_at(23.9), "last"),  # a dip under the bar: 23.9 h ≤ 24 h, it stands
        (24 * H, [], packs_at(24), "last"),  # 24 h ≤ 24 h
        (24 * H, [], packs_at(24.1), None),  # 24.1 h > 24 h: lapsed
        (24 * H, [SPREADS], packs_at(0.1), None),  # the scheduler spreads now: nothing stands
        (24 * H, [], None, None),  # never found
        (timedelta(0), [], packs_at(0.1), None),  # memory 0: only the cycle that finds it
        (24 * H, [], Finding("packing", "cluster", "info", "packs"), None),  # no time: lapsed
    ],
)
def test_standing(
    memory: timedelta, found: list[Finding], last: Finding | None, stands: object
) -> None:
    patience = PackingPatience(None, memory)
    expected = last if stands == "last" else stands
    assert patience.standing(found, last, NOW) is expected


def test_a_remembered_finding_says_when_it_was_found() -> None:
    held = held_back([starved("ml/a", 0.5)], {"ml/a"}, PackingPatience(None), NOW, packs_at(3))
    assert "(as of 2026-12-02 09:00 UTC: packs)" in held["ml/a"]


@pytest.mark.parametrize(
    ("text", "patience"),
    [
        ("", PackingPatience(timedelta(0))),  # the default: the room's forecast decides
        ("make_room_packing_patience_s: null\n", PackingPatience(None)),
        ("make_room_packing_patience_s: 86400\n", PackingPatience(24 * H)),
        ("make_room_packing_patience_s: 0\n", PackingPatience(timedelta(0))),  # off
        ("make_room_packing_patience_s: 7200\n", PackingPatience(2 * H)),
        ("make_room_packing_memory_s: 3600\n", PackingPatience(timedelta(0), H)),
        ("make_room_packing_memory_s: 0\n", PackingPatience(timedelta(0), timedelta(0))),
    ],
)
def test_the_setting(tmp_path: Path, text: str, patience: PackingPatience) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(f"planner:\n  {text}" if text else "{}\n")
    assert load_settings(path).packing_patience() == patience


@pytest.mark.parametrize("field", ["make_room_packing_patience_s", "make_room_packing_memory_s"])
def test_a_negative_setting_is_refused_naming_the_field(tmp_path: Path, field: str) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(f"planner:\n  {field}: -5\n")
    with pytest.raises(SettingsError, match=f"setting planner.{field} "):
        load_settings(path)
