"""NVML (``nvidia-ml-py``): the GPUs of this node, their memory, processes and NVLink links.

The only module that imports ``pynvml``. :class:`NvmlInventory` takes the module as a
parameter so tests can hand it a fake with the same functions; by default it is the real
library, which needs the NVIDIA driver (``libnvidia-ml.so.1``) on the machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MIB = 2**20


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here: no library, no driver, or no permission."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_mib: int
    """GPU memory the process holds; -1 when NVML does not say (e.g. under MIG or WDDM)."""


@dataclass(frozen=True, slots=True)
class NvLink:
    """One active NVLink of a GPU: the PCI bus id at the other end, and what is there."""

    link: int
    remote_bus_id: str
    remote_kind: str
    """``gpu``, ``switch``, ``npu``, or ``unknown`` (old drivers do not say)."""


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    bus_id: str
    """Normalised PCI bus id ``dddddddd:bb:dd.f`` (lower case)."""
    memory_total_mib: int
    memory_used_mib: int
    processes: tuple[GpuProcess, ...] = ()
    links: tuple[NvLink, ...] = ()


_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)$")


def normalise_bus_id(raw: object) -> str:
    """``00000000:07:00.0``, ``0000:07:00.0`` and ``07:00.0`` name one device: make them equal."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    text = text.strip().strip("\x00")
    match = _BUS_ID.match(text)
    if match is None:
        return text.lower()
    domain, bus, device, function = (int(g, 16) for g in match.groups(default="0"))
    return f"{domain:08x}:{bus:02x}:{device:02x}.{function:x}"


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlInventory:
    """Reads the node's GPUs through NVML. ``open()`` first; ``close()`` when done."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml: Any = nvml
        self._open = False

    @property
    def nvml(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - a dependency of the package
                raise NvmlUnavailable(f"nvidia-ml-py is not installed: {exc}") from exc
            self._nvml = pynvml
        return self._nvml

    def open(self) -> None:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML could not start ({exc}); is the NVIDIA driver installed and the container "
                "run with the NVIDIA runtime (NVIDIA_VISIBLE_DEVICES=all)?"
            ) from exc
        self._open = True

    def close(self) -> None:
        if self._open:
            try:
                self.nvml.nvmlShutdown()
            finally:
                self._open = False

    def driver_version(self) -> str:
        return _text(self.nvml.nvmlSystemGetDriverVersion())

    def devices(self) -> tuple[GpuDevice, ...]:
        """Every GPU NVML sees, in NVML index order, with memory, processes and active links."""
        nvml = self.nvml
        out = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(
                GpuDevice(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    bus_id=normalise_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId),
                    memory_total_mib=int(memory.total) // MIB,
                    memory_used_mib=int(memory.used) // MIB,
                    processes=self._processes(handle),
                    links=self._links(handle),
                )
            )
        return tuple(out)

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        nvml = self.nvml
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError:
            return ()
        out = []
        for p in procs:
            raw = getattr(p, "usedGpuMemory", None)
            # NVML_VALUE_NOT_AVAILABLE is the all-ones unsigned long long (pynvml may give None).
            used = -1 if raw is None else int(raw)
            known = 0 <= used < 2**63
            out.append(GpuProcess(int(p.pid), used // MIB if known else -1))
        return tuple(out)

    def _links(self, handle: Any) -> tuple[NvLink, ...]:
        nvml = self.nvml
        kinds = {
            getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0): "gpu",
            getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_IBMNPU", 1): "npu",
            getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2): "switch",
        }
        links = []
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError:
                # NotSupported: no NVLink on this GPU (or past its last link); InvalidArgument:
                # past the last link. Either way there is nothing more to read.
                break
            if state != nvml.NVML_FEATURE_ENABLED:
                continue
            try:
                remote = normalise_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except nvml.NVMLError:
                continue
            try:
                kind = kinds.get(
                    int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)), "unknown"
                )
            except (nvml.NVMLError, AttributeError):
                kind = "unknown"  # drivers before R450 cannot say
            links.append(NvLink(link, remote, kind))
        return tuple(links)
