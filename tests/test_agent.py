"""The node agent: NVLink domains from fake NVML topologies of real machines, the annotation
published through the emulated API server, and /metrics."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from defrag.adapters.kube import KubeActuator, RetryPolicy
from defrag.adapters.kube_convert import node_from_json
from defrag.adapters.nvml import NvmlInventory, NvmlUnavailable, normalise_bus_id
from defrag.agent.service import Agent
from defrag.agent.topology import format_domains, nvlink_domains, read_topology
from defrag.model.resources import NVLINK_DOMAINS_ANNOTATION
from tests.support import kubeobjects
from tests.support.kubeapi import KubeApi, running

GPU, NPU, SWITCH = (
    pynvml.NVML_NVLINK_DEVICE_TYPE_GPU,
    pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU,
    pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
)
GIB = 2**30


@dataclass
class FakeGpu:
    bus: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * GIB
    used: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    links: list[tuple[str, int] | None] | None = None
    """Per link: (remote bus id, remote device type), None = link down; None = no NVLink."""


class FakeNvml:
    """The part of the pynvml module the adapter calls, with pynvml's own error classes."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_NVLINK_DEVICE_TYPE_GPU = GPU
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = NPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH = SWITCH

    def __init__(self, gpus: Sequence[FakeGpu], remote_type: bool = True) -> None:
        self.gpus = list(gpus)
        self.inited = 0
        if not remote_type:  # drivers before R450 have no such function
            self.nvmlDeviceGetNvLinkRemoteDeviceType = self._missing

    @staticmethod
    def _err(code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    def _missing(self, *args: Any) -> int:
        raise self._err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def nvmlInit(self) -> None:
        self.inited += 1

    def nvmlShutdown(self) -> None:
        self.inited -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}-fake"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h].name.encode()  # older pynvml returns bytes

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self.gpus[h].bus.encode())

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        g = self.gpus[h]
        return SimpleNamespace(total=g.total, used=g.used, free=g.total - g.used)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.gpus[h].processes]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        links = self.gpus[h].links
        if links is None:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(links):
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if links[link] else pynvml.NVML_FEATURE_DISABLED

    def _link(self, h: int, link: int) -> tuple[str, int]:
        links = self.gpus[h].links
        assert links is not None and links[link] is not None
        return links[link]  # type: ignore[return-value]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._link(h, link)[0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        return self._link(h, link)[1]


# --- topologies of real machines ---------------------------------------------------------------

DGX_H100_BUS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]  # nvidia-smi on a DGX H100


def bus(b: str) -> str:
    return f"00000000:{b.upper()}:00.0"


def nvswitch_8() -> list[FakeGpu]:
    """HGX/DGX H100: 18 NVLinks per GPU, spread over the 4 NVSwitches (5+4+4+5)."""
    switches = [bus(s) for s in ("05", "06", "07", "08")]
    per_switch = [0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3]
    return [
        FakeGpu(bus(b), links=[(switches[s], SWITCH) for s in per_switch]) for b in DGX_H100_BUS
    ]


def direct(edges: Sequence[tuple[int, int]], n: int, links_per_gpu: int, per_edge: int) -> list:
    """GPUs joined by direct GPU-to-GPU links (``per_edge`` links per pair)."""
    buses = [bus(f"{0x10 + 0x10 * i:02x}") for i in range(n)]
    links: list[list[tuple[str, int] | None]] = [[] for _ in range(n)]
    for a, b in edges:
        links[a] += [(buses[b], GPU)] * per_edge
        links[b] += [(buses[a], GPU)] * per_edge
    return [
        FakeGpu(buses[i], "NVIDIA A100-SXM4-80GB", links=ls + [None] * (links_per_gpu - len(ls)))
        for i, ls in enumerate(links)
    ]


def two_islands() -> list[FakeGpu]:
    """Two HGX A100 4-GPU boards: each board fully connected (4 links per pair, 12 per GPU)."""
    quad = [(a, b) for a in range(4) for b in range(a + 1, 4)]
    return direct(quad + [(a + 4, b + 4) for a, b in quad], 8, 12, 4)


