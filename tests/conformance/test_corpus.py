"""The conformance corpus: real-shaped Kubernetes objects for every GPU resource shape and every
scheduling constraint (issue 12), each scenario checked against its expectations through the
snapshot path, the live path (the emulated API server), ``defrag report``/``plan``/``detect``, the
scheduler's filter and make-room.

Layout (``tests/conformance/objects/``): ``<name>.yaml`` is one ``v1 List`` as ``kubectl get … -o
yaml`` prints it; ``<name>.expect.yaml`` says, in the model's terms (``Node.num_gpu``,
``Node.pools``, ``Pod.num_gpu``/``gpu_milli``/``pool``/``pool_units``/``gang``/``priority``/
``scheduling_gates``, ``Cluster.warnings``), what defrag must make of it; ``SOURCES.md`` names the
upstream repository and path each fact comes from.

Expectation keys (all optional except ``nodes``, ``pods`` and ``warnings``):

- ``nodes``: name → ``whole_gpus``, ``pools``, ``free_whole_gpus`` (GPUs with nothing on them);
- ``pods``: ``ns/name`` → any of ``num_gpu``, ``gpu_milli``, ``pool``, ``pool_units``, ``gang``
  (exact, null = none), ``gang_group`` (pods sharing a group share one non-empty gang),
  ``priority``, ``gated``; ``absent``: pods that must be left out;
- ``warnings``: one entry per expected warning, each a list of substrings that one warning
  holds (the object, ``Node n`` / ``Pod ns/name``, and the key);
- ``report``: fields of ``defrag report -o json``;
- ``placement``: pending pod → the nodes ``schedule`` may choose (``[]``: unschedulable);
- ``excluded``: pending pod → nodes its constraints exclude (never chosen, never freed for it);
- ``admitted``: pending pod → nodes the filter must let through (each has room for it now);
- ``starving``: pod → starvation reason at ``AT`` (exactly these pods starve);
- ``no_node_finding``: nodes the fragmentation detector must not flag (pool-only nodes);
- ``gated``: pods that get no finding and no room; ``room_for``: pods make-room serves;
- ``room_from``: pending pod → nodes make-room for that pod alone may evict from (non-empty).
"""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from defrag.adapters.kube import KubeClusterSource, RetryPolicy
from defrag.adapters.snapshot import load_snapshot
from defrag.cli import app
from defrag.cli.run import _detector, _planner
from defrag.daemon.cycle import CyclePorts, run_cycle
from defrag.decide import CycleConfig
from defrag.extender.server import serve, stop
from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.plan import PlanOptions, make_plan
from defrag.rules import load_rules
from defrag.scoring.framework import Placement
from defrag.scoring.policies.reserve_binpack import ReserveBinpack
from defrag.scoring.scheduler import explain, schedule
from defrag.settings import load_settings
from tests.support.kubeapi import KubeApi, running

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
OBJECTS = HERE / "objects"
SOURCES = HERE / "SOURCES.md"
AT = "2026-11-30T12:00:00Z"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
FAST = RetryPolicy(attempts=2, backoff_s=0.0, timeout_s=5.0)
SCHEMA_VERSION = "1.31"
NAMES = sorted(
    p.name.removesuffix(".yaml")
    for p in OBJECTS.glob("*.yaml")
    if not p.name.endswith(".expect.yaml")
)
runner = CliRunner()


def fixture_path(name: str) -> Path:
    return OBJECTS / f"{name}.yaml"


@cache
def items(name: str) -> tuple[dict[str, Any], ...]:
    doc = yaml.safe_load(fixture_path(name).read_text(encoding="utf-8"))
    assert doc["kind"] == "List", f"{name}: expected a v1 List"
    return tuple(doc["items"])


@cache
def expect(name: str) -> dict[str, Any]:
    data = yaml.safe_load((OBJECTS / f"{name}.expect.yaml").read_text(encoding="utf-8"))
    assert {"nodes", "pods", "warnings"} <= set(data), f"{name}.expect.yaml: nodes/pods/warnings"
    return data  # type: ignore[no-any-return]


