"""NVIDIA/KAI-Scheduler's consolidation action as a timeline hook, from its source.

Paths are in NVIDIA/KAI-Scheduler (commit 72de64f); line numbers are that commit's.

In every scheduling session (:meth:`KaiConsolidation.session`), ``consolidation.go``
``Execute`` 32-78 takes the pending *preemptible* jobs in job order (priority, high first;
then creation, old first); no queue-depth cap applies (``session.go`` ``GetJobsDepth``: none
is configured for consolidation by default). A job no easier than one that already failed is
skipped (scheduling signatures, on by default: ``cmd/scheduler/app/options/options.go`` 120).
For each job:

* ``IsEnoughGPUsAllocatableForJob`` (``actions/utils/action.go`` 131-160): the idle GPUs of
  the cluster — whole idle GPUs plus the free part of shared GPUs (``node_info.go``
  ``GetSumOfIdleGPUs`` 592-609) — must cover the job's request (a fraction for a shared pod).
* The victims (``buildConsolidationVictimsQueue`` 129-157, ``GetVictimsQueue``
  ``actions/utils/action.go`` 18-45): running preemptible jobs other than the job, in reverse
  job order (lowest priority first, newest first), at most
  ``maxNumberConsolidationPreemptees`` + 1 (default 16: ``options.go`` 114). Upstream picks
  them while iterating a Go map, so *which* 17 is arbitrary; here the first 17 in victim order.
* The scenarios (``pod_scenario_builder.go``, ``by_pod_solver.go`` 63-143): victims accumulate
  one job at a time; for each scenario the accumulated victims on the latest victim's node
  are evicted in simulation, then the job and those victims are allocated again in job order
  (``common/action.go`` ``TryToVirtuallyAllocatePreemptorAndGetVictims`` 74-122) on the
  nodes the job may use plus the victims' nodes — a victim may land on its own node again,
  on other GPUs or the same. The job must be placed, and every victim too
  (``allPodsReallocated`` 118-127); the first such scenario is committed: the victims move
  (pipelined; a victim placed on its old GPUs does not move) and the job is bound where it
  was placed, which the timeline holds for it.

Preemptibility is the job's priority against 100 (``pkg/common/podgroup/preemptible.go``
10-26), the priority its PriorityClass's value (``cluster_info.go`` ``getPodGroupPriority``
531-542): KAI's classes ``train`` 50, ``interactive-preemptible`` 75, ``build`` 100,
``inference`` 125 (``pkg/scheduler/constants/priorities.go``). A pod with no class gets the
one KAI's pod-grouper gives its owner's kind: ``inference`` for a Deployment
(``podgrouper/plugins/deployment/deployment_grouper.go`` 48), ``train`` otherwise
(``defaultgrouper/default_grouper.go`` 66). The simulator's trace pods have no owner: the
timeline's hook reads serving pods as Deployment pods and the rest as Job pods
(:func:`sim_owner_kind`). The scheduler places with KAI's GPU binpack (:class:`KaiBinpack`,
``pkg/scheduler/plugins/nodeplacement/pack.go``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.scoring.framework import Placement, Policy
from defrag.scoring.policies.base import BestFitGpuChoice
from defrag.scoring.scheduler import schedule
from defrag.sim.hooks import Move
from defrag.sim.migration import kind_of
from defrag.sim.state import SimState

KAI_PRIORITY_CLASSES = {"train": 50, "interactive-preemptible": 75, "build": 100, "inference": 125}
NON_PREEMPTIBLE_FROM = 100
"""``preemptible.go`` 10: a job of this priority or more is not preemptible."""
MAX_CONSOLIDATION_PREEMPTEES = 16
DEPLOYMENT_KINDS = ("Deployment", "ReplicaSet")


class KaiBinpack(BestFitGpuChoice):
    """KAI's ``nodeResourcePack`` (``pack.go``): among the nodes that fit, the fewer GPUs a
    node has left unallocated the higher it scores: 100 × (1 − (free − min) / (max − min)),
    min/max over the fitting nodes; all equal → 100. CPU-only pods pack on CPU the same way."""

    name = "kai-binpack"

    def score(self, pod: Pod, arrays: NodeArrays, feasible: BoolArray) -> FloatArray:
        if pod.num_gpu:
            free = arrays.free_share().astype(float) / GPU_MILLI
            has = arrays.gpu_total > 0
        else:
            free = arrays.cpu_free.astype(float)
            has = arrays.cpu_total > 0
        ok = feasible & has
        out = np.zeros(len(arrays))
        if not ok.any():
            return out
        lo, hi = float(free[ok].min()), float(free[ok].max())
        if hi == 0:
            return out
        if hi == lo:
            out[ok] = 100.0
            return out
        out[ok] = 100.0 * (1.0 - (free[ok] - lo) / (hi - lo))
        return out


def kai_priority(pod: Pod, owner_kind: str | None = None) -> int:
    """The job's priority: its KAI class's, its own PriorityClass's value, or the class the
    pod-grouper gives its owner's kind (``owner_kind`` overrides the pod's owner)."""
    if pod.priority_class in KAI_PRIORITY_CLASSES:
        return KAI_PRIORITY_CLASSES[pod.priority_class]
    if pod.priority_class:
        return pod.priority
    kind = owner_kind if owner_kind is not None else (pod.owner.kind if pod.owner else "")
    return KAI_PRIORITY_CLASSES["inference" if kind in DEPLOYMENT_KINDS else "train"]


def sim_owner_kind(pod: Pod) -> str:
    """The simulator's reading of a trace pod's owner: serving pods run under Deployments,
    the rest (training, batch, CPU) under Jobs."""
    return "Deployment" if kind_of(pod) == "serving" else "Job"


def sim_priority(pod: Pod) -> int:
    """:func:`kai_priority` of a trace pod (owner from :func:`sim_owner_kind` when none)."""
    return kai_priority(pod, None if pod.owner is not None else sim_owner_kind(pod))


def preemptible(priority: int) -> bool:
    return priority < NON_PREEMPTIBLE_FROM


Seat = tuple[Pod, int, tuple[int, ...]]
"""A pod in a session's view: pod, row, GPU slots."""


