"""Eviction budgets per window, per node and per namespace, counted as evictions go out.

The limits are the planner's :class:`~defrag.plan.config.EvictionBudget` (one value, built
from the settings with the rest of the planner's configuration): the planner plans within
it, and this ledger enforces it again across every plan of one window opening.

The spend outlives the process through a :class:`~defrag.ports.SpendRecord` (the leader's
Lease): :class:`SpendBook` recovers it before admitting anything and records it before the
evictions it counts go out (write-ahead: a crash in between over-counts, never under-counts).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from defrag.model.status import Status
from defrag.model.utc import utc
from defrag.plan.config import EvictionBudget
from defrag.ports import SpendRecord, SpendUnreadable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class BudgetLedger:
    """What one window opening has spent. A new window key starts a fresh ledger."""

    budgets: EvictionBudget
    window: str = ""
    total: int = 0
    by_node: Counter[str] = field(default_factory=Counter)
    by_namespace: Counter[str] = field(default_factory=Counter)

    def for_window(self, key: str) -> BudgetLedger:
        """This ledger if it counts ``key``'s window, else a fresh one for it."""
        if key == self.window:
            return self
        return BudgetLedger(self.budgets, key)

    def copy(self) -> BudgetLedger:
        return BudgetLedger(
            self.budgets, self.window, self.total, Counter(self.by_node), Counter(self.by_namespace)
        )

    def to_dict(self) -> dict[str, object]:
        """The spend, without the limits (those come from the settings of whoever reads it)."""
        return {
            "window": self.window,
            "total": self.total,
            "by_node": {k: n for k, n in sorted(self.by_node.items()) if n > 0},
            "by_namespace": {k: n for k, n in sorted(self.by_namespace.items()) if n > 0},
        }

    @classmethod
    def from_dict(cls, budgets: EvictionBudget, data: Mapping[str, object]) -> BudgetLedger:
        """The ledger :meth:`to_dict` wrote, counted against ``budgets``; ValueError when
        ``data`` is not such a spend."""
        window = spend_window(data)
        return cls(
            budgets,
            window,
            _count(data, "total"),
            Counter(_counts(data, "by_node")),
            Counter(_counts(data, "by_namespace")),
        )

    def merged(self, other: BudgetLedger) -> BudgetLedger:
        """The larger spend of the two, key by key (same window): what either saw spent."""
        return BudgetLedger(
            self.budgets,
            self.window,
            max(self.total, other.total),
            self.by_node | other.by_node,  # Counter | Counter: the larger count of each key
            self.by_namespace | other.by_namespace,
        )

    def admit(self, pods: Sequence[tuple[str, str]]) -> Status:
        """Spend budget for ``pods`` — (namespace, node) pairs, a gang at once — or refuse all."""
        total = self.total + len(pods)
        limit = self.budgets.total
        if limit is not None and total > limit:
            return Status.fail(
                f"window budget: {self.total} of {limit} evictions spent, {len(pods)} more asked"
            )
        nodes = Counter(node for _, node in pods)
        refused = _over("node", "from", nodes, self.by_node, self.budgets.per_node)
        if refused is not None:
            return refused
        spaces = Counter(ns for ns, _ in pods)
        refused = _over("namespace", "in", spaces, self.by_namespace, self.budgets.per_namespace)
        if refused is not None:
            return refused
        self.total = total
        self.by_node.update(nodes)
        self.by_namespace.update(spaces)
        return Status.success()

    def refund(self, pods: Sequence[tuple[str, str]]) -> None:
        """Give back what :meth:`admit` spent on ``pods`` (never below nothing): steps that
        turned out not to need an eviction (a pod already Terminating)."""
        for namespace, node in pods:
            self.total = max(self.total - 1, 0)
            self.by_node[node] = max(self.by_node[node] - 1, 0)
            self.by_namespace[namespace] = max(self.by_namespace[namespace] - 1, 0)


def spend_window(data: Mapping[str, object]) -> str:
    """The window key of a recorded spend, after checking the whole spend has the shape
    :meth:`BudgetLedger.to_dict` writes; ValueError naming what is wrong."""
    window = data.get("window")
    if not isinstance(window, str):
        raise ValueError("no window key")
    _count(data, "total")
    _counts(data, "by_node")
    _counts(data, "by_namespace")
    return window


def _count(data: Mapping[str, object], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} is not a count: {value!r}")
    return value


def _counts(data: Mapping[str, object], key: str) -> dict[str, int]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} is not a mapping: {value!r}")
    for name, n in value.items():
        if not isinstance(name, str) or not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{key} has {name!r}: {n!r}, not a name and a count")
    return dict(value)


class InMemorySpend:
    """A :class:`~defrag.ports.SpendRecord` in this process only: one replica without a Lease,
    or tests. It outlives no restart (as the ledger alone did)."""

    def __init__(self) -> None:
        self.saved: dict[str, object] | None = None

    def load(self) -> dict[str, object] | None:
        return None if self.saved is None else dict(self.saved)

    def save(self, spend: Mapping[str, object]) -> Status:
        self.saved = dict(spend)
        return Status.success()


