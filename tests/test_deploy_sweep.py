"""deploy/sweep: the in-cluster sweep renders, its objects validate, its pods run defrag's image
under the restricted Pod Security profile with no API token, its Role grants only what running
a sweep needs, its sweep file plans, and the daemon's overlays do not include it.

The DaskJob's shape is dask-kubernetes's CRD (dask/dask-kubernetes,
dask_kubernetes/operator/customresources/templates.yaml and daskjob.yaml: spec.job.spec and
spec.cluster.spec.{scheduler,worker}.spec are PodSpecs, the scheduler's service a ServiceSpec);
the scheduler's Service is ``<cluster>-scheduler`` and the operator sets
``DASK_SCHEDULER_ADDRESS`` in the runner and the workers
(dask_kubernetes/operator/controller/controller.py)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from defrag.sim.sweep.spec import load_sweep
from defrag.sim.sweep.tasks import plan_sweep
from tests.test_deploy import DEPLOY, IMAGE, K8S_VERSION, Obj, one, render

SWEEP = DEPLOY / "sweep"


@pytest.fixture(scope="module")
def objs() -> list[Obj]:
    return render(SWEEP)


def pod_specs(job: Obj) -> dict[str, Obj]:
    spec = job["spec"]
    return {
        "runner": spec["job"]["spec"],
        "worker": spec["cluster"]["spec"]["worker"]["spec"],
        "scheduler": spec["cluster"]["spec"]["scheduler"]["spec"],
    }


def test_objects_validate(objs: list[Obj]) -> None:
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "Role", "ConfigMap", "PersistentVolumeClaim", "DaskJob"]
    )
    for o in objs:
        if o["kind"] != "DaskJob":
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
    job = one(objs, "DaskJob", "defrag-sweep")
    assert job["apiVersion"] == "kubernetes.dask.org/v1"
    for name, spec in pod_specs(job).items():
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    service = job["spec"]["cluster"]["spec"]["scheduler"]["service"]
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": service}
    kubernetes_validate.validate(svc, K8S_VERSION, strict=True)
    assert service["selector"]["dask.org/cluster-name"] == job["metadata"]["name"]


def test_pods_run_defrag_restricted_without_a_token(objs: list[Obj]) -> None:
    ns = one(objs, "Namespace", "defrag-sweep")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert one(objs, "ServiceAccount", "defrag-sweep")["automountServiceAccountToken"] is False
    for name, spec in pod_specs(one(objs, "DaskJob", "defrag-sweep")).items():
        assert spec["serviceAccountName"] == "defrag-sweep", name
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        for c in spec["containers"]:
            assert c["image"] == IMAGE, name
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
            assert sc["readOnlyRootFilesystem"] is True
            assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), name


def test_the_runner_runs_the_mounted_sweep_and_the_workers_join_it(objs: list[Obj]) -> None:
    specs = pod_specs(one(objs, "DaskJob", "defrag-sweep"))
    runner = specs["runner"]["containers"][0]
    assert runner["args"][:3] == ["simulate", "--sweep", "/sweep/sweep.yaml"]
    assert "--dask" not in runner["args"]  # the operator's DASK_SCHEDULER_ADDRESS
    mounts = {m["mountPath"]: m["name"] for m in runner["volumeMounts"]}
    volumes = {v["name"]: v for v in specs["runner"]["volumes"]}
    assert volumes[mounts["/sweep"]]["configMap"]["name"] == "defrag-sweep"
    claim = volumes[mounts["/results"]]["persistentVolumeClaim"]["claimName"]
    one(objs, "PersistentVolumeClaim", claim)
    worker = specs["worker"]["containers"][0]
    assert worker["command"] == ["dask"] and worker["args"][0] == "worker"
    assert worker["args"][worker["args"].index("--nthreads") + 1] == "1"
    assert specs["scheduler"]["containers"][0]["args"][0] == "scheduler"


def test_the_shipped_sweep_file_plans(objs: list[Obj], tmp_path: Path) -> None:
    text = one(objs, "ConfigMap", "defrag-sweep")["data"]["sweep.yaml"]
    path = tmp_path / "sweep.yaml"
    path.write_text(text, encoding="utf-8")
    spec = load_sweep(path)
    assert spec.results == Path("/results/sweep")
    plan = plan_sweep(spec, path)
    assert len(plan.points) == 12 and plan.tasks


def test_the_role_grants_only_running_sweeps(objs: list[Obj]) -> None:
    role = one(objs, "Role", "defrag-sweep-runner")
    allowed = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    writes = {(g, r) for g, r, v in allowed if v not in ("get", "list", "watch")}
    assert writes == {("kubernetes.dask.org", "daskjobs")}
    assert not [a for a in allowed if "*" in a or a[1] == "secrets"]
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_the_daemons_overlays_leave_the_sweep_out() -> None:
    for kustomization in DEPLOY.glob("overlays/*/kustomization.yaml"):
        text = kustomization.read_text(encoding="utf-8")
        assert "sweep" not in text, kustomization
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text(encoding="utf-8"))
    assert not [r for r in base["resources"] if "sweep" in r]