@dataclass(frozen=True, slots=True)
class Consolidation:
    """A session's outcome: the victims' moves, in an order the timeline can apply, and the
    row each consolidated job was bound to (pipelined) in the session, by pod id."""

    moves: tuple[Move, ...]
    bound: dict[str, int]


@dataclass
class KaiConsolidation:
    max_preemptees: int = MAX_CONSOLIDATION_PREEMPTEES
    priority_of: Callable[[Pod], int] = kai_priority
    _order_cache: dict[str, tuple[int, float, str]] = field(default_factory=dict, repr=False)
    """Each pod's job-order key, by pod id (a hook serves one run)."""

    name = "kai-consolidation"

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        return ()

    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        return self.session(state, [pod])

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        return self.session(state, list(state.pending.values()))

    def created(self, state: SimState, pod: Pod) -> float:
        job = state.jobs.get(pod.key)
        return job.arrived if job is not None else 0.0

    def job_order(self, state: SimState) -> Callable[[Pod], tuple[int, float, str]]:
        """Job order (``session_plugins.go`` ``JobOrderFn`` 227-242: priority high first, then
        creation, then UID); each pod's priority and creation are read once per run."""
        cache = self._order_cache

        def key(p: Pod) -> tuple[int, float, str]:
            got = cache.get(p.key)
            if got is None:
                got = cache[p.key] = (-self.priority_of(p), self.created(state, p), p.key)
            return got

        return key

    def session(self, state: SimState, pending: Sequence[Pod]) -> list[Move]:
        """One scheduling session's consolidation over ``pending``: the victims' moves."""
        return list(self.plan(state, pending).moves)

    def plan(self, state: SimState, pending: Sequence[Pod]) -> Consolidation:
        """One scheduling session's consolidation over ``pending``, on a copy of the cluster:
        each committed scenario is seen by the jobs after it."""
        if self.max_preemptees == 0:
            return Consolidation((), {})  # consolidation disabled (consolidation.go 36-39)
        order = self.job_order(state)
        view: _View | None = None
        moves: list[Move] = []
        bound: dict[str, int] = {}
        failed: list[Pod] = []
        idle = float(state.arrays.free_share().sum())  # milli-GPUs; a bound job takes its part
        for pod in sorted(pending, key=order):
            if order(pod)[0] <= -NON_PREEMPTIBLE_FROM:
                continue  # not preemptible
            if any(_not_easier(pod, f) for f in failed):
                continue
            if idle < pod.gpu_demand_milli:
                failed.append(pod)  # IsEnoughGPUsAllocatableForJob
                continue
            if view is None:
                view = _View(state, order, self.max_preemptees + 1)
            found = self.consolidate(view, pod)
            if found is None:
                failed.append(pod)
            else:
                moves.extend(found)
                bound[pod.key] = view.seat(pod.key)[1]
                idle -= pod.gpu_demand_milli
        return Consolidation(tuple(moves), bound)

    def consolidate(self, view: _View, pod: Pod) -> list[Move] | None:
        """The first feasible scenario's moves, or None; on success ``view`` holds the result."""
        victims = [view.seat(k) for k in view.candidates if k != pod.key]
        for k in range(1, len(victims) + 1):
            node = victims[k - 1][1]
            here = [v for v in victims[:k] if v[1] == node]
            moves = view.simulate(pod, here)
            if moves is not None:
                return moves
        return None


