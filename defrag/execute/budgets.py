"""The window's spend kept across restarts and leaders.

The spend is counted by :class:`~defrag.plan.spend.BudgetLedger`, the one eviction count the
planner, the executor and the simulator share: the planner plans within what is left of it,
and the executor admits every eviction through it again as they go out.

The spend outlives the process through a :class:`~defrag.ports.SpendRecord` (the leader's
Lease): :class:`SpendBook` recovers it before admitting anything and records it before the
evictions it counts go out (write-ahead: a crash in between over-counts, never under-counts).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from defrag.model.status import Status
from defrag.model.utc import utc
from defrag.plan.spend import BudgetLedger
from defrag.ports import SpendRecord, SpendUnreadable

log = logging.getLogger(__name__)


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
