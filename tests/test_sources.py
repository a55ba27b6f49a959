"""One cluster-source factory (defrag/adapters/sources.py) for every command: which backend
the flags name, and the one-line errors when they name none, two, or one that cannot open."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from defrag.adapters.kube import KubeClusterSource
from defrag.adapters.simcluster import SimCluster
from defrag.adapters.snapshot import SnapshotFileSource
from defrag.adapters.sources import IN_CLUSTER_ENV, SourceError, SourceSpec, open_source
from tests.support.kubeapi import KubeApi
from tests.support.snapshots import scattered_20

POD_ENV = {IN_CLUSTER_ENV: "10.96.0.1"}


@pytest.mark.parametrize(
    ("snapshots", "kubeconfig", "context", "env", "kind"),
    [
        ([Path("a.json")], None, None, {}, "snapshot"),
        ([Path("a.json"), Path("b.yaml")], None, None, POD_ENV, "snapshot"),  # files win in a pod
        ([], Path("kubeconfig"), None, {}, "kube"),
        ([], None, "staging", {}, "kube"),  # a context alone means the default kubeconfig
        ([], None, None, POD_ENV, "kube"),  # nothing given, inside a pod: the service account
        # $KUBECONFIG, as kubectl reads it (issue 22): the live cluster, a flag still wins
        ([], None, None, {"KUBECONFIG": "/a:/b"}, "kube"),
        ([Path("a.json")], None, None, {"KUBECONFIG": "/a"}, "snapshot"),
    ],
)
def test_flags_name_one_backend(
    snapshots: list[Path], kubeconfig: Path | None, context: str | None, env: dict, kind: str
) -> None:
    spec = SourceSpec.from_flags(snapshots, kubeconfig, context, environ=env)
    assert spec.kind == kind
    assert spec.snapshots == tuple(snapshots)


@pytest.mark.parametrize(
    ("snapshots", "kubeconfig", "env", "message"),
    [
        ([Path("a.json")], Path("k"), {}, "give --snapshot or --kubeconfig, not both"),
        ([], None, {}, "no cluster given (--snapshot FILE or --kubeconfig FILE; else $KUBECONFIG"),
        ([], None, {"KUBECONFIG": ""}, "no cluster given"),
    ],
)
def test_flags_that_name_no_single_backend(
    snapshots: list[Path], kubeconfig: Path | None, env: dict, message: str
) -> None:
    with pytest.raises(SourceError, match=re.escape(message)):
        SourceSpec.from_flags(snapshots, kubeconfig, None, environ=env)


def test_without_flags_or_kubeconfig_env_the_default_kubeconfig_names_the_live_cluster(
    tmp_path: Path,
) -> None:
    """~/.kube/config, as kubectl reads it, for every command (report, plan, place and detect
    asked for a flag where run and extender read it)."""
    home = {"HOME": str(tmp_path)}
    with pytest.raises(SourceError, match="no cluster given"):
        SourceSpec.from_flags([], None, None, environ=home)
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("apiVersion: v1\nkind: Config\n")
    spec = SourceSpec.from_flags([], None, None, environ=home)
    assert spec.kind == "kube" and spec.kubeconfig is None and spec.probe


def test_each_backend_opens_to_its_source(tmp_path: Path) -> None:
    items = scattered_20()
    snapshot = tmp_path / "cluster.json"
    snapshot.write_text(json.dumps(items))
    from tests.test_daemon_cli import kubeconfig

    files = open_source(SourceSpec((snapshot,)))
    assert isinstance(files.source, SnapshotFileSource) and files.api is None
    sim = open_source(SourceSpec(sim=True, sim_speedup=10.0))
    assert isinstance(sim.source, SimCluster) and sim.sim is sim.source
    with KubeApi(items["items"]) as api:
        live = open_source(SourceSpec(live=True, kubeconfig=kubeconfig(tmp_path, api.url)))
        assert isinstance(live.source, KubeClusterSource) and live.api is not None
        # the live cluster read through the factory is the snapshot's cluster
        assert live.source.snapshot().arrays.names == files.source.snapshot().arrays.names
        assert {r.method for r in api.requests} == {"GET"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SourceSpec(), "name one cluster: snapshot files, the live API or the simulated cluster"),
        (SourceSpec((Path("x.json"),), live=True), r"\(got 2\)"),
        (SourceSpec(live=True, kubeconfig=Path("/nonexistent/kubeconfig")), "no such file"),
        (SourceSpec((Path("/nonexistent/cluster.json"),)), "/nonexistent/cluster.json"),
    ],
)
def test_backends_that_cannot_open_say_why(spec: SourceSpec, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        open_source(spec)


def test_inside_a_pod_without_a_service_account_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # KUBERNETES_SERVICE_HOST set (as in every pod) but no token mounted here: the in-cluster
    # loader fails, and the message names the service account, not a kubeconfig.
    monkeypatch.setenv(IN_CLUSTER_ENV, "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    spec = SourceSpec.from_flags([], None, None)
    with pytest.raises(SourceError, match="in-cluster service account"):
        open_source(spec)


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, {"KUBECONFIG": "{a}:{b}"}, "from-env"),  # the colon-separated list, merged
        (
            None,
            {"KUBECONFIG": "{a}:{b}", IN_CLUSTER_ENV: "10.96.0.1"},
            "from-env",
        ),  # before the pod's
        ("{c}", {"KUBECONFIG": "{a}:{b}"}, "from-flag"),  # --kubeconfig wins
    ],
)
def test_connect_honours_kubeconfig_as_kubectl_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str | None, env: dict, expected: str
) -> None:
    from defrag.adapters.kube import connect

    def kubeconfig(server: str, with_context: bool) -> str:
        doc: dict[str, object] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": server, "cluster": {"server": f"https://{server}:6443"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
        }
        if with_context:
            doc["contexts"] = [{"name": "c", "context": {"cluster": server, "user": "u"}}]
            doc["current-context"] = "c"
        return json.dumps(doc)

    files = {"a": ("from-env", True), "b": ("unused", False), "c": ("from-flag", True)}
    paths = {}
    for name, (server, ctx) in files.items():
        paths[name] = tmp_path / name
        paths[name].write_text(kubeconfig(server, ctx))
    monkeypatch.delenv(IN_CLUSTER_ENV, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(**paths))
    api = connect(flag.format(**paths) if flag else None)
    assert api.configuration.host == f"https://{expected}:6443"
