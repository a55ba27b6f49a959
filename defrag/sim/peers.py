"""The defragmenters users run instead of defrag, as timeline hooks, from their own source.

* :class:`HighNodeUtilization` — kubernetes-sigs/descheduler's ``HighNodeUtilization``
  (``pkg/framework/plugins/nodeutilization/highnodeutilization.go``, ``nodeutilization.go``):
  nodes whose requested ``nvidia.com/gpu`` (and cpu, memory, pods: 100% when not set) are all
  at or below ``thresholds`` are *underutilized*; the others are the destinations. Nothing
  happens when no node is underutilized, when their number is ≤ ``numberOfNodes``, when every
  node is, or when none is a destination. The underutilized nodes are visited by ascending
  usage (the sum of the usage quantities: CPU in milli, memory in bytes, pods, GPUs — as
  ``sortNodesByUsage`` adds them); on each, the default evictor's removable pods are evicted
  lowest priority first (then QoS: BestEffort, Burstable, Guaranteed), while every resource
  of the destinations' pooled headroom (capacity − requests, summed) stays above zero; each
  eviction takes the pod's requests off the pool. Per-node, per-namespace and total limits
  (the policy's ``maxNoOfPodsToEvict*``) are honoured. Evicted pods go back to the scheduler
  (nothing is reserved), which the docs require to score ``MostAllocated``. It runs every
  ``--descheduling-interval`` (``kubernetes/deployment/deployment.yaml``: 5 min).
* :class:`LowNodeUtilization` — the same package's ``LowNodeUtilization``, the control: nodes
  below ``thresholds`` are the destinations, nodes above ``targetThresholds`` on any resource
  the sources (by descending usage); pods are evicted while the source stays above its target
  and the destinations' headroom up to *their* targets is positive. It spreads.
* :class:`KaiConsolidation` — NVIDIA/KAI-Scheduler's consolidation action
  (``pkg/scheduler/actions/consolidation/consolidation.go``,
  ``pkg/scheduler/actions/common/solvers/{job_solver,pod_scenario_builder,by_pod_solver}.go``):
  in every scheduling session, for each pending *preemptible* job in queue order (jobs not
  easier than one that already failed are skipped), if the cluster has enough idle GPUs in
  all, victims are taken one job at a time from the running preemptible jobs (lowest priority
  first, at most ``maxNumberConsolidationPreemptees`` = 16); for each accumulated scenario the
  victims on the latest victim's node are evicted in simulation, the pending job is placed,
  and then every victim must be placed again (``allPodsReallocated``) — else the scenario is
  dropped. The first feasible scenario is committed: the victims move (pipelined to their new
  nodes) and the pending job is bound to the node they left. No PDB is consulted. The
  scheduler places with KAI's GPU binpack (:class:`KaiBinpack`,
  ``pkg/scheduler/plugins/nodeplacement/pack.go``).

The simulator's pods carry no owner, PDB, local storage or mirror annotation; they are read
as controller-owned (as by the defrag hook), so the default evictor's rules only exclude
DaemonSet pods, mirror pods and system-critical priorities here. KAI's preemptibility comes
from its default priority classes (``train`` 50 is preemptible, ``build`` 100 and
``inference`` 125 are not): training and batch pods read as ``train``, serving (``LS`` with at
most one GPU) and CPU-only pods as non-preemptible (:func:`kai_preemptible`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from defrag.model.arrays import BoolArray, FloatArray, NodeArrays
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.scoring.framework import Placement
from defrag.scoring.policies.base import BestFitGpuChoice
from defrag.scoring.scheduler import schedule
from defrag.sim.hooks import REQUEUE, Move
from defrag.sim.migration import kind_of
from defrag.sim.state import Placed, SimState

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
"""``utils.SystemCriticalPriority``: the default evictor never evicts at or above it."""
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
MAX_PODS = 110
"""The kubelet's default ``maxPods`` (the ``pods`` resource of a node)."""
QOS_TIER = {"BE": 0, "Burstable": 1, "Guaranteed": 2, "LS": 2}
"""The trace's QoS as Kubernetes QoS tiers (BestEffort < Burstable < Guaranteed)."""
RESOURCES = ("gpu", "cpu", "memory", "pods")