@dataclass(slots=True)
class SpendBook:
    """The executor's side of the :class:`~defrag.ports.SpendRecord`: recovery and recording.

    The record keeps the spend of every window opening still open, by key
    (``{"windows": {key: {"total", "by_node", "by_namespace", "until"}}}``): make-room-now
    outside the windows spends the UTC day's budget between two window openings, so switching
    from one key to the other must find each one's spend again. An entry is dropped once its
    ``until`` (the opening's end; the day's end for the day's key) has passed.

    Unknown is never read as nothing spent. A record that cannot be read now refuses this
    execution's evictions (the next cycle reads again). A record that is not such a map
    refuses evictions in the window opening this process first found it in (the next one's
    first recording replaces it); an entry that is not a spend refuses its own window's."""

    record: SpendRecord = field(default_factory=InMemorySpend)
    malformed_in: str | None = None
    """The window key in force when this process first found a malformed record."""
    entries: dict[str, object] = field(default_factory=dict)
    """The record's entries as last read or written (what a save keeps beside its own)."""

    def recover(self, ledger: BudgetLedger) -> tuple[BudgetLedger, str]:
        """``ledger`` raised to the recorded spend of its window, and the reason evictions are
        refused in it ("" when they are not)."""
        try:
            data = self.record.load()
        except SpendUnreadable as exc:
            if exc.malformed:
                return ledger, self._malformed(ledger.window, str(exc))
            return ledger, f"cannot read the window's spend: {exc}"
        windows = {} if data is None else data.get("windows")
        if not isinstance(windows, Mapping):
            return ledger, self._malformed(ledger.window, "the record holds no window map")
        self.malformed_in = None
        self.entries = dict(windows)
        entry = windows.get(ledger.window)
        if entry is None:
            return ledger, ""
        try:
            if not isinstance(entry, Mapping):
                raise ValueError("not a mapping")
            recorded = BudgetLedger.from_dict(ledger.budgets, {**entry, "window": ledger.window})
        except ValueError as exc:
            return ledger, (
                f"the recorded spend of window {ledger.window} is malformed ({exc}): no "
                "eviction in this window"
            )
        return ledger.merged(recorded), ""

    def save(
        self, ledger: BudgetLedger, until: datetime | None = None, now: datetime | None = None
    ) -> Status:
        """Record ``ledger``'s spend (kept until ``until``; the entries past their ``until`` at
        ``now`` dropped); a failure (never an exception) says why."""
        entry = {k: v for k, v in ledger.to_dict().items() if k != "window"}
        known = self.entries.get(ledger.window)
        if until is None and isinstance(known, Mapping):
            until_text = known.get("until")  # a refund keeps what the admission wrote
        else:
            until_text = until.isoformat() if until is not None else None
        entries = {key: value for key, value in self.entries.items() if not _expired(value, now)}
        entries[ledger.window] = {**entry, "until": until_text}
        try:
            saved = self.record.save({"windows": entries})
        except Exception as exc:  # a record that cannot say is a record not written
            return Status.fail(str(exc) or type(exc).__name__)
        if saved.ok:
            self.entries = entries
        return saved

    def refund(self, ledger: BudgetLedger, pods: Sequence[tuple[str, str]]) -> None:
        """:meth:`BudgetLedger.refund`, written back to the record when there was any; a
        failed write-back only leaves the record over-counting (logged)."""
        ledger.refund(pods)
        if not pods:
            return
        saved = self.save(ledger)
        if not saved.ok:
            log.warning("cannot record the window's refunded spend (it over-counts): %s", saved)

    def _malformed(self, window: str, why: str) -> str:
        if self.malformed_in is None:
            self.malformed_in = window
        if self.malformed_in != window:
            return ""  # found in an earlier window opening: this one's recording replaces it
        return f"the window's recorded spend is unreadable, no eviction in this window: {why}"


def _expired(entry: object, now: datetime | None) -> bool:
    """Whether a recorded entry's ``until`` has passed (an unreadable one is kept: it may be
    the spend of a window still open)."""
    if now is None or not isinstance(entry, Mapping) or not isinstance(entry.get("until"), str):
        return False
    try:
        until = datetime.fromisoformat(str(entry["until"]))
    except ValueError:
        return False
    return utc(until) < utc(now)


def _over(
    what: str, where: str, asked: Counter[str], spent: Counter[str], limit: int | None
) -> Status | None:
    """The refusal for the first key (in name order) that ``asked`` would take past ``limit``
    (None: unlimited)."""
    if limit is None:
        return None
    for key, n in sorted(asked.items()):
        if spent[key] + n > limit:
            return Status.fail(
                f"{what} budget: {spent[key]} of {limit} evictions {where} {key} spent, "
                f"{n} more asked"
            )
    return None
