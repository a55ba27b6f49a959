"""GPU resource shapes as real clusters expose them, mapped onto the model (docs/kubernetes.md).

A node's GPUs reach the model either as exclusive whole GPUs (``Node.num_gpu``, what multi-GPU
jobs and the fragmentation figures count) or as pool units (``Node.pools``: MIG profiles,
time-sliced replicas). A pod's GPU request becomes whole GPUs, a share of each GPU
(``gpu_milli``), or pool units. Every vendor convention read here is named with its source:

- NVIDIA k8s-device-plugin / GPU Feature Discovery: ``nvidia.com/gpu``; ``nvidia.com/gpu.count``
  is the physical count, ``nvidia.com/gpu.replicas`` the time-slicing replicas
  (``internal/lm/resource.go``); renamed replicas are ``nvidia.com/gpu.shared``; MIG profiles are
  ``nvidia.com/mig-<profile>`` (mixed strategy) or plain ``nvidia.com/gpu`` with label
  ``nvidia.com/mig.strategy=single`` (README, "MIG support").
- HAMi (Project-HAMi/HAMi, ``docs/develop/protocol.md``): allocatable ``nvidia.com/gpu`` is GPUs ×
  ``deviceSplitCount``; the physical GPUs are listed in the node annotation
  ``hami.io/node-nvidia-register``; pods ask ``nvidia.com/gpumem`` (MiB per GPU),
  ``nvidia.com/gpumem-percentage`` and ``nvidia.com/gpucores`` (percent of each GPU).
- KAI-Scheduler (``docs/gpu-sharing/``): pod annotations ``gpu-fraction`` and ``gpu-memory``
  (MiB) with no ``nvidia.com/gpu`` request; a reservation pod in ``kai-resource-reservation``
  holds the whole GPU.
- Koordinator (``koordinator.sh/gpu-core``, ``koordinator.sh/gpu-memory-ratio``,
  ``koordinator.sh/gpu``): 100 = one whole GPU.

What cannot be modelled is a :class:`ShapeWarning` naming the object and the key; the object is
left out (a pending pod) or counted conservatively (a node, a bound pod) — never 0 GPUs silently.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from defrag.model.resources import GPU_RESOURCE
from defrag.model.units import GPU_MILLI

SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
HAMI_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
KAI_FRACTION_ANNOTATION = "gpu-fraction"
KAI_FRACTION_DEVICES_ANNOTATION = "gpu-fraction-num-devices"
KAI_MEMORY_ANNOTATION = "gpu-memory"
KAI_RESERVATION_NAMESPACE = "kai-resource-reservation"
KOORD_CORE = "koordinator.sh/gpu-core"
KOORD_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
KOORD_GPU = "koordinator.sh/gpu"
KOORD_MEMORY = "koordinator.sh/gpu-memory"
KOORD_SHARED = "koordinator.sh/gpu.shared"
HAMI_PRIORITY = "nvidia.com/priority"

KNOWN_GPU_KEYS = frozenset(
    {
        GPU_RESOURCE,
        SHARED_RESOURCE,
        HAMI_MEMORY,
        HAMI_MEMORY_PERCENT,
        HAMI_CORES,
        KOORD_CORE,
        KOORD_MEMORY_RATIO,
        KOORD_GPU,
        KOORD_MEMORY,
        KOORD_SHARED,
        HAMI_PRIORITY,
    }
)
ACCELERATOR_PREFIXES = (
    "nvidia.com/",
    "amd.com/",
    "gpu.intel.com/",
    "habana.ai/",
    "aws.amazon.com/neuron",
    "google.com/tpu",
    "xilinx.com/",
    "koordinator.sh/gpu",
)
"""Extended resources that are accelerators: an unknown one is said, never ignored."""


@dataclass(frozen=True, slots=True)
class ShapeWarning:
    """What defrag cannot model of one object: ``obj`` (``Node n`` / ``Pod ns/p``), the JSON
    path of the key, what was done instead. ``leave_out``: the object is not modelled at all."""

    obj: str
    path: str
    message: str
    leave_out: bool = False

    def __str__(self) -> str:
        return f"{self.obj}: {self.path}: {self.message}"


def is_pool_resource(name: str) -> bool:
    return name == SHARED_RESOURCE or name.startswith(MIG_PREFIX)


def is_unknown_accelerator(name: str) -> bool:
    return (
        name.startswith(ACCELERATOR_PREFIXES)
        and name not in KNOWN_GPU_KEYS
        and not is_pool_resource(name)
    )


# --- nodes -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeGpus:
    num_gpu: int
    pools: Mapping[str, int]
    gpu_memory_mib: int | None = None
    """Per-GPU memory from a vendor annotation (HAMi), when the labels do not say."""


def node_gpus(
    who: str,
    alloc_path: str,
    allocatable: Mapping[str, int],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    warn: list[ShapeWarning],
) -> NodeGpus:
    """Exclusive GPUs and pools of one node from its allocatable counts, labels and annotations.

    ``allocatable`` holds every extended resource as a whole count (non-count values are the
    caller's error to report).
    """
    gpus = allocatable.get(GPU_RESOURCE, 0)
    pools = {res: n for res, n in allocatable.items() if is_pool_resource(res) and n > 0}
    for res, n in sorted(allocatable.items()):
        if n > 0 and is_unknown_accelerator(res):
            warn.append(
                ShapeWarning(
                    who,
                    f'{alloc_path}["{res}"]',
                    f"{n} unit(s) of {res}: defrag does not model this accelerator resource; "
                    "they are left out of every GPU figure",
                )
            )
    replicas = _label_int(labels, GPU_REPLICAS_LABEL)
    physical = _label_int(labels, GPU_COUNT_LABEL)
    if HAMI_REGISTER_ANNOTATION in annotations:
        devices, memory = _hami_devices(annotations[HAMI_REGISTER_ANNOTATION])
        path = f'metadata.annotations["{HAMI_REGISTER_ANNOTATION}"]'
        if devices is None:
            count = physical if physical is not None else 0
            warn.append(
                ShapeWarning(
                    who,
                    path,
                    "cannot read HAMi's device list; "
                    + (
                        f"{count} physical GPU(s) taken from {GPU_COUNT_LABEL}"
                        if physical is not None
                        else f"its {gpus} {GPU_RESOURCE} (GPUs × split count) are left out"
                    ),
                )
            )
            return NodeGpus(min(count, gpus), pools)
        return NodeGpus(min(devices, gpus) if gpus else devices, pools, memory)
    if (
        gpus
        and labels.get(MIG_STRATEGY_LABEL) == "single"
        and "-MIG-" in labels.get(GPU_PRODUCT_LABEL, "")
    ):
        # MIG single strategy: every nvidia.com/gpu is one MIG slice of the same profile.
        return NodeGpus(0, {**pools, GPU_RESOURCE: gpus})
    if gpus and replicas is not None and replicas > 1:
        # Time-slicing with renameByDefault false: nvidia.com/gpu counts replicas.
        return NodeGpus(0, {**pools, GPU_RESOURCE: gpus})
    if gpus and physical is not None and gpus > physical:
        warn.append(
            ShapeWarning(
                who,
                f'{alloc_path}["{GPU_RESOURCE}"]',
                f"{gpus} allocatable but label {GPU_COUNT_LABEL} says {physical} and nothing "
                "(replicas, MIG, HAMi) explains the difference; counted as shared GPU units, "
                "never as whole GPUs",
            )
        )
        return NodeGpus(0, {**pools, GPU_RESOURCE: gpus})
    if not gpus and allocatable.get(KOORD_CORE, 0) >= 100:
        # Koordinator's GPU share resources: 100 gpu-core per GPU.
        return NodeGpus(allocatable[KOORD_CORE] // 100, pools)
    return NodeGpus(gpus, pools)


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(labels[key]) if key in labels else None
    except ValueError:
        return None


def _hami_devices(text: str) -> tuple[int | None, int | None]:
    """(GPU count, per-GPU memory MiB) from HAMi's registration annotation: a JSON list of
    devices (``devmem`` in MiB), or the older ``id,count,devmem,devcore,type,numa,health:``
    string. (None, None) when unreadable."""
    text = text.strip()
    if text.startswith("["):
        try:
            devices = json.loads(text)
        except json.JSONDecodeError:
            return None, None
        if not isinstance(devices, list):
            return None, None
        mems = [d.get("devmem") for d in devices if isinstance(d, dict)]
        mem = min((m for m in mems if isinstance(m, int) and m > 0), default=None)
        return len(devices), mem
    entries = [e for e in text.split(":") if e.strip()]
    if not entries or any(len(e.split(",")) < 4 for e in entries):
        return None, None
    try:
        mem = min(int(e.split(",")[2]) for e in entries)
    except ValueError:
        mem = None
    return len(entries), mem


# --- pods --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodGpus:
    num_gpu: int = 0
    gpu_milli: int = GPU_MILLI
    pool: str = ""
    pool_units: int = 0
    gpu_memory_mib: int = 0
    share_memory_mib: int = 0
    """A share asked as GPU memory (KAI ``gpu-memory``, HAMi ``gpumem``): the share is resolved
    against the node's GPU memory when the cluster is built, ``gpu_milli`` being its floor."""


def pod_gpus(
    who: str,
    namespace: str,
    requests: Mapping[str, Decimal],
    annotations: Mapping[str, str],
    has_claims: bool,
    bound: bool,
    warn: list[ShapeWarning],
) -> PodGpus:
    """The pod's GPU request in the model's terms; warnings for what cannot be modelled."""
    leave = not bound  # a pending pod defrag cannot model is left out; a bound one is kept
    found: list[PodGpus] = []
    if has_claims:
        warn.append(
            ShapeWarning(
                who,
                "spec.resourceClaims",
                "dynamic resource allocation claims are not modelled; "
                + ("the pod is left out" if leave else "its claimed devices are not counted"),
                leave_out=leave,
            )
        )
    for res, value in sorted(requests.items()):
        if value > 0 and is_unknown_accelerator(res):
            warn.append(
                ShapeWarning(
                    who,
                    f"spec.containers[*].resources.requests[{res!r}]",
                    f"{res} is not a GPU resource defrag models; "
                    + ("the pod is left out" if leave else "counted for CPU and memory only"),
                    leave_out=leave,
                )
            )
    pools = {res: v for res, v in requests.items() if is_pool_resource(res) and v > 0}
    if len(pools) > 1:
        names = ", ".join(sorted(pools))
        warn.append(
            ShapeWarning(
                who,
                "spec.containers[*].resources.requests",
                f"asks units of several GPU pools ({names}); only {min(pools)} is counted"
                + ("" if bound else "; the pod is left out"),
                leave_out=leave,
            )
        )
    if pools:
        res = min(pools)
        found.append(PodGpus(pool=res, pool_units=_whole(pools[res])))
    gpus = requests.get(GPU_RESOURCE, Decimal(0))
    hami = {k: requests[k] for k in (HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES) if k in requests}
    if gpus > 0:
        found.append(_hami(_whole(gpus), hami) if hami else PodGpus(num_gpu=_whole(gpus)))
    koord = _koordinator(requests)
    if koord is not None:
        found.append(koord)
    kai = _kai(who, annotations, warn)
    if kai is not None and namespace != KAI_RESERVATION_NAMESPACE and not bound:
        # Bound, a KAI fraction holds nothing of its own: KAI's reservation pod (in
        # kai-resource-reservation, asking a whole nvidia.com/gpu) holds the GPU it shares.
        found.append(kai)
    if not found:
        return PodGpus()
    if len(found) > 1 and not pools:
        # Several conventions on one pod (e.g. nvidia.com/gpu and a KAI annotation): the
        # largest claim is counted, so nothing is undercounted.
        return max(found, key=lambda g: (g.num_gpu * g.gpu_milli, g.share_memory_mib))
    return found[0]


def _whole(value: Decimal) -> int:
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def _hami(gpus: int, hami: Mapping[str, Decimal]) -> PodGpus:
    """HAMi: ``gpus`` vGPUs on distinct GPUs, each taking a share of compute
    (``gpucores``, percent) and of memory (``gpumem`` MiB, or ``gpumem-percentage``). HAMi gives a
    pod that names no memory the whole GPU's memory, so ``gpucores`` alone is a whole GPU."""
    cores = hami.get(HAMI_CORES, Decimal(0)) / 100
    if HAMI_MEMORY_PERCENT in hami and hami[HAMI_MEMORY_PERCENT] > 0:
        share = max(cores, min(hami[HAMI_MEMORY_PERCENT], Decimal(100)) / 100)
        return PodGpus(num_gpu=gpus, gpu_milli=_milli(share))
    if HAMI_MEMORY in hami and hami[HAMI_MEMORY] > 0:
        memory = _whole(hami[HAMI_MEMORY])
        return PodGpus(
            num_gpu=gpus, gpu_milli=_milli(cores), gpu_memory_mib=memory, share_memory_mib=memory
        )
    return PodGpus(num_gpu=gpus)


def _milli(share: Decimal) -> int:
    return min(GPU_MILLI, max(1, math.ceil(share * GPU_MILLI)))


def _koordinator(requests: Mapping[str, Decimal]) -> PodGpus | None:
    """Koordinator: ``gpu-memory-ratio`` / ``gpu-core`` / ``gpu`` in percent of one GPU; below
    100 a share of one GPU, otherwise whole GPUs (rounded up)."""
    value = max(
        (requests.get(k, Decimal(0)) for k in (KOORD_GPU, KOORD_MEMORY_RATIO, KOORD_CORE)),
        default=Decimal(0),
    )
    if value <= 0:
        return None
    if value < 100:
        return PodGpus(num_gpu=1, gpu_milli=max(1, math.ceil(value * 10)))
    return PodGpus(num_gpu=_whole(value / 100))


def _kai(who: str, annotations: Mapping[str, str], warn: list[ShapeWarning]) -> PodGpus | None:
    """KAI-Scheduler GPU sharing: ``gpu-fraction`` (0 < f ≤ 1, on ``gpu-fraction-num-devices``
    GPUs) or ``gpu-memory`` (MiB)."""
    devices = 1
    if KAI_FRACTION_DEVICES_ANNOTATION in annotations:
        try:
            devices = max(1, int(annotations[KAI_FRACTION_DEVICES_ANNOTATION]))
        except ValueError:
            devices = 1
    if KAI_FRACTION_ANNOTATION in annotations:
        path = f'metadata.annotations["{KAI_FRACTION_ANNOTATION}"]'
        try:
            fraction = float(annotations[KAI_FRACTION_ANNOTATION])
        except ValueError:
            fraction = math.nan
        if not 0 < fraction <= 1:
            warn.append(
                ShapeWarning(
                    who,
                    path,
                    f"{annotations[KAI_FRACTION_ANNOTATION]!r} is not a fraction in "
                    "(0, 1]; counted as one whole GPU",
                )
            )
            return PodGpus(num_gpu=devices)
        return PodGpus(num_gpu=devices, gpu_milli=max(1, math.ceil(fraction * GPU_MILLI)))
    if KAI_MEMORY_ANNOTATION in annotations:
        path = f'metadata.annotations["{KAI_MEMORY_ANNOTATION}"]'
        try:
            memory = int(annotations[KAI_MEMORY_ANNOTATION])
        except ValueError:
            memory = 0
        if memory <= 0:
            warn.append(
                ShapeWarning(
                    who,
                    path,
                    f"{annotations[KAI_MEMORY_ANNOTATION]!r} is not a memory size in "
                    "MiB; counted as one whole GPU",
                )
            )
            return PodGpus(num_gpu=devices)
        return PodGpus(num_gpu=devices, gpu_milli=1, share_memory_mib=memory, gpu_memory_mib=memory)
    return None


def share_for_memory(memory_mib: int, gpu_memory_mib: int, floor: int = 1) -> int:
    """The share (milli-GPU) ``memory_mib`` of a GPU with ``gpu_memory_mib`` is, at least
    ``floor``; a whole GPU when the GPU's memory is unknown (conservative)."""
    if gpu_memory_mib <= 0:
        return GPU_MILLI
    return min(GPU_MILLI, max(floor, math.ceil(GPU_MILLI * memory_mib / gpu_memory_mib)))


# --- kube-state-metrics ------------------------------------------------------------------------


def ksm_name(resource: str) -> str:
    """A resource name as kube-state-metrics writes it in its ``resource`` label
    (``nvidia.com/mig-1g.10gb`` → ``nvidia_com_mig_1g_10gb``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", resource)


KSM_GPU = ksm_name(GPU_RESOURCE)
"""``nvidia.com/gpu`` as kube-state-metrics labels it."""
_KSM_POOL_PREFIXES = (ksm_name(MIG_PREFIX), ksm_name(SHARED_RESOURCE))
_KSM_KNOWN = frozenset(ksm_name(k) for k in KNOWN_GPU_KEYS)
_KSM_ACCELERATORS = tuple(ksm_name(p) for p in ACCELERATOR_PREFIXES)


def ksm_kind(label: str) -> str:
    """What a kube-state-metrics ``resource`` label is: ``gpu`` (whole NVIDIA GPUs), ``pool``
    (MIG profiles, renamed time-sliced replicas), ``unknown`` (an accelerator defrag does not
    model) or ``other`` (cpu, memory, a known sharing key)."""
    if label == KSM_GPU:
        return "gpu"
    if label.startswith(_KSM_POOL_PREFIXES):
        return "pool"
    if label.startswith(_KSM_ACCELERATORS) and label not in _KSM_KNOWN:
        return "unknown"
    return "other"