@cache
def snapshot(name: str) -> Cluster:
    return load_snapshot(fixture_path(name))


def cases(key: str) -> list[Any]:
    """``pytest.param(name, pod, value)`` for every pod listed under ``key`` in any fixture."""
    out = []
    for name in NAMES:
        for pod, value in (expect(name).get(key) or {}).items():
            out.append(pytest.param(name, pod, value, id=f"{name}:{pod}"))
    return out


# --- the corpus itself -------------------------------------------------------------------------


def test_corpus_has_every_shape() -> None:
    """The scenarios issue 12 names are all here (a rename must not silently drop one)."""
    assert set(NAMES) >= {
        "gfd-plain", "nvlink", "timeslice", "timeslice-renamed", "mig-single", "mig-mixed",
        "hami", "kai", "koordinator", "kueue-gated", "volcano", "constraints",
        "unknown-vendor", "dra",
    }  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_objects_are_schema_valid(name: str) -> None:
    """Real-shaped: every object passes the Kubernetes OpenAPI schema, unknown fields refused."""
    for obj in items(name):
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_names_its_sources(name: str) -> None:
    header = fixture_path(name).read_text(encoding="utf-8").split("apiVersion:", 1)[0]
    assert f"SOURCES.md#{name}" in header, f"{name}.yaml: header must point to SOURCES.md#{name}"
    text = SOURCES.read_text(encoding="utf-8")
    section = re.search(rf"^## {re.escape(name)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, f"SOURCES.md has no section '## {name}'"
    # each section cites at least one upstream repository path as `owner/repo` … `path`
    assert re.search(r"`[\w.-]+/[\w.-]+`", section.group(1)), f"SOURCES.md#{name}: no repository"


# --- snapshot path -----------------------------------------------------------------------------


def check_cluster(name: str, cluster: Cluster) -> None:
    """``cluster`` is what ``name.expect.yaml`` says (nodes, pods, warnings)."""
    exp = expect(name)
    nodes = {n.name: n for n in cluster.nodes}
    assert set(nodes) == set(exp["nodes"]), f"{name}: nodes"
    free = dict(zip(cluster.arrays.names, cluster.arrays.free_whole_count().tolist(), strict=True))
    for node_name, want in exp["nodes"].items():
        node = nodes[node_name]
        got = {
            "whole_gpus": node.num_gpu,
            "pools": {k: v for k, v in dict(node.pools).items() if v},
            "free_whole_gpus": int(free[node_name]),
        }
        assert {k: got[k] for k in want} == want, f"{name}: Node {node_name}"
    for key in exp.get("absent") or []:
        assert key not in cluster.pods, f"{name}: Pod {key} should be left out"
    groups: dict[str, set[str | None]] = {}
    for key, want in exp["pods"].items():
        assert key in cluster.pods, f"{name}: Pod {key} missing"
        got = pod_fields(cluster.pods[key])
        plain = {k: v for k, v in want.items() if k != "gang_group"}
        assert {k: got[k] for k in plain} == plain, f"{name}: Pod {key}"
        if "gang_group" in want:
            groups.setdefault(want["gang_group"], set()).add(got["gang"])
    for group, gangs in groups.items():
        assert len(gangs) == 1 and None not in gangs, f"{name}: gang group {group}: {gangs}"
    if len(groups) > 1:
        assert len({g for gs in groups.values() for g in gs}) == len(groups), f"{name}: gangs"
    check_warnings(name, list(cluster.warnings))


def pod_fields(pod: Pod) -> dict[str, Any]:
    return {
        "num_gpu": pod.num_gpu,
        "gpu_milli": pod.gpu_milli,
        "pool": pod.pool,
        "pool_units": pod.pool_units,
        "gang": pod.gang,
        "priority": pod.priority,
        "gated": pod.gated and bool(pod.scheduling_gates),
    }


def check_warnings(name: str, warnings: list[str]) -> None:
    """One warning per expected entry, each holding all of the entry's substrings."""
    want = expect(name)["warnings"]
    assert len(warnings) == len(want), f"{name}: warnings {warnings}"
    unmatched = list(warnings)
    for needles in want:
        hit = next((w for w in unmatched if all(n in w for n in needles)), None)
        assert hit is not None, f"{name}: no warning holding {needles} in {warnings}"
        unmatched.remove(hit)


@pytest.mark.parametrize("name", NAMES)
def test_snapshot_path(name: str) -> None:
    check_cluster(name, snapshot(name))


@pytest.mark.parametrize("name", NAMES)
def test_snapshot_split_into_json_files_is_the_same(name: str, tmp_path: Path) -> None:
    """``kubectl get nodes -o json`` and ``kubectl get pods,pdb,priorityclasses -A -o json`` saved
    apart make the same cluster as the one YAML List."""
    nodes = [o for o in items(name) if o["kind"] == "Node"]
    rest = [o for o in items(name) if o["kind"] != "Node"]
    files = []
    for part, objs in (("nodes", nodes), ("rest", rest)):
        path = tmp_path / f"{part}.json"
        doc = {"apiVersion": "v1", "kind": "List", "items": objs, "metadata": {}}
        path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
        files.append(path)
    split = load_snapshot(files)
    whole = snapshot(name)
    assert list(split.nodes) == list(whole.nodes)
    assert dict(split.pods) == dict(whole.pods)
    assert sorted(split.warnings) == sorted(whole.warnings)


# --- live path: the same objects served by the emulated API server -----------------------------


@pytest.fixture
def serving(request: pytest.FixtureRequest) -> Iterator[KubeApi]:
    """The emulated API server holding the objects of the fixture named by the test's param."""
    yield from running(items(request.node.callspec.params["name"]))


@pytest.mark.parametrize("name", NAMES)
def test_live_path_matches_the_snapshot(name: str, serving: KubeApi) -> None:
    api = serving
    live = KubeClusterSource(api.client(), page_size=3, retry=FAST).snapshot()
    check_cluster(name, live)
    from_file = snapshot(name)
    assert list(live.nodes) == list(from_file.nodes)
    assert dict(live.pods) == dict(from_file.pods)
    assert (live.arrays.gpu_free == from_file.arrays.gpu_free).all()
    assert sorted(live.warnings) == sorted(from_file.warnings)
    assert not api.writes(), "a snapshot only reads"


class FixedClock:
    def now(self) -> datetime:
        return NOW


@pytest.mark.parametrize("name", NAMES)
def test_daemon_cycle_survives_on_the_live_path(name: str, serving: KubeApi) -> None:
    """One dry-run cycle of the daemon over the API: no object fails it; findings as detect's."""
    ports = CyclePorts(
        source=KubeClusterSource(serving.client(), retry=FAST),
        clock=FixedClock(),
        detector=_detector(load_rules([ROOT / "rules"]), None),
        planner=_planner(load_settings(None, {})),
    )
    result = run_cycle(ports, CycleConfig(goal="all"))
    starving = {f.subject.removeprefix("pod/") for f in result.findings if f.kind == "starvation"}
    assert starving == set(expect(name).get("starving") or {})
    if result.plan is not None:
        check_plan(name, result.plan.to_dict())
    assert not serving.writes(), "a dry run writes nothing"


@pytest.mark.parametrize("name", NAMES)
def test_extender_is_ready_on_the_live_path(name: str, serving: KubeApi) -> None:
    """The extender's relist converts every object: /readyz answers 200."""
    source = KubeClusterSource(serving.client(), retry=FAST)
    srv = serve(source, host="127.0.0.1", port=0, relist_interval_s=60)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=5)
        conn.request("GET", "/readyz")
        resp = conn.getresponse()
        body = resp.read().decode()
        assert resp.status == 200, body
    finally:
        srv.shutdown()
        stop(srv)


