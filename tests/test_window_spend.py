"""The window's eviction spend outlives the process: recorded before the evictions it counts,
recovered by the next process or leader, and never read as nothing when it is unknown."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from defrag.adapters.simcluster import SIM_START, SimClock, SimCluster, fragmented_cluster
from defrag.execute import EvictionBudget, Executor, ExecutorSettings, WindowStatus
from defrag.execute.budgets import InMemorySpend, SpendBook
from defrag.execute.mode import RunMode
from defrag.model.resources import Pod
from defrag.model.status import Status
from defrag.plan.model import Plan, Step
from defrag.plan.spend import BudgetLedger
from defrag.ports import EvictionResult, SpendUnreadable
from tests.test_execute import movable_on

OPEN = WindowStatus(True, "test window", SIM_START)
KEY = OPEN.key
BUDGET = EvictionBudget(total=4, per_node=50, per_namespace=50)


# --- the ledger ----------------------------------------------------------------------------------


def test_the_ledger_round_trips() -> None:
    ledger = BudgetLedger(BUDGET, "w1")
    assert ledger.admit([("a", "n1"), ("b", "n2")]).ok
    ledger.refund([("b", "n2")])
    data = ledger.to_dict()
    assert data == {"window": "w1", "total": 1, "by_node": {"n1": 1}, "by_namespace": {"a": 1}}
    back = BudgetLedger.from_dict(BUDGET, data)
    assert back.to_dict() == data and back.budgets == BUDGET


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"window": 3, "total": 1},
        {"window": "w1", "total": "1"},
        {"window": "w1", "total": True},
        {"window": "w1", "total": 1, "by_node": []},
        {"window": "w1", "total": 1, "by_node": {"n1": -1}},
    ],
)
def test_a_malformed_spend_is_refused(data: Mapping[str, object]) -> None:
    with pytest.raises(ValueError):
        BudgetLedger.from_dict(BUDGET, data)


def test_merging_keeps_the_larger_spend_of_each_key() -> None:
    mine = BudgetLedger.from_dict(
        BUDGET, {"window": "w1", "total": 1, "by_node": {"n1": 1}, "by_namespace": {"a": 1}}
    )
    recorded = BudgetLedger.from_dict(
        BUDGET, {"window": "w1", "total": 3, "by_node": {"n2": 3}, "by_namespace": {"a": 3}}
    )
    merged = mine.merged(recorded).to_dict()
    assert merged == {
        "window": "w1",
        "total": 3,
        "by_node": {"n1": 1, "n2": 3},
        "by_namespace": {"a": 3},
    }


# --- recovery --------------------------------------------------------------------------------


class Record:
    """A SpendRecord whose load and save can be made to fail."""

    def __init__(self, saved: Mapping[str, object] | None = None) -> None:
        self.saved = dict(saved) if saved is not None else None
        self.load_error: SpendUnreadable | None = None
        self.save_error = ""
        self.saves: list[dict[str, object]] = []

    def load(self) -> dict[str, object] | None:
        if self.load_error is not None:
            raise self.load_error
        return None if self.saved is None else dict(self.saved)

    def save(self, spend: Mapping[str, object]) -> Status:
        if self.save_error:
            return Status.fail(self.save_error)
        self.saved = dict(spend)
        self.saves.append(dict(spend))
        return Status.success()


def test_recovery_takes_the_recorded_spend_of_the_same_window_only() -> None:
    book = SpendBook(Record({"windows": {"w1": {"total": 3, "by_node": {"n1": 3}}}}))
    ledger, refused = book.recover(BudgetLedger(BUDGET, "w1"))
    assert refused == "" and ledger.total == 3 and ledger.by_node["n1"] == 3
    ledger, refused = book.recover(BudgetLedger(BUDGET, "w2"))  # another window's record
    assert refused == "" and ledger.total == 0


def test_an_unreadable_record_refuses_and_is_asked_again() -> None:
    record = Record()
    record.load_error = SpendUnreadable("the API server is down")
    book = SpendBook(record)
    _, refused = book.recover(BudgetLedger(BUDGET, "w1"))
    assert refused == "cannot read the window's spend: the API server is down"
    record.load_error = None
    assert book.recover(BudgetLedger(BUDGET, "w1"))[1] == ""


def test_a_malformed_record_refuses_the_window_it_was_found_in() -> None:
    record = Record()
    record.load_error = SpendUnreadable("annotation x is not JSON", malformed=True)
    book = SpendBook(record)
    _, refused = book.recover(BudgetLedger(BUDGET, "w1"))
    assert "no eviction in this window" in refused and "annotation x" in refused
    assert book.recover(BudgetLedger(BUDGET, "w1"))[1] == refused
    # It was there before w2 opened: it cannot be w2's spend.
    assert book.recover(BudgetLedger(BUDGET, "w2"))[1] == ""
    # A malformed entry refuses its own window only.
    book = SpendBook(Record({"windows": {"w3": {"total": -2}}}))
    assert "malformed" in book.recover(BudgetLedger(BUDGET, "w3"))[1]
    assert book.recover(BudgetLedger(BUDGET, "w4"))[1] == ""
    # A record that is no window map at all is as unreadable as one that is not JSON.
    book = SpendBook(Record({"window": "w5", "total": 1}))
    assert "no eviction in this window" in book.recover(BudgetLedger(BUDGET, "w5"))[1]


def test_each_window_finds_its_own_spend_again_between_the_others() -> None:
    # Make-room-now spends the day's budget between window openings: going back to the day's
    # key must find the day's spend, not start it afresh (the soak counted 29 evictions on a
    # day's budget of 5 when it did).
    record = Record()
    day, opening = "outside-windows/2026-12-03", "2026-12-03T18:56:00+00:00"
    for key, pods, admitted in ((day, 3, True), (opening, 4, True), (day, 2, False)):
        book = SpendBook(record)  # a new process each time: only the record remembers
        ledger, refused = book.recover(BudgetLedger(BUDGET, key))
        assert refused == ""
        status = ledger.admit([("a", f"n{i}") for i in range(pods)])
        assert status.ok is admitted, status  # the day's 3 of 4 are found again: 2 more refused
        assert book.save(ledger).ok
    book = SpendBook(record)
    assert book.recover(BudgetLedger(BUDGET, day))[0].total == 3
    assert book.recover(BudgetLedger(BUDGET, opening))[0].total == 4


def test_an_opening_past_its_end_is_dropped_from_the_record() -> None:
    from datetime import timedelta

    record = Record()
    book = SpendBook(record)
    ledger = BudgetLedger(BUDGET, "w1")
    assert ledger.admit([("a", "n1")]).ok
    assert book.save(ledger, until=SIM_START, now=SIM_START - timedelta(minutes=1)).ok
    later = BudgetLedger(BUDGET, "w2")
    assert later.admit([("a", "n1")]).ok
    assert book.save(later, until=None, now=SIM_START + timedelta(seconds=1)).ok
    assert record.saved is not None and set(record.saved["windows"]) == {"w2"}


# --- the executor ----------------------------------------------------------------------------


def plan_for(pods: list[Pod], target: str = "gpu-01") -> Plan:
    steps = tuple(Step("migrate", p.key, p.node or "", target, "repack") for p in pods)
    return Plan("repack", "reserve-binpack", steps, ())


def executor(sim: SimCluster, clock: SimClock, record: Record | None) -> Executor:
    settings = ExecutorSettings(
        budgets=BUDGET, batch_size=2, replacement_timeout_s=120, poll_interval_s=10
    )
    return Executor(sim, sim, clock, settings, mode=RunMode.live(), sleep=clock.sleep, spend=record)


def spent(record: Record, key: str) -> object:
    """The total the record holds for window ``key`` (None when none)."""
    windows = (record.saved or {}).get("windows") or {}
    return (windows.get(key) or {}).get("total")  # type: ignore[union-attr]


def started() -> tuple[SimCluster, SimClock]:
    clock = SimClock(speedup=0)
    return SimCluster(fragmented_cluster(), clock), clock


def test_a_restarted_executor_resumes_the_windows_spend() -> None:
    sim, clock = started()
    record = Record()
    first = executor(sim, clock, record)
    cluster = sim.snapshot()
    on_00 = movable_on(cluster, "gpu-00")  # 3 pods
    assert first.execute(plan_for(on_00), cluster, OPEN).counts == {"evicted": 3}
    assert spent(record, OPEN.key) == 3
    # The process restarts: a new executor, the same record (the Lease).
    second = executor(sim, clock, record)
    cluster = sim.snapshot()
    on_02 = movable_on(cluster, "gpu-02")
    assert len(on_02) >= 2
    result = second.execute(plan_for(on_02, "gpu-03"), cluster, OPEN)
    assert result.counts["evicted"] == 1, result.counts
    assert sum(1 for o in result.outcomes if "budget-window: 4 of 4" in o.reason) >= 1
    assert len(sim.evictions) == 4


def test_without_a_record_a_restart_forgets_as_before() -> None:
    sim, clock = started()
    cluster = sim.snapshot()
    executor(sim, clock, None).execute(plan_for(movable_on(cluster, "gpu-00")), cluster, OPEN)
    cluster = sim.snapshot()
    on_02 = movable_on(cluster, "gpu-02")
    result = executor(sim, clock, None).execute(plan_for(on_02, "gpu-03"), cluster, OPEN)
    assert result.counts["evicted"] == min(len(on_02), 4)


def test_the_spend_is_recorded_before_the_first_eviction() -> None:
    sim, clock = started()
    record = Record()
    seen: list[object] = []
    evict = sim.evict

    def spy(namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        seen.append(spent(record, OPEN.key))
        return evict(namespace, name, uid=uid)

    sim.evict = spy  # type: ignore[method-assign]
    cluster = sim.snapshot()
    executor(sim, clock, record).execute(plan_for(movable_on(cluster, "gpu-00")), cluster, OPEN)
    assert seen == [3, 3, 3]


def test_an_unrecorded_spend_evicts_nothing() -> None:
    sim, clock = started()
    record = Record()
    record.save_error = "the Lease was not written: 500"
    ex = executor(sim, clock, record)
    cluster = sim.snapshot()
    result = ex.execute(plan_for(movable_on(cluster, "gpu-00")), cluster, OPEN)
    assert {o.result for o in result.outcomes} == {"skipped"}
    assert all(
        o.reason == "cannot record the window's spend: the Lease was not written: 500"
        for o in result.outcomes
    )
    assert sim.evictions == [] and ex.ledger.total == 0  # nothing spent either
    assert sim.snapshot().node("gpu-00").taints == ()


def test_an_unknown_spend_evicts_nothing_in_its_window() -> None:
    sim, clock = started()
    record = Record()
    record.load_error = SpendUnreadable(
        "annotation defrag.io/window-spend on Lease defrag-system/defrag is not JSON",
        malformed=True,
    )
    cluster = sim.snapshot()
    result = executor(sim, clock, record).execute(
        plan_for(movable_on(cluster, "gpu-00")), cluster, OPEN
    )
    assert {o.result for o in result.outcomes} == {"skipped"}
    assert all("defrag.io/window-spend" in o.reason for o in result.outcomes)
    assert sim.evictions == [] and record.saves == []


def test_a_refund_is_written_back() -> None:
    record = Record()
    book = SpendBook(record)
    ledger = BudgetLedger(BUDGET, "w1")
    assert ledger.admit([("a", "n1"), ("a", "n1")]).ok
    assert book.save(ledger).ok
    book.refund(ledger, [])  # nothing given back: nothing written
    assert len(record.saves) == 1
    book.refund(ledger, [("a", "n1")])
    entry = {"total": 1, "by_node": {"n1": 1}, "by_namespace": {"a": 1}, "until": None}
    assert record.saved == {"windows": {"w1": entry}}
    record.save_error = "down"
    book.refund(ledger, [("a", "n1")])  # a failed write-back only over-counts: no raise
    assert ledger.total == 0 and spent(record, "w1") == 1


def test_in_memory_spend_is_the_default() -> None:
    sim, clock = started()
    ex = executor(sim, clock, None)
    assert isinstance(ex.book.record, InMemorySpend)
