"""The openb trace loader: both pod-list shapes, node lists, and errors naming file/line/column."""

from __future__ import annotations

from pathlib import Path

import pytest

from defrag.sim.trace import TraceError, load_nodes, load_pods
from tests.support.data import require_data

FULL_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
SHORT_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"


def write(tmp_path: Path, text: str, name: str = "pods.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_full_shape_reads_every_column(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        FULL_HEADER
        + "p0,12000,16384,1,460,T4|P100,LS,Running,10,20,11\n"
        + "p1,8000,4096,0,0,,BE,Pending,5,9,\n"
        + "p2,64000,1024,8,1000,,Burstable,Running,1,2,1\n",
    )
    trace = load_pods(path)
    p0, p1, p2 = trace.pods
    assert trace.has_times
    assert (p0.num_gpu, p0.gpu_milli, p0.cpu_milli, p0.memory_mib) == (1, 460, 12000, 16384)
    assert p0.gpu_models == frozenset({"T4", "P100"})
    assert (p0.qos, p0.priority) == ("LS", 3)
    assert (p1.num_gpu, p1.gpu_demand_milli, p1.gpu_models, p1.priority) == (0, 0, frozenset(), 0)
    assert p2.gpu_demand_milli == 8000 and p2.priority == 1
    rec0, rec1, _ = trace.records
    assert (rec0.phase, rec0.creation_time, rec0.deletion_time, rec0.scheduled_time) == (
        "Running",
        10,
        20,
        11,
    )
    assert rec1.scheduled_time is None  # a pod that stayed Pending
    # 460 + 0 + 8 × 1000 milli-GPU
    assert trace.gpu_demand_milli == 8460


def test_short_shape_has_no_times_qos_or_models(tmp_path: Path) -> None:
    trace = load_pods(write(tmp_path, SHORT_HEADER + "p0,6000,12288,1,460\np1,88000,1,8,1000\n"))
    assert not trace.has_times
    assert [p.gpu_demand_milli for p in trace.pods] == [460, 8000]
    assert all(p.qos == "" and p.gpu_models == frozenset() for p in trace.pods)
    assert trace.records[0].creation_time is None


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("p0,12x,1,1,1000\n", ":2: column 'cpu_milli': expected an integer, got '12x'"),
        ("p0,1,1,1,1000\np1,1,1,1,2000\n", ":3: column 'gpu_milli': 2000 is out of range"),
        ("p0,1,1,2,500\n", ":2: column 'gpu_milli': 500: only a 1-GPU pod may share"),
        ("p0,1,1,1,0\n", ":2: column 'gpu_milli': 0 for a pod asking 1 GPU"),
        ("p0,-5,1,0,0\n", ":2: column 'cpu_milli': -5 is out of range"),
        ("p0,1,1,1\n", ":2: 4 field(s), the header has 5"),
        (",1,1,0,0\n", ":2: column 'name': empty pod name"),
        ("p0,1,1,0,0\np0,1,1,0,0\n", ": duplicate pod name 'p0'"),
    ],
)
def test_malformed_pod_rows_name_file_line_column(tmp_path: Path, body: str, where: str) -> None:
    path = write(tmp_path, SHORT_HEADER + body)
    with pytest.raises(TraceError) as err:
        load_pods(path)
    assert str(err.value).startswith(str(path))
    assert where in str(err.value)


def test_unknown_qos_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_HEADER + "p0,1,1,1,1000,,Gold,Running,0,1,0\n")
    with pytest.raises(TraceError, match=r":2: column 'qos': unknown QoS class 'Gold'"):
        load_pods(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", ":1: empty file"),
        ("name,cpu_milli,num_gpu\n", ":1: header lacks column(s) memory_mib, gpu_milli"),
        (SHORT_HEADER, ": no pods"),
    ],
)
def test_bad_pod_files(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_pods(path)


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot open"):
        load_pods(tmp_path / "absent.csv")


def test_node_list(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, NODE_HEADER + "n0,64000,262144,2,P100\nn1,32000,1024,0,\n"))
    assert [(n.name, n.num_gpu, n.gpu_model, n.cpu_milli) for n in nodes] == [
        ("n0", 2, "P100", 64000),
        ("n1", 0, "", 32000),
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("n0,1,1,2,\n", ":2: column 'model': a node with 2 GPU(s) needs a GPU model"),
        ("n0,1,1,two,G2\n", ":2: column 'gpu': expected an integer, got 'two'"),
        ("n0,1,1,0,\nn0,1,1,0,\n", ": duplicate node name(s): n0"),
    ],
)
def test_malformed_node_rows(tmp_path: Path, body: str, message: str) -> None:
    path = write(tmp_path, NODE_HEADER + body, "nodes.csv")
    with pytest.raises(TraceError) as err:
        load_nodes(path)
    assert message in str(err.value)


def test_shared_openb_files_load_in_both_shapes() -> None:
    files = ("node_list_gpu_node", "pod_list_default", "pod_list_multigpu20", "pod_list_gpuspec10")
    openb = require_data(*(f"openb/openb_{name}.csv" for name in files)) / "openb"
    nodes = load_nodes(openb / "openb_node_list_gpu_node.csv")
    # README: 1,213 GPU nodes, 6,212 GPUs.
    assert (len(nodes), sum(n.num_gpu for n in nodes)) == (1213, 6212)
    default = load_pods(openb / "openb_pod_list_default.csv")
    # README: 8,152 pods, total demand ≈ 6,087 GPUs.
    assert len(default.records) == 8152 and default.has_times
    assert round(default.gpu_demand_milli / 1000) == 6087
    short = load_pods(openb / "openb_pod_list_multigpu20.csv")
    assert not short.has_times and len(short.records) > 8000
    spec = load_pods(openb / "openb_pod_list_gpuspec10.csv")
    assert any(p.gpu_models for p in spec.pods)
