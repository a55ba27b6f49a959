"""NVIDIA/KAI-Scheduler's own consolidation test tables, one row per upstream case.

Upstream: NVIDIA/KAI-Scheduler commit 72de64f, ``pkg/scheduler/actions/consolidation/
consolidation_test.go`` (the action alone, ``CONS``) and ``pkg/scheduler/actions/
integration_tests/consolidation/consolidation_test.go`` and ``consolidationFractional_test.go``
(a whole session, ``INT``/``FRAC``); each row cites the line of its case's ``Name``.

How a case is translated: every job has one task (pod) asking ``RequiredGPUsPerTask`` GPUs
(a fraction is a GPU share, ``gpu_milli``) with KAI's priority class of its ``Priority``
(``constants.Priority*Number``); nodes have their ``GPUs`` and room for every pod's CPU and
memory (the fixtures ask none); a fractional running pod has a GPU of its own ("running on
different GPUs"). Jobs are created in list order, oldest first (``jobs_fake/jobs.go``
``BuildJobsAndTasksMaps``: now − (jobs − index) minutes), which the job order breaks ties
with. The expectation per job: its node afterwards (None: still pending) and, in the
action's own tests, whether it moved (``Pipelined``) or stayed (``Running``); the
integration tests report every pod ``Running`` on its final node, so only the node is
checked there.

Cases that cannot be mapped are in :data:`UNMAPPED` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

CONS = "actions/consolidation/consolidation_test.go"
INT = "actions/integration_tests/consolidation/consolidation_test.go"
FRAC = "actions/integration_tests/consolidation/consolidationFractional_test.go"
TRAIN, INTERACTIVE, BUILD = "train", "interactive-preemptible", "build"


@dataclass(frozen=True)
class J:
    """A one-task job: its GPUs, its class, the node it runs on (None: pending), and what
    upstream expects — the node afterwards (None: pending) and, where the test says,
    whether it moved (True: Pipelined victim) or not (False: Running)."""

    name: str
    gpus: float
    node: str | None
    expect_node: str | None
    moved: bool | None = None
    cls: str = TRAIN


@dataclass(frozen=True)
class KaiCase:
    name: str
    where: str
    nodes: tuple[tuple[str, int], ...]
    jobs: tuple[J, ...]


def run(
    name: str, gpus: float, node: str, after: str, moved: bool | None = None, cls: str = TRAIN
) -> J:
    return J(name, gpus, node, after, moved, cls)


def pend(name: str, gpus: float, after: str | None, cls: str = TRAIN) -> J:
    return J(name, gpus, None, after, None, cls)


FOUR = (("node0", 4), ("node1", 4))
TWO = (("node0", 2), ("node1", 2))

KAI_CASES: tuple[KaiCase, ...] = (
    KaiCase("2 jobs of 1 task running on different GPUs, two pending jobs, only first can be "
            "consolidated", f"{CONS}:46", FOUR,
            (run("running_job0", 2, "node0", "node0", False),
             run("running_job1", 2, "node1", "node0", True),
             pend("pending_job0", 3, "node1"), pend("pending_job1", 2, None))),
    KaiCase("2 jobs of 1 task running on different GPUs, 2 pending jobs, only second can be "
            "consolidated", f"{CONS}:254", FOUR,
            (run("running_job0", 2, "node0", "node0", False),
             run("running_job1", 2, "node1", "node0", True),
             pend("pending_job0", 5, None), pend("pending_job1", 3, "node1"))),
    KaiCase("2 jobs of 1 task running on different GPUs, two pending jobs - can't Consolidate",
            f"{CONS}:467", FOUR,
            (run("running_job0", 3, "node0", "node0", False),
             run("running_job1", 3, "node1", "node1", False),
             pend("pending_job0", 2, None), pend("pending_job1", 2, None))),
    KaiCase("2 jobs of 1 task running on different GPUs, 1 job of 3 gpus is pending - can't "
            "Consolidate", f"{CONS}:554", FOUR,
            (run("running_job0", 3, "node0", "node0", False),
             run("running_job1", 3, "node1", "node1", False), pend("pending_job0", 3, None))),
    KaiCase("3 jobs are running on different GPUs, 1 job pending - Consolidate and verify not "
            "all preemptors are evicted as well", f"{CONS}:626", FOUR,
            (run("running_job0", 3, "node0", "node0", False),
             run("running_job1", 1, "node1", "node0", True),
             run("running_job2", 2, "node1", "node1", False), pend("pending_job0", 2, "node1"))),
    KaiCase("2 build jobs are running on different GPUs - never consoliate", f"{CONS}:722", TWO,
            (run("running_job0", 1, "node0", "node0", False, BUILD),
             run("running_job1", 1, "node1", "node1", False, BUILD),
             pend("pending_job0", 2, None, BUILD))),
    KaiCase("2 jobs running on different nodes - verify build job allocation isn't handled by "
            "consolidation", f"{CONS}:795", FOUR,
            (run("running_job0", 1, "node0", "node0", False),
             run("running_job1", 1, "node1", "node1", False),
             pend("pending_job0", 2, None, BUILD))),
    KaiCase("2 jobs of 1 task running on different GPUs, 1 task is preemptible interactive job, "
            "1 job of 2 gpus is pending - consolidate without killing the preemptible "
            "interactive", f"{CONS}:1061", FOUR,
            (run("running_job0", 2, "node0", "node1", True),
             run("running_job1", 2, "node1", "node1", False, INTERACTIVE),
             pend("pending_job0", 3, "node0"))),
    KaiCase("2 jobs of 0.5 task running on different GPUs, 1 job of 1 gpus is pending - "
            "Consolidate and run the pending job", f"{CONS}:1140", (("node0", 2),),
            (run("running_job0", 0.5, "node0", "node0", False),
             run("running_job1", 0.5, "node0", "node0", True), pend("pending_job0", 1, "node0"))),
    KaiCase("jump over full nodes pods", f"{CONS}:1472",
            (("node0", 4), ("node1", 4), ("node2", 4), ("node3", 4)),
            (run("running_job0", 4, "node0", "node0", False),
             run("running_job1", 2, "node1", "node1", False),
             run("running_job2", 2, "node2", "node1", True),
             run("running_job3", 4, "node3", "node3", False), pend("pending_job0", 3, "node2"))),
    KaiCase("1 train job of 1 GPU running on node0, 1 train job of 1 GPU running on node 0, 1 "
            "pending job of 2 GPUs - consolidate", f"{INT}:30", TWO,
            (run("running_job0", 1, "node0", "node0"), run("running_job1", 1, "node1", "node0"),
             pend("pending_job0", 2, "node1"))),
    KaiCase("1 build job of 1 GPU running on node0, 1 build job of 1 GPU running on node 0, 1 "
            "pending job of 2 GPUs - don't consolidate", f"{INT}:108", TWO,
            (run("running_job0", 1, "node0", "node0", cls=BUILD),
             run("running_job1", 1, "node1", "node1", cls=BUILD), pend("pending_job0", 2, None))),
    KaiCase("consolidate fractional GPUs and insert a fractional train job", f"{FRAC}:104",
            (("node0", 2),),
            (run("running_job0", 0.5, "node0", "node0"), run("running_job1", 0.5, "node0", "node0"),
             pend("pending_job0", 0.7, "node0"))),
    KaiCase("consolidate fractional GPUs and insert a whole train job", f"{FRAC}:184",
            (("node0", 2),),
            (run("running_job0", 0.5, "node0", "node0"), run("running_job1", 0.5, "node0", "node0"),
             pend("pending_job0", 1, "node0"))),
    KaiCase("can't consolidate fractional GPUs and insert a whole train job", f"{FRAC}:263",
            (("node0", 2),),
            (run("running_job0", 0.5, "node0", "node0"), run("running_job1", 0.6, "node0", "node0"),
             pend("pending_job0", 1, None))),
    KaiCase("can't consolidate fractional GPUs and insert a fractional train job", f"{FRAC}:337",
            (("node0", 2),),
            (run("running_job0", 0.5, "node0", "node0"), run("running_job1", 0.6, "node0", "node0"),
             pend("pending_job0", 0.8, None))),
)  # fmt: skip

UNMAPPED: tuple[tuple[str, str], ...] = (
    (f"{CONS}:140, 348", "a pending job of two tasks (a gang): the timeline's jobs are one pod"),
    (f"{CONS}:868, 961", "two queues with deserved shares (the proportion plugin): the timeline "
     "has one queue"),
    (f"{CONS}:1221, 1293, 1372", "elastic jobs (several tasks, minAvailable 1)"),
    (f"{CONS}:1591", "one job of two tasks that cannot share a node"),
    (f"{CONS}:1786", "MPI jobs (launcher and workers)"),
    (f"{CONS}:1947; {INT}:185, 388", "topology-constrained jobs (racks, zones)"),
    (f"{FRAC}:27 and consolidationGpuMemory_test.go (every case)",
     "GPU-memory requests (a fraction of a GPU's memory): the model asks shares, not MiB"),
    ("actions/consolidation/consolidation_subgroups_test.go (every case)",
     "sub-groups of a multi-task job"),
    ("actions/integration_tests/consolidation/consolidationGang_test.go (every case)",
     "gang jobs (several tasks)"),
)  # fmt: skip
"""Upstream cases with no translation, and why."""
