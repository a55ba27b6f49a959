"""Reads the controlling owners of the pods a plan would evict (:data:`~defrag.plan.planner.
OwnerLookup`): does the owner exist, with the UID the pod names, not being deleted, and — a
batch/v1 Job — how many retries it has left (:mod:`defrag.plan.owners`).

One GET per owner, asked only for a plan's victims (a steady cycle without a plan asks nothing);
the answers are kept for :data:`KEEP_S` seconds, so a room that waits several cycles does not
read its Job every cycle, and dropped at once on any doubt: a failed read is facts with a
``problem`` (the pod is not moved), never kept.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from defrag.adapters.kube import API_ERRORS, RetryPolicy, _Caller, _describe, _loaded
from defrag.model.resources import OwnerRef
from defrag.plan.owners import JobFacts, OwnerFacts, TrainingFacts

KEEP_S = 10.0
"""How long an owner's answer is reused. Short: a Job's ``status.failed`` moves as its pods
fail, and the planner's retries count from it."""

PLURALS: Mapping[tuple[str, str], tuple[str, str]] = {
    ("apps", "ReplicaSet"): ("v1", "replicasets"),
    ("apps", "StatefulSet"): ("v1", "statefulsets"),
    ("", "ReplicationController"): ("v1", "replicationcontrollers"),
    ("batch", "Job"): ("v1", "jobs"),
    ("ray.io", "RayCluster"): ("v1", "rayclusters"),
    ("kubeflow.org", "PyTorchJob"): ("v1", "pytorchjobs"),
}
"""(group, kind) → (the version asked when the reference names none, the resource): each kind of
:data:`~defrag.plan.owners.RECREATING_KINDS` and ``READ_KINDS`` (a test keeps them in step),
granted ``get`` in deploy/base/rbac.yaml."""

TERMINAL_CONDITIONS = {
    "Complete": "Complete",
    "Failed": "Failed",
    "SuccessCriteriaMet": "Complete",
    "FailureTarget": "Failed",
}
"""A Job's conditions that say it has ended or is ending (kubernetes pkg/apis/batch/types.go
JobConditionType; FailureTarget and SuccessCriteriaMet are set before the terminal one)."""

TRAINING_TERMINAL_CONDITIONS = {"Succeeded": "Succeeded", "Failed": "Failed"}
"""A Kubeflow training job's conditions that say it has ended (kubeflow.org/v1 JobConditionType)."""


class KubeOwnerLookup:
    """Owners read from the API server, as the planner's :data:`OwnerLookup` port."""

    def __init__(
        self,
        api: client.ApiClient,
        retry: RetryPolicy | None = None,
        keep_s: float = KEEP_S,
        monotonic: Any = time.monotonic,
    ) -> None:
        self.api = api
        self.call = _Caller(retry or RetryPolicy(attempts=2, backoff_s=0.2), api)
        self.custom: Any = client.CustomObjectsApi(api)  # raw JSON both ways
        self.core: Any = client.CoreV1Api(api)
        self.keep_s = keep_s
        self.monotonic = monotonic
        self._kept: dict[str, tuple[float, OwnerFacts]] = {}
        self._lock = threading.Lock()

    def __call__(self, wanted: Mapping[str, tuple[str, OwnerRef]]) -> dict[str, OwnerFacts]:
        now = self.monotonic()
        out: dict[str, OwnerFacts] = {}
        for key, (namespace, ref) in wanted.items():
            with self._lock:
                kept = self._kept.get(key)
            if kept is not None and now - kept[0] < self.keep_s:
                out[key] = kept[1]
                continue
            facts = self.read(namespace, ref)
            out[key] = facts
            with self._lock:
                if facts.problem:
                    self._kept.pop(key, None)
                else:
                    self._kept[key] = (now, facts)
        with self._lock:  # forget what is past its time, so the map stays as small as a plan
            for key in [k for k, (t, _) in self._kept.items() if now - t >= self.keep_s]:
                del self._kept[key]
        return out

    def read(self, namespace: str, ref: OwnerRef) -> OwnerFacts:
        """The owner ``ref`` of a pod in ``namespace``, as the API server answers now."""
        known = PLURALS.get((ref.group, ref.kind))
        if known is None:
            return OwnerFacts(found=False, problem=f"defrag does not read {ref.kind} objects")
        version = ref.api_version.rpartition("/")[2] or known[0]
        plural = known[1]
        try:
            response = self.call(
                lambda: _loaded(self._get(ref.group, version, namespace, plural, ref.name))
            )
        except ApiException as exc:
            if exc.status == 404:
                return OwnerFacts(found=False)
            what = f"{plural}.{ref.group}" if ref.group else plural
            hint = f" (defrag's ClusterRole needs get on {what})" if exc.status == 403 else ""
            return OwnerFacts(found=False, problem=f"{_describe(exc)}{hint}")
        except API_ERRORS as exc:  # cut off, refused, timed out
            return OwnerFacts(found=False, problem=_describe(exc))
        try:
            obj = json.loads(response.data)
        except ValueError as exc:
            return OwnerFacts(found=False, problem=f"unreadable answer ({exc})")
        return owner_facts(ref.kind, ref.group, obj)

    def _get(self, group: str, version: str, namespace: str, plural: str, name: str) -> Any:
        if group:
            return self.custom.get_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                name,
                _preload_content=False,
                _request_timeout=self.call.timeout,
            )
        # The core group has one such kind; CustomObjectsApi's paths are /apis/ only.
        return self.core.read_namespaced_replication_controller(
            name, namespace, _preload_content=False, _request_timeout=self.call.timeout
        )


