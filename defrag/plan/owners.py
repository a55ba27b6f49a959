"""Whether an evicted pod comes back: its controlling owner, the kinds known to recreate, and
what a looked-up owner says (a Job's retries).

An eviction deletes the pod. Only a controller that creates a new pod for the one deleted makes
that a move rather than a loss, so a pod is a victim only when

* its ``ownerReferences`` has an entry with ``controller: true`` (a pod with only
  non-controlling owners has no one to recreate it: the garbage collector's owners are not
  controllers);
* that controller's kind is one known to recreate its pods (:data:`RECREATING_KINDS`), or one
  the operator opts in (setting ``planner.evict_owner_kinds``);
* and, when the owner was looked up (:class:`OwnerFacts`, the daemon looks up every victim's
  owner before it acts), it exists with the UID the pod names, is not being deleted, and — a
  batch/v1 Job — has a retry left for the eviction: Kubernetes counts a pod deleted before it
  finished as a failure, and a Job whose failures pass ``spec.backoffLimit`` fails whole
  (``BackoffLimitExceeded``), unless a ``podFailurePolicy`` rule ignores the
  ``DisruptionTarget`` condition an eviction sets.

Within one plan a Job's retries are spent like a disruption budget
(:meth:`~defrag.plan.constraints.Ledger.check`): two evictions need two retries left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from defrag.model.resources import OwnerRef, Pod
from defrag.model.status import Status

BARE_POD = "bare-pod"
"""No controlling owner that recreates the pod (the constraint's name in a plan's blocked)."""
JOB_RETRIES = "job-retries"
"""A batch/v1 Job with fewer retries left than the plan would spend on it."""

INDEX_FAILURE_ANNOTATION = "batch.kubernetes.io/job-index-failure-count"
"""The failures so far of an Indexed Job's index, which the Job controller writes on each pod
of the index (kubernetes pkg/apis/batch/types.go, JobIndexFailureCountAnnotation)."""

RECREATING_KINDS: Mapping[tuple[str, str], str] = {
    ("apps", "ReplicaSet"): "keeps spec.replicas pods, at once (Deployments own ReplicaSets)",
    ("apps", "StatefulSet"): "recreates the ordinal once the old pod is gone (LeaderWorkerSet's)",
    ("", "ReplicationController"): "the ReplicaSet controller's code: keeps spec.replicas pods",
    ("batch", "Job"): "recreates while retries are left (backoffLimit, podFailurePolicy)",
    ("ray.io", "RayCluster"): "KubeRay recreates a missing head or worker pod",
}
"""(API group, kind) of the controllers that create a new pod for one deleted, whatever their
spec says (a Job: as long as its looked-up retries allow). A reference without an apiVersion
(trace pods) is matched by kind alone. Not here, because whether they recreate depends on
their spec: Kubeflow's training jobs (a replica whose ``restartPolicy`` is ``Never``, the
default of TFJob, MPIJob, XGBoostJob and JAXJob, fails the whole job) and Volcano Jobs (a
``PodEvicted`` policy may abort or restart the job): opt in with ``planner.evict_owner_kinds`` when
yours do. Each source in docs/planning.md, "Only what comes back"."""


READ_KINDS: Mapping[tuple[str, str], str] = {
    ("kubeflow.org", "PyTorchJob"): (
        "the training operator recreates a replica whose restartPolicy is not Never"
    ),
}
"""Kinds that recreate an evicted pod only when their spec says so: trusted per object, once
read (:class:`TrainingFacts`), never by kind alone (opting the kind in trusts every object)."""

REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
"""The replica type (Master, Worker; the operator writes it lower-cased in recent releases) the
training operator puts on each pod it creates."""


@dataclass(frozen=True, slots=True)
class TrainingFacts:
    """What of a Kubeflow training job decides whether it recreates an evicted replica.

    The operator counts a deleted running pod as a failed replica; with the replica's
    ``restartPolicy`` ``Never`` the job fails, otherwise it restarts and recreates the pod
    (kubeflow/training-operator v1.9.0, ``pkg/core/status.go``, ``pytorchjob_controller.go``
    ``UpdateJobStatus``). ``runPolicy.backoffLimit`` caps the restarts by a count the operator
    keeps in its work queue, which no one can read: a job that sets it is not trusted."""

    restart_policies: Mapping[str, str]
    """Replica type (lower-cased) → its ``restartPolicy`` (the API's default, OnFailure, when
    the spec leaves it out)."""
    backoff_limit: int | None = None
    """``spec.runPolicy.backoffLimit``."""
    finished: str = ""
    """``Succeeded`` or ``Failed`` when the job has ended."""


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What of a batch/v1 Job decides whether one more deleted pod fails it."""

    backoff_limit: int = 6
    """``spec.backoffLimit`` (the API's default is 6)."""
    failed: int = 0
    """``status.failed``: pods counted failed so far."""
    ignores_disruption: bool = False
    """A ``spec.podFailurePolicy`` rule with action Ignore on the ``DisruptionTarget`` pod
    condition: an eviction is not counted."""
    backoff_limit_per_index: int | None = None
    """``spec.backoffLimitPerIndex`` (an Indexed Job's limit per index), None when unset."""
    finished: str = ""
    """``Complete`` or ``Failed`` when the Job has ended (its pods are not rescheduled)."""
    suspended: bool = False
    """``spec.suspend``: the Job controller deletes its pods and creates none."""