def pcie_pairs() -> list[FakeGpu]:
    """8× A100 PCIe with NVLink bridges on pairs (3 bridges × 4 links); the rest down."""
    return direct([(0, 1), (2, 3), (4, 5), (6, 7)], 8, 12, 4)


def hybrid_cube_mesh() -> list[FakeGpu]:
    """DGX-1 V100: 6 links per GPU, a hybrid cube mesh — not all pairs, but one component."""
    edges = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    edges += [(a + 4, b + 4) for a, b in edges] + [(i, i + 4) for i in range(4)]
    return direct(edges, 8, 6, 1)


def no_nvlink(n: int = 4) -> list[FakeGpu]:
    """L4 / T4 PCIe cards: NVML answers NotSupported for NVLink."""
    return [FakeGpu(bus(f"{0x40 + i:02x}"), "NVIDIA L4", 24 * GIB) for i in range(n)]


def crossed_pairs() -> list[FakeGpu]:
    """Bridges on (0,2) and (1,3): NVLink domains that are not index ranges."""
    return direct([(0, 2), (1, 3)], 4, 12, 4)


def power9_npu() -> list[FakeGpu]:
    """IBM AC922: GPUs 0-1 linked to each other and to the CPU (NPU); 2-3 likewise."""
    gpus = direct([(0, 1), (2, 3)], 4, 6, 3)
    for g in gpus:
        assert g.links is not None
        g.links[3:6] = [(bus("04"), NPU)] * 3  # the same CPU bus for all: must join nothing
    return gpus


TOPOLOGIES = [
    # (name, gpus, remote device type known, domains, annotation)
    ("nvswitch-8", nvswitch_8(), True, [tuple(range(8))], "0-7"),
    ("nvswitch-8-old-driver", nvswitch_8(), False, [tuple(range(8))], "0-7"),
    ("two-4-gpu-islands", two_islands(), True, [(0, 1, 2, 3), (4, 5, 6, 7)], "0-3,4-7"),
    ("pcie-pairs", pcie_pairs(), True, [(0, 1), (2, 3), (4, 5), (6, 7)], "0-1,2-3,4-5,6-7"),
    ("hybrid-cube-mesh", hybrid_cube_mesh(), True, [tuple(range(8))], "0-7"),
    ("no-nvlink", no_nvlink(), True, [(0,), (1,), (2,), (3,)], "0,1,2,3"),
    ("power9-npu", power9_npu(), True, [(0, 1), (2, 3)], "0-1,2-3"),
    ("single-gpu", no_nvlink(1), True, [(0,)], "0"),
    ("no-gpu", [], True, [], ""),
]


@pytest.mark.parametrize(
    ("gpus", "remote_type", "domains", "annotation"),
    [t[1:] for t in TOPOLOGIES],
    ids=[t[0] for t in TOPOLOGIES],
)
def test_domains_of_real_topologies(
    gpus: list[FakeGpu], remote_type: bool, domains: list[tuple[int, ...]], annotation: str
) -> None:
    inventory = NvmlInventory(FakeNvml(gpus, remote_type))
    inventory.open()
    topology = read_topology(inventory.devices())
    inventory.close()
    assert list(topology.domains) == domains
    assert topology.annotation == annotation
    assert topology.notes == ()
    if gpus:
        # The converter that reads the annotation back sees the same domains.
        obj = kubeobjects.node("n", len(gpus), nvlink=annotation)
        assert node_from_json(obj).domains == tuple(domains)


def test_non_contiguous_domain_is_published_conservatively() -> None:
    devices = NvmlInventory(FakeNvml(crossed_pairs())).devices()
    assert nvlink_domains(devices) == ((0, 2), (1, 3))
    topology = read_topology(devices)
    # {0,2} and {1,3} cannot be written as ranges: each splits into single GPUs, so the
    # scheduler never puts a 2-GPU pod on GPUs that share no NVLink.
    assert topology.annotation == "0,1,2,3"
    assert len(topology.notes) == 2 and "not contiguous" in topology.notes[0]