def default_evictor(pod: Pod) -> bool:
    """Whether descheduler's DefaultEvictor would let ``pod`` go (``defaultevictor.go``)."""
    if pod.is_daemonset or MIRROR_ANNOTATION in pod.annotations:
        return False
    return not (
        pod.priority >= SYSTEM_CRITICAL_PRIORITY or pod.priority_class.startswith("system-")
    )


def eviction_order(pods: Sequence[Pod]) -> list[Pod]:
    """``SortPodsBasedOnPriorityLowToHigh``: priority, then QoS tier, low first."""
    return sorted(pods, key=lambda p: (p.priority, QOS_TIER.get(p.qos, 2), p.key))


def usage(arrays: NodeArrays, pods_on: Callable[[int], int]) -> dict[str, np.ndarray]:
    """Requested resources per row (GPU in GPUs, CPU milli, memory MiB, pod count)."""
    n = len(arrays)
    return {
        "gpu": (arrays.gpu_total * GPU_MILLI - arrays.free_share()) / GPU_MILLI,
        "cpu": (arrays.cpu_total - arrays.cpu_free).astype(float),
        "memory": (arrays.mem_total - arrays.mem_free).astype(float),
        "pods": np.array([pods_on(r) for r in range(n)], dtype=float),
    }


def capacity(arrays: NodeArrays) -> dict[str, np.ndarray]:
    return {
        "gpu": arrays.gpu_total.astype(float),
        "cpu": arrays.cpu_total.astype(float),
        "memory": arrays.mem_total.astype(float),
        "pods": np.full(len(arrays), float(MAX_PODS)),
    }


def percent(used: dict[str, np.ndarray], cap: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.where(cap[k] > 0, 100.0 * used[k] / np.maximum(cap[k], 1e-9), 0.0) for k in used}


def pod_request(pod: Pod) -> dict[str, float]:
    return {
        "gpu": pod.gpu_demand_milli / GPU_MILLI,
        "cpu": float(pod.cpu_milli),
        "memory": float(pod.memory_mib),
        "pods": 1.0,
    }


def usage_sum(used: dict[str, np.ndarray], row: int) -> float:
    """``sortNodesByUsage``: CPU in milli, memory in bytes, the rest in units, added up."""
    return (
        used["cpu"][row] + used["memory"][row] * 1024 * 1024 + used["pods"][row] + used["gpu"][row]
    )


def thresholds_of(given: dict[str, float]) -> dict[str, float]:
    """cpu, memory, pods default to 100% when not set; GPU counts only when set."""
    out = {"cpu": 100.0, "memory": 100.0, "pods": 100.0}
    out.update(given)
    return out


@dataclass(frozen=True, slots=True)
class Limits:
    """``maxNoOfPodsToEvictPerNode``, ``…PerNamespace``, ``…Total`` (None: no limit)."""

    per_node: int | None = None
    per_namespace: int | None = None
    total: int | None = None


class _Descheduler:
    """Shared by both nodeutilization plugins: the eviction loop of ``evictPodsFromSourceNodes``."""

    name = "descheduler"

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        return ()

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        return ()

    def _evict(
        self,
        state: SimState,
        sources: list[int],
        available: dict[str, float],
        keep_going: Callable[[int, dict[str, float], dict[str, np.ndarray]], bool],
        used: dict[str, np.ndarray],
    ) -> list[Move]:
        moves: list[Move] = []
        by_ns: dict[str, int] = {}
        lim = self.limits
        for row in sources:
            removable = eviction_order(
                [p.pod for p in state.rows[row].values() if default_evictor(p.pod)]
            )
            if not removable or not keep_going(row, available, used):
                continue
            on_node = 0
            for pod in removable:
                if lim.per_node is not None and on_node >= lim.per_node:
                    break
                if lim.total is not None and len(moves) >= lim.total:
                    return moves
                if (
                    lim.per_namespace is not None
                    and by_ns.get(pod.namespace, 0) >= lim.per_namespace
                ):
                    continue
                placed: Placed = state.rows[row][pod.key]
                moves.append(Move(pod.key, placed.row, REQUEUE, ()))
                on_node += 1
                by_ns[pod.namespace] = by_ns.get(pod.namespace, 0) + 1
                for k, v in pod_request(pod).items():
                    available[k] -= v
                    used[k][row] -= v
                if not keep_going(row, available, used):
                    break
        return moves


