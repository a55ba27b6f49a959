"""The mutable state of one simulation run: free resources, placed and pending pods.

``arrays`` is a mutable :class:`~defrag.model.arrays.NodeArrays` whose rows match ``nodes``
(both sorted by node name). Every change goes through :meth:`SimState.place`,
:meth:`SimState.remove` and :meth:`SimState.apply_moves`, which keep ``arrays``, ``placed``
and ``rows`` consistent. Planners that want the immutable model call :meth:`to_cluster`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np

from defrag.model.arrays import NodeArrays
from defrag.model.cluster import Cluster
from defrag.model.resources import Node, Pod
from defrag.model.workload import WorkloadMix
from defrag.scoring.framework import Placement
from defrag.scoring.scheduler import schedule
from defrag.sim.moves import REQUEUE, Move

if TYPE_CHECKING:
    from defrag.scoring.framework import Policy
    from defrag.sim.migration import Job


class InvalidMove(ValueError):
    """A hook's move that names an unknown pod, the wrong source, or GPUs that do not fit."""


@dataclass(frozen=True, slots=True)
class Placed:
    """A pod running on ``row``, on GPU slots ``gpus``, since simulated time ``since``."""

    pod: Pod
    row: int
    gpus: tuple[int, ...]
    since: float = 0.0