def owner_facts(kind: str, group: str, obj: Any) -> OwnerFacts:
    """What an owner object (the API server's JSON) says of the pods it owns."""
    if not isinstance(obj, dict):
        return OwnerFacts(found=False, problem="the answer is not an object")
    meta = obj.get("metadata") or {}
    facts = OwnerFacts(
        found=True,
        uid=str(meta.get("uid") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if (group, kind) == ("kubeflow.org", "PyTorchJob"):
        return replace(facts, training=training_facts(spec, status))
    if (group, kind) == ("batch", "Job"):
        return replace(facts, job=job_facts(spec, status))
    return facts


def job_facts(spec: Mapping[str, Any], status: Mapping[str, Any]) -> JobFacts:
    """A batch/v1 Job's spec and status as :class:`JobFacts` (the API's defaults where a field
    is left out; an unreadable number counts as no retry left)."""
    backoff = _int(spec.get("backoffLimit"), 6)
    per_index = spec.get("backoffLimitPerIndex")
    return JobFacts(
        backoff_limit=backoff,
        failed=_int(status.get("failed"), 0, bad=backoff + 1),
        ignores_disruption=_ignores_disruption(spec.get("podFailurePolicy")),
        backoff_limit_per_index=None if per_index is None else _int(per_index, 0),
        finished=_ended(status, TERMINAL_CONDITIONS),
        suspended=spec.get("suspend") is True,
    )


def training_facts(spec: Mapping[str, Any], status: Mapping[str, Any]) -> TrainingFacts:
    """A kubeflow.org/v1 PyTorchJob's spec and status as :class:`TrainingFacts`: each replica
    type's ``restartPolicy`` (OnFailure, the API's default, when left out), the run policy's
    ``backoffLimit``, whether it has ended (a ``Succeeded`` or ``Failed`` condition)."""
    replicas = spec.get("pytorchReplicaSpecs")
    policies: dict[str, str] = {}
    if isinstance(replicas, Mapping):
        for kind, replica in replicas.items():
            policy = replica.get("restartPolicy") if isinstance(replica, Mapping) else None
            policies[str(kind).lower()] = str(policy) if policy else "OnFailure"
    run = spec.get("runPolicy")
    limit = run.get("backoffLimit") if isinstance(run, Mapping) else None
    ended = _ended(status, TRAINING_TERMINAL_CONDITIONS)
    return TrainingFacts(policies, None if limit is None else _int(limit, 0), ended)


def _ended(status: Mapping[str, Any], terminal: Mapping[str, str]) -> str:
    """How the object has ended by the last of its true ``terminal`` conditions ("": not)."""
    ended = ""
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("status") == "True":
            ended = terminal.get(str(cond.get("type")), ended)
    return ended


def _ignores_disruption(policy: Any) -> bool:
    """Whether a rule of ``podFailurePolicy`` ignores a pod with the DisruptionTarget condition
    (the condition an eviction sets; rules are matched in order, the first match decides, so
    a rule before it that matches the same pod otherwise is not looked into: only a policy
    whose first condition rule is that Ignore counts)."""
    if not isinstance(policy, dict):
        return False
    for rule in policy.get("rules") or []:
        if not isinstance(rule, dict):
            return False
        conditions = rule.get("onPodConditions") or []
        if rule.get("onExitCodes") is not None:
            # An exit-code rule could match an evicted pod first (its containers are killed).
            return False
        for cond in conditions:
            if (
                isinstance(cond, dict)
                and cond.get("type") == "DisruptionTarget"
                and cond.get("status", "True") == "True"
            ):
                return rule.get("action") == "Ignore"
    return False


def _int(value: Any, default: int, bad: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        return bad
    return value
