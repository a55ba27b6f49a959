"""Snapshot files: the fixtures, several files, YAML, and errors that name the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from defrag.adapters.snapshot import SnapshotError, load_snapshot
from defrag.model.resources import Pod
from defrag.scoring.framework import Placement
from defrag.scoring.policies.reserve_binpack import ReserveBinpack
from defrag.scoring.scheduler import schedule
from tests.support import kubeobjects as k
from tests.support.snapshots import ALL, FIXTURES, render


@pytest.mark.parametrize("name", sorted(ALL))
def test_fixture_files_match_their_generator(name: str) -> None:
    # Regenerate with: .venv/bin/python -m tests.support.snapshots
    assert (FIXTURES / name).read_text(encoding="utf-8") == render(ALL[name]())


def test_worked_example_has_1_8_and_4_free_gpus() -> None:
    cluster = load_snapshot(FIXTURES / "worked_example.json")
    free = dict(zip(cluster.arrays.names, cluster.arrays.free_whole_count().tolist(), strict=True))
    assert free == {"node-1": 1, "node-2": 8, "node-3": 4}  # 8-4-2-1, 8, 8-4


def test_scattered_20_has_20_free_gpus_one_or_two_per_node_and_a_pending_8_gpu_job() -> None:
    cluster = load_snapshot(FIXTURES / "scattered_20.json")
    free = cluster.arrays.free_whole_count()
    assert int(free.sum()) == 20  # 6 nodes x 2 + 8 nodes x 1
    assert set(free.tolist()) == {1, 2}
    (pending,) = cluster.pending_pods()
    assert (pending.key, pending.num_gpu, pending.priority) == ("research/llm-train-0", 8, 1000)
    assert pending.pending_reason == "Unschedulable"
    assert [p.key for p in cluster.pdbs] == ["serving/serve"]


def test_nvlink_fixture_free_gpu_sets() -> None:
    arrays = load_snapshot(FIXTURES / "nvlink.json").arrays
    free = {
        name: arrays.whole_free()[i].nonzero()[0].tolist() for i, name in enumerate(arrays.names)
    }
    assert free == {"nvl-a": [2, 3, 4, 5], "nvl-b": [4, 5, 6, 7]}


def test_several_files_and_yaml_make_one_cluster(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(k.as_list([k.node("n1"), k.node("n2")])))
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        yaml.safe_dump(k.pod("p", gpus=2, node_name="n2", priority=None, priority_class="hi"))
        + "---\n"
        + yaml.safe_dump(k.priority_class("hi", 500))
    )
    cluster = load_snapshot([nodes, pods])
    assert [n.name for n in cluster.nodes] == ["n1", "n2"]
    assert cluster.pods["default/p"].priority == 500  # resolved across files
    assert cluster.arrays.free_whole_count().tolist() == [8, 6]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"items": [', r"line 1 column 12: invalid JSON"),
        ("items: [a, b\n", r"line 2 column 1: invalid YAML"),
        ("", r"empty file"),
        ('{"items": {}}', r"items: expected a list"),
        ('"just a string"', r"expected a Kubernetes object or List"),
    ],
)
def test_errors_name_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "snap.json"
    path.write_text(content)
    with pytest.raises(SnapshotError, match=re.escape(f"{path}: ") + message):
        load_snapshot(path)


BAD_NODE = {"kind": "Node", "metadata": {"name": "bad"}}
ONE_BAD_OBJECT = [
    # (objects, the warning naming object and field, what is left in the cluster)
    (
        [k.node("n1"), BAD_NODE, k.pod("on-bad", node_name="bad"), k.pod("ok", node_name="n1")],
        "Node bad: status.allocatable: missing (and no status.capacity); left out, with the pods",
        {"default/ok"},
    ),
    (
        [k.node("n1"), k.pod("p", node_name="ghost")],
        "Pod default/p: spec.nodeName: no such node; left out",
        set(),
    ),
    (
        [k.node("n1"), k.pod("p", annotations={"defrag.io/gpu-milli": "half"}, node_name="n1")],
        'Pod default/p: metadata.annotations["defrag.io/gpu-milli"]: \'half\' is not an integer',
        set(),
    ),
    (
        [k.node("n1"), k.pod("p", "default", 1, annotations={"defrag.io/gpu-indices": "0-20000000"},
                             node_name="n1")],
        "GPU indices stop at 1023",
        set(),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("objects", "warning", "pods"), ONE_BAD_OBJECT)
def test_one_bad_object_is_left_out_with_a_warning(
    tmp_path: Path, objects: list[dict[str, object]], warning: str, pods: set[str]
) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(k.as_list(objects)))
    cluster = load_snapshot(path)
    assert [n.name for n in cluster.nodes] == ["n1"]
    assert set(cluster.pods) == pods
    assert any(warning in w for w in cluster.warnings), cluster.warnings
    with pytest.raises(SnapshotError, match=re.escape(f"{path}: ")):
        load_snapshot(path, strict=True)


def test_a_node_holding_an_unreadable_pod_takes_nothing_new(tmp_path: Path) -> None:
    # What the unreadable pod holds is unknown: the node must not look free to the planner.
    bad = k.pod("p", "default", 1, node_name="n1", annotations={"defrag.io/gpu-milli": "half"})
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(k.as_list([k.node("n1"), k.node("n2"), bad])))
    cluster = load_snapshot(path)
    placed = schedule(Pod("new", num_gpu=1), cluster, ReserveBinpack())
    assert isinstance(placed, Placement) and placed.node == "n2"
    assert "node n1 takes no new pods" in cluster.warnings[0]


def test_an_unreadable_pdb_protects_its_whole_namespace(tmp_path: Path) -> None:
    pdb = k.pdb("serve", "serving", match_labels={"app": "serve"})
    pdb["status"]["disruptionsAllowed"] = -3
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(k.as_list([k.node("n1"), pdb])))
    (kept,) = load_snapshot(path).pdbs
    assert kept.namespace == "serving" and kept.disruptions_allowed == 0
    assert kept.selects(Pod("any", namespace="serving", labels={"app": "other"}))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match=r"nope\.json: no such file"):
        load_snapshot(tmp_path / "nope.json")


def test_files_are_strict_about_conflicting_gpu_indices(tmp_path: Path) -> None:
    gi = {"defrag.io/gpu-indices": "0,1"}
    path = tmp_path / "snap.json"
    path.write_text(
        json.dumps(
            k.as_list(
                [
                    k.node("n1"),
                    k.pod("a", gpus=2, node_name="n1", annotations=gi),
                    k.pod("b", gpus=2, node_name="n1", annotations=gi),
                ]
            )
        )
    )
    with pytest.raises(SnapshotError, match="overcommitted"):
        load_snapshot(path, strict=True)
    # lenient (the default): the conflicting slot annotations are ignored, both pods kept
    assert set(load_snapshot(path).pods) == {"default/a", "default/b"}
