"""kubernetes-sigs/descheduler's nodeutilization plugins as timeline hooks, from its source.

Paths are in kubernetes-sigs/descheduler (commit 7d2b28b); line numbers are that commit's.

* :class:`DefaultEvictor` — ``pkg/framework/plugins/defaultevictor/defaultevictor.go``:
  ``Filter`` (466-502: the evict annotation lets any pod go; mirror, static and terminating
  pods stay; then the protections of ``legacyGetPodProtections`` 404-429: DaemonSet pods,
  system-critical priority, pods with no owner (``applyFailedBarePodsProtection`` 226-245),
  local storage — the model has none) and ``PreEvictionFilter`` with ``nodeFit`` (436-448:
  the pod must fit some *other* node, ``pkg/descheduler/node/node.go`` ``NodeFit`` 134-171:
  schedulable, node selector and affinity, NoSchedule/NoExecute taints tolerated, requests
  within allocatable and a pod slot free).
* :class:`HighNodeUtilization` — ``highnodeutilization.go`` ``Balance`` 115-231: nodes whose
  usage is at or below ``thresholds`` on every thresholded resource are underutilized (even
  cordoned ones), the schedulable rest are the destinations; nothing happens when no node is
  underutilized, when their number is ≤ ``numberOfNodes``, when every node is, or when no
  destination is left. Usage is requests: cpu, memory and pods always (``resourceNames``
  87-94), an extended resource (``nvidia.com/gpu`` here) only when thresholded (README:
  "will not be used to compute node's usage if it's not specified"). ``pods`` capacity is the
  node's allocatable pods (:attr:`~defrag.model.resources.Node.max_pods`).
  ``OnlyThresholdingResources`` (71-77) keeps only pods that request a thresholded resource.
* :class:`LowNodeUtilization` — ``lownodeutilization.go`` ``Balance`` 150-338: schedulable
  nodes at or below ``thresholds`` are underutilized (destinations), nodes above
  ``targetThresholds`` on any resource are the sources, by descending usage; thresholds and
  targets must name the same resources (``validation.go`` 79-100). ``useDeviationThresholds``
  (``assessNodesUsagesAndRelativeThresholds``, ``nodeutilization.go`` 491-535) sets each
  threshold relative to the mean usage.
* The eviction loop both share — ``nodeutilization.go`` ``evictPodsFromSourceNodes`` 166-245
  and ``evictPods`` 250-356: the destinations' pooled headroom (capacity capped at the high
  threshold, less usage, summed, 703-755); per source node, removable pods lowest priority
  first, then QoS (``SortPodsBasedOnPriorityLowToHigh``, ``pkg/descheduler/pod/pods.go``
  249-286); a pod that tolerates no destination's taints is skipped (285-291,
  ``PodToleratesTaints``, ``pkg/utils/pod.go`` 149-175); a namespace in
  ``evictableNamespaces.exclude`` is skipped (295-307); each eviction takes the pod's
  requests off the pool and the node; the loop stops when any pooled resource is ≤ 0 (or, for
  LNU, when the source is no longer above its target).

The simulator's trace pods carry no owner: the timeline re-creates every evicted pod, which
only a controller does, so the timeline's hooks read them as controller-owned
(``DefaultEvictor(bare_pods_owned=True)``, as the defrag hook does with ``enforce=False``);
that is the simulator's reading, not an upstream argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from defrag.model.resources import Pod, Taint
from defrag.model.status import Status
from defrag.model.units import GPU_MILLI
from defrag.scoring.filters import R_TOPOLOGY, filter_masks
from defrag.sim.hooks import REQUEUE, Move
from defrag.sim.state import SimState

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
"""``utils.SystemCriticalPriority``: the default evictor never evicts at or above it."""
SYSTEM_CRITICAL_CLASSES = ("system-cluster-critical", "system-node-critical")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
EVICT_ANNOTATION = "descheduler.alpha.kubernetes.io/evict"
"""``defaultevictor.go`` 42: a pod with it is evictable whatever the other checks say."""
ONLY_THRESHOLDING_RESOURCES = "OnlyThresholdingResources"
QOS_TIER = {"BE": 0, "BestEffort": 0, "Burstable": 1, "Guaranteed": 2, "LS": 2}
"""The trace's QoS as Kubernetes QoS tiers (BestEffort < Burstable < Guaranteed)."""
RESOURCES = ("cpu", "memory", "pods", "gpu")
"""The resources the plugins count; ``gpu`` is ``nvidia.com/gpu``."""
ALIASES = {"nvidia.com/gpu": "gpu"}


