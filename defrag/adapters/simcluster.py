"""A simulated cluster behind the daemon's ports (``defrag run --cluster sim``).

:class:`SimCluster` is a :class:`~defrag.ports.ClusterSource` and an
:class:`~defrag.ports.Actuator` over the model. Evictions honour PodDisruptionBudgets (a 429
answer when ``disruptionsAllowed`` is 0), and a controller-owned pod comes back as a Pending
replacement that the scheduler's own :func:`~defrag.scoring.scheduler.schedule` places after
``schedule_delay_s`` (simulated) — so the drain taint keeps it off the draining node, exactly
as on a real cluster. Time is a :class:`SimClock`, sped up and advanced by ``sleep``.
It has no metrics: detection runs on the cluster state alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from defrag.model.cluster import Cluster, PodDisruptionBudget
from defrag.model.resources import EVICTABLE_ANNOTATION, Node, OwnerRef, Pod, Taint
from defrag.ports import EvictionResult
from defrag.scoring.framework import Placement
from defrag.scoring.profile import ProfileConfig
from defrag.scoring.scheduler import schedule

PDB_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."
SIM_START = datetime(2026, 1, 5, 1, 50, tzinfo=UTC)
"""Ten minutes before the demo's 02:00 window opens."""


class SimClock:
    """Simulated time: ``speedup`` simulated seconds per real second, plus what ``sleep`` skips."""

    def __init__(self, start: datetime = SIM_START, speedup: float = 60.0) -> None:
        self._start = start
        self._real0 = time.monotonic()
        self._offset_s = 0.0
        self.speedup = speedup
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            elapsed = (time.monotonic() - self._real0) * self.speedup + self._offset_s
        return self._start + timedelta(seconds=elapsed)

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of simulated time pass at once (no real waiting)."""
        with self._lock:
            self._offset_s += max(0.0, seconds)

    def advance_to(self, moment: datetime) -> None:
        gap = (moment - self.now()).total_seconds()
        if gap > 0:
            self.sleep(gap)


@dataclass(frozen=True, slots=True)
class SimEvent:
    at: datetime
    kind: str
    namespace: str
    name: str
    reason: str
    message: str
    warning: bool


@dataclass(frozen=True, slots=True)
class _Due:
    key: str
    at: datetime
    pdbs: tuple[str, ...]
    """PDBs whose disruption comes back once this replacement runs."""


class SimCluster:
    """The simulated cluster: snapshot, evict, taint, annotate, events. Thread-safe."""

    def __init__(
        self,
        cluster: Cluster,
        clock: SimClock | None = None,
        *,
        profile: ProfileConfig = ProfileConfig(),
        schedule_delay_s: float = 20.0,
    ) -> None:
        self.clock = clock or SimClock()
        self.profile = profile
        """The scheduler's scoring configuration: each pass builds its profile for the
        cluster as it is then (its mix), as the extender does once per relist."""
        self.schedule_delay_s = schedule_delay_s
        self.events: list[SimEvent] = []
        self.evictions: list[EvictionResult] = []
        self.rehearsals: list[EvictionResult] = []
        """Answers to :meth:`rehearse_eviction` (nothing changed)."""
        self._state = cluster
        self._due: list[_Due] = []
        self._serial = 0
        self._lock = threading.RLock()

    # --- ClusterSource -------------------------------------------------------------------

    def snapshot(self) -> Cluster:
        """The cluster now, after the scheduler placed every replacement that is due."""
        with self._lock:
            self._run_scheduler()
            return self._state

    # --- Actuator ------------------------------------------------------------------------

    def evict(self, namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        return self._eviction(namespace, name, uid, rehearsal=False)

    def rehearse_eviction(self, namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        """What :meth:`evict` would answer now, changing nothing (kept in :attr:`rehearsals`)."""
        return self._eviction(namespace, name, uid, rehearsal=True)

    def _eviction(self, namespace: str, name: str, uid: str, *, rehearsal: bool) -> EvictionResult:
        key = f"{namespace}/{name}"
        with self._lock:
            pod = self._state.pods.get(key)
            if pod is None or pod.node is None:
                result = EvictionResult(key, "gone", "pod not found")
            elif uid and pod.uid and pod.uid != uid:
                result = EvictionResult(key, "gone", f"replaced (UID {pod.uid}, not {uid})")
            else:
                result = self._evict(pod, rehearsal)
            (self.rehearsals if rehearsal else self.evictions).append(result)
            return result

    def taint_node(self, node: str, key: str, value: str, effect: str) -> None:
        with self._lock:
            old = self._node(node)
            taints = (*(t for t in old.taints if t.key != key), Taint(key, effect, value))
            self._replace_node(replace(old, taints=taints))

    def untaint_node(self, node: str, key: str) -> None:
        with self._lock:
            old = self._node(node)
            self._replace_node(replace(old, taints=tuple(t for t in old.taints if t.key != key)))

    def annotate_node(self, node: str, annotations: Mapping[str, str | None]) -> None:
        with self._lock:
            old = self._node(node)
            self._replace_node(replace(old, annotations=_merged(old.annotations, annotations)))

    def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        key = f"{namespace}/{name}"
        with self._lock:
            pod = self._state.pods.get(key)
            if pod is None:
                raise KeyError(f"pod {key} not found")
            # Annotations hold no resources: the pod is swapped in place, the arrays kept.
            pods = self._state.pods_copy()
            pods[key] = replace(pod, annotations=_merged(pod.annotations, annotations))
            self._state = replace(self._state, pods=MappingProxyType(pods))

    def event(
        self, kind: str, namespace: str, name: str, reason: str, message: str, warning: bool = False
    ) -> None:
        with self._lock:
            self.events.append(
                SimEvent(self.clock.now(), kind, namespace, name, reason, message, warning)
            )

    # --- internals -----------------------------------------------------------------------

    def _evict(self, pod: Pod, rehearsal: bool) -> EvictionResult:
        pdbs = [b for b in self._state.pdbs if b.selects(pod)]
        blocking = [b for b in pdbs if b.disruptions_allowed <= 0]
        if blocking:
            return EvictionResult(pod.key, "blocked", f"{PDB_MESSAGE} ({blocking[0].key})")
        if rehearsal:
            return EvictionResult(pod.key, "evicted", "rehearsal: would be evicted")
        state = self._state.with_pod_removed(pod.key)
        if pdbs:
            state = _with_pdbs(state, {b.key: b.disruptions_allowed - 1 for b in pdbs})
        if pod.owner is not None and pod.owner.kind not in ("Node", "DaemonSet"):
            twin = self._replacement(pod)
            state = state.with_pod_added(twin)
            due = self.clock.now() + timedelta(seconds=self.schedule_delay_s)
            self._due.append(_Due(twin.key, due, tuple(b.key for b in pdbs)))
        self._state = state
        return EvictionResult(pod.key, "evicted", "")

    def _replacement(self, pod: Pod) -> Pod:
        """The pod its controller creates: StatefulSets reuse the name, others get a new one."""
        self._serial += 1
        owner = pod.owner
        assert owner is not None
        name = pod.name if owner.kind == "StatefulSet" else f"{owner.name}-r{self._serial:04d}"
        now = self.clock.now()
        return replace(
            pod,
            name=name,
            node=None,
            gpu_indices=(),
            phase="Pending",
            created_at=now,
            pending_since=now,
            uid=f"sim-{self._serial}",
        )

    def _run_scheduler(self) -> None:
        """Place what the scheduler would now: due replacements and other Pending pods,
        highest priority first. What does not fit stays Pending with the scheduler's reason."""
        now = self.clock.now()
        waiting = {d.key: d for d in self._due if d.at > now}
        due = {d.key: d for d in self._due if d.at <= now}
        queue = sorted(
            (p for p in self._state.pending_pods() if p.key not in waiting),
            key=lambda p: (-p.priority, p.key),
        )
        restore: dict[str, int] = {}
        # One profile per pass, for the cluster as the pass finds it (as the extender builds
        # one per relist), not rebuilt for every pending pod.
        policy = self.profile.for_cluster(self._state).policy
        for pod in queue:
            placed = schedule(pod, self._state, policy)
            if isinstance(placed, Placement):
                self._state = self._state.with_pod_bound(pod.key, placed.node, placed.gpus)
                for key in due.pop(pod.key).pdbs if pod.key in due else ():
                    restore[key] = restore.get(key, 0) + 1
            elif pod.pending_reason != placed.summary:
                self._state = self._state.with_pod_removed(pod.key).with_pod_added(
                    replace(pod, pending_reason=placed.summary)
                )
        self._due = [*waiting.values(), *due.values()]
        if restore:
            current = {b.key: b.disruptions_allowed for b in self._state.pdbs}
            self._state = _with_pdbs(
                self._state, {k: current[k] + n for k, n in restore.items() if k in current}
            )

    def _node(self, name: str) -> Node:
        if name not in self._state.arrays.index:
            raise KeyError(f"node {name} not found")
        return self._state.node(name)

    def _replace_node(self, node: Node) -> None:
        nodes = [node if n.name == node.name else n for n in self._state.nodes]
        self._state = _rebuild(self._state, nodes=nodes)


