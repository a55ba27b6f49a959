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
rule has too little evidence to say, nothing is held back. A packing finding stands for
``memory`` (24 h) after the last cycle that reported it, so one cycle whose share dips under
the bar does not undo the verdict. A 24 h patience was measured too: on
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

SPREADING_KIND = "spreading"
"""The spreading rule's finding that the scheduler spreads: evidence against packing, so no
earlier packing finding stands beside it."""

DEFAULT_PATIENCE: timedelta | None = timedelta(0)
"""Hold nothing back: whether a room is worth making while the scheduler packs is the room's
forecast value against its cost (:mod:`defrag.plan.departures`; the packing verdict is its
input). None (never while the scheduler packs) was the default before the forecast."""

DEFAULT_MEMORY = timedelta(hours=24)
"""How long a packing finding stands after the last cycle that reported it: the spreading
rule's own window. The share it is judged on wavers about its bar while the scheduler does
not change (224 of 264 placements, 0.848, at one window of a packing scheduler on gpuspec10's
held-out seed 46, 0.85 and above at the windows before it); a verdict that lapsed for one
cycle let make-room evict 25 pods for a wait the departures were serving."""


@dataclass(frozen=True, slots=True)
class PackingPatience:
    """How long a starved pod waits for departures while the scheduler packs."""

    patience: timedelta | None = DEFAULT_PATIENCE
    """Room only for pods pending at least this long; None: none while the scheduler packs;
    0: as under a spreading scheduler."""
    memory: timedelta = DEFAULT_MEMORY
    """A packing finding stands this long after the last cycle that reported it (0: only in
    the cycle that reports it)."""

    @property
    def holds_back(self) -> bool:
        """Whether this patience can hold any pod back (a patience of 0 or less cannot)."""
        return self.patience is None or self.patience > timedelta(0)

    def standing(
        self, findings: Iterable[Finding], last: Finding | None, now: datetime
    ) -> Finding | None:
        """The packing finding that holds at ``now``: this cycle's, else ``last`` (the latest
        an earlier cycle reported, its ``since`` the moment it was found) while it is at most
        :attr:`memory` old and this cycle does not find the scheduler spreading; None
        otherwise."""
        found = list(findings)
        current = next((f for f in found if f.kind == PACKING_KIND), None)
        if current is not None:
            return current
        if any(f.kind == SPREADING_KIND for f in found):
            return None
        if last is None or last.since is None or utc(now) - utc(last.since) > self.memory:
            return None
        return last

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
            f"({_seen(packing)}{packing.summary}): departures free whole nodes and the "
            "scheduler fills them"
        )


HELD_BACK = "held-back"
"""The reason's name (as the planner's constraint names are)."""


def held_back(
    findings: Iterable[Finding],
    pods: Iterable[str],
    patience: PackingPatience,
    now: datetime,
    packing: Finding | None,
) -> Mapping[str, str]:
    """The pods of ``pods`` (``namespace/name``) that make-room holds back this cycle → why:
    ``packing`` is the packing finding that stands (:meth:`PackingPatience.standing`), each
    pod's pending time its starvation finding's ``since``."""
    if packing is None:
        return {}
    found = list(findings)
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


def _seen(packing: Finding) -> str:
    """When the packing finding was found, for a reason that may quote an earlier cycle's."""
    if packing.since is None:
        return ""
    return f"as of {utc(packing.since).strftime('%Y-%m-%d %H:%M')} UTC: "


def _hours(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 3600:.2g} h"


__all__ = [
    "DEFAULT_MEMORY",
    "DEFAULT_PATIENCE",
    "HELD_BACK",
    "PACKING_KIND",
    "SPREADING_KIND",
    "PackingPatience",
    "held_back",
]