@dataclass(frozen=True, slots=True)
class OwnerFacts:
    """A pod's controlling owner as the API server answered for it."""

    found: bool
    uid: str = ""
    deleting: bool = False
    """``metadata.deletionTimestamp`` set: the owner and its pods are going."""
    job: JobFacts | None = None
    training: TrainingFacts | None = None
    problem: str = ""
    """Why the owner could not be read (forbidden, unreachable): not proven, so not moved."""


def owner_key(pod: Pod) -> str | None:
    """``namespace/Kind/name`` of the pod's controlling owner, None without one."""
    owner = pod.owner
    if owner is None or not owner.controller:
        return None
    return f"{pod.namespace}/{owner.kind}/{owner.name}"


def kind_name(owner: OwnerRef) -> str:
    """``Kind.group`` (``Kind`` alone in the core group or without an apiVersion): the form of
    the setting ``planner.evict_owner_kinds``."""
    return f"{owner.kind}.{owner.group}" if owner.group else owner.kind


def read_kind(owner: OwnerRef) -> bool:
    """Whether defrag reads owners of this kind before it evicts (known and read kinds)."""
    return (owner.group, owner.kind) in READ_KINDS or known_kind(owner)


def known_kind(owner: OwnerRef, extra: Iterable[str] = ()) -> bool:
    """Whether ``owner``'s kind recreates pods (known, or opted in by ``extra``)."""
    if owner.api_version:
        known = (owner.group, owner.kind) in RECREATING_KINDS
    else:
        known = any(kind == owner.kind for _, kind in RECREATING_KINDS)
    return known or kind_name(owner) in extra or owner.kind in extra


def recreation(
    pod: Pod, facts: OwnerFacts | None, extra: Iterable[str] = (), *, reading: bool = False
) -> Status:
    """Whether evicting ``pod`` is a move (its controller makes a new one) and not a loss.

    ``facts``: the owner as looked up (None: not looked up; the kind alone decides, as for a
    snapshot file or a trace). ``reading``: the owner will be read before the plan stands, so
    a kind trusted only per object (:data:`READ_KINDS`) may be chosen unread for now."""
    owner = pod.owner
    if owner is None:
        return Status.fail(f"{BARE_POD}: no owner would recreate it")
    if not owner.controller:
        return Status.fail(
            f"{BARE_POD}: {owner.kind} {owner.name} owns it but is not its controller; "
            "no controller would recreate it"
        )
    if owner.kind == "Node":
        return Status.fail(f"{BARE_POD}: a static pod of node {owner.name}")
    read_only = (owner.group, owner.kind) in READ_KINDS and not known_kind(owner, extra)
    if read_only and facts is None and not reading:
        return Status.fail(
            f"{BARE_POD}: its controller {kind_name(owner)} {owner.name} recreates a replica "
            "only when its spec says so, and was not read"
        )
    if not read_only and not known_kind(owner, extra):
        return Status.fail(
            f"{BARE_POD}: its controller {kind_name(owner)} {owner.name} is not a kind known "
            "to recreate pods (opt in with planner.evict_owner_kinds)"
        )
    if facts is None:
        return Status.success()  # known kind; or read kind, to be read before the plan stands
    what = f"{owner.kind} {owner.name}"
    if facts.problem:
        return Status.fail(f"{BARE_POD}: its controller {what} could not be read: {facts.problem}")
    if not facts.found:
        return Status.fail(f"{BARE_POD}: its controller {what} does not exist")
    if owner.uid and facts.uid and owner.uid != facts.uid:
        return Status.fail(
            f"{BARE_POD}: its controller {what} is another object now (UID {facts.uid}, "
            f"the pod names {owner.uid})"
        )
    if facts.deleting:
        return Status.fail(f"{BARE_POD}: its controller {what} is being deleted")
    if facts.job is not None:
        return _job(pod, facts.job, what)
    if facts.training is not None and read_only:
        return _training(pod, facts.training, what)
    return Status.success()


