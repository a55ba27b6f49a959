"""The simulator's cluster view shows running pods as the cluster would: created at their
(re)start, with ``defrag.io/last-checkpoint``, and by the same object at a later cycle while
nothing it shows has changed."""

from __future__ import annotations

from datetime import timedelta

import pytest

from defrag.model.resources import CHECKPOINT_ANNOTATION, Node, Pod
from defrag.model.workload import WorkloadMix
from defrag.scoring.policies import make_policy
from defrag.sim.daemon_view import EPOCH, ClusterView
from defrag.sim.migration import Job
from defrag.sim.state import SimState


def _state(interval: float | None, started: float | None) -> SimState:
    """One 4-GPU node running ``job`` (1 GPU, started at ``started``, checkpointing every
    ``interval`` hours of work; None: never) and ``cpu`` (no job: shown as it is)."""
    nodes = [Node("a", cpu_milli=32_000, memory_mib=0, num_gpu=4, gpu_model="G2")]
    mix = WorkloadMix.default()
    state = SimState.new(nodes, make_policy("least-allocated", mix=mix), "least-allocated", mix)
    pod = Pod("job", num_gpu=1, cpu_milli=1000, annotations={"team": "x"})
    state.place(pod, 0, (0,), started or 0.0)
    job = Job(pod, 0.0, work_h=50.0, interval_h=interval, overhead_h=0.1)
    if started is not None:
        job.start(started, overhead=False)
    state.jobs[pod.key] = job
    state.place(Pod("cpu", cpu_milli=2000), 0, ())
    return state


def _iso(hours: float) -> str:
    return (EPOCH + timedelta(hours=hours)).isoformat()


@pytest.mark.parametrize(
    ("interval", "started", "cycles", "shown", "same"),
    [
        # checkpoints every 1 h of work from 0.5: at 1.7 and 2.4 the last one was at 1.5
        # (1.2 h and 1.9 h of work: 1 checkpoint), at 2.6 at 2.5 (2.1 h: 2 checkpoints)
        (1.0, 0.5, (1.7, 2.4, 2.6), (1.5, 1.5, 2.5), (None, True, False)),
        # before its first checkpoint a pod shows its start (it resumed from the state then)
        (1.0, 0.5, (0.9, 1.2), (0.5, 0.5), (None, True)),
        # a serving pod (nothing to lose) shows the cycle's time: a new pod each cycle
        (0.0, 0.5, (1.7, 2.4), (1.7, 2.4), (None, False)),
        # a pod that never checkpoints shows no checkpoint, only its start
        (None, 0.5, (1.7, 2.4), (None, None), (None, True)),
    ],
)
def test_a_running_pod_is_shown_with_its_start_and_last_checkpoint(
    interval: float | None,
    started: float,
    cycles: tuple[float, ...],
    shown: tuple[float | None, ...],
    same: tuple[bool | None, ...],
) -> None:
    state = _state(interval, started)
    view = ClusterView()
    before: Pod | None = None
    for now, last, reused in zip(cycles, shown, same, strict=True):
        pods = view.cluster(state, now).pods
        pod = pods["default/job"]
        assert pod.created_at == EPOCH + timedelta(hours=started)
        expected = {"team": "x"} | ({CHECKPOINT_ANNOTATION: _iso(last)} if last is not None else {})
        assert dict(pod.annotations) == expected
        if reused is not None:
            assert (pod is before) == reused
        before = pod
        assert CHECKPOINT_ANNOTATION not in pods["default/cpu"].annotations  # no job
        assert (pod.node, pod.gpu_indices) == ("a", (0,))


def test_a_pod_not_running_in_its_job_is_shown_as_it_is() -> None:
    state = _state(1.0, None)  # the job has not started (pending in the timeline's books)
    pod = ClusterView().cluster(state, 1.0).pods["default/job"]
    assert CHECKPOINT_ANNOTATION not in pod.annotations
    assert pod.created_at == EPOCH  # placed at hour 0