# --- the CLI: report, plan, detect --------------------------------------------------------------


def invoke(*args: str) -> tuple[Any, list[str]]:
    """Run the CLI; (parsed JSON stdout, the ``warning:`` lines of stderr)."""
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.output}"
    assert "Traceback" not in result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("warning:")]
    return json.loads(result.stdout), lines


def check_cli_warnings(name: str, data: Mapping[str, Any], lines: list[str]) -> None:
    check_warnings(name, [ln.removeprefix("warning:").strip() for ln in lines])
    assert len(data.get("warnings", [])) == len(expect(name)["warnings"]), "JSON warnings"


@pytest.mark.parametrize("name", NAMES)
def test_report_cli(name: str) -> None:
    data, lines = invoke("report", "--snapshot", str(fixture_path(name)), "-o", "json")
    check_cli_warnings(name, data, lines)
    for key, value in (expect(name).get("report") or {}).items():
        assert data[key] == value, f"{name}: report {key}"
    # No MIG slice or time-sliced replica counts as a whole GPU: a pool-only node adds nothing.
    rows = {row["name"]: row for row in data.get("nodes", [])}
    for node, want in expect(name)["nodes"].items():
        if want.get("whole_gpus") == 0 and node in rows:
            assert rows[node]["total"] == 0 and rows[node]["largest_job"] == 0, node