@pytest.mark.parametrize(
    ("domains", "text"),
    [
        ([(0, 1, 2, 3, 4, 5, 6, 7)], "0-7"),
        ([(4, 5, 6, 7), (0, 1, 2, 3)], "0-3,4-7"),
        ([(0, 1, 4, 5), (2, 3, 6, 7)], "0-1,2-3,4-5,6-7"),
        ([(0,), (1, 2)], "0,1-2"),
        ([], ""),
    ],
)
def test_format_domains(domains: list[tuple[int, ...]], text: str) -> None:
    assert format_domains(domains)[0] == text


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (b"00000000:07:00.0", "00000000:07:00.0"),
        ("0000:07:00.0", "00000000:07:00.0"),
        ("07:00.0", "00000000:07:00.0"),
        ("00000000:DB:00.0\x00\x00", "00000000:db:00.0"),
    ],
)
def test_bus_ids_normalise(raw: object, normal: str) -> None:
    assert normalise_bus_id(raw) == normal


def test_links_reported_with_legacy_bus_id_width_still_join() -> None:
    """A remote PCI id in the 16-character legacy form names the same GPU as the 32-char one."""
    gpus = direct([(0, 1)], 2, 4, 2)
    for g in gpus:
        assert g.links is not None
        g.links = [(r[0][4:], r[1]) if r else None for r in g.links]  # "0000:10:00.0"
    assert nvlink_domains(NvmlInventory(FakeNvml(gpus)).devices()) == ((0, 1),)


def test_real_nvml_without_a_driver_is_a_clear_error() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # a machine with a driver: this test is about machines without one
        pynvml.nvmlShutdown()
        pytest.skip("NVML is available here")
    with pytest.raises(NvmlUnavailable, match="NVIDIA driver"):
        NvmlInventory().open()


# --- publishing through the emulated API server ----------------------------------------------


@pytest.fixture
def kube_api() -> Iterator[KubeApi]:
    yield from running([kubeobjects.node("gpu-1", 8), kubeobjects.node("gpu-2", 8)])


def annotator(api: KubeApi) -> KubeActuator:
    """The daemon's own API adapter; one attempt, so an injected 503 surfaces at once."""
    return KubeActuator(api.client(), retry=RetryPolicy(attempts=1))


def patches(api: KubeApi) -> list[Any]:
    return [r for r in api.requests if r.method == "PATCH"]


def test_agent_publishes_domains_through_the_api(kube_api: KubeApi) -> None:
    fake = FakeNvml(two_islands())
    inventory = NvmlInventory(fake)
    inventory.open()
    agent = Agent("gpu-1", inventory, annotator(kube_api))
    agent.sync_once()
    node = kube_api.get("Node", "gpu-1")
    assert node is not None
    assert node["metadata"]["annotations"][NVLINK_DOMAINS_ANNOTATION] == "0-3,4-7"
    other = kube_api.get("Node", "gpu-2")
    assert other is not None
    assert NVLINK_DOMAINS_ANNOTATION not in (other["metadata"].get("annotations") or {})
    (req,) = patches(kube_api)
    assert (req.verb, req.resource, req.name) == ("patch", "nodes", "gpu-1")
    assert [r.verb for r in kube_api.requests] == ["patch"]  # RBAC: patch nodes, nothing else

    # Unchanged topology: no request at all.
    agent.sync_once()
    assert len(patches(kube_api)) == 1

    # A bridge fails and the node comes back as PCIe pairs: published again.
    fake.gpus = pcie_pairs()
    agent.sync_once()
    assert len(patches(kube_api)) == 2
    node = kube_api.get("Node", "gpu-1")
    assert node is not None
    assert node["metadata"]["annotations"][NVLINK_DOMAINS_ANNOTATION] == "0-1,2-3,4-5,6-7"