class _View:
    """A session's copy of the cluster: free resources, and where the pods it moved sit."""

    def __init__(
        self, state: SimState, order: Callable[[Pod], tuple[int, float, str]], limit: int
    ) -> None:
        self.arrays = state.arrays.copy()
        self.policy: Policy = state.policy
        self.order = order
        self.state = state
        self.moved: dict[str, Seat] = {}
        # the victims queue: running preemptible pods in reverse job order, the first `limit`
        # (moving a victim does not change its place in the order)
        running = (p.pod for p in state.placed.values())
        self.candidates = [
            p.key
            for p in heapq.nlargest(
                limit, (p for p in running if preemptible(-order(p)[0])), key=order
            )
        ]

    def seat(self, key: str) -> Seat:
        got = self.moved.get(key)
        if got is not None:
            return got
        p = self.state.placed[key]
        return (p.pod, p.row, p.gpus)

    def simulate(self, pod: Pod, evicted: list[Seat]) -> list[Move] | None:
        """Evict ``evicted``; allocate ``pod`` and the victims in job order; all or nothing."""
        a = self.arrays
        for v, row, gpus in evicted:
            a.release(row, v, gpus)
        allowed = a.model_allowed(pod).copy()
        for _, row, _ in evicted:
            allowed[row] = True
        exclude = ~allowed
        done: list[Seat] = []
        ok = True
        for p in sorted([pod, *(v for v, _, _ in evicted)], key=self.order):
            spot = schedule(p, a, self.policy, exclude=exclude)
            if not isinstance(spot, Placement):
                ok = False  # the job fits nowhere, or a victim is releasing (allPodsReallocated)
                break
            a.allocate(spot.row, p, spot.gpus)
            done.append((p, spot.row, spot.gpus))
        if not ok:
            self._undo(done, evicted)
            return None
        done = self._keep_whole_seats(done, evicted)
        seat = {p.key: (row, gpus) for p, row, gpus in done}
        job_row = seat[pod.key][0]
        moves: list[Move] = []
        for v, row, gpus in evicted:
            new_row, new_gpus = seat[v.key]
            if new_row == row and set(new_gpus) == set(gpus):
                continue  # re-placed where it ran: nothing moves
            hold = pod.key if job_row == row else None
            moves.append(Move(v.key, row, new_row, new_gpus, hold))
        before = a.copy()
        for p, row, gpus in reversed(done):
            before.release(row, p, gpus)
        for v, row, gpus in evicted:
            before.allocate(row, v, gpus)
        ordered = order_moves(moves, before, {v.key: (v, gpus) for v, _, gpus in evicted})
        if ordered is None:  # victims trading places: the simulator applies moves one by one
            self._undo(done, evicted)
            return None
        for p, row, gpus in done:
            self.moved[p.key] = (p, row, gpus)
        return ordered

    def _keep_whole_seats(self, done: list[Seat], evicted: list[Seat]) -> list[Seat]:
        """``done`` with each whole-GPU victim that was allocated to its own node on its own
        GPUs again. KAI counts whole GPUs per node and does not track which, so such a victim
        stays Running (consolidation_test.go 626-715): it trades slots with the whole-GPU
        pods that took them, or takes them back where they are free."""
        a = self.arrays
        slots = {p.key: list(gpus) for p, _, gpus in done}
        rows = {p.key: row for p, row, _ in done}
        whole = {p.key for p, _, _ in done if p.gpu_milli >= GPU_MILLI}
        for v, row, old in evicted:
            new = slots[v.key]
            if v.num_gpu == 0 or v.key not in whole or rows[v.key] != row:
                continue
            want = [g for g in old if g not in new]
            spare = [g for g in new if g not in old]
            for g, s in zip(want, spare, strict=True):
                holder = next(
                    (k for k, gs in slots.items() if k != v.key and rows[k] == row and g in gs),
                    None,
                )
                if holder is None and a.gpu_free[row, g] >= GPU_MILLI:
                    a.gpu_free[row, g] -= GPU_MILLI  # a free slot: take it back
                    a.gpu_free[row, s] += GPU_MILLI
                elif holder in whole:
                    slots[holder][slots[holder].index(g)] = s  # trade whole GPUs
                else:
                    continue  # a share of it is taken: keep the new slot
                new[new.index(s)] = g
        return [(p, row, tuple(slots[p.key])) for p, row, _ in done]

    def _undo(self, done: list[Seat], evicted: list[Seat]) -> None:
        for p, row, gpus in reversed(done):
            self.arrays.release(row, p, gpus)
        for v, row, gpus in evicted:
            self.arrays.allocate(row, v, gpus)