def _training(pod: Pod, job: TrainingFacts, what: str) -> Status:
    if job.finished:
        return Status.fail(f"{BARE_POD}: its controller {what} has {job.finished.lower()}")
    if job.backoff_limit is not None:
        return Status.fail(
            f"{BARE_POD}: its controller {what} caps its restarts (runPolicy.backoffLimit "
            f"{job.backoff_limit}) by a count no one can read"
        )
    kind = pod.labels.get(REPLICA_TYPE_LABEL, "").lower()
    policy = job.restart_policies.get(kind)
    if policy is None:
        return Status.fail(
            f"{BARE_POD}: its controller {what} has no replica type {kind or '(unlabelled)'}"
        )
    if policy == "Never":
        return Status.fail(
            f"{BARE_POD}: its controller {what} fails the job when a {kind} replica is deleted "
            "(restartPolicy Never)"
        )
    return Status.success()


def retries_left(pod: Pod, job: JobFacts) -> int | None:
    """How many more of the Job's pods may be deleted before it fails (None: no limit)."""
    if job.ignores_disruption:
        return None
    if job.backoff_limit_per_index is not None:
        raw = pod.annotations.get(INDEX_FAILURE_ANNOTATION, "0")
        try:
            failures = int(raw)
        except ValueError:
            return 0  # unreadable: not proven to have a retry
        return max(job.backoff_limit_per_index - failures, 0)
    # The Job fails once status.failed exceeds spec.backoffLimit (job_controller.go,
    # exceedsBackoffLimit: failed > backoffLimit); an index once the failures its pods carry
    # reach backoffLimitPerIndex (indexed_job_utils.go, isIndexFailed).
    return max(job.backoff_limit - job.failed, 0)


def _job(pod: Pod, job: JobFacts, what: str) -> Status:
    if job.finished:
        return Status.fail(f"{BARE_POD}: its controller {what} has {job.finished.lower()}")
    if job.suspended:
        return Status.fail(f"{BARE_POD}: its controller {what} is suspended")
    left = retries_left(pod, job)
    if left is not None and left < 1:
        return Status.fail(f"{JOB_RETRIES}: {_retries(pod, job, what, left)}")
    return Status.success()


def retry_budget(pod: Pod, facts: OwnerFacts | None) -> int | None:
    """The retries the plan may spend on ``pod``'s Job (None: not a looked-up Job, or no
    limit); pods of one Job share one count, an Indexed Job's index its own."""
    if facts is None or facts.job is None:
        return None
    return retries_left(pod, facts.job)


def retry_key(pod: Pod, facts: OwnerFacts | None) -> str | None:
    """What the retries of :func:`retry_budget` are counted under: the Job, or its index."""
    key = owner_key(pod)
    if key is None or facts is None or facts.job is None:
        return None
    if facts.job.backoff_limit_per_index is not None:
        index = pod.annotations.get("batch.kubernetes.io/job-completion-index", "")
        return f"{key}#{index}"
    return key


def describe_retries(pod: Pod, facts: OwnerFacts, left: int) -> str:
    owner = pod.owner
    what = f"{owner.kind} {owner.name}" if owner is not None else "its Job"
    job = facts.job if facts.job is not None else JobFacts()
    return _retries(pod, job, what, left)


def _retries(pod: Pod, job: JobFacts, what: str, left: int) -> str:
    if job.backoff_limit_per_index is not None:
        failures = pod.annotations.get(INDEX_FAILURE_ANNOTATION, "0")
        return (
            f"{what} has {left} retr{'y' if left == 1 else 'ies'} left for this index "
            f"(backoffLimitPerIndex {job.backoff_limit_per_index}, {failures} failed); "
            "an eviction counts as a failure"
        )
    return (
        f"{what} has {left} retr{'y' if left == 1 else 'ies'} left (backoffLimit "
        f"{job.backoff_limit}, {job.failed} failed); an eviction counts as a failure"
    )