@dataclass(slots=True)
class SimState:
    nodes: tuple[Node, ...]
    arrays: NodeArrays
    policy: Policy
    policy_name: str
    mix: WorkloadMix
    placed: dict[str, Placed] = field(default_factory=dict)
    """Running pods by pod id (``pod.key``)."""
    rows: list[dict[str, Placed]] = field(default_factory=list)
    """Running pods of each row, by pod id."""
    pending: dict[str, Pod] = field(default_factory=dict)
    """Pods waiting for room (timeline protocol), by pod id, in arrival order."""
    migrations: int = 0
    jobs: dict[str, Job] = field(default_factory=dict)
    """Timeline protocol: every pod's job (progress, checkpoints, waits), by pod id."""
    reserved: dict[int, tuple[str, float]] = field(default_factory=dict)
    """Timeline protocol: rows held for a pending pod (``defrag.io/reserved-for``): row →
    (pod id, simulated hour the hold expires)."""

    @classmethod
    def new(
        cls, nodes: Iterable[Node], policy: Policy, policy_name: str, mix: WorkloadMix
    ) -> SimState:
        ordered = tuple(sorted(nodes, key=lambda n: n.name))
        arrays = NodeArrays.from_nodes(ordered)
        return cls(ordered, arrays, policy, policy_name, mix, rows=[{} for _ in ordered])

    # --- changes -----------------------------------------------------------------------------

    def place(self, pod: Pod, row: int, gpus: Sequence[int], now: float = 0.0) -> Placed:
        key = pod.key
        if key in self.placed:
            raise ValueError(f"pod {key} is already placed")
        placed = Placed(pod, row, tuple(gpus), now)
        self.arrays.allocate(row, pod, placed.gpus)
        self.placed[key] = placed
        self.rows[row][key] = placed
        if self.pending:
            self.pending.pop(key, None)
        return placed

    def remove(self, pod_id: str) -> Placed:
        placed = self.placed.pop(pod_id)
        del self.rows[placed.row][pod_id]
        self.arrays.release(placed.row, placed.pod, placed.gpus)
        return placed

    def apply_moves(self, moves: Sequence[Move]) -> int:
        """Apply ``moves`` in order; all or nothing. Returns the number applied."""
        return len(self.apply_moves_detailed(moves))

    def apply_moves_detailed(self, moves: Sequence[Move]) -> list[tuple[Placed, Placed | None]]:
        """Apply ``moves`` in order, all or nothing: (before, after) per move, ``after`` None
        for an eviction to the queue (:data:`~defrag.sim.hooks.REQUEUE`; the caller queues
        the pod). Only moves with a new seat count as migrations: another node, or other GPUs
        of the same node (KAI moves a victim to another GPU of its node)."""
        done: list[tuple[Placed, Placed | None]] = []
        try:
            for move in moves:
                before = self._check(move)
                if move.target_row == REQUEUE:
                    done.append((self.remove(move.pod_id), None))
                else:
                    done.append((before, self._move(move)))
        except InvalidMove:
            for before, after in reversed(done):
                if after is not None:
                    self.remove(after.pod.key)
                self.place(before.pod, before.row, before.gpus, before.since)
            raise
        self.migrations += sum(after is not None for _, after in done)
        return done

    def release_expired(self, now: float) -> set[int]:
        """Drop the holds that timed out by ``now``; the rows they held."""
        gone = {row for row, (_, until) in self.reserved.items() if until <= now}
        for row in gone:
            del self.reserved[row]
        return gone

    def release_for(self, pod_id: str) -> set[int]:
        """Drop the holds kept for ``pod_id`` (it started, somewhere)."""
        gone = {row for row, (pid, _) in self.reserved.items() if pid == pod_id}
        for row in gone:
            del self.reserved[row]
        return gone

    def schedule(self, pod: Pod) -> Placement | None:
        """Where the scheduler puts ``pod`` now (rows held for other pods excluded), or None."""
        exclude = self.excluded_for(pod.key) if self.reserved else None
        result = schedule(pod, self.arrays, self.policy, exclude=exclude, why=False)
        return result if isinstance(result, Placement) else None

    def excluded_for(self, pod_id: str) -> np.ndarray | None:
        """Rows a pod may not use: those held for another pod (None: no hold anywhere)."""
        if not self.reserved:
            return None
        mask = np.zeros(len(self.nodes), dtype=bool)
        for row, (pid, _) in self.reserved.items():
            if pid != pod_id:
                mask[row] = True
        return mask

    def _check(self, move: Move) -> Placed:
        placed = self.placed.get(move.pod_id)
        if placed is None:
            raise InvalidMove(f"move of {move.pod_id}: no such running pod")
        if placed.row != move.source_row:
            raise InvalidMove(
                f"move of {move.pod_id}: it runs on row {placed.row}, not {move.source_row}"
            )
        if move.target_row == REQUEUE:
            return placed
        if not 0 <= move.target_row < len(self.nodes):
            raise InvalidMove(f"move of {move.pod_id}: bad target row {move.target_row}")
        if move.target_row == move.source_row and (
            not move.gpus or set(move.gpus) == set(placed.gpus)
        ):
            raise InvalidMove(
                f"move of {move.pod_id}: row {move.target_row} is its own, on the same GPUs"
            )
        return placed

    def _move(self, move: Move) -> Placed:
        before = self.remove(move.pod_id)
        pod, a, row = before.pod, self.arrays, move.target_row
        reason = _misfit(a, pod, row, move.gpus)
        if reason:
            self.place(pod, before.row, before.gpus, before.since)
            raise InvalidMove(f"move of {move.pod_id} to {self.nodes[row].name}: {reason}")
        return self.place(pod, row, move.gpus, before.since)

    # --- views -------------------------------------------------------------------------------

    def pods_on(self, row: int) -> tuple[Placed, ...]:
        return tuple(self.rows[row].values())

    def to_cluster(self, epoch: datetime | None = None) -> Cluster:
        """The immutable model of this state: running pods bound, pending pods pending. With
        ``epoch`` (simulated hour 0), each running pod carries its bind time: ``epoch`` + the
        hour it started on its node."""
        bound = [
            replace(
                p.pod,
                node=self.nodes[p.row].name,
                gpu_indices=p.gpus,
                phase="Running",
                scheduled_at=(
                    p.pod.scheduled_at if epoch is None else epoch + timedelta(hours=p.since)
                ),
            )
            for p in self.placed.values()
        ]
        waiting = [
            replace(p, node=None, gpu_indices=(), phase="Pending") for p in self.pending.values()
        ]
        return Cluster.build(self.nodes, [*bound, *waiting])

    def allocated_gpu_milli(self) -> int:
        a = self.arrays
        return int(a.gpu_total.sum()) * 1000 - int(a.free_share().sum())


def _misfit(a: NodeArrays, pod: Pod, row: int, gpus: tuple[int, ...]) -> str:
    """Why ``pod`` cannot take ``gpus`` on ``row`` (capacity only), or '' when it can."""
    if a.cpu_free[row] < pod.cpu_milli:
        return "not enough CPU"
    if a.mem_free[row] < pod.memory_mib:
        return "not enough memory"
    if pod.num_gpu == 0:
        return "" if not gpus else "GPU slots given to a pod that asks none"
    total = int(a.gpu_total[row])
    if len(gpus) != pod.num_gpu or len(set(gpus)) != len(gpus):
        return f"{len(gpus)} GPU slot(s) given, the pod asks {pod.num_gpu}"
    if any(not 0 <= g < total for g in gpus):
        return f"GPU slot out of range 0..{total - 1}"
    if any(a.gpu_free[row, g] < pod.gpu_milli for g in gpus):
        return "GPU slot(s) without enough free share"
    if not a.model_allowed(pod)[row]:
        return "GPU model not allowed"
    return ""
