"""Gated and unsatisfiable pods on the real control plane: a daemon cycle reports neither as
starving and makes room for neither.

The make-room stage (``tests/e2e/stage.py``: three 8-GPU nodes with 10 GPUs free, none with 8;
kube-scheduler with the extender), then two high-priority pods: ``held``, 8 GPUs, created with
Kueue's scheduling gate ``kueue.x-k8s.io/admission`` (kubernetes-sigs/kueue
pkg/controller/jobs/pod/constants; the API server marks it PodScheduled=False, reason
``SchedulingGated``: kubernetes pkg/registry/core/pod/strategy.go), and ``huge``, 16 GPUs, more
than any node has. One ``defrag run --once`` (a dry run): no finding for ``held``, an
``unsatisfiable`` finding (action ``alert``) for ``huge``, no plan step. Then the gate is
removed, as Kueue does on admission: the next cycle finds ``held`` starving (``fragmented``)
and plans its room — the gate, not the shape, kept it out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import Kubelet
from tests.e2e.stage import HIGH, Stage, make_room_stage

GATE = "kueue.x-k8s.io/admission"


@pytest.fixture
def stage(plane: ControlPlane, kubelet: Kubelet, tmp_path: Path) -> Iterator[Stage]:
    with make_room_stage(plane, kubelet, "mr-gates", tmp_path) as made:
        yield made


def _pod(stage: Stage, name: str, gpus: int, gates: list[str]) -> None:
    spec = c.pod_spec(gpus, HIGH)
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": stage.ns, "labels": {"app": name}},
        "spec": spec,
    }
    stage.plane.admin.post(f"/api/v1/namespaces/{stage.ns}/pods", body)


def _waits_for(stage: Stage, name: str, reason: str) -> None:
    def marked(pods: list[dict[str, Any]]) -> bool:
        return len(pods) == 1 and c.not_scheduled(pods[0], reason) is not None

    c.wait_pods(stage.plane.admin, stage.ns, f"app={name}", marked, 30, what=f"{name}: {reason}")


def _cycle(stage: Stage) -> dict[str, Any]:
    args = ["run", "--once", "--kubeconfig", str(stage.kubeconfig)]
    args += ["--settings", str(stage.settings()), "--rules", str(stage.rules)]
    return dict(c.defrag_json(*args, timeout_s=120))


def test_gated_and_unsatisfiable_pods_get_no_room(stage: Stage) -> None:
    held, huge = f"{stage.ns}/held", f"{stage.ns}/huge"
    _pod(stage, "held", 8, [GATE])
    _pod(stage, "huge", 16, [])
    _waits_for(stage, "held", "SchedulingGated")
    _waits_for(stage, "huge", "Unschedulable")
    time.sleep(3.5)  # past the stage rule's `for` (3 s)

    result = _cycle(stage)
    by_subject = {f["subject"]: f for f in result["findings"]}
    assert f"pod/{held}" not in by_subject, by_subject.get(f"pod/{held}")
    never = by_subject[f"pod/{huge}"]
    assert (never["kind"], never["action"]) == ("unsatisfiable", "alert"), never
    assert "asks 16 GPUs, the largest node has 8" in never["summary"]
    assert not (result.get("plan") or {}).get("steps"), result["plan"]

    # Kueue admits the workload: it removes the gate, and the pod is the scheduler's to place
    stage.plane.admin.patch(
        f"/api/v1/namespaces/{stage.ns}/pods/held", {"spec": {"schedulingGates": None}}
    )
    _waits_for(stage, "held", "Unschedulable")
    result = _cycle(stage)
    by_subject = {f["subject"]: f for f in result["findings"]}
    starving = by_subject[f"pod/{held}"]
    assert (starving["kind"], starving["evidence"]["reason"]) == ("starvation", "fragmented")
    assert by_subject[f"pod/{huge}"]["kind"] == "unsatisfiable"
    steps = (result.get("plan") or {}).get("steps") or []
    assert {s["for_pod"] for s in steps if s.get("for_pod")} == {held}, steps
