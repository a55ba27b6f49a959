"""The chaos soak: two daemon replicas on the real control plane, under faults, checked for
invariants after the fact from the API server's audit log and the objects' history.

    .venv/bin/python -m bench.bench_soak --seed 1 --cycles 1000 [--json out.json]

What runs (tests/e2e's harness): etcd, kube-apiserver (audit log, every request), the
kube-controller-manager, the kubelet stand-in, kube-scheduler with the shipped configuration and
the defrag extender, two ``defrag run`` replicas (``dry_run: false``, leader election, a 1 s
cycle, a ``make-room-now`` starvation rule) each as its own ServiceAccount bound to defrag's
roles, a real Alertmanager with a webhook receiver, and a Prometheus that misbehaves on demand.
The daemons and the extender reach the API server through ``tests/e2e/faultproxy.py``.

A seeded stream of GPU workloads (Deployments arriving and completing, 8-GPU jobs of a
non-preempting high-priority class) and seeded chaos (leader SIGKILL and SIGSTOP past its
Lease, extender killed, Prometheus down or answering garbage, Alertmanager restarted, PDBs with
``maxUnavailable: 0`` added and removed, pods deleted, nodes cordoned and deleted, terminating
pods held) run until the replicas have run ``--cycles`` cycles; then the chaos stops, the soak
runs clean for ``--drain-s`` seconds and every invariant is checked (``Report.violations``).

The safe-to-grant invariants, beside the PDB, Lease and marks ones:

* **0 evictions of pods that do not return.** Workloads nothing recreates run among the others,
  two a node on three of the GPU nodes (``_never_place``), at the default priority, from before
  the load: a bare pod, a pod whose
  controlling owner is that bare pod, one owned by a ConfigMap, one whose only ownerReference
  is a non-controlling one to a ReplicaSet (0 replicas, a selector matching nothing, so the
  garbage collector keeps the pod and the ReplicaSet never adopts it), and two batch/v1 Jobs
  with ``backoffLimit: 0`` (the harness's kube-controller-manager runs ``*`` controllers: the
  Job controller and the garbage collector among them). One gone is replaced under a new name;
  the chaos never deletes them but with a deleted node (such a Job's failure is the harness's,
  not counted). Every 201 eviction's pod must have a controlling ReplicaSet, StatefulSet,
  ReplicationController or Job with retries left; no soak Job may end ``Failed`` with
  ``BackoffLimitExceeded``.
* **0 second rooms**, from the Node writes (logged at RequestResponse for this: the resulting
  ``defrag.io/reserved-for``): no room for a pod on a second node while its first room stands
  or while a pod evicted from the first room is still Terminating.
* **0 budget overruns.** The soak used only make-room-now with an unbounded budget; now the
  daemons have execution windows (``*/2 * * * *`` UTC, 60 s open) and a fixed budget of 5
  evictions (``eviction_budget_follows_demand: false``, so the limit is the setting, not the
  backlog). Inside a window make-room works as ever, 5 evictions per opening — a soak's rooms
  for up to three starving 8-GPU jobs at once ask more, so the budget binds, and a leader
  killed or paused mid-window hands the rest of the opening to a replica that must know what
  was spent. Outside, make-room-now spends the UTC day's allowance (``URGENT_BUDGET_KEY``, the
  same limit of 5): hit in the first minutes of any soak, after which starved jobs wait for
  the next window (at most 60 s). A 1,000-cycle soak (about 15 minutes) sees some 8 openings.
  Each 201 eviction is charged to a budget key (see :meth:`Soak._budget` for the cycle-start
  leeway) and an overrun is more than the limit in one key, both replicas and all restarts
  together.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from scipy import stats

from tests.e2e import cluster as c
from tests.e2e.controlplane import (
    AssetsMissing,
    ControlPlane,
    Process,
    find_assets,
    spawn,
    start_control_plane,
    wait_for,
)
from tests.e2e.faultproxy import FaultProxy, FaultRates
from tests.e2e.kubelet import Kubelet, add_node
from tests.e2e.stage import HIGH
from tests.support.alertmanager import AlertmanagerServer, WebhookReceiver
from tests.support.binaries import free_port
from tests.support.broken_prometheus import BrokenPrometheus, Fault

NS = "soak"
SYSTEM = "defrag-system"
START_S = 60.0
"""How long a daemon has to answer /healthz once started (the extender half again, for
/readyz after its first list)."""
CHAOS_STARTED = "chaos-started"
"""The file in ``--out`` holding when the chaos began (ISO, UTC): where the RSS slope's
warm-up starts."""
REPLICAS = ("defrag", "defrag-2")  # ServiceAccount per replica (its identity too)
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM}/leases/defrag"
LEASE_S = 4
ALERT_TTL_S = 120
"""The daemons' ``alerts.ttl_s``: an alert no leader refreshes for this long lapses in
Alertmanager (resolved at the ``endsAt`` of its last refresh)."""
DRAIN_TAINT = "defrag.io/draining"
RESERVED = "defrag.io/reserved-for"
RESERVED_AT = "defrag.io/reserved-at"
# How long a mark still there when the drain ends may take to go: the reservation's timeout
# (execution.replacement_timeout_s) plus a leader cycle slowed by a loaded machine.
MARK_GRACE_S = 60.0
SIZES = (1, 2, 2, 4, 4, 6)

# The long memory soak (``--memory``): the soak's workloads and chaos keep to a pool of nodes
# labelled ``hot``; the rest of the fleet (``cold``) holds filler Deployments in their own
# namespace whose sizes change at a steady seeded rate (pods created and deleted).
POOL = "soak.defrag.io/pool"
FILL_NS = "soak-fill"
FILL_PER_DEPLOYMENT = 50
WARMUP_S = 900.0
"""RSS slopes of the memory soak are fitted from this long after the chaos began (the fleet
made, filled, the load and faults on)."""

# Execution windows that chaos makes bind (see the module docstring): one opens every 2 minutes
# (UTC) for 60 s, each with a fixed budget of WINDOW_BUDGET evictions; between them the
# make-room-now rule spends the day's out-of-window allowance (the same limit, per UTC day).
WINDOW_CRON = "*/2 * * * *"
WINDOW_PERIOD_S = 120
WINDOW_LENGTH_S = 60
WINDOW_BUDGET = 5
WINDOW_LEEWAY_S = 30.0
"""A cycle picks its window (its budget key) when it starts and may evict up to this long
after: an eviction is charged to a key some cycle start in [t - leeway, t] would have had."""
URGENT_KEY = "outside-windows/{day}"  # defrag/daemon/cycle.py URGENT_BUDGET_KEY

# Workloads nothing recreates: never to be evicted (the label says which kind each pod is).
NEVER = "soak.defrag.io/never-evict"
NEVER_KINDS = ("bare", "pod-owned", "configmap-owned", "ref-only", "job-backoff0", "job-backoff0")
NEVER_OWNER_CM = "nx-owner"
NEVER_OWNER_RS = "nx-rs"
NEVER_NODES = 3  # nodes the never-evict pods are spread over, two each
RECREATING = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})

# Node writes at RequestResponse (the resulting Node: its annotations, whether it is cordoned),
# every other request at Metadata, as the harness's policy.
SOAK_AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "RequestResponse",
            "verbs": ["create", "update", "patch"],
            "resources": [{"group": "", "resources": ["nodes"]}],
        },
        {"level": "Metadata"},
    ],
}

RULES = {
    "rules": [
        {
            "name": "high-priority-starved",
            "detector": "starvation",
            "severity": "critical",
            "action": "make-room-now",
            "for": "2s",
            "min_priority": 1000,
            "priority_classes": [HIGH],
        },
        {
            "name": "cluster-idle",
            "detector": "idle",
            "severity": "info",
            "action": "alert",
            "query": "avg(DCGM_FI_DEV_GPU_UTIL)",
            "threshold_pct": 20,
            "for": "1m",
            "step": "15s",
            "max_gap": "1m",
        },
    ]
}


def daemon_settings(
    prometheus: str, alertmanager: str, cycle_interval_s: float = 1.0, ready_max_age_s: float = 30
) -> dict[str, Any]:
    return {
        "scoring": {"policy": "reserve-binpack"},
        "execution": {"dry_run": False, "replacement_timeout_s": 8, "poll_interval_s": 0.5},
        "leadership": {"enabled": True, "lease_duration_s": LEASE_S},
        "daemon": {"cycle_interval_s": cycle_interval_s, "ready_max_age_s": ready_max_age_s},
        "planner": {"make_room_worth": 0},
        "windows": {
            "schedule": [{"cron": WINDOW_CRON, "length_s": WINDOW_LENGTH_S}],
            "max_evictions_per_window": WINDOW_BUDGET,
            "budget_follows_demand": False,
            "max_evictions_per_namespace": 100000,
            "max_evictions_per_node": 100000,
        },
        "prometheus": {"url": prometheus, "timeout_s": 3},
        "alerts": {"urls": [alertmanager], "resend_interval_s": 5, "ttl_s": ALERT_TTL_S},
        "logging": {"format": "json"},
    }


# --- the audit log, read as it grows ------------------------------------------------------------


class AuditTail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.events: list[dict[str, Any]] = []
        self._rest = b""

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self._rest + data
        lines = data.split(b"\n")
        self._rest = lines.pop()
        new = [json.loads(line) for line in lines if line.strip()]
        self.events.extend(e for e in new if kept(e))
        return new


def kept(event: dict[str, Any]) -> bool:
    """The audit events the invariants read (node and Lease writes, evictions, pod deletions):
    a soak of hours logs millions of others, which the harness need not hold."""
    ref = event.get("objectRef", {})
    resource, verb = ref.get("resource"), event.get("verb")
    if resource in ("nodes", "leases"):
        return verb in ("create", "update", "patch", "delete")
    return resource == "pods" and (ref.get("subresource") == "eviction" or verb == "delete")


def _age(reserved_at: str, now: float) -> str:
    """How old a reservation is at ``now`` (its ``reserved-at``), for the report."""
    try:
        return f"{now - stamp(reserved_at):.1f} s old"
    except ValueError:
        return "age unknown"


def stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


# --- processes -------------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    kubeconfig: Path
    settings: Path
    rules: Path
    port: int = 0
    process: Process | None = None
    incarnation: int = 0
    paused_until: float = 0.0
    scrapes: dict[int, dict[str, float]] = field(default_factory=dict)
    """incarnation → the last /metrics figures read from it."""
    rss: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, incarnation, VmRSS kB)."""