class ConfigError(ValueError):
    """A plugin argument upstream's validation refuses; the message says which."""


# --- the default evictor -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DefaultEvictor:
    """``DefaultEvictorArgs`` with its defaults (every protection on, ``nodeFit`` off)."""

    node_fit: bool = False
    evict_system_critical_pods: bool = False
    evict_daemonset_pods: bool = False
    evict_failed_bare_pods: bool = False
    bare_pods_owned: bool = False
    """The simulator's reading of owner-less trace pods as controller-owned (module doc)."""

    def filter(self, pod: Pod) -> Status:
        """``Filter``: whether the pod may be considered at all, with the reasons it may not."""
        if EVICT_ANNOTATION in pod.annotations:
            return Status.success()
        reasons: list[str] = []
        if MIRROR_ANNOTATION in pod.annotations:
            reasons.append("pod is a mirror pod")
        if pod.owner is not None and pod.owner.kind == "Node":
            reasons.append("pod is a static pod")
        if pod.deleting_since is not None:
            reasons.append("pod is terminating")
        if not self.evict_daemonset_pods and pod.is_daemonset:
            reasons.append("daemonset pods are protected against eviction")
        if not self.evict_system_critical_pods and (
            pod.priority >= SYSTEM_CRITICAL_PRIORITY
            or pod.priority_class in SYSTEM_CRITICAL_CLASSES
        ):
            reasons.append("pod has system critical priority and is protected against eviction")
        if pod.owner is None and not self.bare_pods_owned:
            if not self.evict_failed_bare_pods:
                reasons.append("pod does not have any ownerRefs")
            elif pod.phase != "Failed":
                reasons.append("pod does not have any ownerRefs and is not in failed phase")
        return Status.fail(*reasons) if reasons else Status.success()

    def pre_eviction(self, pod: Pod, state: SimState, row: int) -> Status:
        """``PreEvictionFilter``: with ``nodeFit``, the pod must fit another node."""
        if not self.node_fit or fits_other_node(pod, state, row):
            return Status.success()
        return Status.fail("pod does not fit on any other node")


def fits_other_node(pod: Pod, state: SimState, row: int) -> bool:
    """``PodFitsAnyOtherNode``: ``NodeFit`` on every node but ``row`` (NVLink topology,
    which NodeFit does not know, is not asked)."""
    ok = np.ones(len(state.nodes), dtype=bool)
    for reason, mask in filter_masks(pod, state.arrays):
        if reason != R_TOPOLOGY:
            ok &= mask
    ok[row] = False
    for r in np.flatnonzero(ok):
        if len(state.rows[int(r)]) >= state.nodes[int(r)].max_pods:
            ok[r] = False
    return bool(ok.any())


def tolerates_some(pod: Pod, taints_of: Sequence[tuple[Taint, ...]]) -> bool:
    """``PodToleratesTaints``: every taint (any effect) of at least one destination."""
    return any(
        len(pod.tolerations) >= len(taints)
        and all(any(t.tolerates(taint) for t in pod.tolerations) for taint in taints)
        for taints in taints_of
    )


def eviction_order(pods: Sequence[Pod]) -> list[Pod]:
    """``SortPodsBasedOnPriorityLowToHigh``: priority, then QoS tier, low first."""
    return sorted(pods, key=lambda p: (p.priority, QOS_TIER.get(p.qos, 2), p.key))