@pytest.mark.parametrize("name", NAMES)
def test_plan_cli(name: str) -> None:
    data, lines = invoke("plan", "--snapshot", str(fixture_path(name)), "--now", AT, "-o", "json")
    check_cli_warnings(name, data, lines)
    check_plan(name, data)


def check_plan(name: str, data: Mapping[str, Any]) -> None:
    """No step frees an excluded node for its pod; gated pods get no room."""
    exp = expect(name)
    excluded = exp.get("excluded") or {}
    gated = set(exp.get("gated") or [])
    for step in data["steps"]:
        target = step.get("for_pod")
        assert target not in gated, f"{name}: room made for gated pod {target}"
        assert step["pod"] not in gated
        if target in excluded:
            assert step["from"] not in excluded[target], f"{name}: {step} frees an excluded node"
    served = {t.split(" ", 1)[0] for t in data.get("targets", [])}
    assert not served & gated, f"{name}: gated pods among the targets {served}"


@pytest.mark.parametrize("name", NAMES)
def test_detect_cli(name: str) -> None:
    data, lines = invoke("detect", "--snapshot", str(fixture_path(name)), "--at", AT, "-o", "json")
    check_cli_warnings(name, data, lines)
    assert data["failures"] == []
    exp = expect(name)
    starving = {
        f["subject"].removeprefix("pod/"): f for f in data["findings"] if f["kind"] == "starvation"
    }
    want = exp.get("starving") or {}
    assert set(starving) == set(want), f"{name}: starving pods"
    for key, reason in want.items():
        assert starving[key]["evidence"]["reason"] == reason, f"{name}: {key}"
        detail = starving[key]["evidence"]["detail"]
        for node in (exp.get("excluded") or {}).get(key, []):
            assert not re.search(rf"\b{re.escape(node)}\b", detail), f"{key}: {detail}"
    flagged = {f["subject"] for f in data["findings"]}
    for node in exp.get("no_node_finding") or []:
        assert f"node/{node}" not in flagged, f"{name}: a pool-only node is not fragmented"


# --- constraints as the scheduler reads them ---------------------------------------------------


@pytest.mark.parametrize(("name", "key", "allowed"), cases("placement"))
def test_schedule_places_only_where_allowed(name: str, key: str, allowed: list[str]) -> None:
    cluster = snapshot(name)
    verdict = schedule(cluster.pods[key], cluster, ReserveBinpack())
    if not allowed:
        assert not isinstance(verdict, Placement), f"{key} should not fit anywhere: {verdict}"
    else:
        assert isinstance(verdict, Placement), f"{key}: {verdict}"
        assert verdict.node in allowed