@dataclass
class Soak:
    seed: int
    cycles: int
    folder: Path
    nodes: int = 8
    drain_s: float = 45.0
    chaos_every_s: tuple[float, float] = (4.0, 9.0)
    rates: FaultRates = field(default_factory=FaultRates)
    max_wall_s: float = 7200.0
    verbose: bool = True
    memory: bool = False
    """The long memory soak: no SIGKILL of a daemon or the extender (SIGSTOP pauses stay),
    the workloads on a pool of ``pool`` nodes among ``nodes``, ``fill_pods`` filler pods on
    the rest with churn, Prometheus trickling, API answers trickled, RSS to ``out``/rss.csv
    every ``rss_every_s`` seconds, the daemons and the extender run through
    ``bench/soak_probe.py`` (object counts by type every ``probe_every_s``)."""
    pool: int = 8
    fill_pods: int = 0
    out: Path | None = None
    rss_every_s: float = 60.0
    probe_every_s: float = 600.0
    cycle_interval_s: float = 1.0
    replica_count: int = len(REPLICAS)
    defrag_env: tuple[tuple[str, str], ...] = ()
    """Environment for the daemons and the extender only (an allocator to try, say), not for
    the control plane or Prometheus."""

    @property
    def names(self) -> tuple[str, ...]:
        """The replicas this soak runs (one replica leads alone: its pauses leave no leader)."""
        return REPLICAS[: self.replica_count]

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.chaos_rng = random.Random(self.seed * 7919 + 1)
        self.replicas: dict[str, Replica] = {}
        self.chaos: Counter[str] = Counter()
        self.notes: list[str] = []
        self.pdb_log: dict[str, list[tuple[float, str, int, dict[str, str]]]] = defaultdict(list)
        """PDB name → (time, resourceVersion, disruptionsAllowed, selector) samples."""
        self.pod_labels: dict[str, dict[str, str]] = {}
        self.pod_state: dict[str, list[tuple[float, bool, bool]]] = defaultdict(list)
        """pod name → (time, bound, terminating) samples (the starving pods' history)."""
        self.prom_modes: list[tuple[float, str]] = []
        self.kills: list[tuple[float, str]] = []
        """(time, replica) of every SIGKILL: faults answered to a process just killed are
        seen by nobody."""
        self.stop = threading.Event()
        self.chaos_on = threading.Event()
        self.errors: list[str] = []
        self.deployments: dict[str, int] = {}  # name → GPUs per pod (live ones)
        self.jobs: dict[str, float] = {}  # high-priority job → time it was first seen Running
        self.serial = 0
        self.node_names: list[str] = []
        self.pod_node: dict[str, str] = {}
        """pod name → the node it was last seen bound to."""
        self.pod_owner: dict[str, tuple[str, str] | None] = {}
        """pod name → (kind, name) of its controlling owner (None: no controller)."""
        self.slots: list[dict[str, Any]] = [
            {"kind": kind, "name": "", "gpus": 1, "node": ""} for kind in NEVER_KINDS
        ]
        """The never-evict workloads kept running: each slot's current pod (or Job)."""
        self.never_created: Counter[str] = Counter()
        self.job_backoff: dict[str, int] = {}  # the soak's Jobs → backoffLimit
        self.harness_deleted: set[str] = set()
        """Never-evict pods (and their Jobs) the chaos itself deleted, with their node."""
        self.owner_uids: dict[str, str] = {}
        self.cold_nodes: list[str] = []
        self.fillers: dict[str, int] = {}  # filler Deployment → replicas asked
        self.churn: Counter[str] = Counter()
        self.rss_rows: list[tuple[float, str, int, int]] = []
        """(time, process, pid, VmRSS kB) sampled every ``rss_every_s`` (memory soak)."""
        self.started_at = time.time()
        self.chaos_started: float | None = None
        self.marks_at_end: list[str] | None = None
        if self.memory and self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)

    def say(self, text: str) -> None:
        if self.verbose:
            print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)

    # --- set-up --------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        # the node writes' bodies are in the audit log (the reservations), nothing else more
        from tests.e2e import controlplane

        policy = controlplane.AUDIT_POLICY
        controlplane.AUDIT_POLICY = SOAK_AUDIT_POLICY
        try:
            self.plane = start_control_plane(self.folder / "plane")
        finally:
            controlplane.AUDIT_POLICY = policy
        try:
            return self._run(started)
        finally:
            self.stop.set()
            for replica in self.replicas.values():
                if replica.process is not None:
                    replica.process.stop()
            with contextlib.suppress(Exception):
                self.proxy.stop()
            with contextlib.suppress(Exception):
                self.am.close()
            with contextlib.suppress(Exception):
                self.receiver.close()
            with contextlib.suppress(Exception):
                self.prom.stop()
            with contextlib.suppress(Exception):
                self.kubelet.stop()
            self.plane.stop()

    def _run(self, started: float) -> dict[str, Any]:
        plane = self.plane
        c.apply_rbac(plane)
        second_service_account(plane, REPLICAS[1])
        # pods take a moment to finish terminating, as with a real kubelet (grace period)
        self.kubelet = Kubelet(plane.admin, delete_delay_s=2.0).start()
        c.namespace(plane.admin, NS)
        c.priority_class(plane.admin, HIGH, 100000, preempt=False)
        if self.memory:
            self._add_fleet()
        else:
            for i in range(self.nodes):
                self._add_node(f"g{i + 1}")
        self.audit = AuditTail(plane.audit_log)
        self.proxy = FaultProxy(
            plane.server,
            plane.pki.ca,
            seed=self.seed,
            rates=self.rates,
            request_faults_for=set(REPLICAS),
        )
        self.proxy.start()
        self.receiver = WebhookReceiver()
        self.received: list[Notified] = []
        record = self.receiver._record

        def timed(payload: dict[str, Any]) -> None:
            for alert in payload.get("alerts", []):
                self.received.append(
                    (
                        time.time(),
                        str(alert.get("status")),
                        dict(alert.get("labels", {})),
                        ends_at(alert),
                    )
                )
            record(payload)

        self.receiver._record = timed  # type: ignore[method-assign]
        self.am = AlertmanagerServer(self.receiver.url)
        self.am.start()
        self.prom = BrokenPrometheus()
        self.prom.start()
        self.prom_modes.append((time.time(), "ok"))
        rules = self.folder / "rules"
        rules.mkdir(parents=True, exist_ok=True)
        c.write_yaml(rules / "soak.yaml", RULES)
        settings = c.write_yaml(
            self.folder / "daemon-settings.yaml",
            # a cycle at thousands of nodes on a loaded machine takes longer than 30 s at times
            daemon_settings(
                self.prom.url, self.am.url, self.cycle_interval_s, 120 if self.memory else 30
            ),
        )
        # the extender and kube-scheduler (the scheduler talks to the API directly)
        # tokens outlive the soak (the harness's default, 2 h, locked a 2 h soak's daemons out)
        lifetime = max(7200, int(self.max_wall_s + 3600))
        ext_token = plane.token(SYSTEM, "defrag-scheduler", seconds=lifetime)
        self.ext_kubeconfig = self.proxy.kubeconfig(
            self.folder / "extender.kubeconfig", ext_token, "extender"
        )
        self.ext_settings = c.write_yaml(
            self.folder / "extender-settings.yaml", {"scoring": {"policy": "reserve-binpack"}}
        )
        self.ext_port = free_port()
        self._start_extender()
        sched_kc = plane.service_account_kubeconfig(SYSTEM, "defrag-scheduler")
        plane.start_scheduler(c.scheduler_config(self.ext_port, True), sched_kc, "kube-scheduler")
        for name in self.names:
            token = plane.token(SYSTEM, name, seconds=lifetime)
            kc = self.proxy.kubeconfig(self.folder / f"{name}.kubeconfig", token, name)
            self.replicas[name] = Replica(name, kc, settings, rules)
            self._start_replica(self.replicas[name])
        # the never-evict workloads first (old enough by the time rooms are made), some load,
        # then faults and chaos
        self._never_setup()
        self._keep_never()
        while self._used() < 8 * len(self.node_names) * 0.75:
            self._arrive()
        if self.memory:
            self._fill_fleet()
        self.proxy.enabled = True
        self.chaos_on.set()
        self.chaos_started = time.time()
        if self.memory and self.out is not None:  # soak_plot's --since, read from beside rss.csv
            stamp = datetime.fromtimestamp(self.chaos_started, UTC).isoformat(timespec="seconds")
            (self.out / CHAOS_STARTED).write_text(stamp + "\n")
        loops = [self._workload_loop, self._chaos_loop, self._observe_loop, self._keeper_loop]
        if self.memory:
            loops += [self._fleet_churn_loop, self._rss_loop]
        threads = [threading.Thread(target=self._guard(loop), daemon=True) for loop in loops]
        for t in threads:
            t.start()
        self.say(
            f"running to {self.cycles} cycles or {self.max_wall_s:.0f} s "
            f"(seed {self.seed}, {self.nodes} nodes)"
        )
        last_said = 0
        while True:
            done = self.total_cycles()
            if done >= self.cycles or time.monotonic() - started > self.max_wall_s:
                break
            if done - last_said >= (500 if self.memory else 50):
                self.say(
                    f"{done} cycles, faults {dict(self.proxy.counts)}, chaos {dict(self.chaos)}"
                    + (f", churn {dict(self.churn)}" if self.memory else "")
                )
                last_said = done
            if self.errors:
                raise RuntimeError(f"soak harness failed: {self.errors[0]}")
            time.sleep(1)
        chaos_wall = time.monotonic() - started
        # stop the chaos, heal everything, run clean
        self.say("chaos off; draining")
        self.chaos_on.clear()
        self.proxy.enabled = False
        self._heal()
        time.sleep(self.drain_s)
        # A room made in the drain's last seconds is a drain under way, not something left: it
        # gets time to be taken or to time out and be released by the leader's next cycle, which
        # on a loaded machine can take tens of seconds. A job still pending gets its room in
        # that time too (a room made after the marks were read would be one under way). What
        # marks a node when both are done, or at the deadline, counts.
        deadline = time.monotonic() + max(self.drain_s, MARK_GRACE_S)
        while (self._marked_nodes() or self._pending_jobs()) and time.monotonic() < deadline:
            time.sleep(0.5)
        self.marks_at_end = self._marks()
        self.stop.set()
        for t in threads:
            t.join(timeout=30)
        self._observe_once()
        for replica in self.replicas.values():
            self._scrape(replica)
        report = self.check()
        report["wall_s"] = round(time.monotonic() - started, 1)
        report["chaos_wall_s"] = round(chaos_wall, 1)
        if self.memory:
            report["memory"] = self._memory_report()
        return report

    def _guard(self, fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except Exception as exc:  # the harness's own failure ends the soak
                self.errors.append(f"{fn.__name__}: {type(exc).__name__}: {exc}")
                raise

        return run

    def _add_node(self, short: str) -> None:
        name = f"{NS}-{short}"
        if self.memory:
            add_node(self.plane.admin, name, 8, labels={POOL: "hot"})
        else:
            add_node(self.plane.admin, name, 8)
        self.node_names.append(name)

    # --- the memory soak's fleet ---------------------------------------------------------

    def _add_fleet(self) -> None:
        """``pool`` hot nodes (the soak's workloads and chaos), the rest cold (filler), made
        by four threads (a node is four requests)."""
        from concurrent.futures import ThreadPoolExecutor

        for i in range(self.pool):
            self._add_node(f"g{i + 1}")
        cold = [f"{NS}-c{i + 1}" for i in range(self.nodes - self.pool)]

        def one(name: str) -> None:
            add_node(self.plane.admin, name, 8, labels={POOL: "cold"})

        t0 = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            for n, _ in enumerate(pool.map(one, cold), 1):
                if n % 1000 == 0:
                    self.say(f"{n} cold nodes ({time.monotonic() - t0:.0f} s)")
        self.cold_nodes = cold
        self.say(f"{self.nodes} nodes ({self.pool} hot) in {time.monotonic() - t0:.0f} s")

    def _fill_fleet(self) -> None:
        """Filler Deployments of 1-GPU pods on the cold nodes, ``FILL_PER_DEPLOYMENT`` pods
        each, until ``fill_pods`` are bound (or 20 minutes)."""
        c.namespace(self.plane.admin, FILL_NS)
        count = max(1, -(-self.fill_pods // FILL_PER_DEPLOYMENT))
        for i in range(count):
            name = f"fill-{i + 1}"
            self._deployment(FILL_NS, name, 1, FILL_PER_DEPLOYMENT, pool="cold")
            self.fillers[name] = FILL_PER_DEPLOYMENT
        t0 = time.monotonic()
        bound = 0
        while time.monotonic() - t0 < 1200:
            pods = self.plane.admin.get(f"/api/v1/namespaces/{FILL_NS}/pods")["items"]
            bound = sum(1 for p in pods if p["spec"].get("nodeName"))
            if bound >= self.fill_pods * 0.98:
                break
            self.say(f"filler pods bound: {bound} / {self.fill_pods}")
            time.sleep(15)
        self.say(f"{bound} filler pods bound in {time.monotonic() - t0:.0f} s")

    def _fleet_churn_loop(self) -> None:
        """Every 5-15 s (seeded) one filler Deployment resized to 30-70 pods: on average
        some 10 pods created or deleted each time, the fleet's size steady."""
        rng = random.Random(self.seed * 104729 + 3)
        while not self.stop.is_set():
            time.sleep(rng.uniform(5.0, 15.0))
            if not self.chaos_on.is_set() or not self.fillers:
                continue
            name = rng.choice(sorted(self.fillers))
            replicas = rng.randint(30, 70)
            with contextlib.suppress(requests.RequestException):
                self.plane.admin.patch(
                    f"/apis/apps/v1/namespaces/{FILL_NS}/deployments/{name}",
                    {"spec": {"replicas": replicas}},
                )
                delta = replicas - self.fillers[name]
                self.churn["created" if delta > 0 else "deleted"] += abs(delta)
                self.churn["resizes"] += 1
                self.fillers[name] = replicas

    def _watched_processes(self) -> dict[str, int]:
        """name → PID of every process whose RSS the memory soak records."""
        out = {}
        for name, replica in self.replicas.items():
            if replica.process is not None and replica.process.alive():
                out[f"daemon-{name}"] = replica.process.proc.pid
        with contextlib.suppress(AttributeError):
            if self.extender.process.alive():
                out["extender"] = self.extender.process.proc.pid
        for name in ("kube-apiserver", "etcd"):
            proc = self.plane.processes.get(name)
            if proc is not None and proc.alive():
                out[name] = proc.proc.pid
        out["harness"] = os.getpid()
        return out

    def _rss_loop(self) -> None:
        """VmRSS of each watched process every ``rss_every_s``, appended to rss.csv as it goes
        (a soak cut short keeps what it sampled), and a progress line beside it."""
        folder = self.out or self.folder
        csv = folder / "rss.csv"
        if not csv.exists():
            csv.write_text("time_utc,elapsed_s,process,pid,rss_kb\n")
        while not self.stop.is_set():
            now = time.time()
            rows = []
            for name, pid in self._watched_processes().items():
                with contextlib.suppress(OSError, ValueError):
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            kb = int(line.split()[1])
                            rows.append((now, name, pid, kb))
            self.rss_rows.extend(rows)
            with csv.open("a") as f:
                for t, name, pid, kb in rows:
                    f.write(f"{iso(t)},{t - self.started_at:.0f},{name},{pid},{kb}\n")
            progress = {
                "time": iso(now),
                "elapsed_s": round(now - self.started_at),
                "cycles": self.total_cycles(),
                "faults": dict(self.proxy.counts),
                "chaos": dict(self.chaos),
                "churn": dict(self.churn),
                "load": os.getloadavg(),
                "rss_kb": {name: kb for _, name, _, kb in rows},
            }
            with (folder / "progress.jsonl").open("a") as f:
                f.write(json.dumps(progress) + "\n")
            self.stop.wait(self.rss_every_s)

    def _memory_report(self) -> dict[str, Any]:
        """Per process: RSS slope (least squares, kB/min) after the first ``WARMUP_S``, and
        what grew most in each probed process's object counts (first probe after the warm-up
        against the last)."""
        since = self.chaos_started or self.started_at
        out: dict[str, Any] = {"rss": long_rss_figures(self.rss_rows, since)}
        growth = {}
        for path in sorted((self.out or self.folder).glob("objects-*.jsonl")):
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            after = [x for x in lines if x["time"] - since >= WARMUP_S] or lines
            if len(after) >= 2:
                a, b = after[0]["types"], after[-1]["types"]
                diff = {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b)}
                top = sorted(diff.items(), key=lambda kv: -kv[1])[:10]
                growth[path.stem.removeprefix("objects-")] = {
                    "minutes": round((after[-1]["time"] - after[0]["time"]) / 60, 1),
                    "grew_most": dict(top),
                }
        out["objects"] = growth
        out["churn"] = dict(self.churn)
        out["nodes"] = {"hot": len(self.node_names), "cold": len(self.cold_nodes)}
        return out

    def _command(self, who: str) -> tuple[list[str], dict[str, str]]:
        """How to start ``defrag``: the command, or in the memory soak the probe around it."""
        if not self.memory:
            return [c.defrag_path()], dict(self.defrag_env)
        env = {
            **dict(self.defrag_env),
            "SOAK_PROBE_FILE": str((self.out or self.folder) / f"objects-{who}.jsonl"),
            "SOAK_PROBE_EVERY_S": str(self.probe_every_s),
            "SOAK_PROBE_PEAKS_FILE": str((self.out or self.folder) / f"peaks-{who}.jsonl"),
            "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
            ),
        }
        return [sys.executable, "-m", "bench.soak_probe"], env

    def _start_extender(self) -> None:
        metrics = free_port()
        command, env = self._command("extender")
        proc = spawn(
            "defrag-extender",
            [
                *command, "extender", "--kubeconfig", str(self.ext_kubeconfig),
                "--host", "127.0.0.1", "--port", str(self.ext_port),
                "--metrics-port", str(metrics), "--metrics-host", "127.0.0.1",
                "--settings", str(self.ext_settings),
            ],
            self.plane.folder,
            env=env,
        )  # fmt: skip
        self.plane.processes["defrag-extender"] = proc
        self.extender = c.Served(proc, metrics)
        c.wait_ready(proc, metrics, timeout_s=1.5 * START_S)

    def _start_replica(self, replica: Replica) -> None:
        replica.port = free_port()
        replica.incarnation += 1
        name = f"daemon-{replica.name}"
        command, env = self._command(replica.name)
        replica.process = spawn(
            name,
            [
                *command, "run", "--kubeconfig", str(replica.kubeconfig),
                "--settings", str(replica.settings), "--rules", str(replica.rules),
            ],
            self.plane.folder,
            env={
                "DEFRAG_HTTP__PORT": str(replica.port),
                "DEFRAG_HTTP__HOST": "127.0.0.1",
                "DEFRAG_LEADERSHIP__IDENTITY": replica.name,
                **env,
            },
        )  # fmt: skip
        self.plane.processes[name] = replica.process
        port = replica.port
        wait_for(
            name,
            lambda: requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok,
            START_S,
            replica.process,
        )

    # --- the workload stream -------------------------------------------------------------

    def _workload_loop(self) -> None:
        while not self.stop.is_set():
            time.sleep(self.rng.uniform(1.0, 3.0))
            if self.stop.is_set():
                return
            with contextlib.suppress(requests.RequestException):
                self._workload_step()

    def _used(self) -> int:
        return sum(self.deployments.values()) + sum(s["gpus"] for s in self.slots)

    # --- workloads nothing recreates: never to be evicted ---------------------------------

    def _never_setup(self) -> None:
        """The owners the never-evict pods name: a ConfigMap, and a ReplicaSet of 0 replicas
        whose selector matches none of them (a non-controlling reference to a ReplicaSet)."""
        api = self.plane.admin
        cm = api.post(
            f"/api/v1/namespaces/{NS}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NEVER_OWNER_CM}},
        )
        self.owner_uids["ConfigMap"] = cm["metadata"]["uid"]
        nothing = {"app": f"{NEVER_OWNER_RS}-matches-nothing"}
        rs = api.post(
            f"/apis/apps/v1/namespaces/{NS}/replicasets",
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": NEVER_OWNER_RS},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": nothing},
                    "template": {"metadata": {"labels": nothing}, "spec": c.pod_spec(0)},
                },
            },
        )
        self.owner_uids["ReplicaSet"] = rs["metadata"]["uid"]

    def _keeper_loop(self) -> None:
        while not self.stop.is_set():
            time.sleep(3.0)
            with contextlib.suppress(requests.RequestException):
                self._keep_never()

    def _keep_never(self) -> None:
        """Each slot's workload running: one gone (evicted, deleted with its node, its Job
        failed) is replaced under a new name."""
        api = self.plane.admin
        live = {
            p["metadata"]["name"]: p
            for p in c.pods(api, NS, NEVER)
            if not p["metadata"].get("deletionTimestamp")
        }
        jobs = {
            j["metadata"]["name"]: j
            for j in api.get(f"/apis/batch/v1/namespaces/{NS}/jobs")["items"]
        }
        bare = next((s for s in self.slots if s["kind"] == "bare"), None)
        for slot in self.slots:
            kind, name = slot["kind"], slot["name"]
            if kind == "job-backoff0":
                job = jobs.get(name)
                finished = job is not None and any(
                    cond.get("type") in ("Failed", "Complete") and cond.get("status") == "True"
                    for cond in job.get("status", {}).get("conditions", [])
                )
                if job is not None and not finished:
                    continue
            elif name in live:
                continue
            owners: list[dict[str, Any]] = []
            if kind == "pod-owned":
                owner = live.get(bare["name"]) if bare else None
                if owner is None:
                    continue  # next time, once the bare pod runs again
                owners = [{"apiVersion": "v1", "kind": "Pod", "name": owner["metadata"]["name"],
                           "uid": owner["metadata"]["uid"], "controller": True}]  # fmt: skip
            elif kind == "configmap-owned":
                owners = [{"apiVersion": "v1", "kind": "ConfigMap", "name": NEVER_OWNER_CM,
                           "uid": self.owner_uids["ConfigMap"], "controller": True}]  # fmt: skip
            elif kind == "ref-only":
                owners = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": NEVER_OWNER_RS,
                           "uid": self.owner_uids["ReplicaSet"]}]  # fmt: skip
            self.serial += 1
            slot["name"] = f"nx-{kind}-{self.serial}"
            self._never_place(slot)
            self._never_create(kind, slot["name"], slot["gpus"], owners, slot["node"])
            self.never_created[kind] += 1
            if kind == "bare":
                live[slot["name"]] = api.get(f"/api/v1/namespaces/{NS}/pods/{slot['name']}")

    def _never_place(self, slot: dict[str, Any]) -> None:
        """Two slots a node, on NEVER_NODES nodes: left alone, the binpacking scheduler puts
        them all on one node, which no room would choose; here each shares its node with the
        Deployments, so a room there is as cheap as anywhere (before the others' pods count),
        and most nodes stay free of them, so rooms can still be made once they are unmovable.
        A slot whose node is gone moves to the live node with the fewest slots."""
        nodes = list(self.node_names)
        if slot["node"] in nodes or not nodes:
            return
        held = Counter(s["node"] for s in self.slots if s["node"] in nodes)
        spread = nodes[:NEVER_NODES] if len(held) < NEVER_NODES else sorted(held)
        slot["node"] = min(spread, key=lambda n: (held[n], nodes.index(n)))

    def _never_create(
        self, kind: str, name: str, gpus: int, owners: list[dict[str, Any]], node: str
    ) -> None:
        labels = {"app": name, NEVER: kind}
        spec = c.pod_spec(gpus)
        if node:  # the scheduler still places it (GPUs counted), on that node only
            term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
            spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [term]}]
                    }
                }
            }
        api = self.plane.admin
        if kind == "job-backoff0":
            self.job_backoff[name] = 0
            api.post(
                f"/apis/batch/v1/namespaces/{NS}/jobs",
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": name, "labels": labels},
                    "spec": {
                        "backoffLimit": 0,
                        "completions": 1,
                        "parallelism": 1,
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {**spec, "restartPolicy": "Never"},
                        },
                    },
                },
            )
            return
        meta: dict[str, Any] = {"name": name, "labels": labels}
        if owners:
            meta["ownerReferences"] = owners
        api.post(
            f"/api/v1/namespaces/{NS}/pods",
            {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec},
        )

    def _workload_step(self) -> None:
        if not self.chaos_on.is_set():  # draining: nothing new arrives, running jobs complete
            for name, since in list(self.jobs.items()):
                if since and time.time() - since > 5:
                    self._delete_deployment(name)
                    self.jobs.pop(name, None)
            return
        capacity = 8 * len(self._live_nodes())
        x = self.rng.random()
        if x < 0.3 and len(self.jobs) < 3:
            self.serial += 1
            name = f"job-{self.serial}"
            self._deployment(NS, name, 8, priority_class_name=HIGH)
            self.jobs[name] = 0.0
            return
        # jobs complete some seconds after they run
        for name, since in list(self.jobs.items()):
            if since and time.time() - since > self.rng.uniform(5, 20):
                self._delete_deployment(name)
                self.jobs.pop(name, None)
                return
        if self._used() < capacity * 0.85 and x < 0.8:
            self._arrive()
        elif self.deployments:
            name = self.rng.choice(sorted(self.deployments))
            if self.rng.random() < 0.5:  # scaled to 0, then deleted
                self.plane.admin.patch(
                    f"/apis/apps/v1/namespaces/{NS}/deployments/{name}", {"spec": {"replicas": 0}}
                )
            self._delete_deployment(name)
            self.deployments.pop(name, None)

    def _arrive(self) -> None:
        self.serial += 1
        gpus = self.rng.choice(SIZES)
        name = f"w{gpus}-{self.serial}"
        self._deployment(NS, name, gpus)
        self.deployments[name] = gpus

    def _deployment(
        self,
        ns: str,
        name: str,
        gpus: int,
        replicas: int = 1,
        priority_class_name: str | None = None,
        pool: str = "hot",
    ) -> None:
        """A Deployment (tests/e2e/cluster.py's shape); in the memory soak kept to its pool."""
        if not self.memory:
            c.deployment(
                self.plane.admin, ns, name, gpus, replicas, priority_class_name=priority_class_name
            )
            return
        labels = {"app": name}
        spec = c.pod_spec(gpus, priority_class_name)
        spec["nodeSelector"] = {POOL: pool}
        self.plane.admin.post(
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": spec},
                },
            },
        )

    def _delete_deployment(self, name: str) -> None:
        self.plane.admin.delete(
            f"/apis/apps/v1/namespaces/{NS}/deployments/{name}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
        )

    def _live_nodes(self) -> list[str]:
        return list(self.node_names)

    # --- chaos ---------------------------------------------------------------------------

    def _chaos_loop(self) -> None:
        kills = 0 if self.memory else 1  # the memory soak restarts no process it measures
        actions = [
            ("leader-kill", 3 * kills, self._kill_leader),
            ("leader-pause", 3, self._pause_leader),
            ("extender-kill", 1 * kills, self._kill_extender),
            ("prometheus", 2, self._prometheus_fault),
            ("alertmanager-restart", 1, self._restart_alertmanager),
            ("pdb", 3, self._pdb_change),
            ("pod-delete", 3, self._delete_pod),
            ("node-cordon", 1, self._cordon_node),
            ("node-delete", 1, self._delete_node),
            ("hold-terminating", 2, self._hold),
        ]
        weights = [w for _, w, _ in actions]
        while not self.stop.is_set():
            time.sleep(self.chaos_rng.uniform(*self.chaos_every_s))
            if not self.chaos_on.is_set():
                continue
            kind, _, act = self.chaos_rng.choices(actions, weights)[0]
            try:
                if act() is not False:
                    self.chaos[kind] += 1
            except requests.RequestException as exc:
                self.notes.append(f"chaos {kind}: {exc}")

    def leader(self) -> Replica | None:
        with contextlib.suppress(requests.RequestException, KeyError):
            holder = self.plane.admin.get(LEASE)["spec"].get("holderIdentity")
            return self.replicas.get(str(holder))
        return None

    def _kill_leader(self) -> bool:
        replica = self.leader()
        if replica is None or replica.process is None or not replica.process.alive():
            return False
        self._scrape(replica)
        self.kills.append((time.time(), replica.name))
        replica.process.proc.kill()
        replica.process.proc.wait()
        time.sleep(self.chaos_rng.uniform(0.5, 3.0))
        self._start_replica(replica)
        return True

    def _pause_leader(self) -> bool:
        replica = self.leader()
        if replica is None or replica.process is None or not replica.process.alive():
            return False
        self._scrape(replica)
        os.kill(replica.process.proc.pid, signal.SIGSTOP)
        replica.paused_until = time.time() + LEASE_S + 3
        # past its Lease (the other replica takes over), then it wakes up
        time.sleep(LEASE_S + self.chaos_rng.uniform(2.0, 5.0))
        os.kill(replica.process.proc.pid, signal.SIGCONT)
        replica.paused_until = 0.0
        return True

    def _kill_extender(self) -> bool:
        # as for a replica: a watch dropped just before the kill may never reach its log
        self.kills.append((time.time(), "extender"))
        self.extender.process.proc.kill()
        self.extender.process.proc.wait()
        time.sleep(self.chaos_rng.uniform(0.5, 3.0))
        self._start_extender()
        return True

    def _prometheus_fault(self) -> bool:
        modes = ["refused", "garbage", "500"] + (["trickle", "refused"] if self.memory else [])
        mode = self.chaos_rng.choice(modes)
        self.prom_modes.append((time.time(), mode))
        if mode == "refused":
            self.prom.stop()
        elif mode == "garbage":
            self.prom.set(Fault("body", body="<html>not prometheus</html>"))
        elif mode == "trickle":  # a byte every 20-200 ms: some answers end in time, most not
            interval = self.chaos_rng.uniform(0.02, 0.2)
            self.prom.set(Fault("trickle", interval_s=interval, trickle_bytes=60))
        else:
            self.prom.set(Fault("status"))
        # the memory soak's Prometheus stays down for minutes at times
        longest = 120.0 if self.memory else 10.0
        time.sleep(self.chaos_rng.uniform(3.0, longest))
        if mode == "refused":
            self.prom.start()
        self.prom.set(Fault())
        self.prom_modes.append((time.time(), "ok"))
        return True

    def _restart_alertmanager(self) -> bool:
        self.am.stop()
        time.sleep(self.chaos_rng.uniform(1.0, 5.0))
        self.am.start()
        return True

    def _pdb_change(self) -> bool:
        api = self.plane.admin
        existing = api.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets")["items"]
        if existing and self.chaos_rng.random() < 0.5:
            victim = self.chaos_rng.choice(existing)["metadata"]["name"]
            api.delete(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/{victim}")
            return True
        if not self.deployments:
            return False
        name = self.chaos_rng.choice(sorted(self.deployments))
        with contextlib.suppress(requests.HTTPError):  # already there
            api.post(
                f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": {"name": name},
                    "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": name}}},
                },
            )
        return True

    def _running_pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in c.pods(self.plane.admin, NS)
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        ]

    def _delete_pod(self) -> bool:
        # Prefer the pods a plan is about to move: those on a node being drained or a node
        # the planner would free, else any.
        # (not the never-evict pods: what counts is whether defrag evicts them)
        pods = [p for p in self._running_pods() if NEVER not in p["metadata"].get("labels", {})]
        if not pods:
            return False
        draining = set(self._marked_nodes())
        near = [p for p in pods if p["spec"]["nodeName"] in draining] or pods
        pod = self.chaos_rng.choice(near)
        self.plane.admin.delete(f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}")
        return True

    def _marked_nodes(self) -> list[str]:
        return list(self._node_marks())

    def _pending_jobs(self) -> list[str]:
        """The soak's high-priority jobs not yet running (their rooms are still to come)."""
        return [name for name, since in list(self.jobs.items()) if not since]

    def _marks(self) -> list[str]:
        """Every drain taint and reservation on a node, with the reservation's age."""
        return [mark for marks in self._node_marks().values() for mark in marks]

    def _node_marks(self) -> dict[str, list[str]]:
        """The marked nodes, each with its drain taint and reservation (with its age)."""
        checked = time.time()
        found: dict[str, list[str]] = {}
        for node in self.plane.admin.get("/api/v1/nodes")["items"]:
            name = node["metadata"]["name"]
            keys = [t["key"] for t in node["spec"].get("taints", [])]
            notes = node["metadata"].get("annotations", {})
            marks = [f"{name}: taint {DRAIN_TAINT}"] if DRAIN_TAINT in keys else []
            if RESERVED in notes:
                at = notes.get(RESERVED_AT, "")
                marks.append(
                    f"{name}: annotation {RESERVED} "
                    f"({notes[RESERVED]}, {RESERVED_AT} {at or 'missing'}, {_age(at, checked)})"
                )
            if marks:
                found[name] = marks
        return found

    def _cordon_node(self) -> bool:
        marked = self._marked_nodes()
        node = self.chaos_rng.choice(marked or self.node_names)
        path = f"/api/v1/nodes/{node}"
        self.plane.admin.patch(path, {"spec": {"unschedulable": True}})
        time.sleep(self.chaos_rng.uniform(2.0, 6.0))
        with contextlib.suppress(requests.HTTPError):
            self.plane.admin.patch(path, {"spec": {"unschedulable": None}})
        return True

    def _delete_node(self) -> bool:
        marked = [n for n in self._marked_nodes() if n in self.node_names]
        if len(self.node_names) <= 4:
            return False
        node = self.chaos_rng.choice(marked or self.node_names)
        self.node_names.remove(node)
        self.plane.admin.delete(f"/api/v1/nodes/{node}")
        # its pods would be gone with their kubelet: delete them, as the pod GC would
        for pod in c.pods(self.plane.admin, NS):
            if pod["spec"].get("nodeName") == node:
                labels = pod["metadata"].get("labels", {})
                if NEVER in labels:  # its Job fails by the harness's hand, not defrag's
                    self.harness_deleted.add(pod["metadata"]["name"])
                    self.harness_deleted.add(labels.get("job-name", ""))
                self.plane.admin.delete(
                    f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}",
                    {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                )
        time.sleep(self.chaos_rng.uniform(1.0, 4.0))
        self.serial += 1
        self._add_node(f"n{self.serial}")
        return True

    def _hold(self) -> bool:
        pods = self._running_pods()
        if not pods:
            return False
        pod = self.chaos_rng.choice(pods)
        prefix = f"{NS}/{pod['metadata']['labels']['app']}-"
        self.kubelet.hold.add(prefix)
        time.sleep(self.chaos_rng.uniform(3.0, 10.0))
        self.kubelet.release([prefix])
        return True

    def _heal(self) -> None:
        """Everything back: Prometheus answering, Alertmanager up, nothing held or paused."""
        deadline = time.time() + 30
        while any(r.paused_until for r in self.replicas.values()) and time.time() < deadline:
            time.sleep(0.2)
        self.kubelet.release(list(self.kubelet.hold))
        self.prom.set(Fault())
        with contextlib.suppress(Exception):
            self.prom.start()
        with contextlib.suppress(Exception):
            self.am.start()
        for node in self.plane.admin.get("/api/v1/nodes")["items"]:
            if node["spec"].get("unschedulable"):
                self.plane.admin.patch(
                    f"/api/v1/nodes/{node['metadata']['name']}", {"spec": {"unschedulable": None}}
                )
        for replica in self.replicas.values():
            if replica.process is not None and not replica.process.alive():
                self._start_replica(replica)

    # --- observation -------------------------------------------------------------------------

    def _observe_loop(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(requests.RequestException):
                self._observe_once()
            time.sleep(2.0 if self.memory else 0.25)

    def _observe_once(self) -> None:
        now = time.time()
        api = self.plane.admin
        for pdb in api.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets")["items"]:
            log = self.pdb_log[pdb["metadata"]["name"]]
            rv = pdb["metadata"]["resourceVersion"]
            allowed = int(pdb.get("status", {}).get("disruptionsAllowed", 0))
            selector = pdb["spec"].get("selector", {}).get("matchLabels", {})
            if (pdb.get("status", {}).get("observedGeneration") or 0) < pdb["metadata"].get(
                "generation", 1
            ):
                allowed = 0  # not computed yet: the API server refuses evictions on it
            log.append((now, rv, allowed, selector))
        for pod in c.pods(api, NS):
            name = pod["metadata"]["name"]
            self.pod_labels.setdefault(name, pod["metadata"].get("labels", {}))
            if pod["spec"].get("nodeName"):
                self.pod_node[name] = pod["spec"]["nodeName"]
            if name not in self.pod_owner:
                refs = pod["metadata"].get("ownerReferences", [])
                ctl = next((r for r in refs if r.get("controller")), None)
                self.pod_owner[name] = (ctl["kind"], ctl["name"]) if ctl else None
            app = pod["metadata"].get("labels", {}).get("app", "")
            if app.startswith("job-"):
                bound = bool(pod["spec"].get("nodeName"))
                self.pod_state[name].append(
                    (now, bound, bool(pod["metadata"].get("deletionTimestamp")))
                )
                running = bound and pod["status"].get("phase") == "Running"
                if running and app in self.jobs and not self.jobs[app]:
                    self.jobs[app] = now
        self.audit.read()
        for replica in self.replicas.values():
            self._scrape(replica)

    def _scrape(self, replica: Replica) -> None:
        proc = replica.process
        if proc is None or not proc.alive() or replica.paused_until:
            return
        with contextlib.suppress(requests.RequestException):
            text = requests.get(f"http://127.0.0.1:{replica.port}/metrics", timeout=2).text
            replica.scrapes[replica.incarnation] = parse_metrics(text)
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    replica.rss.append((time.time(), replica.incarnation, int(line.split()[1])))

    def total_cycles(self) -> int:
        return int(sum(metric_sum(s, "defrag_cycles_total") for r in self.replicas.values()
                       for s in r.scrapes.values()))  # fmt: skip

    # --- the invariants ------------------------------------------------------------------------

    def check(self) -> dict[str, Any]:
        events = self.audit.events
        users = {c.sa_user(SYSTEM, name): name for name in REPLICAS}
        evictions = [
            e
            for e in events
            if e["user"].get("username", "") in users
            and e["verb"] == "create"
            and e.get("objectRef", {}).get("subresource") == "eviction"
            # the executor's preflight (a server-side dry run) evicts nothing
            and "dryRun=All" not in e.get("requestURI", "")
        ]
        ok = [e for e in evictions if e["responseStatus"]["code"] == 201]
        codes = Counter(e["responseStatus"]["code"] for e in evictions)
        # 1. pods evicted twice
        per_pod: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in ok:
            per_pod[e["objectRef"]["name"]].append(e)
        twice = {n: es for n, es in per_pod.items() if len(es) > 1}
        retried = sum(
            1
            for es in twice.values()
            if len({e["user"].get("username", "") for e in es}) == 1
            and stamp(es[-1]["requestReceivedTimestamp"]) - stamp(es[0]["stageTimestamp"]) < 60
        )
        # 2. PDB violations: a 201 while a PDB over the pod allowed no disruption, read both
        # before and after the eviction at the same resourceVersion
        pdb_violations = []
        for e in ok:
            name = e["objectRef"]["name"]
            if per_pod[name][0] is not e:
                continue  # a second eviction of a terminating pod skips the PDB; counted above
            labels = self.pod_labels.get(name, {})
            t = stamp(e["stageTimestamp"])
            for pdb, log in self.pdb_log.items():
                before = [s for s in log if s[0] <= t]
                after = [s for s in log if s[0] > t]
                if not before or not after:
                    continue
                b, a = before[-1], after[0]
                covered = b[3] and all(labels.get(k) == v for k, v in b[3].items())
                if covered and b[2] == 0 and a[1] == b[1]:
                    pdb_violations.append(f"{name} under {pdb} at {e['stageTimestamp']}")
        # 3. evictions by a replica that did not hold the Lease (from the Lease writes)
        lease_writes = sorted(
            (
                (
                    stamp(e["requestReceivedTimestamp"]),
                    stamp(e["stageTimestamp"]),
                    users[e["user"].get("username", "")],
                )
                for e in events
                if e["user"].get("username", "") in users
                and e["verb"] in ("update", "create")
                and e.get("objectRef", {}).get("resource") == "leases"
                and e.get("objectRef", {}).get("subresource") is None
                and e["responseStatus"]["code"] in (200, 201)
            ),
            key=lambda w: w[1],
        )  # fmt: skip
        not_leader = []
        for e in ok:
            who = users[e["user"].get("username", "")]
            t_in, t_done = stamp(e["requestReceivedTimestamp"]), stamp(e["stageTimestamp"])
            last = [w for w in lease_writes if w[1] <= t_in]
            if not last or last[-1][2] != who or t_done > held_until(lease_writes, last[-1]):
                holder = last[-1][2] if last else "nobody"
                not_leader.append(
                    f"{who} evicted {e['objectRef']['name']} at {e['stageTimestamp']} "
                    f"(holder {holder})"
                )
        # 4. marks left on the nodes, read when the drain had ended (the daemons still run, so
        # a room made since is one under way)
        leftovers = self.marks_at_end if self.marks_at_end is not None else self._marks()
        # 5. alerts resolved then fired again for a finding that never cleared
        refired = self._refires()
        # 6. tracebacks in any log
        tracebacks = []
        for path in sorted(self.plane.folder.glob("*.log")):
            text = path.read_text(errors="replace")
            if "Traceback" in text:
                tracebacks.append(path.name)
        # 7. faults visible
        visibility = self._visibility()
        # 8. evictions of pods nothing recreates, and the soak's Jobs failed for it
        not_returning, unseen = self._not_returning(ok)
        jobs_failed = self._jobs_backoff_exceeded()
        # 9. a second room for a pod while its first stands or still empties
        rooms, second, excused = self._second_rooms(events, ok)
        # 10. more evictions in one window opening (or out-of-window day) than its budget
        budget = self._budget(ok)
        # 11. RSS
        rss = {name: rss_figures(r.rss) for name, r in self.replicas.items()}
        cycles_by = {
            name: int(sum(metric_sum(s, "defrag_cycles_total") for s in r.scrapes.values()))
            for name, r in self.replicas.items()
        }
        leader_cycles = sum(self._log_count(name, "cycle (leader") for name in self.names)
        buckets = merged_buckets(
            [s for r in self.replicas.values() for s in r.scrapes.values()],
            "defrag_cycle_duration_seconds_bucket",
        )
        violations = {
            "pdb_violations": len(pdb_violations),
            "pods_evicted_twice": len(twice),
            "evictions_without_lease": len(not_leader),
            "marks_left": len(leftovers),
            "alerts_refired": len(refired),
            "tracebacks": len(tracebacks),
            "faults_not_visible": sum(1 for v in visibility.values() if not v["visible"]),
            "evictions_not_returning": len(not_returning),
            "jobs_backoff_exceeded": len(jobs_failed),
            "second_rooms": len(second),
            "budget_overruns": budget["overruns"],
        }
        return {
            "seed": self.seed,
            "cycles": sum(cycles_by.values()),
            "cycles_by_replica": cycles_by,
            "leader_cycles": leader_cycles,
            "leader_cycles_by_replica": {
                name: self._log_count(name, "cycle (leader") for name in self.names
            },
            "evictions_201": len(ok),
            "never_evict_created": dict(sorted(self.never_created.items())),
            "rooms": rooms,
            "budget": {k: v for k, v in budget.items() if k != "overrun_keys"},
            "eviction_codes": {str(k): v for k, v in sorted(codes.items())},
            "faults": dict(sorted(self.proxy.counts.items())),
            "faults_by_caller": {
                f"{a}/{b}": n for (a, b), n in sorted(self.proxy.by_caller.items())
            },
            "requests_by_caller": dict(self.proxy.requests),
            "chaos": dict(sorted(self.chaos.items())),
            "violations": violations,
            "details": {
                "pdb_violations": pdb_violations[:20],
                "pods_evicted_twice": {
                    n: [(e["user"].get("username", ""), e["stageTimestamp"]) for e in es]
                    for n, es in list(twice.items())[:20]
                },
                "evicted_twice_by_one_replica_within_60s": retried,
                "evictions_without_lease": not_leader[:20],
                "marks_left": leftovers,
                "alerts_refired": refired[:20],
                "tracebacks": tracebacks,
                "fault_visibility": visibility,
                "evictions_not_returning": not_returning[:20],
                "evicted_pods_unseen": unseen[:20],
                "jobs_backoff_exceeded": jobs_failed[:20],
                "second_rooms": second[:20],
                "second_rooms_excused": excused[:20],
                "budget_overruns": budget["overrun_keys"],
                "kills": self.kills,
            },
            "fault_log": [
                (round(t, 3), caller, kind, what) for t, caller, kind, what in self.proxy.log
            ],
            "cycle_p99_s_le": bucket_quantile(buckets, 0.99),
            "cycle_p50_s_le": bucket_quantile(buckets, 0.5),
            "rss": rss,
            "notifications": len(self.receiver.notifications),
            "notes": self.notes[:20],
        }  # fmt: skip

    def _not_returning(self, ok: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
        """Each 201 eviction whose pod has no controlling owner that recreates it: a
        ReplicaSet, StatefulSet or ReplicationController, or a Job with retries left (the
        soak's Jobs have none). Pods the harness never saw are listed apart."""
        out, unseen = [], []
        for e in ok:
            name = e["objectRef"]["name"]
            if name not in self.pod_owner:
                unseen.append(f"{name} at {e['stageTimestamp']}")
                continue
            owner = self.pod_owner[name]
            kind = self.pod_labels.get(name, {}).get(NEVER)
            returns = (
                kind is None
                and owner is not None
                and (
                    owner[0] in RECREATING
                    or (owner[0] == "Job" and self.job_backoff.get(owner[1], 1) > 0)
                )
            )
            if not returns:
                what = kind or (f"{owner[0]}/{owner[1]}" if owner else "no controller")
                out.append(
                    f"{name} ({what}) by {e['user']['username'].rsplit(':', 1)[-1]} "
                    f"at {e['stageTimestamp']}"
                )
        return out, unseen

    def _jobs_backoff_exceeded(self) -> list[str]:
        """The soak's Jobs failed with BackoffLimitExceeded, but for those whose pod the
        harness deleted with its node."""
        out = []
        for job in self.plane.admin.get(f"/apis/batch/v1/namespaces/{NS}/jobs")["items"]:
            name = job["metadata"]["name"]
            for cond in job.get("status", {}).get("conditions", []):
                if (
                    cond.get("type") == "Failed"
                    and cond.get("status") == "True"
                    and cond.get("reason") == "BackoffLimitExceeded"
                    and name not in self.harness_deleted
                ):
                    out.append(f"{name} failed at {cond.get('lastTransitionTime')}")
        return out

    def _second_rooms(
        self, events: list[dict[str, Any]], ok: list[dict[str, Any]]
    ) -> tuple[int, list[str], list[str]]:
        """Replays every node's ``defrag.io/reserved-for`` from the audit log's node writes
        (their resulting Node, logged at RequestResponse) and deletions, into rooms: (node,
        pod, reserved from, released at). A second room is a room for a pod opened on another
        node while a first room for it stands, or while a pod evicted from the first room's
        node after it was reserved (and before the second) is still Terminating (its final
        deletion in the audit log is later). Make-room reservations only (not ``owner:``
        seats). Pairs whose first room's node was cordoned then are listed apart (excused)."""
        writes: list[tuple[float, int, str, dict[str, Any] | None]] = []
        for e in events:
            ref = e.get("objectRef", {})
            if ref.get("resource") != "nodes" or ref.get("subresource"):
                continue
            code = e["responseStatus"]["code"]
            t = stamp(e["stageTimestamp"])
            if e["verb"] == "delete" and code == 200:
                writes.append((t, 0, ref.get("name", ""), None))
            elif e["verb"] in ("create", "update", "patch") and code in (200, 201):
                node = e.get("responseObject")
                if isinstance(node, dict) and node.get("kind") == "Node":
                    rv = int(node["metadata"].get("resourceVersion", 0))
                    writes.append((t, rv, node["metadata"]["name"], node))
        writes.sort(key=lambda w: (w[0], w[1]))
        holding: dict[str, set[str]] = defaultdict(set)  # node → pods it is reserved for
        cordoned: dict[str, list[tuple[float, bool]]] = defaultdict(list)
        opened: dict[tuple[str, str], float] = {}
        rooms: list[tuple[str, str, float, float]] = []  # node, pod, from, released
        last_rv: dict[str, int] = {}
        for t, rv, name, node in writes:
            if node is not None and rv and rv < last_rv.get(name, 0):
                continue  # an older state logged after a newer one
            if node is not None:
                last_rv[name] = rv
            now: set[str] = set()
            if node is not None:
                value = node["metadata"].get("annotations", {}).get(RESERVED, "")
                now = {h.strip() for h in value.split(",") if h.strip()}
                now = {h for h in now if not h.startswith("owner:")}
                cordoned[name].append((t, bool(node["spec"].get("unschedulable"))))
            for pod in holding[name] - now:
                rooms.append((name, pod, opened.pop((name, pod)), t))
            for pod in now - holding[name]:
                opened[(name, pod)] = t
            holding[name] = now
        rooms += [(name, pod, t, float("inf")) for (name, pod), t in opened.items()]
        gone: dict[str, float] = {}
        for e in events:
            ref = e.get("objectRef", {})
            if (
                ref.get("resource") == "pods"
                and not ref.get("subresource")
                and e["verb"] == "delete"
                and e["responseStatus"]["code"] == 200
            ):
                gone[ref.get("name", "")] = max(
                    gone.get(ref.get("name", ""), 0.0), stamp(e["stageTimestamp"])
                )
        evicted = [
            (stamp(e["requestReceivedTimestamp"]), e["objectRef"]["name"])
            for e in ok
            if e["objectRef"]["name"] in self.pod_node
        ]
        by_pod: dict[str, list[tuple[str, str, float, float]]] = defaultdict(list)
        for room in sorted(rooms, key=lambda r: r[2]):
            by_pod[room[1]].append(room)
        second: list[str] = []
        excused: list[str] = []
        for pod, its in by_pod.items():
            for i, (node2, _, t2, _) in enumerate(its):
                for node1, _, t1, end1 in its[:i]:
                    if node1 == node2:
                        continue
                    emptying = [
                        name
                        for te, name in evicted
                        if self.pod_node[name] == node1
                        and t1 - 1 <= te <= min(end1, t2)
                        and gone.get(name, float("inf")) > t2
                    ]
                    if end1 <= t2 and not emptying:
                        continue
                    why = (
                        "first room stands"
                        if end1 > t2
                        else (f"first room's {', '.join(emptying)} still Terminating")
                    )
                    line = (
                        f"{pod}: {node2} reserved at {iso(t2)} while {node1} (reserved at "
                        f"{iso(t1)}): {why}"
                    )
                    states = [u for tc, u in cordoned[node1] if tc <= t2]
                    (excused if states and states[-1] else second).append(line)
        return len(rooms), second, excused

    def _budget(self, ok: list[dict[str, Any]]) -> dict[str, Any]:
        """201 evictions per budget key against ``max_evictions_per_window``. A cycle takes
        its key (the window opening, or outside the windows the UTC day) when it starts, and
        may still evict ``WINDOW_LEEWAY_S`` later: each eviction may be charged to any key a
        cycle start in [t - leeway, t] had. Overruns: the fewest evictions past a key's limit
        over every such charging (a flow), so a figure above 0 is an overrun whichever cycle
        sent which eviction."""
        cands: list[set[str]] = []
        naive: Counter[str] = Counter()
        for e in ok:
            t = stamp(e["requestReceivedTimestamp"])
            keys = {budget_key(t - d) for d in range(int(WINDOW_LEEWAY_S) + 1)}
            cands.append(keys | {budget_key(t)})
            naive[budget_key(t)] += 1
        charged = charge(cands, WINDOW_BUDGET)
        over = {k: n for k, n in naive.items() if n > WINDOW_BUDGET}
        return {
            "limit": WINDOW_BUDGET,
            "windows": f"{WINDOW_CRON!r} for {WINDOW_LENGTH_S} s, UTC",
            "evictions_by_key": dict(sorted(naive.items())),
            "keys_at_limit": sum(1 for n in naive.values() if n >= WINDOW_BUDGET),
            "refusals": self._budget_refusals(),
            "overruns": len(ok) - charged,
            "over_at_eviction_time": sum(n - WINDOW_BUDGET for n in over.values()),
            "overrun_keys": over,
        }

    def _budget_refusals(self) -> int:
        """Evictions the executor refused for a window's budget (its DefragSkipped Events)."""
        with contextlib.suppress(requests.RequestException):
            items = self.plane.admin.get(f"/api/v1/namespaces/{NS}/events")["items"]
            return sum(
                int(ev.get("count") or 1)
                for ev in items
                if ev.get("reason") == "DefragSkipped" and "budget-window" in ev.get("message", "")
            )
        return -1

    def _log_lines(self, replica: str) -> list[dict[str, Any]]:
        path = self.plane.folder / f"daemon-{replica}.log"
        out = []
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict):
                    out.append(obj)
        return out

    def _log_count(self, replica: str, prefix: str) -> int:
        return sum(
            1 for o in self._log_lines(replica) if str(o.get("message", "")).startswith(prefix)
        )

    def _leader_cycles(self) -> list[tuple[float, set[str]]]:
        """(time, the finding kinds) of every cycle a replica ran as the leader."""
        out = []
        for name in self.names:
            for o in self._log_lines(name):
                message = str(o.get("message", ""))
                if not message.startswith("cycle (leader"):
                    continue
                m = re.search(r"findings (.*?); ", message)
                kinds = set()
                if m and m.group(1) != "none":
                    kinds = {part.split(" ", 1)[1] for part in m.group(1).split(", ")}
                out.append((datetime.fromisoformat(o["time"]).timestamp(), kinds))
        return sorted(out, key=lambda x: x[0])

    def _refires(self) -> list[str]:
        """Alerts resolved and fired again while their finding never cleared (:func:`refired`)."""
        import defrag.detection  # noqa: F401  (registers the detectors' alerts)
        from defrag.alerting import ALERTS

        kind_of = {a.name: kind for kind in ALERTS.kinds() for a in ALERTS.alerted(kind)}
        return refired(self.received, self._leader_cycles(), kind_of)

    def _visibility(self) -> dict[str, dict[str, Any]]:
        """Each fault kind injected, and where it shows: each daemon's transient-error counter
        and call duration histogram on /metrics (summed over its incarnations), the extender's
        watch log lines. A kind is visible when what shows it counts at least as many as were
        injected into callers that lived to see the answer (faults within 2 s before a SIGKILL
        of that replica or of the extender are counted apart: ``lost_to_kill``)."""
        seen: Counter[tuple[str, str]] = Counter()
        for name, r in self.replicas.items():
            for s in r.scrapes.values():
                for key, value in s.items():
                    m = re.match(r'defrag_kube_api_transient_errors_total\{reason="([^"]+)"\}', key)
                    if m:
                        seen[(name, m.group(1))] += int(value)
                seen[(name, "slow")] += int(
                    s.get("defrag_kube_api_call_seconds_count", 0)
                    - s.get('defrag_kube_api_call_seconds_bucket{le="0.25"}', 0)
                )
        # The extender and (since the daemon keeps its cluster by watch) each replica log what
        # became of their watches: one line per expired or broken watch.
        logs = {"extender": "defrag-extender*.log", **{n: f"daemon-{n}.log" for n in self.replicas}}
        for who, pattern in logs.items():
            text = "".join(p.read_text(errors="replace") for p in self.plane.folder.glob(pattern))
            seen[(who, "expired")] = len(re.findall(r"watching \S+: resourceVersion expired", text))
            seen[(who, "dropped")] = len(
                re.findall(r"watching \S+: .*?(; retrying in|before its timeoutSeconds)", text)
            )
        shows = {
            "5xx": ('defrag_kube_api_transient_errors_total{reason="5xx"}', "5xx"),
            "429": ('defrag_kube_api_transient_errors_total{reason="429"}', "429"),
            "reset": ('defrag_kube_api_transient_errors_total{reason="connection"}', "connection"),
            "latency": ("defrag_kube_api_call_seconds, calls over 0.25 s", "slow"),
            "trickle": ("defrag_kube_api_call_seconds, calls over 0.25 s", "slow"),
            "watch-drop": (
                "the watcher's log: 'watching …: …; retrying in' or 'before its timeoutSeconds'",
                "dropped",
            ),
            "watch-410": ("the watcher's log: 'watching …: resourceVersion expired'", "expired"),
        }
        injected: Counter[tuple[str, str]] = Counter()
        lost: Counter[str] = Counter()
        for t, caller, kind, _ in self.proxy.log:
            if any(who == caller and 0 <= k - t <= 2 for k, who in self.kills):
                lost[kind] += 1
            else:
                injected[(caller, kind)] += 1
        out: dict[str, dict[str, Any]] = {}
        for kind in sorted(self.proxy.counts):
            where, label = shows.get(kind, ("?", "?"))
            callers = sorted({c for c, k in injected if k == kind})
            per = {c: {"injected": injected[(c, kind)], "seen": seen[(c, label)]} for c in callers}
            out[kind] = {
                "shown_by": where,
                "injected": self.proxy.counts[kind],
                "lost_to_kill": lost[kind],
                "by_caller": per,
                "visible": all(v["seen"] >= v["injected"] for v in per.values()),
            }
        return out


# --- the re-fired alerts ------------------------------------------------------------------------

Notified = tuple[float, str, dict[str, str], float | None]
"""One alert of a notification Alertmanager sent: (received, status, labels, its ``endsAt``)."""


def ends_at(alert: dict[str, Any]) -> float | None:
    """An alert's ``endsAt`` in a webhook notification, as a Unix time (None when absent)."""
    from defrag.alerting import parse_rfc3339

    try:
        return parse_rfc3339(str(alert["endsAt"])).timestamp()
    except (KeyError, ValueError, OverflowError):
        return None


def refired(
    received: Sequence[Notified],
    cycles: Sequence[tuple[float, set[str]]],
    kind_of: dict[str, str],
    ttl_s: float = ALERT_TTL_S,
) -> list[str]:
    """A resolved notification, then a firing one for the same labels, with no leader cycle
    in between that did not find that kind: the finding never cleared, yet the alert was
    resolved and fired again. ``cycles``: (time, the finding kinds) of every leader cycle.

    "In between" starts where the resolution was decided. A leader resolves an alert with its
    own time as ``endsAt`` and logs its cycle right after: from 3 s before the resolution on.
    An alert no leader refreshed for ``ttl_s`` lapses in Alertmanager at its ``endsAt``, with
    no cycle there: from its last refresh (``ttl_s`` before) on, since any leader since may be
    one that did not find it (another replica took over). Each pair is named with which."""
    seen: dict[tuple[tuple[str, str], ...], list[Notified]] = defaultdict(list)
    for note in received:
        seen[tuple(sorted(note[2].items()))].append(note)
    out = []
    for key, history in seen.items():
        name = dict(key).get("alertname", "")
        kind = kind_of.get(name, name)
        for (t1, a, _, ends), (t2, b, _, _) in itertools.pairwise(history):
            if a != "resolved" or b != "firing":
                continue
            resolved_at = min(t1, ends) if ends is not None else t1
            lapsed = not any(resolved_at - 1 <= t <= resolved_at + 10 for t, _ in cycles)
            since = resolved_at - ttl_s if lapsed else resolved_at
            cleared = any(since - 3 <= t <= t2 and kind not in kinds for t, kinds in cycles)
            if not cleared:
                how = f"lapsed {ttl_s:g} s after its last refresh" if lapsed else "by a leader"
                out.append(f"{json.dumps(dict(key))} resolved at {t1:.1f} ({how}), fired {t2:.1f}")
    return out


# --- helpers ----------------------------------------------------------------------------------


def second_service_account(plane: ControlPlane, name: str) -> None:
    """A second ServiceAccount bound to every role the ``defrag`` one has."""
    api = plane.admin
    api.apply({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": name, "namespace": SYSTEM}})  # fmt: skip
    subject = {"kind": "ServiceAccount", "name": "defrag", "namespace": SYSTEM}
    for binding in api.get("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")["items"]:
        if subject in binding.get("subjects", []):
            api.apply({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{binding['metadata']['name']}-{name}"},
                "roleRef": binding["roleRef"],
                "subjects": [{**subject, "name": name}],
            })  # fmt: skip
    for binding in api.get("/apis/rbac.authorization.k8s.io/v1/rolebindings")["items"]:
        if subject in binding.get("subjects", []):
            api.apply({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": f"{binding['metadata']['name']}-{name}",
                             "namespace": binding["metadata"]["namespace"]},
                "roleRef": binding["roleRef"],
                "subjects": [{**subject, "name": name}],
            })  # fmt: skip


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def budget_key(t: float) -> str:
    """The budget key of a cycle started at ``t`` (epoch seconds): the window opening that
    holds it (``WINDOW_CRON`` fires every ``WINDOW_PERIOD_S`` from the epoch, UTC), or outside
    the windows the UTC day — as defrag/execute/windows.py and URGENT_BUDGET_KEY name them."""
    start = t - t % WINDOW_PERIOD_S
    if t - start < WINDOW_LENGTH_S:
        return datetime.fromtimestamp(start, UTC).isoformat()
    return URGENT_KEY.format(day=datetime.fromtimestamp(t, UTC).date().isoformat())


def charge(cands: list[set[str]], limit: int) -> int:
    """The most items that can each be charged to one of their candidate keys with no key
    charged more than ``limit`` (augmenting paths: a bipartite b-matching)."""
    held: dict[str, list[int]] = defaultdict(list)

    def place(i: int, seen: set[str]) -> bool:
        for key in sorted(cands[i]):
            if key in seen:
                continue
            seen.add(key)
            if len(held[key]) < limit:
                held[key].append(i)
                return True
            for j in list(held[key]):
                if place(j, seen):
                    held[key].remove(j)
                    held[key].append(i)
                    return True
        return False

    return sum(1 for i in range(len(cands)) if place(i, set()))


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[key] = float(value)
    return out


def metric_sum(sample: dict[str, float], name: str) -> float:
    return sum(v for k, v in sample.items() if k == name or k.startswith(name + "{"))


def merged_buckets(samples: list[dict[str, float]], name: str) -> dict[float, float]:
    out: dict[float, float] = defaultdict(float)
    for s in samples:
        for key, value in s.items():
            m = re.match(re.escape(name) + r'\{le="([^"]+)"\}', key)
            if m:
                out[float(m.group(1))] += value
    return dict(out)


def bucket_quantile(buckets: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket that holds quantile ``q`` (a histogram's resolution)."""
    if not buckets:
        return None
    total = buckets.get(float("inf"), max(buckets.values()))
    for le in sorted(buckets):
        if buckets[le] >= q * total:
            return le
    return None


def rss_figures(samples: list[tuple[float, int, int]]) -> dict[str, Any]:
    """Peak RSS, and the slope (kB/min) over the second half of each incarnation's samples,
    for the longest-lived incarnation."""
    if not samples:
        return {}
    by: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for t, inc, kb in samples:
        by[inc].append((t, kb))
    longest = max(by.values(), key=lambda s: s[-1][0] - s[0][0])
    half = longest[len(longest) // 2 :]
    fitted = rss_slope(half)
    slope = fitted[0] if fitted is not None else 0.0
    return {
        "peak_mb": round(max(kb for _, _, kb in samples) / 1024, 1),
        "incarnations": len(by),
        "longest_minutes": round((longest[-1][0] - longest[0][0]) / 60, 1),
        "slope_kb_per_min_second_half": round(slope, 1),
        "start_mb": round(half[0][1] / 1024, 1) if half else None,
        "end_mb": round(half[-1][1] / 1024, 1) if half else None,
    }


def rss_slope(
    samples: Sequence[tuple[float, int]],
) -> tuple[float, tuple[float, float]] | None:
    """The least-squares slope of (time s, RSS kB) samples in kB/min and its 95% confidence
    interval (Student's t over the fit's standard error); None below three samples or when
    they span no time."""
    if len(samples) < 3 or samples[0][0] == samples[-1][0]:
        return None
    fit = stats.linregress([t for t, _ in samples], [kb for _, kb in samples])
    half = float(stats.t.ppf(0.975, len(samples) - 2) * fit.stderr) * 60
    slope = float(fit.slope) * 60
    return slope, (slope - half, slope + half)


def long_rss_figures(rows: list[tuple[float, str, int, int]], started: float) -> dict[str, Any]:
    """Per process: the least-squares RSS slope (kB/min) over the samples taken ``WARMUP_S``
    or more after ``started``, its start, end and peak, and how many PIDs it had (1 when
    nothing restarted it)."""
    by: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    for t, name, pid, kb in rows:
        by[name].append((t, pid, kb))
    out: dict[str, Any] = {}
    for name, samples in sorted(by.items()):
        late = [(t, kb) for t, _, kb in samples if t - started >= WARMUP_S]
        fitted = rss_slope(late)
        out[name] = {
            "samples": len(samples),
            "samples_after_warmup": len(late),
            "pids": len({pid for _, pid, _ in samples}),
            "slope_kb_per_min_after_warmup": round(fitted[0], 1) if fitted else None,
            # the slope's 95% confidence interval: RSS moves by megabytes with each collection
            # and trim, so a slope of a few kB/min is only told from 0 over hours of samples
            "slope_ci95_kb_per_min": [round(v, 1) for v in fitted[1]] if fitted else None,
            "minutes_after_warmup": round((late[-1][0] - late[0][0]) / 60, 1) if late else 0,
            "mb_at_warmup_end": round(late[0][1] / 1024, 1) if late else None,
            "mb_at_end": round(samples[-1][2] / 1024, 1),
            "peak_mb": round(max(kb for _, _, kb in samples) / 1024, 1),
        }
    return out


def table(report: dict[str, Any]) -> str:
    rows = [("seed", report["seed"]), ("cycles (both replicas)", report["cycles"]),
            ("leader cycles", report["leader_cycles"]),
            ("evictions (201)", report["evictions_201"]),
            ("eviction answers", report["eviction_codes"]),
            ("cycle p50 / p99 (s, bucket bound)",
             f"{report['cycle_p50_s_le']} / {report['cycle_p99_s_le']}"),
            ("wall (s)", report.get("wall_s"))]  # fmt: skip
    budget = report["budget"]
    rows += [("leader cycles by replica", report["leader_cycles_by_replica"]),
             ("never-evict workloads created", report["never_evict_created"]),
             ("rooms (make-room reservations)", report["rooms"]),
             (f"evictions per budget key (limit {budget['limit']})", budget["evictions_by_key"]),
             ("budget keys at the limit / refusals",
              f"{budget['keys_at_limit']} / {budget['refusals']}")]  # fmt: skip
    rows += [(f"fault {k}", v) for k, v in report["faults"].items()]
    rows += [(f"chaos {k}", v) for k, v in report["chaos"].items()]
    rows += [(f"INVARIANT {k}", v) for k, v in report["violations"].items()]
    for name, fig in report["rss"].items():
        rows.append((f"RSS {name}", f"peak {fig.get('peak_mb')} MB, slope "
                     f"{fig.get('slope_kb_per_min_second_half')} kB/min over the second half "
                     f"of a {fig.get('longest_minutes')} min incarnation"))  # fmt: skip
    for name, fig in report.get("memory", {}).get("rss", {}).items():
        rows.append((f"RSS {name} (memory soak)",
                     f"{fig['slope_kb_per_min_after_warmup']} kB/min over "
                     f"{fig['minutes_after_warmup']} min after the first "
                     f"{WARMUP_S / 60:.0f}; {fig['mb_at_warmup_end']} → {fig['mb_at_end']} MB, "
                     f"peak {fig['peak_mb']} MB, {fig['pids']} PID(s)"))  # fmt: skip
    width = max(len(str(k)) for k, _ in rows)
    return "\n".join(f"{k!s:<{width}}  {v}" for k, v in rows)


Write = tuple[float, float, str]
"""A Lease write the API server answered 200/201: (received, done, the replica)."""


def held_until(writes: list[Write], first: Write, lease_s: float = LEASE_S) -> float:
    """Until when the holder of the Lease write ``first`` (received, done, who) held it without
    a break: each renewal by the same holder received before the tenure so far ran out extends
    it by ``lease_s`` from its own receipt. An eviction the API server received within the
    tenure may finish after the renewal that kept it; the Lease was held all along."""
    start, _done, who = first
    until = start + lease_s
    for received, _done, holder in sorted(w for w in writes if w[0] > start):
        if received > until:
            break
        if holder != who:  # taken over: no longer ours from here
            return min(until, received)
        until = received + lease_s
    return until


def env_pairs(items: list[str]) -> list[tuple[str, str]]:
    """``KEY=VALUE`` strings as pairs; ValueError naming the first without a key."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r} is not KEY=VALUE")
        pairs.append((key, value))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--drain-s", type=float, default=45.0)
    parser.add_argument("--max-wall-s", type=float, default=7200.0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", type=Path, help="keep the logs and audit log in this folder")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="the long memory soak: no daemon or extender killed, a fleet of --nodes with "
        "--pool hot nodes and --fill-pods filler pods churned, RSS to --out/rss.csv",
    )
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--fill-pods", type=int, default=4000)
    parser.add_argument("--out", type=Path, help="the memory soak's rss.csv, progress, probes")
    parser.add_argument("--rss-every-s", type=float, default=60.0)
    parser.add_argument("--probe-every-s", type=float, default=600.0)
    parser.add_argument("--cycle-interval-s", type=float, default=1.0)
    parser.add_argument(
        "--defrag-env", action="append", default=[], metavar="KEY=VALUE",
        help="set in the daemons' and the extender's environment only (repeatable), e.g. "
        "PYTHONMALLOC=malloc",
    )  # fmt: skip
    parser.add_argument(
        "--replicas", type=int, choices=(1, 2), default=2, help="defrag run replicas (2: one leads)"
    )
    args = parser.parse_args(argv)
    try:
        env_pairs(args.defrag_env)
    except ValueError as exc:
        print(f"error: --defrag-env: {exc}", file=sys.stderr)
        return 2
    # SIGTERM ends the soak through its clean-up (every process it started stopped by PID)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        find_assets()
    except AssetsMissing as exc:
        print(f"skipped: {exc}")
        return 0
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-")))
        soak = Soak(args.seed, args.cycles, folder, nodes=args.nodes, drain_s=args.drain_s,
                    max_wall_s=args.max_wall_s, memory=args.memory, pool=args.pool,
                    fill_pods=args.fill_pods if args.memory else 0, out=args.out,
                    rss_every_s=args.rss_every_s, probe_every_s=args.probe_every_s,
                    cycle_interval_s=args.cycle_interval_s,
                    replica_count=args.replicas,
                    defrag_env=tuple(env_pairs(args.defrag_env)))  # fmt: skip
        if args.memory:
            soak.chaos_every_s = (8.0, 20.0)
            soak.rates = FaultRates(trickle=0.02)
        report = soak.run()
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    bad = {k: v for k, v in report["violations"].items() if v}
    if bad:
        print(f"INVARIANTS BROKEN: {bad}", file=sys.stderr)
        print(json.dumps(report["details"], indent=2, default=str), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