def test_agent_removes_the_annotation_when_no_gpu_is_left(kube_api: KubeApi) -> None:
    fake = FakeNvml(no_nvlink(2))
    agent = Agent("gpu-1", NvmlInventory(fake), annotator(kube_api))
    agent.sync_once()
    fake.gpus = []
    agent.sync_once()
    node = kube_api.get("Node", "gpu-1")
    assert node is not None
    assert NVLINK_DOMAINS_ANNOTATION not in (node["metadata"].get("annotations") or {})


def test_failed_patch_is_retried_next_sync(kube_api: KubeApi) -> None:
    agent = Agent("gpu-1", NvmlInventory(FakeNvml(nvswitch_8())), annotator(kube_api))
    kube_api.fail("PATCH", "/api/v1/nodes/gpu-1", status=503)
    with pytest.raises(Exception, match="503"):
        agent.sync_once()
    assert agent.published is None
    agent.sync_once()
    node = kube_api.get("Node", "gpu-1")
    assert node is not None and node["metadata"]["annotations"][NVLINK_DOMAINS_ANNOTATION] == "0-7"
    text = generate_latest(agent.registry).decode()
    assert "defrag_agent_publish_errors_total 1.0" in text


# --- metrics -----------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_show_memory_processes_and_domains() -> None:
    gpus = two_islands()
    gpus[5].used = 30 * GIB
    gpus[5].processes = [(4242, 20 * GIB), (4343, 10 * GIB), (4444, None), (4545, 2**64 - 1)]
    agent = Agent("gpu-1", NvmlInventory(FakeNvml(gpus)), annotator=None)
    got = samples(generate_latest(agent.registry).decode())
    gpu5 = {"node": "gpu-1", "gpu": "5", "uuid": "GPU-00000005-fake"}
    model = {**gpu5, "model": "NVIDIA A100-SXM4-80GB"}
    assert got[("defrag_gpu_memory_total_bytes", frozenset(model.items()))] == 80 * GIB
    assert got[("defrag_gpu_memory_used_bytes", frozenset(model.items()))] == 30 * GIB
    by_pid = {
        dict(labels)["pid"]: value
        for (name, labels), value in got.items()
        if name == "defrag_gpu_process_memory_used_bytes"
    }
    # 4444, 4545: NVML did not say (None, NVML_VALUE_NOT_AVAILABLE) → no sample, not a made-up 0.
    assert by_pid == {"4242": 20 * GIB, "4343": 10 * GIB}
    domains = {
        dict(labels)["gpu"]: dict(labels)["domain"]
        for (name, labels), value in got.items()
        if name == "defrag_gpu_nvlink_domain_info"
    }
    assert domains == {str(i): "0" if i < 4 else "1" for i in range(8)}


class _RefusingAnnotator:
    """An API server that refuses the patch (RBAC missing, say)."""

    def annotate_node(self, node: str, annotations: Mapping[str, str | None]) -> None:
        raise RuntimeError('nodes "gpu-1" is forbidden')


def _get(url: str, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + path, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_agent_http_serves_metrics_health_and_readiness() -> None:
    import threading

    from defrag.adapters.health import HealthServer

    agent = Agent("gpu-1", NvmlInventory(FakeNvml(no_nvlink(2))), annotator=_RefusingAnnotator())
    with HealthServer(("127.0.0.1", 0), agent.probes()).start() as server:
        assert _get(server.url, "/healthz") == (200, "ok\n")
        assert _get(server.url, "/readyz") == (200, "ok\n")  # nothing has failed yet
        status, body = _get(server.url, "/metrics")
        assert status == 200 and 'defrag_gpu_memory_total_bytes{gpu="1"' in body
        assert _get(server.url, "/nope")[0] == 404
        stop = threading.Event()
        stop.set()
        agent.run(stop)  # one sync; the patch is refused
        assert _get(server.url, "/readyz") == (
            503,
            'last sync failed: nodes "gpu-1" is forbidden\n',
        )
        assert _get(server.url, "/healthz") == (200, "ok\n")  # alive: it will retry