def _with_pdbs(cluster: Cluster, allowed: Mapping[str, int]) -> Cluster:
    pdbs = [
        replace(b, disruptions_allowed=allowed[b.key]) if b.key in allowed else b
        for b in cluster.pdbs
    ]
    return _rebuild(cluster, pdbs=pdbs)


def _rebuild(
    cluster: Cluster,
    *,
    nodes: list[Node] | None = None,
    pdbs: list[PodDisruptionBudget] | None = None,
) -> Cluster:
    return Cluster.build(
        nodes if nodes is not None else cluster.nodes,
        cluster.pods.values(),
        pdbs if pdbs is not None else cluster.pdbs,
        cluster.priority_classes,
    )


# --- the built-in fragmented cluster ----------------------------------------------------------


def fragmented_cluster(now: datetime = SIM_START) -> Cluster:
    """Twelve 8-GPU nodes with 20 GPUs free, one or two per node: no 8-GPU job fits.

    Eight nodes have 2 GPUs free, four have 1 (8×2 + 4×1 = 20). Inference pods (1 and 2 GPUs)
    belong to Deployments and may move; beside them sit what must stay: a pod under a PDB with
    no disruption left, an opted-out pod, a bare pod and a DaemonSet pod on every node.
    A high-priority 8-GPU training job is Pending.
    """
    born = now - timedelta(hours=6)
    nodes = [
        Node(
            name=f"gpu-{i:02d}",
            cpu_milli=96_000,
            memory_mib=512 * 1024,
            num_gpu=8,
            gpu_model="A100-SXM4-80GB",
            gpu_memory_mib=81920,
        )
        for i in range(12)
    ]
    # GPUs of the pods on each node, one list per node (sum 6 = 2 free, 7 = 1 free).
    layouts = [
        [2, 2, 1, 1],
        [2, 1, 1, 1, 1],
        [2, 2, 2, 1],
        [1, 1, 1, 1, 1, 1],
        [2, 2, 1, 1],
        [2, 2, 2, 1],
        [1, 1, 2, 2],
        [2, 1, 1, 1, 1, 1],
        [2, 2, 1, 1],
        [1, 1, 1, 1, 2],
        [2, 2, 2, 1],
        [2, 2, 1, 1],
    ]
    pods: list[Pod] = []
    serial = 0
    for node, sizes in zip(nodes, layouts, strict=True):
        for gpus in sizes:
            serial += 1
            app = "chat" if gpus == 1 else "embed"
            pods.append(
                Pod(
                    name=f"{app}-{serial:03d}",
                    namespace="inference",
                    num_gpu=gpus,
                    cpu_milli=4000 * gpus,
                    memory_mib=16_384 * gpus,
                    priority=100,
                    owner=OwnerRef("ReplicaSet", f"{app}-{serial % 5}"),
                    labels={"app": app},
                    phase="Running",
                    node=node.name,
                    created_at=born,
                )
            )
        pods.append(
            Pod(
                name=f"dcgm-exporter-{node.name}",
                namespace="monitoring",
                cpu_milli=100,
                memory_mib=128,
                owner=OwnerRef("DaemonSet", "dcgm-exporter"),
                phase="Running",
                node=node.name,
                created_at=born,
                priority=2_000_001_000,
                priority_class="system-node-critical",
            )
        )
    # What must stay where it is: swap three movable pods for protected ones.
    protected = {
        "inference/chat-003": {"labels": {"app": "ledger"}, "owner": OwnerRef("ReplicaSet", "lg")},
        "inference/chat-009": {"annotations": {EVICTABLE_ANNOTATION: "false"}},
        "inference/chat-015": {"owner": None},
    }
    pods = [replace(p, **protected[p.key]) if p.key in protected else p for p in pods]  # type: ignore[arg-type]
    pods.append(
        Pod(
            name="train-llm-0",
            namespace="research",
            num_gpu=8,
            cpu_milli=64_000,
            memory_mib=400_000,
            priority=1000,
            priority_class="research-high",
            owner=OwnerRef("Job", "train-llm"),
            gang="train-llm",
            phase="Pending",
            created_at=now - timedelta(hours=2),
            pending_since=now - timedelta(hours=2),
            pending_reason="0/12 nodes are available: 12 Insufficient nvidia.com/gpu.",
        )
    )
    pdbs = [PodDisruptionBudget("inference", "ledger", {"app": "ledger"}, disruptions_allowed=0)]
    return Cluster.build(nodes, pods, pdbs, {"research-high": 1000})


def _merged(old: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    """``old`` with ``patch`` applied (None removes a key)."""
    merged = dict(old)
    for k, v in patch.items():
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = v
    return merged
