"""Execution windows: cron openings with a length, the idle gate, and budgets per window."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from defrag.execute.windows import Window, window_status
from defrag.plan.config import EvictionBudget
from defrag.plan.spend import BudgetLedger

NIGHTLY = Window("0 2 * * *", 3600)  # 02:00-03:00 UTC every day


def at(hh: int, mm: int, ss: int = 0) -> datetime:
    return datetime(2026, 1, 5, hh, mm, ss, tzinfo=UTC)


@pytest.mark.parametrize(
    ("now", "is_open", "start", "next_open"),
    [
        (at(1, 59, 59), False, None, at(2, 0)),
        (at(2, 0), True, at(2, 0), None),
        (at(2, 59, 59), True, at(2, 0), None),
        (at(3, 0), False, None, datetime(2026, 1, 6, 2, 0, tzinfo=UTC)),  # half-open interval
    ],
)
def test_nightly_window_opens_and_closes_on_its_cron(
    now: datetime, is_open: bool, start: datetime | None, next_open: datetime | None
) -> None:
    status = window_status([NIGHTLY], now)
    assert status.open is is_open
    assert status.start == start
    assert status.next_open == next_open
    if is_open:
        assert status.end == at(3, 0)


def test_second_window_counts_when_the_first_is_closed() -> None:
    lunch = Window("30 12 * * 1-5", 900)  # 12:30-12:45 on weekdays; 2026-01-05 is a Monday
    status = window_status([NIGHTLY, lunch], at(12, 40))
    assert status.open and status.start == at(12, 30)
    assert status.key == at(12, 30).isoformat()


@pytest.mark.parametrize(
    ("idle", "is_open", "fragment"),
    [(None, True, "open until"), (True, True, "is idle"), (False, False, "not idle (idle gate)")],
)
def test_idle_gate_holds_an_open_window_back(
    idle: bool | None, is_open: bool, fragment: str
) -> None:
    status = window_status([NIGHTLY], at(2, 30), idle=idle)
    assert status.open is is_open
    assert fragment in status.reason


def test_no_window_configured_never_opens() -> None:
    status = window_status([], at(2, 30))
    assert not status.open and status.reason == "no execution window configured"


def test_ledger_stops_at_each_budget_and_refuses_gangs_whole() -> None:
    ledger = BudgetLedger(EvictionBudget(total=5, per_node=3, per_namespace=4))
    assert ledger.admit([("a", "n1"), ("a", "n1")]).ok
    # n1 would hold 2 + 2 = 4 > 3: the whole gang is refused, nothing is spent.
    refused = ledger.admit([("b", "n1"), ("b", "n1")])
    assert not refused.ok and "budget-node: 2 of 3" in str(refused)
    assert ledger.total == 2 and ledger.by_namespace["b"] == 0
    # namespace a: 2 + 3 = 5 > 4.
    assert "budget-namespace: 2 of 4" in str(ledger.admit([("a", "n2"), ("a", "n3"), ("a", "n4")]))
    assert ledger.admit([("b", "n2"), ("b", "n3"), ("c", "n4")]).ok  # total 5 = per_window
    assert "budget-window: 5 of 5" in str(ledger.admit([("d", "n5")]))


def test_ledger_starts_afresh_in_a_new_window() -> None:
    ledger = BudgetLedger(EvictionBudget(total=1), window="w1")
    assert ledger.admit([("a", "n1")]).ok
    assert ledger.for_window("w1") is ledger
    fresh = ledger.for_window("w2")
    assert fresh.total == 0 and fresh.admit([("a", "n1")]).ok


@pytest.mark.parametrize(
    ("weekday", "fires"),
    [
        ("1-5", [5, 6, 7, 8, 9]),  # crontab: Monday to Friday (2026-01-05 is a Monday)
        ("0", [11]),  # Sunday
        ("7", [11]),  # Sunday, the other spelling
        ("sat,sun", [10, 11]),
        ("*/3", [7, 10, 11]),  # Sunday, Wednesday, Saturday
    ],
)
def test_weekdays_count_from_sunday_as_in_crontab(weekday: str, fires: list[int]) -> None:
    from defrag.execute.windows import crontab_trigger

    trigger = crontab_trigger(f"0 2 * * {weekday}")
    days, t = [], datetime(2026, 1, 5, tzinfo=UTC)
    while (t := trigger.get_next_fire_time(None, t)) < datetime(2026, 1, 12, tzinfo=UTC):
        days.append(t.day)
        t = t.replace(hour=3)
    assert days == fires
