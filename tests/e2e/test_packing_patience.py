"""Make-room's patience under a packing scheduler, on the real control plane, over cycles.

The make-room stage (``tests/e2e/stage.py``) with a packing history before it: eight 1-GPU pods
placed one at a time by kube-scheduler with the extender, then the fragmented layout (4, 4 and 6
GPUs used on three 8-GPU nodes) and the 8-GPU high-priority pod that waits. The spreading rule
reads 7 of 8 informative placements as packing, so the daemon, live (not a dry run), with
``make_room_packing_patience_s: null`` (the default before the room forecast) evicts nothing,
cycle after cycle, and says
which pod it held back and why; with a patience, it makes the room once the pod has waited
that long, and the pod binds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import Kubelet
from tests.e2e.stage import Stage, bound_train, make_room_stage

HISTORY = 8


@pytest.fixture
def stage(plane: ControlPlane, kubelet: Kubelet, tmp_path: Path) -> Iterator[Stage]:
    with make_room_stage(plane, kubelet, "mr-packing", tmp_path, packed_history=HISTORY) as made:
        yield made


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _pending(stage: Stage) -> list[dict[str, Any]]:
    return [
        p for p in c.pods(stage.plane.admin, stage.ns, "app=train") if not p["spec"].get("nodeName")
    ]


NEVER = {"make_room_packing_patience_s": None}
"""No room while the scheduler packs (a setting's null)."""


def test_the_daemon_holds_back_while_the_scheduler_packs_then_serves_after_its_patience(
    stage: Stage,
) -> None:
    train = stage.starving()
    key = f"{stage.ns}/{train['metadata']['name']}"
    created = _stamp(train["metadata"]["creationTimestamp"])
    time.sleep(3.5)  # past the starvation rule's `for`
    mark = len(stage.plane.audit_events())

    # One live cycle: the packing finding, the pod held back with its reason, no plan.
    result = c.defrag_json(
        "run", "--once", "--kubeconfig", str(stage.kubeconfig),
        "--settings",
        str(stage.settings(execution={"dry_run": False}, planner=NEVER)),
        "--rules", str(stage.rules),
        timeout_s=120,
    )  # fmt: skip
    packing = [f for f in result["findings"] if f["kind"] == "packing"]
    assert len(packing) == 1, [f["kind"] for f in result["findings"]]
    # 8 history placements, the first on an empty cluster; of the layout's 3, a (on empty
    # nodes) and c (6 GPUs: only g3 fits) say nothing, b went beside a's free half: 7 of 8.
    summary = packing[0]["summary"]
    assert "of 8 informative placement(s)" in summary and "7 (88%) went" in summary, summary
    assert list(result["held_back"]) == [key], result["held_back"]
    assert "makes no room while the scheduler packs" in result["held_back"][key]
    assert not (result.get("plan") or {}).get("steps"), result["plan"]

    # The daemon at its default, cycle after cycle (2 s apart): nothing evicted, the pod waits.
    c.start_daemon(
        stage.plane, stage.kubeconfig,
        stage.settings(execution={"dry_run": False}, planner=NEVER), stage.rules,
        f"daemon-{stage.ns}",
    )  # fmt: skip
    time.sleep(12)
    assert stage.plane.processes[f"daemon-{stage.ns}"].alive()
    assert stage.evictions(mark) == [] and stage.rehearsals(mark) == []
    assert len(_pending(stage)) == 1
    stage.plane.processes.pop(f"daemon-{stage.ns}").stop()

    # With a patience longer than the pod has waited so far: the room comes once it has waited
    # that long (pending since its creation at the earliest), not before, and the pod binds.
    patience = math.ceil(time.time() - created) + 10
    mark = len(stage.plane.audit_events())
    c.start_daemon(
        stage.plane, stage.kubeconfig,
        stage.settings(
            execution={"dry_run": False},
            planner={"make_room_packing_patience_s": patience},
        ),
        stage.rules,
        f"daemon-{stage.ns}-patient",
    )  # fmt: skip
    bound = bound_train(stage, timeout_s=patience + 90)
    evictions = [e for e in stage.evictions(mark) if e["responseStatus"]["code"] == 201]
    assert len(evictions) == 1, evictions
    first = _stamp(evictions[0]["stageTimestamp"])
    assert first >= created + patience, (first - created, patience)
    assert bound["metadata"]["name"] == train["metadata"]["name"]
