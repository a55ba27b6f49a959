"""Dry run or live, and everything that follows from it — decided here and nowhere else.

Dry run (the default) writes nothing to the cluster: no eviction, no taint, no annotation, no
Lease (every replica plans and reports), no reconciliation of what an earlier live run left
(it is reported instead); with ``events`` (the setting ``dry_run_events``) it writes Events
only, each marked as a rehearsal. Live evicts through the Eviction API within budgets and
windows, takes the Lease when leader election is on, and reconciles leftovers.

The composition root (``defrag run``: defrag/cli/run.py) reads the settings into one
:class:`RunMode` and hands it to the executor, the unmodelled-object reporter and the cycle;
each asks it what it may do. No function below the root takes a dry-run flag.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunMode:
    dry_run: bool = True
    events: bool = False
    """In dry run, still post the Events a live run would (marked); the setting
    ``dry_run_events``."""
    leader_election: bool = True

    @classmethod
    def live(cls, *, leader_election: bool = True) -> RunMode:
        return cls(False, False, leader_election)

    @property
    def evicts(self) -> bool:
        """Pods are evicted, nodes tainted and annotated: a live run."""
        return not self.dry_run

    @property
    def writes_events(self) -> bool:
        """Events reach the API server (live, or dry run with ``dry_run_events``)."""
        return not self.dry_run or self.events

    @property
    def takes_lease(self) -> bool:
        """Only a live run with leader election writes a Lease; dry run writes none."""
        return self.leader_election and not self.dry_run

    @property
    def reconciles(self) -> bool:
        """Leftovers of an earlier live run are repaired (live) or only reported (dry run)."""
        return not self.dry_run

    @property
    def name(self) -> str:
        """How a run is named in logs and tables."""
        return "dry run" if self.dry_run else "live"

    def to_dict(self) -> dict[str, object]:
        """The mode in a cycle's JSON (``dry_run`` as the setting spells it)."""
        return {"dry_run": self.dry_run, "mode": self.name}


__all__ = ["RunMode"]