class HighNodeUtilization(_Descheduler):
    name = "descheduler-hnu"

    def __init__(
        self, thresholds: dict[str, float] | None = None, number_of_nodes: int = 0,
        limits: Limits = Limits(),
    ) -> None:  # fmt: skip
        super().__init__(limits)
        self.thresholds = thresholds_of(thresholds if thresholds is not None else {"gpu": 50.0})
        self.number_of_nodes = number_of_nodes

    def classify(self, state: SimState) -> tuple[list[int], list[int], dict[str, np.ndarray]]:
        """(underutilized rows by ascending usage, destination rows, usage)."""
        a = state.arrays
        used = usage(a, lambda r: len(state.rows[r]))
        pct = percent(used, capacity(a))
        low = np.ones(len(a), dtype=bool)
        for k, t in self.thresholds.items():
            low &= pct[k] <= t
        rows = np.arange(len(a))
        low_rows = [int(r) for r in rows[low]]
        dest = [int(r) for r in rows[~low & a.schedulable]]
        low_rows.sort(key=lambda r: (usage_sum(used, r), state.nodes[r].name))
        return low_rows, dest, used

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        low, dest, used = self.classify(state)
        n = len(state.nodes)
        if not low or len(low) <= self.number_of_nodes or len(low) == n or not dest:
            return ()
        cap = capacity(state.arrays)
        available = {k: float((cap[k][dest] - used[k][dest]).sum()) for k in RESOURCES}

        def keep_going(row: int, avail: dict[str, float], _: dict[str, np.ndarray]) -> bool:
            return all(v > 0 for v in avail.values())

        return self._evict(state, low, available, keep_going, used)


class LowNodeUtilization(_Descheduler):
    name = "descheduler-lnu"

    def __init__(
        self, thresholds: dict[str, float] | None = None,
        target_thresholds: dict[str, float] | None = None, number_of_nodes: int = 0,
        limits: Limits = Limits(),
    ) -> None:  # fmt: skip
        super().__init__(limits)
        self.thresholds = thresholds_of(thresholds if thresholds is not None else {"gpu": 20.0})
        self.targets = thresholds_of(
            target_thresholds if target_thresholds is not None else {"gpu": 50.0}
        )
        self.number_of_nodes = number_of_nodes

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        a = state.arrays
        used = usage(a, lambda r: len(state.rows[r]))
        cap = capacity(a)
        pct = percent(used, cap)
        low = a.schedulable.copy()
        high = np.zeros(len(a), dtype=bool)
        for k in self.thresholds:
            low &= pct[k] <= self.thresholds[k]
            high |= pct[k] > self.targets[k]
        high &= ~low
        n = len(a)
        low_rows = [int(r) for r in np.flatnonzero(low)]
        high_rows = [int(r) for r in np.flatnonzero(high)]
        if not low_rows or len(low_rows) <= self.number_of_nodes or len(low_rows) == n:
            return ()
        if not high_rows:
            return ()
        # destinations' headroom up to their target thresholds
        available = {
            k: float((cap[k][low_rows] * self.targets[k] / 100.0 - used[k][low_rows]).sum())
            for k in RESOURCES
        }
        high_rows.sort(key=lambda r: (-usage_sum(used, r), state.nodes[r].name))
        targets = self.targets

        def keep_going(row: int, avail: dict[str, float], u: dict[str, np.ndarray]) -> bool:
            above = any(u[k][row] > cap[k][row] * targets[k] / 100.0 for k in RESOURCES)
            return above and all(v > 0 for v in avail.values())

        return self._evict(state, high_rows, available, keep_going, used)


# --- KAI-Scheduler ---------------------------------------------------------------------------


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


def kai_preemptible(pod: Pod) -> bool:
    """Training and batch pods read as KAI's ``train`` class (preemptible); serving and
    CPU-only pods as ``inference``/``build`` (not preemptible)."""
    return kind_of(pod) in ("training", "batch")