# --- usage ---------------------------------------------------------------------------------


def pod_request(pod: Pod) -> dict[str, float]:
    return {
        "cpu": float(pod.cpu_milli),
        "memory": float(pod.memory_mib),
        "pods": 1.0,
        "gpu": pod.gpu_demand_milli / GPU_MILLI,
    }


def requests_any(pod: Pod, names: Sequence[str]) -> bool:
    """``withResourceRequestForAny`` (``nodeutilization.go`` 759-771): a container requests
    one of ``names`` (no container requests ``pods``)."""
    asked = {"cpu": pod.cpu_milli > 0, "memory": pod.memory_mib > 0, "gpu": pod.num_gpu > 0}
    return any(asked.get(n, False) for n in names)


@dataclass(slots=True)
class Usage:
    """Requested resources and capacity per row, for the resources the plugin counts."""

    names: tuple[str, ...]
    used: dict[str, np.ndarray]
    cap: dict[str, np.ndarray]

    @classmethod
    def of(cls, state: SimState, names: Sequence[str]) -> Usage:
        a = state.arrays
        used = {
            "cpu": (a.cpu_total - a.cpu_free).astype(float),
            "memory": (a.mem_total - a.mem_free).astype(float),
            "pods": np.array([len(r) for r in state.rows], dtype=float),
            "gpu": (a.gpu_total * GPU_MILLI - a.free_share()) / GPU_MILLI,
        }
        cap = {
            "cpu": a.cpu_total.astype(float),
            "memory": a.mem_total.astype(float),
            "pods": np.array([n.max_pods for n in state.nodes], dtype=float),
            "gpu": a.gpu_total.astype(float),
        }
        keep = tuple(n for n in RESOURCES if n in names)
        return cls(keep, {n: used[n] for n in keep}, {n: cap[n] for n in keep})

    def percent(self) -> dict[str, np.ndarray]:
        """``ResourceUsageToResourceThreshold``: 0 where the capacity is 0."""
        return {
            k: np.where(self.cap[k] > 0, 100.0 * self.used[k] / np.maximum(self.cap[k], 1e-9), 0.0)
            for k in self.names
        }

    def total(self, row: int) -> float:
        """``sortNodesByUsage``: CPU in milli, memory in bytes, the rest in units, added up."""
        scale = {"memory": 1024.0 * 1024.0}
        return float(sum(self.used[k][row] * scale.get(k, 1.0) for k in self.names))

    def capped(self, row: int, name: str, threshold: Mapping[str, float]) -> float:
        """``capNodeCapacityToThreshold`` (``nodeutilization.go`` 652-698): capacity ×
        threshold, truncated to a whole unit, for a thresholded resource."""
        cap = float(self.cap[name][row])
        if name not in threshold:
            return cap
        return float(math.floor(threshold[name] * 0.01 * cap))  # int64(...) truncates


def normalise(thresholds: Mapping[str, float], what: str) -> dict[str, float]:
    """``validateThresholds``: at least one resource, each in [0, 100]."""
    out = {ALIASES.get(k, k): float(v) for k, v in thresholds.items()}
    if not out:
        raise ConfigError(f"{what}: no resource threshold is configured")
    for name, pct in out.items():
        if name not in RESOURCES:
            raise ConfigError(f"{what}: unknown resource {name!r} (known: {', '.join(RESOURCES)})")
        if not 0 <= pct <= 100:
            raise ConfigError(f"{what}: {name} threshold not in [0, 100] range")
    return out


@dataclass(frozen=True, slots=True)
class Limits:
    """``maxNoOfPodsToEvictPerNode``, ``…PerNamespace``, ``…Total`` (None: no limit)."""

    per_node: int | None = None
    per_namespace: int | None = None
    total: int | None = None


# --- the shared eviction loop ----------------------------------------------------------------

KeepGoing = Callable[[int, dict[str, float]], bool]


