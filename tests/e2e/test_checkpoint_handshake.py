"""The checkpoint handshake on the real control plane (docs/daemon.md, "Checkpoint before
eviction"), as the ``defrag`` ServiceAccount with the RBAC the overlay ships.

A Deployment whose pod template declares ``defrag.io/checkpoint: supported``; a helper thread
plays the workload: it watches its pod for ``defrag.io/checkpoint-requested`` and answers by
writing ``defrag.io/last-checkpoint``. The executor must ask (a pod patch the API server allows
the daemon), wait for the answer, then evict through the Eviction API — in that order in the
audit log.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from defrag.adapters.kube import KubeActuator, KubeClusterSource, connect
from defrag.daemon.cycle import SystemClock
from defrag.execute import Executor, ExecutorSettings, WindowStatus
from defrag.execute.mode import RunMode
from defrag.plan.model import Plan, Step
from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import Kubelet, add_node
from tests.e2e.stage import DAEMON

NS = "ckpt"
ANSWER_AFTER_S = 1.5


class Workload(threading.Thread):
    """Answers the first checkpoint request on its pod, ``ANSWER_AFTER_S`` after seeing it."""

    def __init__(self, plane: ControlPlane, pod: str) -> None:
        super().__init__(daemon=True)
        self.plane, self.pod = plane, pod
        self.stop = threading.Event()
        self.wrote = ""

    def run(self) -> None:
        path = f"/api/v1/namespaces/{NS}/pods/{self.pod}"
        while not self.stop.wait(0.2):
            notes = self.plane.admin.get(path)["metadata"].get("annotations") or {}
            if "defrag.io/checkpoint-requested" in notes:
                time.sleep(ANSWER_AFTER_S)  # saving its state
                self.wrote = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                body = {"metadata": {"annotations": {"defrag.io/last-checkpoint": self.wrote}}}
                self.plane.admin.patch(path, body)
                return


def test_the_workload_checkpoints_before_its_eviction(
    plane: ControlPlane, kubelet: Kubelet
) -> None:
    node = f"{NS}-g1"
    c.namespace(plane.admin, NS)
    add_node(plane.admin, node, 8)
    try:
        c.deployment(
            plane.admin,
            NS,
            "train",
            4,
            annotations={
                "defrag.io/checkpoint": "supported",
                "defrag.io/checkpoint-max-wait": "60s",
            },
        )
        pod = c.wait_pods(plane.admin, NS, "app=train", lambda ps: len(ps) == 1, 30)[0]
        c.bind(plane.admin, pod, node)
        c.wait_pods(plane.admin, NS, "app=train", c.running(1), 30, what="the workload running")
        name = pod["metadata"]["name"]
        workload = Workload(plane, name)
        workload.start()
        api = connect(str(plane.service_account_kubeconfig("defrag-system", "defrag")))
        source = KubeClusterSource(api)
        snapshot = source.snapshot()
        assert snapshot.pods[f"{NS}/{name}"].checkpoints_on_request
        ex = Executor(
            KubeActuator(api),
            source,
            SystemClock(),
            ExecutorSettings(replacement_timeout_s=5, poll_interval_s=0.25),
            mode=RunMode.live(leader_election=False),
        )
        mark = len(plane.audit_events())
        # A preemption (no target): no wait for a replacement, which nothing here schedules.
        plan = Plan("repack", "e2e", (Step("preempt", f"{NS}/{name}", node, None, "e2e"),), ())
        executed = ex.execute(plan, snapshot, WindowStatus(True, "e2e"))
        workload.stop.set()
        workload.join(10)
        (outcome,) = executed.outcomes
        assert (outcome.result, outcome.checkpoint) == ("evicted", "checkpointed"), executed
        assert workload.wrote and workload.wrote in outcome.checkpoint_detail
        # The audit log: the daemon's patch of the pod (the request, allowed by its RBAC), then
        # the workload's patch (the answer), then the daemon's Eviction.
        log = [
            (e["user"]["username"], e["verb"], e["objectRef"].get("subresource", ""))
            for e in plane.audit_events()[mark:]
            if e.get("objectRef", {}).get("resource") == "pods"
            and e["objectRef"].get("name") == name
            and e["verb"] in ("patch", "create")
            and "dryRun=All" not in e.get("requestURI", "")
            and e.get("stage", "ResponseComplete") == "ResponseComplete"
        ]
        asked = log.index((DAEMON, "patch", ""))
        answered = next(i for i, e in enumerate(log) if e[1] == "patch" and e[0] != DAEMON)
        evicted = log.index((DAEMON, "create", "eviction"))
        assert asked < answered < evicted, log
        reasons = {
            e["reason"]
            for e in plane.admin.get(f"/api/v1/namespaces/{NS}/events")["items"]
            if e["involvedObject"]["name"] == name
        }
        assert {"DefragCheckpointRequested", "DefragCheckpointed", "DefragEvicted"} <= reasons
    finally:
        c.clean(plane, NS, [node])