class KaiConsolidation:
    name = "kai-consolidation"

    def __init__(self, max_preemptees: int = 16, max_jobs: int = 64) -> None:
        self.max_preemptees = max_preemptees
        self.max_jobs = max_jobs

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        return ()

    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        return self.session(state, [pod])

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        order = sorted(
            state.pending.values(), key=lambda p: (-p.priority, _queued(state, p), p.key)
        )
        return self.session(state, order)

    def session(self, state: SimState, pending: Sequence[Pod]) -> list[Move]:
        """One scheduling session's consolidation over ``pending`` (in queue order), on a
        copy of the cluster: each committed scenario is seen by the jobs after it."""
        view = _View(state)
        moves: list[Move] = []
        failed: list[Pod] = []
        tried = 0
        for pod in pending:
            if tried >= self.max_jobs:
                break
            if not kai_preemptible(pod) or pod.num_gpu == 0:
                continue
            if any(_not_easier(pod, f) for f in failed):
                continue  # scheduling signatures: no easier than a job that already failed
            tried += 1
            found = self.consolidate(view, pod)
            if found is None:
                failed.append(pod)
            else:
                moves.extend(found)
        return moves

    def consolidate(self, view: _View, pod: Pod) -> list[Move] | None:
        """The first feasible scenario's moves (victims to their new nodes), or None; on
        success ``view`` holds the result (the pending pod bound where the room is)."""
        a = view.arrays
        if pod.gpu_milli < GPU_MILLI:
            if float(a.free_share().sum()) < pod.gpu_demand_milli:
                return None
        elif int(a.free_whole_count().sum()) < pod.num_gpu:
            return None  # IsEnoughGPUsAllocatableForJob
        victims = view.victims(pod, self.max_preemptees + 1)
        for k in range(1, len(victims) + 1):
            node = victims[k - 1][1]
            here = [v for v in victims[:k] if v[1] == node]
            moves = view.simulate(pod, node, here)
            if moves is not None:
                return moves
        return None


Seat = tuple[Pod, int, tuple[int, ...], float]
"""A running pod in a session's view: pod, row, GPU slots, since."""


class _View:
    """A session's copy of the cluster: free resources and where each pod runs."""

    def __init__(self, state: SimState) -> None:
        self.arrays = state.arrays.copy()
        self.policy = state.policy
        self.seats: dict[str, Seat] = {
            k: (p.pod, p.row, p.gpus, p.since) for k, p in state.placed.items()
        }

    def victims(self, pod: Pod, limit: int) -> list[Seat]:
        """Running preemptible pods, lowest priority first, newest first (KAI's victim
        queue), at most ``limit`` (``maxNumberConsolidationPreemptees`` + 1 are tested)."""
        cands = [s for k, s in self.seats.items() if kai_preemptible(s[0]) and k != pod.key]
        cands.sort(key=lambda s: (s[0].priority, -s[3], s[0].key))
        return cands[:limit]

    def simulate(self, pod: Pod, node: int, evicted: list[Seat]) -> list[Move] | None:
        """Evict ``evicted``, place ``pod``, then every victim elsewhere; all or nothing."""
        a = self.arrays
        for v, row, gpus, _ in evicted:
            a.release(row, v, gpus)
        done: list[tuple[Pod, int, tuple[int, ...]]] = []
        moves: list[Move] = []
        spot = schedule(pod, a, self.policy)
        feasible = isinstance(spot, Placement)
        if isinstance(spot, Placement):
            a.allocate(spot.row, pod, spot.gpus)
            done.append((pod, spot.row, spot.gpus))
            for v, row, _, _ in evicted:
                again = schedule(v, a, self.policy)
                if not isinstance(again, Placement) or again.row == row:
                    feasible = False  # allPodsReallocated fails (or no consolidation at all)
                    break
                a.allocate(again.row, v, again.gpus)
                done.append((v, again.row, again.gpus))
                hold = pod.key if spot.row == row else None
                moves.append(Move(v.key, row, again.row, again.gpus, hold))
        if feasible:
            for v, _, _, since in evicted:
                new = next(m for m in moves if m.pod_id == v.key)
                self.seats[v.key] = (v, new.target_row, new.gpus, since)
            return moves
        for p, row, gpus in reversed(done):
            a.release(row, p, gpus)
        for v, row, gpus, _ in evicted:
            a.allocate(row, v, gpus)
        return None


def _not_easier(pod: Pod, failed: Pod) -> bool:
    return (
        pod.num_gpu >= failed.num_gpu
        and pod.gpu_milli >= failed.gpu_milli
        and pod.cpu_milli >= failed.cpu_milli
        and pod.gpu_models == failed.gpu_models
    )


def _queued(state: SimState, pod: Pod) -> float:
    job = state.jobs.get(pod.key)
    return job.queued_at if job is not None and job.queued_at is not None else 0.0


PEERS = ("descheduler-hnu", "descheduler-lnu", "kai-consolidation")
