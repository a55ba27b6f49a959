"""Only what comes back is evicted: the controlling owner, its kind, and what a looked-up owner
says (defrag/plan/owners.py, the planner's owner rounds in defrag/plan/planner.py)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from defrag.model.resources import OwnerRef, Pod
from defrag.plan import Constraints, make_plan
from defrag.plan.constraints import Ledger, check_pod
from defrag.plan.owners import (
    INDEX_FAILURE_ANNOTATION,
    READ_KINDS,
    RECREATING_KINDS,
    REPLICA_TYPE_LABEL,
    JobFacts,
    OwnerFacts,
    TrainingFacts,
    owner_key,
    recreation,
)
from defrag.plan.planner import plan_with_owners
from tests.test_plan_support import NOW, cluster, fill, gpu_node, pending, running

RS = OwnerRef("ReplicaSet", "web-7d9f", True, "apps/v1", "uid-rs")
JOB = OwnerRef("Job", "etl", True, "batch/v1", "uid-job")


def pod(owner: OwnerRef | None, **kw: object) -> Pod:
    return running("p", "n1", owner=owner, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("owner", "words"),
    [
        (None, "no owner would recreate it"),
        (OwnerRef("ReplicaSet", "x", False, "apps/v1"), "not its controller"),
        (OwnerRef("Pod", "launcher", True, "v1"), "Pod launcher is not a kind known"),
        (OwnerRef("ConfigMap", "cm", True, "v1"), "ConfigMap cm is not a kind known"),
        (OwnerRef("Node", "n1", True, "v1"), "static pod of node n1"),
        # the kind alone is not enough: a Job of another API group is not batch/v1's
        (OwnerRef("Job", "j", True, "example.com/v1"), "Job.example.com j is not a kind known"),
    ],
)
def test_a_pod_no_controller_recreates_is_bare(owner: OwnerRef | None, words: str) -> None:
    status = check_pod(pod(owner), Constraints(), NOW)
    assert not status.ok
    assert status.reasons[0].startswith("bare-pod: ")
    assert words in status.reasons[0]


def test_known_kinds_move_and_an_unknown_kind_moves_only_when_opted_in() -> None:
    for group, kind in RECREATING_KINDS:
        ref = OwnerRef(kind, "o", True, f"{group}/v1" if group else "v1")
        assert check_pod(pod(ref), Constraints(), NOW).ok, kind
    mine = OwnerRef("TrainRun", "r", True, "ml.example.com/v2")
    assert not check_pod(pod(mine), Constraints(), NOW).ok
    opted = Constraints(owner_kinds=frozenset({"TrainRun.ml.example.com"}))
    assert check_pod(pod(mine), opted, NOW).ok
    # a trace pod's reference has no apiVersion: its kind alone decides
    assert check_pod(pod(OwnerRef("ReplicaSet", "r")), Constraints(), NOW).ok


@pytest.mark.parametrize(
    ("facts", "words"),
    [
        (OwnerFacts(found=False), "ReplicaSet web-7d9f does not exist"),
        (OwnerFacts(found=True, uid="uid-other"), "is another object now"),
        (OwnerFacts(found=True, uid="uid-rs", deleting=True), "is being deleted"),
        (OwnerFacts(found=False, problem="HTTP 403: forbidden"), "could not be read: HTTP 403"),
    ],
)
def test_a_looked_up_owner_that_cannot_recreate_blocks(facts: OwnerFacts, words: str) -> None:
    status = recreation(pod(RS), facts)
    assert not status.ok
    assert words in status.reasons[0]
    assert recreation(pod(RS), OwnerFacts(found=True, uid="uid-rs")).ok


@pytest.mark.parametrize(
    ("job", "ok"),
    [
        (JobFacts(backoff_limit=0, failed=0), False),  # the eviction would fail the Job
        (JobFacts(backoff_limit=1, failed=0), True),
        (JobFacts(backoff_limit=3, failed=3), False),
        (JobFacts(backoff_limit=0, ignores_disruption=True), True),
        (JobFacts(backoff_limit=6, finished="Complete"), False),
    ],
)
def test_a_job_moves_only_with_a_retry_left(job: JobFacts, ok: bool) -> None:
    status = recreation(pod(JOB), OwnerFacts(found=True, uid="uid-job", job=job))
    assert status.ok is ok, status


def test_an_indexed_job_counts_the_retries_of_the_pods_index() -> None:
    job = OwnerFacts(found=True, uid="uid-job", job=JobFacts(backoff_limit_per_index=1))
    fresh = pod(JOB, annotations={INDEX_FAILURE_ANNOTATION: "0"})
    spent = pod(JOB, annotations={INDEX_FAILURE_ANNOTATION: "1"})
    garbled = pod(JOB, annotations={INDEX_FAILURE_ANNOTATION: "one"})
    assert recreation(fresh, job).ok
    assert "job-retries" in recreation(spent, job).reasons[0]
    assert not recreation(garbled, job).ok


def test_a_plan_spends_a_jobs_retries_like_a_disruption_budget() -> None:
    a, b = (running(f"w{i}", "n1", owner=JOB) for i in range(2))
    facts = {owner_key(a) or "": OwnerFacts(True, "uid-job", job=JobFacts(backoff_limit=1))}
    ledger = Ledger([], Constraints(), facts)
    status, culprit = ledger.check([(a, "n1"), (b, "n1")])
    assert not status.ok and culprit == b.key
    assert status.reasons[0].startswith("job-retries: Job etl has 1 retry left")
    assert ledger.check([(a, "n1")])[0].ok
    ledger.commit([(a, "n1")])
    assert "0 retries left" in ledger.check([(b, "n1")])[0].reasons[0]


class Lookup:
    """An owner lookup answering from a table, counting what it was asked."""

    def __init__(self, table: Mapping[str, OwnerFacts]) -> None:
        self.table = table
        self.asked: list[set[str]] = []

    def __call__(self, wanted: Mapping[str, tuple[str, OwnerRef]]) -> dict[str, OwnerFacts]:
        self.asked.append(set(wanted))
        return {k: self.table.get(k, OwnerFacts(found=True)) for k in wanted}


def test_the_plan_looks_up_its_victims_and_plans_around_a_job_without_retries() -> None:
    # n2 holds three pods of a Job with backoffLimit 0 (the cheapest room: younger pods);
    # n1 four ReplicaSet pods. Without lookups the plan empties n2; with them it must not.
    nodes = [gpu_node("n1", gpus=8), gpu_node("n2", gpus=8), gpu_node("n3", gpus=8)]
    pods = [
        *fill("n1", 4, owner=RS),
        *fill("n2", 3, owner=JOB, hours=0.5),
        *fill("n3", 4, prefix="x", owner=RS),
        pending("big", 8),
    ]
    c = cluster(nodes, pods)
    blind = make_plan(c, "make-room", now=NOW)
    assert {s.source for s in blind.steps} == {"n2"}
    job_key = "default/Job/etl"
    lookup = Lookup({job_key: OwnerFacts(True, "uid-job", job=JobFacts(backoff_limit=0))})
    plan = plan_with_owners(c, lookup, "make-room", now=NOW)
    assert plan.steps and {s.source for s in plan.steps} <= {"n1", "n3"}
    assert not any("n2-" in s.pod for s in plan.steps)
    assert any(b.constraint == "job-retries" for b in plan.blocked)
    assert job_key in lookup.asked[0]
    # the second plan's victims were looked up too, and needed no third round
    assert any("default/ReplicaSet/web-7d9f" in asked for asked in lookup.asked)
    assert len(lookup.asked) == 2


def test_owners_the_lookup_finds_recreating_cost_one_round() -> None:
    nodes = [gpu_node("n1"), gpu_node("n2")]
    pods = [*fill("n1", 3, owner=RS), *fill("n2", 5, prefix="y", owner=RS), pending("big", 8)]
    lookup = Lookup({})
    plan = plan_with_owners(cluster(nodes, pods), lookup, "make-room", now=NOW)
    assert plan.steps
    assert lookup.asked == [{"default/ReplicaSet/web-7d9f"}]


def test_after_the_rounds_every_owner_is_read_once_and_the_last_plan_uses_them() -> None:
    # Each round finds the next node's owner refusing: after LOOKUP_ROUNDS plans, every owner
    # in the cluster is read and the final plan has no victim whose owner said no.
    nodes = [gpu_node(f"n{i}") for i in range(1, 6)]
    owners = [OwnerRef("ReplicaSet", f"rs{i}", True, "apps/v1", f"u{i}") for i in range(1, 6)]
    pods = [*(p for i, o in enumerate(owners, 1) for p in fill(f"n{i}", 1 + i % 2, owner=o))]
    pods.append(pending("big", 8))
    table = {f"default/ReplicaSet/rs{i}": OwnerFacts(found=False) for i in range(1, 5)}
    lookup = Lookup(table)
    plan = plan_with_owners(cluster(nodes, pods), lookup, "make-room", now=NOW)
    assert {s.source for s in plan.steps} == {"n5"}
    asked = set().union(*lookup.asked)
    assert asked == {f"default/ReplicaSet/rs{i}" for i in range(1, 6)}
    assert sum(len(a) for a in lookup.asked) == len(asked)  # nobody read twice


def test_the_adapter_reads_every_kind_the_core_trusts_and_no_other() -> None:
    from defrag.adapters.kube_owners import PLURALS

    assert set(PLURALS) == set(RECREATING_KINDS) | set(READ_KINDS)


def test_a_jobs_spec_and_status_as_the_api_server_gives_them() -> None:
    # batch/v1 Job fields (kubernetes pkg/apis/batch/types.go): backoffLimit defaulted to 6,
    # podFailurePolicy rules in order, the terminal and terminal-intent conditions.
    from defrag.adapters.kube_owners import job_facts

    assert job_facts({}, {}) == JobFacts(backoff_limit=6, failed=0)
    ignore = {
        "rules": [
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            }
        ]
    }
    assert job_facts({"podFailurePolicy": ignore}, {}).ignores_disruption
    # an exit-code rule first may match the evicted pod's killed containers before it
    exit_first = {"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [137]}},
        *ignore["rules"],
    ]}  # fmt: skip
    assert not job_facts({"podFailurePolicy": exit_first}, {}).ignores_disruption
    counted = {"rules": [{"action": "Count", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    assert not job_facts({"podFailurePolicy": counted}, {}).ignores_disruption
    failing = {"conditions": [{"type": "FailureTarget", "status": "True"}], "failed": 1}
    assert job_facts({"backoffLimit": 0}, failing) == JobFacts(0, 1, finished="Failed")
    assert job_facts({"suspend": True}, {}).suspended
    assert job_facts({"backoffLimitPerIndex": 2}, {}).backoff_limit_per_index == 2


PYTORCH = OwnerRef("PyTorchJob", "bert", True, "kubeflow.org/v1", "uid-pt")


@pytest.mark.parametrize(
    ("replica", "training", "words"),
    [
        ("worker", TrainingFacts({"master": "OnFailure", "worker": "OnFailure"}), ""),
        ("Worker", TrainingFacts({"worker": "ExitCode"}), ""),  # the label's older casing
        ("worker", TrainingFacts({"worker": "Never"}), "restartPolicy Never"),
        ("worker", TrainingFacts({"worker": "OnFailure"}, backoff_limit=3), "backoffLimit 3"),
        ("worker", TrainingFacts({"worker": "OnFailure"}, finished="Succeeded"), "succeeded"),
        ("launcher", TrainingFacts({"worker": "OnFailure"}), "no replica type launcher"),
    ],
)
def test_a_pytorchjob_is_trusted_per_object_once_read(
    replica: str, training: TrainingFacts, words: str
) -> None:
    p = pod(PYTORCH, labels={REPLICA_TYPE_LABEL: replica})
    status = recreation(p, OwnerFacts(True, "uid-pt", training=training))
    assert status.ok is (words == ""), status
    if words:
        assert words in status.reasons[0]
    # never by its kind alone: unread, it is not proven
    assert "was not read" in recreation(p, None).reasons[0]
    # opting the kind in trusts every object, unread
    assert recreation(p, None, ["PyTorchJob.kubeflow.org"]).ok


def test_a_pytorchjobs_spec_as_the_api_server_gives_it() -> None:
    # kubeflow.org/v1 PyTorchJob (training-operator pkg/apis/kubeflow.org/v1): a map of replica
    # type to ReplicaSpec (restartPolicy OnFailure by default), runPolicy, JobConditions.
    from defrag.adapters.kube_owners import owner_facts

    job = {
        "metadata": {"uid": "uid-pt"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "Never"},
                "Worker": {"replicas": 3},
            },
            "runPolicy": {"cleanPodPolicy": "None"},
        },
        "status": {"conditions": [{"type": "Running", "status": "True"}]},
    }
    facts = owner_facts("PyTorchJob", "kubeflow.org", job)
    assert facts.training == TrainingFacts({"master": "Never", "worker": "OnFailure"})


def test_a_pytorchjob_pod_is_chosen_once_its_job_is_read_and_only_then() -> None:
    # The only room is on n1, whose pod is a PyTorchJob worker. Unread (a snapshot), it stays;
    # read as OnFailure, it moves; read as Never, it stays and says why.
    nodes = [gpu_node("n1"), gpu_node("n2")]
    worker = running("w", "n1", 4, owner=PYTORCH, labels={REPLICA_TYPE_LABEL: "worker"})
    kept = {"defrag.io/evictable": "false"}
    pods = [worker, *fill("n2", 4, prefix="x", owner=RS, annotations=kept), pending("big", 8)]
    c = cluster(nodes, pods)
    assert make_plan(c, "make-room", now=NOW).steps == ()
    key = "default/PyTorchJob/bert"
    recreates = TrainingFacts({"worker": "OnFailure"})
    restarts = Lookup({key: OwnerFacts(True, "uid-pt", training=recreates)})
    plan = plan_with_owners(c, restarts, "make-room", now=NOW)
    assert [s.pod for s in plan.steps] == ["default/w"]
    assert key in restarts.asked[0]
    fails = Lookup({key: OwnerFacts(True, "uid-pt", training=TrainingFacts({"worker": "Never"}))})
    plan = plan_with_owners(c, fails, "make-room", now=NOW)
    assert plan.steps == ()
    assert any("restartPolicy Never" in b.detail for b in plan.blocked)