@dataclass
class _Descheduler:
    limits: Limits = field(default_factory=Limits, kw_only=True)
    evictor: DefaultEvictor = field(default_factory=DefaultEvictor, kw_only=True)
    exclude_namespaces: frozenset[str] = field(default=frozenset(), kw_only=True)
    """``evictableNamespaces.exclude`` (inclusion is not supported upstream)."""

    def on_unschedulable(self, state: SimState, pod: Pod, now: float) -> Sequence[Move]:
        return ()

    def on_window(self, state: SimState, now: float) -> Sequence[Move]:
        return ()

    def removable(self, pod: Pod) -> bool:
        return self.evictor.filter(pod).ok

    def evict(
        self, state: SimState, sources: list[int], dest: list[int], usage: Usage,
        high: Mapping[str, float], keep_going: KeepGoing,
    ) -> list[Move]:  # fmt: skip
        """``evictPodsFromSourceNodes``: the moves (evictions to the queue), in order."""
        available = {
            k: float(sum(usage.capped(r, k, high) - usage.used[k][r] for r in dest))
            for k in usage.names
        }
        dest_taints = [state.nodes[r].taints for r in dest]
        moves: list[Move] = []
        by_ns: dict[str, int] = {}
        lim = self.limits
        for row in sources:
            removable = eviction_order(
                [p.pod for p in state.rows[row].values() if self.removable(p.pod)]
            )
            if not removable or not keep_going(row, available):
                continue
            on_node = 0
            for pod in removable:
                if lim.per_node is not None and on_node >= lim.per_node:
                    break
                if not tolerates_some(pod, dest_taints):
                    continue
                if pod.namespace in self.exclude_namespaces:
                    continue
                if not self.evictor.pre_eviction(pod, state, row).ok:
                    continue
                if lim.total is not None and len(moves) >= lim.total:
                    return moves
                if (
                    lim.per_namespace is not None
                    and by_ns.get(pod.namespace, 0) >= lim.per_namespace
                ):
                    continue
                moves.append(Move(pod.key, row, REQUEUE, ()))
                on_node += 1
                by_ns[pod.namespace] = by_ns.get(pod.namespace, 0) + 1
                req = pod_request(pod)
                for k in usage.names:
                    available[k] -= req[k]
                    usage.used[k][row] -= req[k]
                if not keep_going(row, available):
                    break
        return moves


@dataclass
class HighNodeUtilization(_Descheduler):
    """``HighNodeUtilizationArgs``: ``thresholds`` (required), ``numberOfNodes``,
    ``evictionModes``, ``evictableNamespaces.exclude``."""

    name = "descheduler-hnu"
    thresholds: Mapping[str, float] = field(default_factory=lambda: {"gpu": 20.0})
    number_of_nodes: int = 0
    eviction_modes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.thresholds = normalise(self.thresholds, "HighNodeUtilization thresholds")
        for mode in self.eviction_modes:
            if mode != ONLY_THRESHOLDING_RESOURCES:
                raise ConfigError(f"invalid eviction mode {mode}")

    def removable(self, pod: Pod) -> bool:
        if ONLY_THRESHOLDING_RESOURCES in self.eviction_modes and not requests_any(
            pod, list(self.thresholds)
        ):
            return False
        return self.evictor.filter(pod).ok

    def classify(self, state: SimState) -> tuple[list[int], list[int], Usage]:
        """(underutilized rows by ascending usage, destination rows, usage)."""
        usage = Usage.of(state, [*self.thresholds, "cpu", "memory", "pods"])
        pct = usage.percent()
        low = np.ones(len(state.nodes), dtype=bool)
        for k, t in self.thresholds.items():
            low &= pct[k] <= t
        rows = np.arange(len(state.nodes))
        low_rows = [int(r) for r in rows[low]]
        dest = [int(r) for r in rows[~low & state.arrays.schedulable]]
        low_rows.sort(key=lambda r: (usage.total(r), state.nodes[r].name))
        return low_rows, dest, usage

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        low, dest, usage = self.classify(state)
        n = len(state.nodes)
        if not low or len(low) <= self.number_of_nodes or len(low) == n or not dest:
            return ()
        high = {k: 100.0 for k in self.thresholds}

        def keep_going(_: int, avail: dict[str, float]) -> bool:
            return all(v > 0 for v in avail.values())

        return self.evict(state, low, dest, usage, high, keep_going)


