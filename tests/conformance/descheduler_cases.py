"""kubernetes-sigs/descheduler's own nodeutilization test tables, one row per upstream case.

Upstream: kubernetes-sigs/descheduler commit 7d2b28b,
``pkg/framework/plugins/nodeutilization/highnodeutilization_test.go`` (HNU) and
``lownodeutilization_test.go`` (LNU); each row cites the line of its case's ``name``. The
fixtures are ``test.BuildTestNode(name, millicpu, memory, pods)`` and
``test.BuildTestPod(name, millicpu, memory, node)`` (``test/test_utils.go`` 60, 204).

How a case is translated (faithful, no reinterpretation):

* CPU, pods and the thresholds carry over as they are; memory carries over as the same number
  in the model's unit (MiB instead of bytes): percentages are unchanged, and no case's node
  order depends on memory.
* The extended resource ``example.com/foo`` (``nodeutilization_test.go`` 60) is the GPU
  (``nvidia.com/gpu``): both are whole-unit extended resources the plugins count alike.
* A pod built with CPU requests is Burstable, ``test.MakeBestEffortPod`` BestEffort; a pod
  with no ``SetPodPriority`` has priority 0 (upstream: nil, which sorts before 0; no case
  mixes the two on one node).
* Owners: ``SetRSOwnerRef``/``SetNormalOwnerRef`` a ReplicaSet, ``SetDSOwnerRef`` a DaemonSet,
  none otherwise; the mirror annotation as is; ``SetHostPathEmptyDirVolumeSource`` (local
  storage) has no model — each such pod is also a mirror pod, refused for that.
* The plugins run with the evictor each test builds: ``DefaultEvictorArgs{NodeFit: true}``
  (HNU 487, LNU 1209, 1373), ``DefaultEvictorArgs{}`` (HNU taints 617); the per-node limit
  of the taint tests is their expected count (HNU 616, LNU 1372).

Cases that cannot be mapped are in :data:`UNMAPPED` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from defrag.model.resources import Node, OwnerRef, Pod, Taint, Toleration
from defrag.model.selectors import NodeSelector, NodeSelectorTerm, Requirement

HNU_TEST = "highnodeutilization_test.go"
LNU_TEST = "lownodeutilization_test.go"
CRITICAL = 2_000_000_000
HIGH = 10_000  # highPriority, nodeutilization_test.go 59
KEY, WEST, EAST = "datacenter", "west", "east"


@dataclass(frozen=True)
class N:
    """``test.BuildTestNode(name, millicpu, mem, pods)`` (+ GPUs, cordon, labels, taints)."""

    name: str
    cpu: int
    mem: int
    pods: int
    gpus: int = 0
    unschedulable: bool = False
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()

    def node(self) -> Node:
        return Node(
            self.name, cpu_milli=self.cpu, memory_mib=self.mem, num_gpu=self.gpus,
            gpu_model="G" if self.gpus else "", unschedulable=self.unschedulable,
            labels=dict(self.labels), taints=self.taints, max_pods=self.pods,
        )  # fmt: skip


@dataclass(frozen=True)
class P:
    """``test.BuildTestPod(name, millicpu, mem, node)`` and what the case applies to it."""

    name: str
    cpu: int
    mem: int
    node: str
    owner: str | None = "ReplicaSet"
    gpus: int = 0
    priority: int = 0
    qos: str = "Burstable"
    namespace: str = "default"
    mirror: bool = False
    selector: tuple[tuple[str, str], ...] = ()
    affinity_in: tuple[str, tuple[str, ...]] | None = None
    tolerations: tuple[Toleration, ...] = ()

    def pod(self) -> Pod:
        qos = "BE" if self.cpu == 0 and self.mem == 0 and self.qos == "Burstable" else self.qos
        affinity = None
        if self.affinity_in is not None:
            key, values = self.affinity_in
            affinity = NodeSelector((NodeSelectorTerm((Requirement(key, "In", values),)),))
        return Pod(
            self.name, namespace=self.namespace, num_gpu=self.gpus, cpu_milli=self.cpu,
            memory_mib=self.mem, priority=self.priority, qos=qos,
            owner=OwnerRef(self.owner, "o") if self.owner else None,
            annotations={"kubernetes.io/config.mirror": "m"} if self.mirror else {},
            node_selector=dict(self.selector), affinity=affinity,
            tolerations=self.tolerations, phase="Running",
        )  # fmt: skip


def rs(name: str, cpu: int, node: str, mem: int = 0, **kw: object) -> P:
    return P(name, cpu, mem, node, **kw)  # type: ignore[arg-type]


def ds(name: str, cpu: int, node: str, mem: int = 0) -> P:
    return P(name, cpu, mem, node, owner="DaemonSet")


def local(name: str, cpu: int, node: str, mem: int = 0, **kw: object) -> P:
    """Local storage and a mirror pod (upstream's ``withLocalStorage``)."""
    return P(name, cpu, mem, node, mirror=True, **kw)  # type: ignore[arg-type]


def critical(
    name: str, cpu: int, node: str, mem: int = 0, owner: str | None = "ReplicaSet", gpus: int = 0
) -> P:
    """kube-system, ``SystemCriticalPriority`` (upstream's ``withCriticalPod``)."""
    return P(
        name, cpu, mem, node, owner=owner, gpus=gpus, priority=CRITICAL, namespace="kube-system"
    )


@dataclass(frozen=True)
class Case:
    name: str
    where: str
    plugin: str  # "hnu" | "lnu"
    thresholds: dict[str, float]
    nodes: tuple[N, ...]
    pods: tuple[P, ...]
    expected: int
    evicted: tuple[str, ...] = ()
    targets: dict[str, float] = field(default_factory=dict)
    modes: tuple[str, ...] = ()
    node_fit: bool = True
    per_node: int | None = None
    deviation: bool = False
    exclude: tuple[str, ...] = ()


def _n3(cpu: int = 4000, mem: int = 3000) -> tuple[N, N, N]:
    return N("n1", cpu, mem, 10), N("n2", cpu, mem, 10), N("n3", cpu, mem, 10, unschedulable=True)


CP = {"cpu": 30.0, "pods": 30.0}
CP50 = {"cpu": 50.0, "pods": 50.0}
TAINT = Taint("key", "NoSchedule", "value")
TOLERATE = (Toleration("key", "Equal", "value"),)

HNU_CASES: tuple[Case, ...] = (
    Case("no node below threshold usage", f"{HNU_TEST}:57", "hnu", {"cpu": 20, "pods": 20},
         (N("n1", 4000, 3000, 10), N("n2", 4000, 3000, 10), N("n3", 4000, 3000, 10)),
         tuple(rs(f"p{i}", 400, f"n{(i - 1) // 3 + 1}") for i in range(1, 10)), 0),
    Case("no evictable pods", f"{HNU_TEST}:84", "hnu", {"cpu": 40, "pods": 40},
         (N("n1", 4000, 3000, 9), N("n2", 4000, 3000, 10), N("n3", 4000, 3000, 10)),
         (local("p1", 400, "n1"), critical("p2", 400, "n1"), ds("p3", 400, "n2"),
          ds("p4", 400, "n2"), *(rs(f"p{i}", 400, "n3") for i in range(5, 9))), 0),
    Case("no node to schedule evicted pods", f"{HNU_TEST}:120", "hnu", {"cpu": 20, "pods": 20},
         _n3(), (rs("p1", 400, "n1"), rs("p2", 400, "n2"),
                 *(rs(f"p{i}", 400, "n3") for i in range(3, 6))), 0),
    Case("without priorities", f"{HNU_TEST}:142", "hnu", CP, _n3(),
         (rs("p1", 400, "n1"), critical("p2", 400, "n1"),
          *(rs(f"p{i}", 400, "n2") for i in range(3, 7)), rs("p7", 400, "n3")),
         2, ("p1", "p7")),
    Case("without priorities stop when resource capacity is depleted", f"{HNU_TEST}:172", "hnu",
         CP, _n3(cpu=2000), (rs("p1", 400, "n1"), *(rs(f"p{i}", 400, "n2") for i in range(2, 6)),
                             rs("p6", 400, "n3")), 1),
    Case("with priorities", f"{HNU_TEST}:194", "hnu", {"cpu": 30},
         (N("n1", 4000, 3000, 10), N("n2", 2000, 3000, 10),
          N("n3", 2000, 3000, 10, unschedulable=True)),
         (rs("p1", 400, "n1", priority=0), rs("p2", 400, "n1", priority=HIGH),
          *(rs(f"p{i}", 400, "n2") for i in range(5, 9)), ds("p9", 400, "n3")), 1, ("p1",)),
    Case("without priorities evicting best-effort pods only", f"{HNU_TEST}:224", "hnu",
         {"cpu": 30},
         (N("n1", 3000, 3000, 10), N("n2", 3000, 3000, 5),
          N("n3", 3000, 3000, 10, unschedulable=True)),
         (rs("p1", 0, "n1", qos="BE"), rs("p2", 400, "n1"),
          *(rs(f"p{i}", 400, "n2") for i in range(3, 7))), 1, ("p1",)),
    Case("with extended resource", f"{HNU_TEST}:250", "hnu", {"cpu": 20, "gpu": 40},
         (N("n1", 4000, 3000, 10, gpus=8), N("n2", 4000, 3000, 10, gpus=8),
          N("n3", 4000, 3000, 10, unschedulable=True)),
         (rs("p1", 100, "n1", gpus=1), rs("p2", 100, "n1", gpus=1),
          *(rs(f"p{i}", 500, "n2", gpus=1) for i in range(3, 7))), 2, ("p1", "p2")),
    Case("with extended resource in some of nodes", f"{HNU_TEST}:295", "hnu",
         {"cpu": 40, "gpu": 40},
         (N("n1", 4000, 3000, 10, gpus=8), N("n2", 4000, 3000, 10),
          N("n3", 4000, 3000, 10, unschedulable=True)),
         (rs("p1", 100, "n1", gpus=1), rs("p2", 100, "n1", gpus=1),
          *(rs(f"p{i}", 500, "n2") for i in range(3, 7))), 0),
    Case("Other node match pod node selector", f"{HNU_TEST}:325", "hnu", CP,
         (N("n1", 4000, 3000, 9, labels=((KEY, WEST),)), N("n2", 4000, 3000, 10)),
         (rs("p1", 400, "n1"), rs("p2", 400, "n1"), rs("p3", 400, "n1"), ds("p4", 400, "n1"),
          rs("p5", 400, "n2", selector=((KEY, WEST),))), 1),
    Case("Other node does not match pod node selector", f"{HNU_TEST}:354", "hnu", CP,
         (N("n1", 4000, 3000, 9), N("n2", 4000, 3000, 10)),
         (rs("p1", 400, "n1"), rs("p2", 400, "n1"), rs("p3", 400, "n1"), ds("p4", 400, "n1"),
          rs("p5", 400, "n2", selector=((KEY, WEST),))), 0),
    Case("Other node does not have enough Memory", f"{HNU_TEST}:379", "hnu", CP,
         (N("n1", 4000, 200, 9), N("n2", 4000, 3000, 10)),
         (rs("p1", 400, "n1", 50), rs("p2", 400, "n1", 50), rs("p3", 400, "n1", 50),
          ds("p4", 400, "n1", 50), rs("p5", 400, "n2", 100)), 0),
    Case("Other node does not have enough Memory (the same case again)", f"{HNU_TEST}:401",
         "hnu", CP, (N("n1", 4000, 200, 9), N("n2", 4000, 3000, 10)),
         (rs("p1", 400, "n1", 50), rs("p2", 400, "n1", 50), rs("p3", 400, "n1", 50),
          ds("p4", 400, "n1", 50), rs("p5", 400, "n2", 100)), 0),
    Case("with extended resource threshold and no extended resource pods", f"{HNU_TEST}:423",
         "hnu", {"gpu": 40},
         (N("n1", 4000, 3000, 10, gpus=10), N("n2", 4000, 3000, 10, gpus=10),
          N("n3", 4000, 3000, 10, gpus=10)),
         (rs("p1", 100, "n1", gpus=3), rs("p2", 100, "n1", gpus=3),
          *(rs(f"p{i}", 500, "n2") for i in range(3, 7))), 0,
         modes=("OnlyThresholdingResources",)),
    # TestHighNodeUtilizationWithTaints: thresholds cpu 40 (626), DefaultEvictorArgs{} (617)
    Case("No taints", f"{HNU_TEST}:560", "hnu", {"cpu": 40},
         (N("n1", 1000, 3000, 10), N("n2", 1000, 3000, 10), N("n3", 1000, 3000, 10)),
         (*(rs(f"pod_{i}_n1", 200, "n1") for i in range(1, 4)), rs("pod_4_n2", 200, "n2")),
         1, node_fit=False, per_node=1),
    Case("No pod tolerates node taint", f"{HNU_TEST}:573", "hnu", {"cpu": 40},
         (N("n1", 1000, 3000, 10), N("n3", 1000, 3000, 10, taints=(TAINT,))),
         (rs("pod_1_n1", 200, "n1"), rs("pod_2_n3", 200, "n3")), 0, node_fit=False, per_node=0),
    Case("Pod which tolerates node taint", f"{HNU_TEST}:584", "hnu", {"cpu": 40},
         (N("n1", 1000, 3000, 10), N("n3", 1000, 3000, 10, taints=(TAINT,))),
         (rs("pod_1_n1", 100, "n1"), rs("tolerate_pod", 200, "n1", tolerations=TOLERATE),
          rs("pod_9_n3", 500, "n3")), 1, ("tolerate_pod",), node_fit=False, per_node=1),
)  # fmt: skip


def _lnu_n1_tail(owner8: str | None = "ReplicaSet", mem: int = 0) -> tuple[P, ...]:
    """p6 DaemonSet, p7 local storage + mirror, p8 critical: never evicted."""
    return (ds("p6", 400, "n1", mem), local("p7", 400, "n1", mem),
            critical("p8", 400, "n1", mem, owner=owner8))  # fmt: skip


LNU_NODES = (N("n1", 4000, 3000, 9), N("n2", 4000, 3000, 10),
             N("n3", 4000, 3000, 10, unschedulable=True))  # fmt: skip
N2_EAST = N("n2", 4000, 3000, 10, labels=((KEY, EAST),))
AFFINITY_PODS = (
    rs("p1", 400, "n1"), rs("p2", 400, "n1"), rs("p3", 400, "n1"),
    rs("p4", 400, "n1", affinity_in=(KEY, (WEST,))),
    rs("p5", 400, "n1", affinity_in=(KEY, (WEST,))), *_lnu_n1_tail(), rs("p9", 0, "n2"),
)  # fmt: skip
"""lownodeutilization_test.go 808-869 and 1018-1079: p4 and p5 require datacenter=west."""

LNU_CASES: tuple[Case, ...] = (
    Case("no evictable pods", f"{LNU_TEST}:71", "lnu", CP, LNU_NODES,
         (*(ds(f"p{i}", 400, "n1") for i in range(1, 5)), local("p5", 400, "n1"),
          critical("p6", 400, "n1", owner=None), rs("p9", 400, "n2")), 0, targets=CP50),
    Case("without priorities", f"{LNU_TEST}:121", "lnu", CP, LNU_NODES,
         (*(rs(f"p{i}", 400, "n1") for i in range(1, 6)), *_lnu_n1_tail(None),
          rs("p9", 400, "n2")), 4, targets=CP50),
    Case("without priorities, but excluding namespaces", f"{LNU_TEST}:173", "lnu", CP, LNU_NODES,
         (*(rs(f"p{i}", 400, "n1", namespace="namespace1") for i in range(1, 6)),
          *_lnu_n1_tail(None), rs("p9", 400, "n2")), 0, targets=CP50, exclude=("namespace1",)),
    # evictableNamespaces.include is not read by evictPods (nodeutilization.go 270-273): the
    # owner-less p3-p5 stay, p1 and p2 go
    Case("without priorities, but include only default namespace", f"{LNU_TEST}:245", "lnu", CP,
         LNU_NODES,
         (rs("p1", 400, "n1"), rs("p2", 400, "n1"),
          *(rs(f"p{i}", 400, "n1", owner=None, namespace=f"namespace{i}") for i in range(3, 6)),
          *_lnu_n1_tail(), rs("p9", 400, "n2")), 2, targets=CP50),
    Case("without priorities stop when cpu capacity is depleted", f"{LNU_TEST}:312", "lnu", CP,
         LNU_NODES, (*(rs(f"p{i}", 400, "n1") for i in range(1, 6)), *_lnu_n1_tail(),
                     rs("p9", 400, "n2")), 4, targets=CP50),
    Case("with priorities", f"{LNU_TEST}:365", "lnu", CP, LNU_NODES,
         (*(rs(f"p{i}", 400, "n1", priority=HIGH) for i in range(1, 5)),
          rs("p5", 400, "n1", priority=0), P("p6", 400, 0, "n1", owner="DaemonSet", priority=HIGH),
          local("p7", 400, "n1"), critical("p8", 400, "n1"), rs("p9", 400, "n2")),
         4, targets=CP50),
    Case("without priorities evicting best-effort pods only", f"{LNU_TEST}:437", "lnu", CP,
         LNU_NODES,
         (rs("p1", 400, "n1", qos="BE"), rs("p2", 400, "n1", qos="BE"), rs("p3", 400, "n1"),
          rs("p4", 400, "n1", qos="BE"), rs("p5", 400, "n1", qos="BE"), *_lnu_n1_tail(),
          rs("p9", 400, "n2")), 4, ("p1", "p2", "p4", "p5"), targets=CP50),
    Case("with extended resource", f"{LNU_TEST}:504", "lnu", {"pods": 30, "gpu": 30},
         (N("n1", 4000, 3000, 9, gpus=8), N("n2", 4000, 3000, 10, gpus=8),
          N("n3", 4000, 3000, 10, unschedulable=True)),
         (*(rs(f"p{i}", 0, "n1", gpus=1) for i in range(1, 7)), local("p7", 0, "n1", gpus=1),
          critical("p8", 0, "n1", gpus=1), rs("p9", 0, "n2", gpus=1)),
         3, targets={"pods": 50, "gpu": 50}),
    Case("with extended resource in some of nodes", f"{LNU_TEST}:586", "lnu",
         {"pods": 30, "gpu": 30},
         (N("n1", 4000, 3000, 9, gpus=8), N("n2", 4000, 3000, 10),
          N("n3", 4000, 3000, 10, unschedulable=True)),
         (rs("p1", 0, "n1", gpus=1), rs("p9", 0, "n2")), 0, targets={"pods": 50, "gpu": 50}),
    Case("with extended resource in some of nodes with deviation", f"{LNU_TEST}:627", "lnu",
         {"pods": 5, "gpu": 10},
         (N("n1", 4000, 3000, 10, gpus=8), N("n2", 4000, 3000, 10, gpus=8),
          N("n3", 4000, 3000, 10, unschedulable=True)),
         (rs("p1", 0, "n1", gpus=1), rs("p2", 0, "n2", gpus=7), rs("p3", 0, "n2"),
          rs("p8", 0, "n3"), rs("p9", 0, "n3")), 1,
         targets={"pods": 5, "gpu": 10}, deviation=True),
    Case("without priorities, but only other node is unschedulable", f"{LNU_TEST}:677", "lnu",
         CP, (N("n1", 4000, 3000, 9), N("n2", 4000, 3000, 10, unschedulable=True)),
         (*(rs(f"p{i}", 400, "n1") for i in range(1, 6)), *_lnu_n1_tail()), 0, targets=CP50),
    Case("without priorities, but only other node doesn't match pod node selector for p4 and p5",
         f"{LNU_TEST}:727", "lnu", CP, (N("n1", 4000, 3000, 9), N2_EAST),
         (rs("p1", 400, "n1"), rs("p2", 400, "n1"), rs("p3", 400, "n1"),
          rs("p4", 400, "n1", selector=((KEY, WEST),)),
          rs("p5", 400, "n1", selector=((KEY, WEST),)),
          *_lnu_n1_tail()), 3, targets=CP50),
    Case("without priorities, but only other node doesn't match pod node affinity for p4 and p5",
         f"{LNU_TEST}:791", "lnu", CP, (N("n1", 4000, 3000, 9), N2_EAST),
         AFFINITY_PODS, 3, targets=CP50),
    Case("deviation thresholds", f"{LNU_TEST}:884", "lnu", {"cpu": 5, "pods": 5}, LNU_NODES,
         (*(rs(f"p{i}", 400, "n1") for i in range(1, 6)), *_lnu_n1_tail(), rs("p9", 400, "n2")),
         2, targets={"cpu": 5, "pods": 5}, deviation=True),
    Case("deviation thresholds and overevicting memory", f"{LNU_TEST}:939", "lnu",
         {"cpu": 5, "pods": 5},
         (N("n1", 4000, 3000, 10), N("n2", 4000, 3000, 10),
          N("n3", 4000, 3000, 10, unschedulable=True)),
         (*(rs(f"p{i}", 400, "n1", 375) for i in range(1, 6)), *_lnu_n1_tail(mem=375),
          rs("p9", 400, "n2", 3000)), 0, targets={"cpu": 5, "pods": 5}, deviation=True),
    Case("without priorities different evictions for requested and actual resources",
         f"{LNU_TEST}:1001", "lnu", CP, (N("n1", 4000, 3000, 9), N2_EAST),
         AFFINITY_PODS, 3, targets=CP50),
    Case("without priorities with node eviction limit", f"{LNU_TEST}:1094", "lnu", CP, LNU_NODES,
         (*(rs(f"p{i}", 400, "n1") for i in range(1, 6)), *_lnu_n1_tail(None),
          rs("p9", 400, "n2")), 2, targets=CP50, per_node=2),
    # TestLowNodeUtilizationWithTaints: pods 20 / 70 (1381-1386), NodeFit (1373)
    Case("No taints", f"{LNU_TEST}:1281", "lnu", {"pods": 20},
         (N("n1", 2000, 3000, 10), N("n2", 1000, 3000, 10), N("n3", 1000, 3000, 10)),
         (*(rs(f"pod_{i}_n1", 200, "n1") for i in range(1, 9)), rs("pod_9_n2", 200, "n2")),
         1, targets={"pods": 70}, per_node=1),
    Case("No pod tolerates node taint", f"{LNU_TEST}:1299", "lnu", {"pods": 20},
         (N("n1", 2000, 3000, 10), N("n3", 1000, 3000, 10, taints=(TAINT,))),
         (*(rs(f"pod_{i}_n1", 200, "n1") for i in range(1, 9)), rs("pod_9_n3", 200, "n3")),
         0, targets={"pods": 70}, per_node=0),
    Case("Pod which tolerates node taint", f"{LNU_TEST}:1317", "lnu", {"pods": 20},
         (N("n1", 2000, 3000, 10), N("n3", 1000, 3000, 10, taints=(TAINT,))),
         (*(rs(f"pod_{i}_n1", 200, "n1") for i in range(1, 8)),
          rs("tolerate_pod", 200, "n1", tolerations=TOLERATE), rs("pod_9_n3", 200, "n3")),
         1, ("tolerate_pod",), targets={"pods": 70}, per_node=1),
    Case("Pod which tolerates node taint, set maxPodsToEvictTotal(0), should not be expelled",
         f"{LNU_TEST}:1335", "lnu", {"pods": 20},
         (N("n1", 2000, 3000, 10), N("n3", 1000, 3000, 10, taints=(TAINT,))),
         (*(rs(f"pod_{i}_n1", 200, "n1") for i in range(1, 8)),
          rs("tolerate_pod", 200, "n1", tolerations=TOLERATE), rs("pod_9_n3", 200, "n3")),
         0, targets={"pods": 70}, per_node=0),
)  # fmt: skip

UNMAPPED: tuple[tuple[str, str], ...] = (
    (f"{LNU_TEST}:1244 (the 17 TestLowNodeUtilization cases run again 'with metrics enabled')",
     "actual usage from metrics-server: the timeline knows requests only"),
    (f"{LNU_TEST}:1431, 1471, 1514, 1558 (TestLowNodeUtilizationWithPrometheusMetrics)",
     "usage from a Prometheus query (MetricResource): no such series in the timeline"),
    (f"{LNU_TEST}:1669 (TestLowNodeUtilizationPrometheusClientNilAtCreation)",
     "a Prometheus client's life cycle, not a balancing decision"),
)  # fmt: skip
"""Upstream cases with no translation, and why."""
