"""A room survives the daemon that made it, on the real control plane.

The make-room stage (``tests/e2e/stage.py``); the victims' pods are held Terminating by the
kubelet stand-in, as a pod with a long grace period is. The daemon makes the room (one eviction)
and is stopped (SIGTERM) while its victim still terminates; a second daemon starts and leads.
Before rooms were kept across a stop, the first daemon released its reservation on the way out
and the second, seeing the node still full of a Terminating pod, made the starving pod a second
room (more evictions) while the first emptied. Now the reservation stays, the second daemon counts
the node whose only obstacle is Terminating as the pod's room, evicts nothing, and the pod binds
there once the victim is gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from defrag.model.resources import RESERVED_FOR_ANNOTATION
from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane, wait_for
from tests.e2e.kubelet import Kubelet
from tests.e2e.stage import Stage, bound_train, make_room_stage


@pytest.fixture
def stage(plane: ControlPlane, kubelet: Kubelet, tmp_path: Path) -> Iterator[Stage]:
    with make_room_stage(plane, kubelet, "restart", tmp_path) as made:
        yield made


class Rooms:
    """The nodes reserved for a pod, sampled every 0.1 s from the nodes' annotations (the audit
    log holds no request bodies)."""

    def __init__(self, stage: Stage, pod: str) -> None:
        self.stage, self.pod = stage, pod
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for node in self.stage.plane.admin.get("/api/v1/nodes")["items"]:
                notes = node["metadata"].get("annotations") or {}
                name = node["metadata"]["name"]
                if notes.get(RESERVED_FOR_ANNOTATION) == self.pod and name not in self.seen:
                    self.seen.append(name)
            self._stop.wait(0.1)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.seen


def test_a_stopped_daemons_room_is_the_next_ones_no_second_room(stage: Stage) -> None:
    plane, kubelet = stage.plane, stage.kubelet
    for name in ("a", "b", "c"):  # whichever is evicted stays Terminating until released
        kubelet.hold.add(f"{stage.ns}/{name}-")
    train = stage.starving()
    key = f"{stage.ns}/{train['metadata']['name']}"
    time.sleep(3.5)  # past the rule's `for`
    mark = len(plane.audit_events())
    rooms = Rooms(stage, key)
    settings = stage.settings(execution={"dry_run": False})
    first = f"daemon-{stage.ns}-1"
    daemon = c.start_daemon(plane, stage.kubeconfig, settings, stage.rules, first)
    wait_for("the first eviction", lambda: bool(stage.evictions(mark)), 60)
    # the drain waits on its Terminating victim, polling the watched store, not listing the API
    wait_for("the drain's polls", lambda: executor_reads(daemon, "store") >= 2, 30)
    plane.processes.pop(first).stop()  # SIGTERM: the stop the Deployment's rollout sends
    assert len(rooms.seen) == 1, rooms.seen
    room = rooms.seen[0]
    node = plane.admin.get(f"/api/v1/nodes/{room}")
    kept = node["metadata"].get("annotations", {}).get(RESERVED_FOR_ANNOTATION)
    second = c.start_daemon(plane, stage.kubeconfig, settings, stage.rules, f"daemon-{stage.ns}-2")
    # the second leads (the first released the Lease) and runs cycles on the room
    c.wait_cycles(second, 5, 60, leading_within_s=60)
    assert second.process.alive()
    evicted = [e for e in stage.evictions(mark) if e["responseStatus"]["code"] == 201]
    assert len(evicted) == 1, [e["objectRef"]["name"] for e in evicted]
    assert rooms.stop() == [room]  # no second room
    assert kept == key, "the room's reservation was released on the way out"
    kubelet.release(list(kubelet.hold))
    kubelet.hold.clear()
    bound = bound_train(stage)
    assert c.node_of(bound) == room


def executor_reads(daemon: c.Served, source: str) -> float:
    """``defrag_executor_cluster_reads_total{source}`` on the daemon's /metrics."""
    for family in text_string_to_metric_families(daemon.get("/metrics").text):
        for sample in family.samples:
            if (
                sample.name == "defrag_executor_cluster_reads_total"
                and sample.labels.get("source") == source
            ):
                return sample.value
    return 0.0
