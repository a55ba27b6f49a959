"""deploy/components/extender: the second scheduler (upstream kube-scheduler, profile
``defrag-scheduler``) with the defrag extender beside it on 127.0.0.1.

Checks that the KubeSchedulerConfiguration uses only field names kube-scheduler knows (it
decodes strictly), that its extender stanza reaches the extender container's real address and
routes with a body in kube-scheduler's wire form, that the shipped container arguments start an
extender that serves exactly that, and that the RBAC is what the upstream "Configure Multiple
Schedulers" task grants plus the scheduler's own Lease and the extender's reads.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from defrag.adapters.gpu_shapes import KNOWN_GPU_KEYS
from defrag.adapters.kube import LeaseElector
from defrag.adapters.snapshot import SnapshotFileSource
from defrag.extender.server import serve, stop
from defrag.extender.wire import MAX_EXTENDER_PRIORITY, VERBS
from tests.support.binaries import free_port
from tests.support.kubeapi import running
from tests.support.processes import wait_ready
from tests.test_deploy import DEPLOY, IMAGE, K8S_VERSION, Obj, one, render
from tests.test_rbac import Clock

ROOT = Path(__file__).resolve().parents[1]
COMPONENT = DEPLOY / "components" / "extender"
CONFIG_FILE = COMPONENT / "kube-scheduler-config.yaml"
CORPUS = ROOT / "tests" / "conformance" / "extender"
SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "worked_example.json"
NAMESPACE = "defrag-system"
ACCOUNT = "defrag-scheduler"
SCHEDULER_NAME = "defrag-scheduler"

# --- the known field names ---------------------------------------------------------------------
# The json tags of k8s.io/kube-scheduler config/v1/types.go at v0.31.14 (Kubernetes 1.31, the
# image's minor version) and of the embedded k8s.io/component-base config/v1alpha1/types.go at
# the same tag. `json:",inline"` members (TypeMeta, DebuggingConfiguration) add their own fields.

TYPE_META = {"apiVersion", "kind"}
DEBUGGING = {"enableProfiling", "enableContentionProfiling"}  # DebuggingConfiguration, inline
KUBE_SCHEDULER_CONFIGURATION = (
    TYPE_META
    | DEBUGGING
    | {
        "parallelism",
        "leaderElection",
        "clientConnection",
        "percentageOfNodesToScore",
        "podInitialBackoffSeconds",
        "podMaxBackoffSeconds",
        "profiles",
        "extenders",
        "delayCacheUntilActive",
    }
)
LEADER_ELECTION = {  # component-base LeaderElectionConfiguration
    "leaderElect",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
    "resourceLock",
    "resourceName",
    "resourceNamespace",
}
CLIENT_CONNECTION = {"kubeconfig", "acceptContentTypes", "contentType", "qps", "burst"}
PROFILE = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
EXTENDER = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
MANAGED_RESOURCE = {"name", "ignoredByScheduler"}  # ExtenderManagedResource
TLS_CONFIG = {  # ExtenderTLSConfig
    "insecure",
    "serverName",
    "certFile",
    "keyFile",
    "caFile",
    "certData",
    "keyData",
    "caData",
}


def unknown_keys(config: Mapping[str, Any]) -> list[str]:
    """Every key of ``config`` that is not a field of the type it sits in, as a dotted path."""
    found: list[str] = []

    def check(obj: Any, known: set[str], where: str) -> None:
        if not isinstance(obj, Mapping):
            found.append(f"{where}: not a mapping")
            return
        found.extend(f"{where}.{k}" if where else k for k in obj if k not in known)

    check(config, KUBE_SCHEDULER_CONFIGURATION, "")
    if "leaderElection" in config:
        check(config["leaderElection"], LEADER_ELECTION, "leaderElection")
    if "clientConnection" in config:
        check(config["clientConnection"], CLIENT_CONNECTION, "clientConnection")
    for i, profile in enumerate(config.get("profiles") or []):
        check(profile, PROFILE, f"profiles[{i}]")
    for i, ext in enumerate(config.get("extenders") or []):
        check(ext, EXTENDER, f"extenders[{i}]")
        if isinstance(ext, Mapping):
            if "tlsConfig" in ext:
                check(ext["tlsConfig"], TLS_CONFIG, f"extenders[{i}].tlsConfig")
            for j, res in enumerate(ext.get("managedResources") or []):
                check(res, MANAGED_RESOURCE, f"extenders[{i}].managedResources[{j}]")
    return found


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def objs() -> list[Obj]:
    return render(DEPLOY / "overlays" / "dry-run")


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CONFIG_FILE.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="module")
def extender_stanza(config: dict[str, Any]) -> dict[str, Any]:
    (ext,) = config["extenders"]
    stanza: dict[str, Any] = ext
    return stanza


def pod_spec(objs: list[Obj]) -> Obj:
    spec: Obj = one(objs, "Deployment", "defrag-scheduler")["spec"]["template"]["spec"]
    return spec


def container(objs: list[Obj], name: str) -> Obj:
    (found,) = [c for c in pod_spec(objs)["containers"] if c["name"] == name]
    return found


def flags(c: Obj) -> dict[str, str]:
    """``--name=value`` arguments of a container, by name."""
    return dict(a[2:].split("=", 1) for a in c["args"] if a.startswith("--") and "=" in a)


def named_port(c: Obj, name: str) -> int:
    (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == name]
    return int(port)


# --- the configuration file ----------------------------------------------------------------------


def test_every_key_is_a_field_kube_scheduler_knows(config: dict[str, Any]) -> None:
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert unknown_keys(config) == []


@pytest.mark.parametrize(
    ("edit", "reported"),
    [
        (lambda c: c.update(leaderElect=True), ["leaderElect"]),
        (
            lambda c: c["extenders"][0].update(nodeCacheCapabale=True),
            ["extenders[0].nodeCacheCapabale"],
        ),
        (lambda c: c["extenders"][0].update(urlprefix="x"), ["extenders[0].urlprefix"]),
        (lambda c: c["profiles"][0].update(name="x"), ["profiles[0].name"]),
        (lambda c: c["leaderElection"].update(leaseName="x"), ["leaderElection.leaseName"]),
        (
            lambda c: c["extenders"][0]["managedResources"][0].update(ignored=True),
            ["extenders[0].managedResources[0].ignored"],
        ),
    ],
)
def test_the_key_check_would_catch_a_mistake(
    config: dict[str, Any], edit: Any, reported: list[str]
) -> None:
    bad = json.loads(json.dumps(config))
    edit(bad)
    assert unknown_keys(bad) == reported


def test_one_profile_named_for_opt_in_and_its_own_lease(config: dict[str, Any]) -> None:
    # not v1.DefaultSchedulerName ("default-scheduler"): only pods that name it are scheduled here
    assert [p["schedulerName"] for p in config["profiles"]] == [SCHEDULER_NAME]
    election = config["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceLock"] == "leases"
    lease = (election["resourceNamespace"], election["resourceName"])
    # not kube-system/kube-scheduler (SchedulerDefaultLockObjectNamespace and ...Name,
    # config/v1/types.go): it never contends with the cluster's own kube-scheduler
    assert lease == (NAMESPACE, "defrag-scheduler")


def test_the_wire_corpus_pods_name_this_scheduler() -> None:
    """The conformance bodies are what this profile is sent: their pod names defrag-scheduler."""
    for name in ("args-nodenames.json", "args-nodes.json"):
        pod = json.loads((CORPUS / name).read_text())["Pod"]
        assert pod["spec"]["schedulerName"] == SCHEDULER_NAME, name


def test_extender_stanza_choices(extender_stanza: dict[str, Any]) -> None:
    assert (extender_stanza["filterVerb"], extender_stanza["prioritizeVerb"]) == VERBS
    assert "bindVerb" not in extender_stanza and "preemptVerb" not in extender_stanza
    assert extender_stanza["nodeCacheCapable"] is True
    assert extender_stanza["ignorable"] is True
    assert extender_stanza["enableHTTPS"] is False
    managed = extender_stanza["managedResources"]
    assert [m["name"] for m in managed] == ["nvidia.com/gpu", "nvidia.com/gpu.shared"]
    for m in managed:
        assert m["name"] in KNOWN_GPU_KEYS  # a resource defrag models
        assert m["ignoredByScheduler"] is False  # kube-scheduler still checks the fit itself
    # kube-scheduler's validateExtenders (pkg/scheduler/apis/config/validation): a positive
    # weight with a prioritizeVerb; managed names unique, each an extended resource name (a
    # domain-qualified name outside kubernetes.io/).
    assert extender_stanza["weight"] > 0
    names = [m["name"] for m in managed]
    assert len(set(names)) == len(names)
    for name in names:
        domain, _, local = name.partition("/")
        assert "." in domain and not domain.endswith("kubernetes.io"), name
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", local), name
    # One extender point (winner 10 vs ≤ 9) × weight × 10 must exceed the default score
    # plugins' combined range: weights 3+2+2+2+1+1+1 = 12, × 100 = 1,200. 1 × 200 × 10 = 2,000.
    assert 1 * extender_stanza["weight"] * (100 // MAX_EXTENDER_PRIORITY) > 1200


# --- the pod: config mounted, extender on loopback -------------------------------------------


def test_the_config_map_holds_this_file_at_the_config_path(objs: list[Obj]) -> None:
    scheduler = container(objs, "kube-scheduler")
    path = Path(flags(scheduler)["config"])
    (mount,) = [m for m in scheduler["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod_spec(objs)["volumes"] if v["name"] == mount["name"]]
    cm = one(objs, "ConfigMap", volume["configMap"]["name"])
    assert re.fullmatch(r"defrag-scheduler-config-[a-z0-9]{10}", cm["metadata"]["name"])
    assert cm["data"][path.name] == CONFIG_FILE.read_text(encoding="utf-8")


def test_url_prefix_is_the_extender_containers_loopback_address(
    objs: list[Obj], extender_stanza: dict[str, Any]
) -> None:
    url = urlsplit(extender_stanza["urlPrefix"])
    ext = flags(container(objs, "extender"))
    assert url.scheme == "http"  # enableHTTPS: false
    assert url.hostname == "127.0.0.1" == ext["host"]
    assert url.port == int(ext["port"])
    # Nothing but the pod's own loopback reaches filter/prioritize: the port is not published
    # and the pod is not on the host network.
    served = {p["containerPort"] for c in pod_spec(objs)["containers"] for p in c["ports"]}
    assert url.port not in served
    assert not pod_spec(objs).get("hostNetwork", False)


def test_kube_scheduler_image_is_pinned_and_runs_restricted(objs: list[Obj]) -> None:
    scheduler = container(objs, "kube-scheduler")
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.31\.\d+", scheduler["image"])
    assert container(objs, "extender")["image"] == IMAGE
    assert scheduler["command"] == ["kube-scheduler"]
    for probe in ("livenessProbe", "readinessProbe"):
        get = scheduler[probe]["httpGet"]
        # /healthz is in kube-scheduler's always-allowed paths; its port serves TLS only.
        assert (get["path"], get["scheme"], get["port"]) == ("/healthz", "HTTPS", "https")
    assert named_port(scheduler, "https") == 10259  # kube-scheduler's DefaultKubeSchedulerPort
    spec = pod_spec(objs)
    assert spec["serviceAccountName"] == ACCOUNT
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_extender_probes_and_monitor_use_its_get_only_port(objs: list[Obj]) -> None:
    ext = container(objs, "extender")
    port = named_port(ext, "metrics")
    assert int(flags(ext)["metrics-port"]) == port
    assert ext["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert ext["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    monitor = one(objs, "PodMonitor", "defrag-scheduler")
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    template = one(objs, "Deployment", "defrag-scheduler")["spec"]["template"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    )


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("Deployment", "defrag-scheduler"),
        ("ServiceAccount", ACCOUNT),
        ("Role", "defrag-scheduler-leader-election"),
        ("RoleBinding", "defrag-scheduler-leader-election"),
        ("RoleBinding", "defrag-scheduler-extension-apiserver-authentication-reader"),
        ("ClusterRoleBinding", "defrag-scheduler-as-kube-scheduler"),
        ("ClusterRoleBinding", "defrag-scheduler-as-volume-scheduler"),
        ("ClusterRole", "defrag-extender"),
        ("ClusterRoleBinding", "defrag-extender"),
        ("NetworkPolicy", "defrag-scheduler"),
    ],
)
def test_scheduler_objects_validate_against_the_openapi_schema(
    objs: list[Obj], kind: str, name: str
) -> None:
    kubernetes_validate.validate(one(objs, kind, name), K8S_VERSION, strict=True)


# --- RBAC ----------------------------------------------------------------------------------------


def bindings_of(objs: list[Obj], account: tuple[str, str]) -> set[tuple[str, str, str, str]]:
    """(binding kind, binding namespace, role kind, role name) for every binding of ``account``."""
    out = set()
    for b in objs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = {
            (s.get("namespace", ""), s["name"])
            for s in b["subjects"]
            if s["kind"] == "ServiceAccount"
        }
        if account in subjects:
            ref = b["roleRef"]
            assert ref["apiGroup"] == "rbac.authorization.k8s.io"
            out.add((b["kind"], b["metadata"].get("namespace", ""), ref["kind"], ref["name"]))
    return out


def test_the_scheduler_account_has_what_the_upstream_task_grants(objs: list[Obj]) -> None:
    assert bindings_of(objs, (NAMESPACE, ACCOUNT)) == {
        # kubernetes/website examples/admin/sched/my-scheduler.yaml:
        ("ClusterRoleBinding", "", "ClusterRole", "system:kube-scheduler"),
        ("ClusterRoleBinding", "", "ClusterRole", "system:volume-scheduler"),
        ("RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader"),
        # its own Lease (system:kube-scheduler names only kube-scheduler's):
        ("RoleBinding", NAMESPACE, "Role", "defrag-scheduler-leader-election"),
        # the extender container's relist (tests/test_deploy_rbac.py checks it is exact):
        ("ClusterRoleBinding", "", "ClusterRole", "defrag-extender"),
    }


def test_lease_role_covers_exactly_the_configured_lease(
    objs: list[Obj], config: dict[str, Any]
) -> None:
    election = config["leaderElection"]
    role = one(objs, "Role", "defrag-scheduler-leader-election")
    assert role["metadata"]["namespace"] == election["resourceNamespace"]
    grants = {
        (verb, name)
        for rule in role["rules"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or ["*"]
        if rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
    }
    # client-go's LeaseLock gets, creates and updates its Lease; create cannot name one.
    lease = election["resourceName"]
    assert grants == {("create", "*"), ("get", lease), ("update", lease)}
    assert sum(len(r["resources"]) for r in role["rules"]) == len(role["rules"]) == 2


def test_a_client_go_style_election_on_that_lease_is_allowed_by_the_role(
    objs: list[Obj], config: dict[str, Any]
) -> None:
    """Two candidates create, renew and take over the configured Lease against the emulated API
    (LeaseElector does what client-go's LeaseLock does: get, create, update); RBAC's rule
    matching — a verb listed, and no resourceNames or the object's name among them (a create
    has no name yet) — allows every request, and a Lease of another name is refused."""
    election = config["leaderElection"]
    namespace, name = election["resourceNamespace"], election["resourceName"]
    rules = one(objs, "Role", "defrag-scheduler-leader-election")["rules"]

    def allowed(verb: str, obj_name: str) -> bool:
        return any(
            verb in r["verbs"] and (not r.get("resourceNames") or obj_name in r["resourceNames"])
            for r in rules
            if r["apiGroups"] == ["coordination.k8s.io"] and r["resources"] == ["leases"]
        )

    clock = Clock()
    for api in running():
        a = LeaseElector(api.client(), namespace, name, identity="a", clock=clock)
        b = LeaseElector(api.client(), namespace, name, identity="b", clock=clock)
        assert a.is_leader() and a.is_leader()  # create, then renew
        clock.t += timedelta(minutes=5)
        assert b.is_leader()  # take over
        leases = [r for r in api.requests if r.resource == "leases"]
        assert {r.verb for r in leases} == {"get", "create", "update"}
        assert all(r.namespace == namespace for r in leases)
        assert [(r.verb, r.name) for r in leases if not allowed(r.verb, r.name)] == []
    assert not allowed("update", "kube-scheduler") and not allowed("get", "defrag")


# --- the extender answers at urlPrefix + verb ----------------------------------------------------


@pytest.fixture(scope="module")
def extender() -> Iterator[tuple[str, int]]:
    srv = serve(SnapshotFileSource([SNAPSHOT]), host="127.0.0.1", port=0)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    host, port = srv.server_address[:2]
    yield str(host), int(port)
    srv.shutdown()
    stop(srv)
    thread.join(timeout=5)


def post(address: tuple[str, int], path: str, payload: bytes) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(*address, timeout=5)
    conn.request("POST", path, payload, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def verb_path(url_prefix: str, verb: str) -> str:
    """The path kube-scheduler POSTs to: strings.TrimRight(urlPrefix, "/") + "/" + verb
    (pkg/scheduler/extender.go HTTPExtender.send)."""
    return urlsplit(url_prefix.rstrip("/") + "/" + verb).path


@pytest.mark.parametrize(
    ("verb_key", "answer"),
    [("filterVerb", "answer-filter-nodenames.json"), ("prioritizeVerb", "answer-prioritize.json")],
)
def test_url_prefix_and_verbs_reach_the_extenders_routes(
    extender: tuple[str, int], extender_stanza: dict[str, Any], verb_key: str, answer: str
) -> None:
    # nodeCacheCapable: true, so kube-scheduler sends NodeNames (args-nodenames.json's mode).
    assert extender_stanza["nodeCacheCapable"] is True
    path = verb_path(extender_stanza["urlPrefix"], extender_stanza[verb_key])
    code, got = post(extender, path, (CORPUS / "args-nodenames.json").read_bytes())
    assert code == 200
    assert got == json.loads((CORPUS / answer).read_text())


def test_a_wrong_verb_would_not_reach_them(
    extender: tuple[str, int], extender_stanza: dict[str, Any]
) -> None:
    path = verb_path(extender_stanza["urlPrefix"], "filters")
    code, got = post(extender, path, (CORPUS / "args-nodenames.json").read_bytes())
    assert code == 404 and "unknown verb" in got["Error"]


# --- the shipped arguments, as a process ---------------------------------------------------------


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    conn.request("GET", path)
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_the_containers_arguments_serve_the_verbs_on_loopback_and_probes_apart(
    objs: list[Obj], extender_stanza: dict[str, Any]
) -> None:
    """The extender container's args as shipped, with free ports instead of 8888/8889 and the
    worked-example snapshot instead of the API: the loopback port answers kube-scheduler's verbs,
    the metrics port answers the probes and Prometheus and refuses the verbs."""
    ext = container(objs, "extender")
    assert ext["command"] == ["defrag"]
    port, metrics_port = free_port(), free_port()
    args = [re.sub(r"^--port=\d+$", f"--port={port}", a) for a in ext["args"]]
    args = [re.sub(r"^--metrics-port=\d+$", f"--metrics-port={metrics_port}", a) for a in args]
    # the settings file the daemon reads (ConfigMap defrag-settings), from the tree
    settings = ROOT / "deploy" / "base" / "settings.yaml"
    args = [re.sub(r"^--settings=.*$", f"--settings={settings}", a) for a in args]
    assert args != ext["args"] and len(args) == len(ext["args"])
    launcher = "import sys; from defrag.cli import main; sys.argv[0] = 'defrag'; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, *args, "--snapshot", str(SNAPSHOT)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "DEFRAG_LOGGING__LEVEL": "WARNING"},
    )
    try:
        wait_ready(proc, metrics_port, "the extender")
        body = (CORPUS / "args-nodenames.json").read_bytes()
        for key in ("filterVerb", "prioritizeVerb"):
            path = verb_path(extender_stanza["urlPrefix"], extender_stanza[key])
            assert post(("127.0.0.1", port), path, body)[0] == 200
            code, answer = post(("127.0.0.1", metrics_port), path, body)
            assert code == 404 and "only GET" in answer["Error"]
        assert get(metrics_port, "/healthz") == (200, b"ok\n")
        code, metrics = get(metrics_port, "/metrics")
        assert code == 200
        # The two requests above, counted (the dashboard's query reads this counter).
        assert b'defrag_extender_requests_total{code="200",verb="filter"} 1.0' in metrics
        assert b'defrag_extender_requests_total{code="200",verb="prioritize"} 1.0' in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=10) == 0  # SIGTERM ends both servers cleanly
        finally:
            if proc.poll() is None:
                proc.kill()


def test_the_extender_reads_the_daemons_settings_file(objs: list[Obj]) -> None:
    """One settings file configures the daemon's and the extender's policy: the extender mounts
    the daemon's ConfigMap where its --settings points, and gives no --policy of its own."""
    daemon_pod = next(
        o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "defrag"
    )
    ext_pod = next(
        o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "defrag-scheduler"
    )
    ext = container(objs, "extender")
    (settings_arg,) = [a for a in ext["args"] if a.startswith("--settings=")]
    assert not [a for a in ext["args"] if a.startswith("--policy")]
    path = settings_arg.removeprefix("--settings=")
    (mount,) = [m for m in ext["volumeMounts"] if m["mountPath"] == path]
    volumes = {v["name"]: v for v in ext_pod["volumes"]}
    daemon_volumes = {v["name"]: v for v in daemon_pod["volumes"]}
    assert volumes[mount["name"]]["configMap"] == daemon_volumes["settings"]["configMap"]