@dataclass
class LowNodeUtilization(_Descheduler):
    """``LowNodeUtilizationArgs``: ``thresholds``, ``targetThresholds`` (same resources),
    ``useDeviationThresholds``, ``numberOfNodes``, ``evictableNamespaces.exclude``; the
    per-node eviction limit is ``limits.per_node``."""

    name = "descheduler-lnu"
    thresholds: Mapping[str, float] = field(default_factory=lambda: {"gpu": 20.0})
    target_thresholds: Mapping[str, float] = field(default_factory=lambda: {"gpu": 50.0})
    number_of_nodes: int = 0
    use_deviation_thresholds: bool = False

    def __post_init__(self) -> None:
        low = normalise(self.thresholds, "LowNodeUtilization thresholds")
        high = normalise(self.target_thresholds, "LowNodeUtilization targetThresholds")
        if set(low) != set(high):
            raise ConfigError(
                "LowNodeUtilization: thresholds and targetThresholds configured different "
                f"resources ({', '.join(sorted(low))} vs {', '.join(sorted(high))})"
            )
        for k in low:
            if low[k] > high[k] and not self.use_deviation_thresholds:
                raise ConfigError(
                    f"LowNodeUtilization: thresholds' {k} percentage is greater than "
                    "targetThresholds'"
                )
        self.thresholds, self.target_thresholds = low, high

    def limits_of(self, usage: Usage) -> tuple[dict[str, float], dict[str, float]]:
        """The (low, high) percentages: static, or around the mean usage (clamped 0-100)."""
        if not self.use_deviation_thresholds:
            return dict(self.thresholds), dict(self.target_thresholds)
        pct = usage.percent()
        # normalizer.Average: over the nodes that have the resource at all
        has = {k: usage.cap[k] > 0 for k in self.thresholds}
        mean = {k: float(pct[k][has[k]].mean()) if has[k].any() else 0.0 for k in has}
        low = {k: min(max(mean[k] - self.thresholds[k], 0.0), 100.0) for k in mean}
        high = {k: min(max(mean[k] + self.target_thresholds[k], 0.0), 100.0) for k in mean}
        return low, high

    def on_tick(self, state: SimState, now: float) -> Sequence[Move]:
        usage = Usage.of(state, [*self.thresholds, "cpu", "memory", "pods"])
        pct = usage.percent()
        lo, hi = self.limits_of(usage)
        n = len(state.nodes)
        low = state.arrays.schedulable.copy()
        high = np.zeros(n, dtype=bool)
        for k in self.thresholds:
            low &= pct[k] <= lo[k]
            high |= pct[k] > hi[k]
        high &= ~low
        low_rows = [int(r) for r in np.flatnonzero(low)]
        high_rows = [int(r) for r in np.flatnonzero(high)]
        if not low_rows or len(low_rows) <= self.number_of_nodes or len(low_rows) == n:
            return ()
        if not high_rows:
            return ()
        high_rows.sort(key=lambda r: (-usage.total(r), state.nodes[r].name))

        def keep_going(row: int, avail: dict[str, float]) -> bool:
            above = any(usage.used[k][row] > usage.capped(row, k, hi) for k in usage.names)
            return above and all(v > 0 for v in avail.values())

        return self.evict(state, high_rows, low_rows, usage, hi, keep_going)


__all__ = [
    "ConfigError",
    "DefaultEvictor",
    "HighNodeUtilization",
    "Limits",
    "LowNodeUtilization",
    "eviction_order",
]
