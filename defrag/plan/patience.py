"""Make-room's patience under a packing scheduler.

When the cluster's scheduler already packs GPU pods (the spreading rule's ``packing`` finding:
most recent placements went where a packing score would put them — defrag's extender, or
``MostAllocated`` for the GPU resource), a pod waits for a whole node mostly until the next
departures free one, and the scheduler fills what they free. Making room then buys little
and costs every victim its restart and its work since its last checkpoint. Measured in the
timeline on every openb trace (docs/benchmarks.md § "The seed score's tie-break and make-room's
patience"): with the extender's score installed, rooms for every starved pod took the default
trace's multi-GPU p95 wait from 0.33 to 0.00 h and lost 9 GPU·h per run (54 on the held-out
seed; 0–16 on the other traces), where KAI's consolidation loses 0–1.

So while the scheduler packs, make-room waits: by default it makes no room at all (the
starvation findings are alerted as ever, so a pod the departures never serve reaches the team
on call); with a ``patience``, a starved pod gets room once it has been pending that long. The
pods held back are reported, each with its reason. Under a spreading scheduler, or when the
rule has too little evidence to say, nothing is held back. A 24 h patience was measured too: on
one trace (gpuspec10) its rooms lost 3–4 GPU·h for a p95 no better on the held-out seed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from defrag.detect.findings import Finding
from defrag.model.status import Status
from defrag.model.utc import utc

PACKING_KIND = "packing"
"""The spreading rule's finding that the scheduler packs (``detectors.spreading.core.PACKING``)."""

STARVATION_KIND = "starvation"

DEFAULT_PATIENCE: timedelta | None = None
"""Never make room while the scheduler packs (docs/benchmarks.md says why)."""


@dataclass(frozen=True, slots=True)
class PackingPatience:
    """How long a starved pod waits for departures while the scheduler packs."""

    patience: timedelta | None = DEFAULT_PATIENCE
    """Room only for pods pending at least this long; None: none while the scheduler packs;
    0: as under a spreading scheduler."""

    @property
    def holds_back(self) -> bool:
        """Whether this patience can hold any pod back (a patience of 0 or less cannot)."""
        return self.patience is None or self.patience > timedelta(0)

    def admits(self, packing: Finding | None, waited: timedelta | None) -> Status:
        """Whether make-room may serve a pod that has waited ``waited`` (None: unknown, taken
        as just arrived) while ``packing`` (the packing finding, None: none this cycle)."""
        if packing is None or not self.holds_back:
            return Status.success()
        waited = waited or timedelta(0)
        if self.patience is not None and waited >= self.patience:
            return Status.success()
        limit = (
            "makes no room while the scheduler packs"
            if self.patience is None
            else f"waits {_hours(self.patience)} before making room while the scheduler packs"
        )
        return Status.fail(
            f"{HELD_BACK}: pending {_hours(waited)}; make-room {limit} "
            f"({packing.summary}): departures free whole nodes and the scheduler fills them"
        )


HELD_BACK = "held-back"
"""The reason's name (as the planner's constraint names are)."""


def held_back(
    findings: Iterable[Finding],
    pods: Iterable[str],
    patience: PackingPatience,
    now: datetime,
) -> Mapping[str, str]:
    """The pods of ``pods`` (``namespace/name``) that make-room holds back this cycle → why,
    read from the findings: the packing finding, and each pod's starvation finding's ``since``
    (pending since)."""
    found = list(findings)
    packing = next((f for f in found if f.kind == PACKING_KIND), None)
    if packing is None:
        return {}
    since = {
        f.subject.removeprefix("pod/"): f.since
        for f in found
        if f.kind == STARVATION_KIND and f.since is not None
    }
    out: dict[str, str] = {}
    for pod in sorted(pods):
        start = since.get(pod)
        waited = utc(now) - utc(start) if start is not None else None
        status = patience.admits(packing, waited)
        if not status.ok:
            out[pod] = str(status)
    return out


def _hours(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 3600:.2g} h"


__all__ = ["DEFAULT_PATIENCE", "HELD_BACK", "PACKING_KIND", "PackingPatience", "held_back"]
