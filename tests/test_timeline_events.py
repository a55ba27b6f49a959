"""The timeline's exact outcome, event by event, pinned on a small synthetic slice.

Every placement (pod, row, GPU slots, simulated hour) and every removal the simulator makes goes
through :meth:`SimState.place` / :meth:`SimState.remove`; the test records that sequence for one
run per defragmenter (and the scores whose caching differs: fgd, random) and compares it, and
the run's whole report, with ``tests/fixtures/timeline_events.json`` — recorded before the
timeline became an event-driven class with incremental scores (issues 23 and 26), so a refactor
or a speed-up that changes any decision fails here with the first event that differs. The peers'
rows were recorded again at 20fbf78, with their ports made faithful (issue 25) and the old
timeline; the rows whose scheduler is ``reserve-binpack`` (defrag-extender, defrag-blind,
reserve-binpack+defrag) again with that score's tie-break (the fewest GPUs among equals,
issue 25); the rows of the daemon (defrag, defrag-extender, defrag-blind, defrag-proposed,
reserve-binpack+defrag) again once a repack for starved pods kept only the drains worth their
cost by the pods they seat (docs/planning.md, "What a room is worth"); every other row is as
first recorded. Make-room's patience under a packing scheduler
changes no row: on this 45-node slice at 110% load no window's placements say "packs"
(docs/planning.md); its hold-back is pinned in tests/test_plan_hook.py.

Regenerate (only for a deliberate change of results, said in the commit):
``DEFRAG_RECORD_TIMELINE_EVENTS=1 .venv/bin/python -m pytest tests/test_timeline_events.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from defrag.model.resources import Pod
from defrag.sim.defragmenters import DEFRAGMENTERS
from defrag.sim.runner import Task, Workload, run_task
from defrag.sim.state import Placed, SimState
from defrag.sim.synthetic import WorkloadParams, synthetic_nodes, synthetic_pods
from defrag.sim.timeline import TimelineConfig, TimelineRun

FIXTURE = Path(__file__).parent / "fixtures" / "timeline_events.json"
RECORD = os.environ.get("DEFRAG_RECORD_TIMELINE_EVENTS") == "1"

# ~45 nodes (the built-in mix × 0.3), offered 110% of its GPUs, more multi-GPU pods than the
# built-in mix so that pods queue, starve and get rooms made; windows every 2 h so that each
# defragmenter's window, tick and unschedulable paths all run within 8 simulated hours.
NODES = synthetic_nodes(0.3)
PARAMS = WorkloadParams(kinds={"cpu": 0.1, "share": 0.3, "1": 0.4, "2": 0.06, "4": 0.06, "8": 0.08})
SHAPES = synthetic_pods(120, seed=5, params=PARAMS)
CONFIG = TimelineConfig(load=1.1, hours=6.0, warmup_hours=2.0, window_every_h=2.0)
CASES: tuple[tuple[str, str], ...] = (
    *(("least-allocated", d) for d in DEFRAGMENTERS),
    ("reserve-binpack", "defrag"),
    ("fgd", "none"),
    ("random", "none"),
)


def _case_id(case: tuple[str, str]) -> str:
    return f"{case[0]}+{case[1]}"


def _record(monkeypatch: pytest.MonkeyPatch, case: tuple[str, str]) -> dict[str, Any]:
    events: list[str] = []
    place, remove = SimState.place, SimState.remove

    def placing(
        self: SimState, pod: Pod, row: int, gpus: Sequence[int], now: float = 0.0
    ) -> Placed:
        events.append(f"+ {pod.key} {row} {','.join(map(str, gpus))} {now!r}")
        return place(self, pod, row, gpus, now)

    def removing(self: SimState, pod_id: str) -> Placed:
        events.append(f"- {pod_id}")
        return remove(self, pod_id)

    monkeypatch.setattr(SimState, "place", placing)
    monkeypatch.setattr(SimState, "remove", removing)
    policy, defragmenter = case
    task = Task("timeline", policy, 3, timeline=CONFIG, defragmenter=defragmenter)
    run = run_task(Workload("slice", NODES, SHAPES), task)
    assert isinstance(run, TimelineRun)
    report = run.to_dict(series=True)
    report.pop("seconds")
    return {"events": events, "report": report}


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    if RECORD:
        return {}
    data: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return data


_RECORDED: dict[str, Any] = {}


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_every_event_is_the_recorded_one(
    monkeypatch: pytest.MonkeyPatch, golden: dict[str, Any], case: tuple[str, str]
) -> None:
    got = _record(monkeypatch, case)
    if RECORD:
        _RECORDED[_case_id(case)] = got
        FIXTURE.write_text(json.dumps(_RECORDED, indent=0, sort_keys=True) + "\n", "utf-8")
        return
    want = golden[_case_id(case)]
    for i, (w, g) in enumerate(zip(want["events"], got["events"], strict=False)):
        assert g == w, f"event {i} of {len(want['events'])} differs"
    assert len(got["events"]) == len(want["events"])
    assert got["report"] == want["report"]


def test_the_slice_exercises_queueing_and_every_defragmenter() -> None:
    # The fixture is worth something only if the runs wait and move: pods left the queue
    # under least-allocated, and every defragmenter but none evicted something.
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    base = data["least-allocated+none"]["report"]
    assert base["mean_queue"] > 0
    moved = {k: v["report"]["evictions"] for k, v in data.items()}
    assert moved["least-allocated+none"] == 0
    runs = [k.split("+") for k, n in moved.items() if n == 0]
    still = {defragmenter for policy, defragmenter in runs if policy == "least-allocated"}
    # Three peers in their upstream configurations (issue 25) find nothing to move on this
    # 45-node slice offered 110% of its GPUs (their sensitivity rows do move); their move paths
    # are pinned case by case in tests/conformance/.
    assert still == {"none", "descheduler-hnu", "descheduler-hnu-lenient", "kai-consolidation"}
