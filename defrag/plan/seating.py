"""Where a cluster's running pods sit, as a plan's workspace starts from it, kept across cycles.

A :class:`~defrag.plan.workspace.Workspace` starts from the cluster's seating: each row's
running pods (seats in key order), the gangs, the CPU held by GPU-less pods per row and the
Terminating pods. Made from nothing that is a walk over every pod, a large part of a later
cycle at fleet scale; yet between two cycles a few pods change (jobs ending and starting)
while the cluster's snapshots share every other pod object. So the last seating is kept and
brought up to date: the pods whose object differs from the last cluster's (by identity: a
:class:`~defrag.model.resources.Pod` is frozen, so the same object is the same pod) are taken
out and put back, and only the rows they touch are put back in key order. The result is the
seating :func:`seating_of` makes from nothing — the same rows in the same order, the same
gangs, sums and sets (``tests/test_plan_seating.py``). Other nodes than last time (a row
added, removed or renamed) or many changed pods: it is made from nothing.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

import numpy as np

from defrag.model.arrays import IntArray
from defrag.model.carried import Carried
from defrag.model.cluster import Cluster, occupies
from defrag.model.podchanges import changed_keys
from defrag.model.resources import Pod
from defrag.model.utc import utc
from defrag.plan.constraints import gang_of
from defrag.plan.departures import DEFAULT_BANDWIDTH_H, DEFAULT_HORIZON_H, Departures


class Occupant(Protocol):
    """A running pod on a row (the simulator's ``Placed`` has the same attributes)."""

    @property
    def pod(self) -> Pod: ...
    @property
    def row(self) -> int: ...
    @property
    def gpus(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class Seat:
    pod: Pod
    row: int
    gpus: tuple[int, ...]


REBUILD_SHARE = 0.05
"""Past this share of the pods changed, the seating is made from nothing (walking every pod
once is then cheaper than taking each out and putting it back)."""


class Seating:
    """A cluster's running pods by row, with what a workspace derives from them.

    ``rows`` are never handed out: a workspace copies them (:meth:`rows_copy`); ``where``,
    ``gangs`` and ``gpuless_cpu`` likewise. ``where`` and ``gangs`` are read by key only, or
    walked into a set: their order is not kept (a changed pod's seat is put at the end of
    ``where``, where one made from nothing has it row by row)."""

    def __init__(
        self,
        pods: Mapping[str, Pod],
        names: tuple[str, ...],
        rows: list[dict[str, Seat]],
        gang_by_pod: dict[str, str],
        gangs: dict[str, tuple[str, ...]],
        gpuless_cpu: IntArray,
        terminating: set[str],
        started_us: dict[str, int],
    ) -> None:
        self.pods = pods
        """The cluster's pods this seating is of (compared pod by pod, by identity)."""
        self.names = names
        self.rows = rows
        self.gang_by_pod = gang_by_pod
        """Every running or pending pod in a gang → its gang."""
        self.gangs = gangs
        self.gpuless_cpu = gpuless_cpu
        self.terminating = terminating
        self.started_us = started_us
        """The running GPU pods not Terminating whose start is known (bound, else created) →
        that moment in microseconds since the epoch: what their ages are read from
        (:func:`departures_of`)."""
        self.where: dict[str, Seat] = _where(rows)

    def rows_copy(self) -> list[dict[str, Seat]]:
        return [dict(r) for r in self.rows]


def _where(rows: Iterable[Mapping[str, Seat]]) -> dict[str, Seat]:
    """Every seat by pod key, row by row (the order a workspace made from its rows has)."""
    return {k: s for r in rows for k, s in r.items()}


def _running(pod: Pod) -> bool:
    """A pod a workspace seats: bound, holding its node's resources (``Cluster.bound_pods``)."""
    return pod.node is not None and occupies(pod)


def _waiting(pod: Pod) -> bool:
    """A pod the workspace counts in its gang while pending (``Cluster.pending_pods``)."""
    return pod.node is None and pod.phase == "Pending" and not pod.terminating


def seating_of(cluster: Cluster) -> Seating:
    """The seating of ``cluster``, made from nothing."""
    arrays = cluster.arrays
    index = arrays.index
    rows: list[dict[str, Seat]] = [{} for _ in range(len(arrays))]
    members: dict[str, list[str]] = defaultdict(list)
    gang_by_pod: dict[str, str] = {}
    cpu = [0] * len(arrays)
    terminating: set[str] = set()
    started: dict[str, int] = {}
    for key, pod in sorted((p.key, p) for p in cluster.bound_pods()):
        row = index[pod.node]  # type: ignore[index]
        rows[row][key] = Seat(pod, row, pod.gpu_indices)
        if pod.num_gpu == 0:
            cpu[row] += pod.cpu_milli
        if pod.terminating:
            terminating.add(key)
        else:
            _note_start(started, key, pod)
        gang = gang_of(pod)
        if gang:
            members[gang].append(key)
            gang_by_pod[key] = gang
    for pod in cluster.pending_pods():
        gang = gang_of(pod)
        if gang:
            members[gang].append(pod.key)
            gang_by_pod[pod.key] = gang
    gangs = {g: tuple(sorted(keys)) for g, keys in members.items()}
    gpuless = np.array(cpu, dtype=np.int64)
    return Seating(
        cluster.pods, arrays.names, rows, gang_by_pod, gangs, gpuless, terminating, started
    )


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(moment: datetime) -> int:
    """``moment`` in whole microseconds since the epoch (exact: a datetime's resolution)."""
    return (utc(moment) - EPOCH) // _MICROSECOND


def _note_start(started: dict[str, int], key: str, pod: Pod) -> None:
    """Keep a running pod's start (bound, else created) when it is a GPU pod and known."""
    if pod.num_gpu:
        since = pod.scheduled_at or pod.created_at
        if since is not None:
            started[key] = micros(since)


def updated(last: Seating, cluster: Cluster) -> Seating | None:
    """``last`` brought up to ``cluster`` in place (see the module docstring), or None where it
    must be made from nothing (other nodes, many changes)."""
    arrays = cluster.arrays
    if arrays.names != last.names:
        return None
    old, new = last.pods, cluster.pods
    if new is old:
        return last
    changed = changed_keys(old, new, max(int(len(new) * REBUILD_SHARE), 1))
    if changed is None:
        return None
    index = arrays.index
    dirty_rows: set[int] = set()
    touched: dict[str, tuple[set[str], set[str]]] = {}  # gang → (members gone, members come)

    def gang_change(gang: str) -> tuple[set[str], set[str]]:
        return touched.setdefault(gang, (set(), set()))

    for key in changed:
        before, after = old.get(key), new.get(key)
        if before is not None:
            seat = last.where.pop(key, None)
            if seat is not None:
                del last.rows[seat.row][key]
                dirty_rows.add(seat.row)
                if seat.pod.num_gpu == 0:
                    last.gpuless_cpu[seat.row] -= seat.pod.cpu_milli
                last.terminating.discard(key)
                last.started_us.pop(key, None)
            gang = last.gang_by_pod.pop(key, None)
            if gang is not None:
                gang_change(gang)[0].add(key)
        if after is None:
            continue
        if _running(after):
            row = index[after.node]  # type: ignore[index]
            seat = Seat(after, row, after.gpu_indices)
            last.rows[row][key] = seat
            last.where[key] = seat
            dirty_rows.add(row)
            if after.num_gpu == 0:
                last.gpuless_cpu[row] += after.cpu_milli
            if after.terminating:
                last.terminating.add(key)
            else:
                _note_start(last.started_us, key, after)
        elif not _waiting(after):
            continue
        gang = gang_of(after)
        if gang:
            last.gang_by_pod[key] = gang
            gang_change(gang)[1].add(key)
    for row in dirty_rows:
        last.rows[row] = dict(sorted(last.rows[row].items()))
    for gang, (gone, come) in touched.items():
        keys = (set(last.gangs.get(gang, ())) - gone) | come
        if keys:
            last.gangs[gang] = tuple(sorted(keys))
        else:
            last.gangs.pop(gang, None)
    last.pods = new
    return last


_kept: Carried[Seating] = Carried()


def seating(cluster: Cluster) -> Seating:
    """The seating of ``cluster``: the kept one brought up to it, else one made from nothing
    (then kept). Callers copy what they change (:meth:`Seating.rows_copy`) while holding
    :func:`held`."""

    def step(last: Seating | None) -> Seating:
        found = updated(last, cluster) if last is not None else None
        return found if found is not None else seating_of(cluster)

    return _kept.step(step)


def departures_of(
    cluster: Cluster,
    now: datetime,
    horizon_h: float = DEFAULT_HORIZON_H,
    bandwidth_h: float = DEFAULT_BANDWIDTH_H,
) -> Departures:
    """:meth:`Departures.of <defrag.plan.departures.Departures.of>` the cluster's bound pods,
    from the starts its kept seating holds (brought up to this cluster, not walked). The same
    ages to the bit: each is the whole microseconds between the two moments over 10⁶ (what
    ``timedelta.total_seconds`` computes: exact integers, divided once), over 3600."""
    with _kept.lock:
        started = seating(cluster).started_us
        since = np.fromiter(started.values(), dtype=np.int64, count=len(started))
    hours = (micros(now) - since) / 1e6 / 3600.0
    return Departures(np.sort(np.maximum(hours, 0.0)), horizon_h, bandwidth_h)


def held() -> threading.RLock:
    """The lock under which :func:`seating` is asked and its answer copied."""
    return _kept.lock


__all__ = [
    "REBUILD_SHARE",
    "Occupant",
    "Seat",
    "Seating",
    "departures_of",
    "held",
    "micros",
    "seating",
    "seating_of",
]