def order_moves(
    moves: list[Move], arrays: NodeArrays, seats: dict[str, tuple[Pod, tuple[int, ...]]]
) -> list[Move] | None:
    """``moves`` in an order the timeline can apply one at a time (each fits when its turn
    comes, from ``arrays`` as they were before the moves; ``seats``: each mover's pod and
    GPUs before); None when no order does (victims trading places)."""
    left = list(moves)
    out: list[Move] = []
    while left:
        for m in left:
            pod, gpus = seats[m.pod_id]
            arrays.release(m.source_row, pod, gpus)
            if _fits(arrays, pod, m.target_row, m.gpus):
                arrays.allocate(m.target_row, pod, m.gpus)
                out.append(m)
                left.remove(m)
                break
            arrays.allocate(m.source_row, pod, gpus)
        else:
            return None
    return out


def _fits(a: NodeArrays, pod: Pod, row: int, gpus: tuple[int, ...]) -> bool:
    return (
        a.cpu_free[row] >= pod.cpu_milli
        and a.mem_free[row] >= pod.memory_mib
        and all(a.gpu_free[row, g] >= pod.gpu_milli for g in gpus)
    )


def _not_easier(pod: Pod, failed: Pod) -> bool:
    return (
        pod.num_gpu >= failed.num_gpu
        and pod.gpu_milli >= failed.gpu_milli
        and pod.cpu_milli >= failed.cpu_milli
        and pod.gpu_models == failed.gpu_models
    )


__all__ = [
    "KAI_PRIORITY_CLASSES",
    "Consolidation",
    "KaiBinpack",
    "KaiConsolidation",
    "kai_priority",
    "preemptible",
    "sim_owner_kind",
    "sim_priority",
]