@pytest.mark.parametrize(("name", "key", "excluded"), cases("excluded"))
def test_excluded_nodes_are_filtered_with_a_reason(
    name: str, key: str, excluded: list[str]
) -> None:
    cluster = snapshot(name)
    verdicts = {v.node: v for v in explain(cluster.pods[key], cluster, ReserveBinpack())}
    for node in excluded:
        assert verdicts[node].score is None and verdicts[node].reasons, f"{key} on {node}"


@pytest.mark.parametrize(("name", "key", "admitted"), cases("admitted"))
def test_admitted_nodes_pass_the_filter(name: str, key: str, admitted: list[str]) -> None:
    cluster = snapshot(name)
    verdicts = {v.node: v for v in explain(cluster.pods[key], cluster, ReserveBinpack())}
    for node in admitted:
        assert verdicts[node].score is not None, f"{key} on {node}: {verdicts[node].reasons}"


def alone(cluster: Cluster, key: str) -> Cluster:
    """The cluster with every other pending pod removed (make-room for ``key`` only)."""
    out = cluster
    for other in [p.key for p in cluster.pending_pods() if p.key != key]:
        out = out.with_pod_removed(other)
    return out


@pytest.mark.parametrize(("name", "key", "excluded"), cases("excluded"))
def test_make_room_never_frees_an_excluded_node(name: str, key: str, excluded: list[str]) -> None:
    plan = make_plan(alone(snapshot(name), key), "make-room", now=NOW)
    for step in plan.steps:
        assert step.source not in excluded, f"{key}: {step}"


@pytest.mark.parametrize(("name", "key", "nodes"), cases("room_from"))
def test_make_room_evicts_from_the_node_the_pod_may_use(
    name: str, key: str, nodes: list[str]
) -> None:
    plan = make_plan(alone(snapshot(name), key), "make-room", now=NOW)
    assert plan.steps, f"{key}: make-room found no room"
    assert {s.source for s in plan.steps} <= set(nodes), plan.steps


@pytest.mark.parametrize("name", [n for n in NAMES if expect(n).get("excluded")])
def test_plan_make_room_cli_respects_constraints(name: str) -> None:
    data, _ = invoke(
        "plan", "--snapshot", str(fixture_path(name)), "--goal", "make-room", "--now", AT,
        "-o", "json",
    )  # fmt: skip
    check_plan(name, data)


@pytest.mark.parametrize("name", [n for n in NAMES if expect(n).get("gated")])
def test_gated_pods_get_no_room(name: str) -> None:
    cluster = snapshot(name)
    gated = set(expect(name)["gated"])
    # The control pod's only room preempts a 6-GPU batch pod for 4 GPUs (a swap, refused by
    # default: docs/planning.md), and by the worth rule once that victim's own wait is priced;
    # this test is about gates, so swaps are allowed and every room is worth making.
    options = PlanOptions(swaps=True, room_worth=0.0)
    plan = make_plan(cluster, "make-room", now=NOW, options=options)
    served = {t.split(" ", 1)[0] for t in plan.targets}
    assert not served & gated
    assert all(s.for_pod not in gated for s in plan.steps)
    # The same pods without their gate would get room: the gate, not their shape, decides.
    assert set(expect(name).get("room_for") or []) <= served
    ungated = cluster
    for key in gated:
        pod = cluster.pods[key]
        ungated = ungated.with_pod_removed(key).with_pod_added(
            replace(pod, scheduling_gates=(), gated=False)
        )
    again = make_plan(ungated, "make-room", now=NOW, options=options)
    assert {t.split(" ", 1)[0] for t in again.targets} & gated, "ungated, they are served"
