"""Loading the Alibaba openb trace: node lists and pod lists, as CSV files.

Node list columns: ``sn, cpu_milli, memory_mib, gpu, model``.
Pod list columns: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli`` and, in the full
(11-column) shape, ``gpu_spec, qos, pod_phase, creation_time, deletion_time, scheduled_time``.
``gpu_milli`` is the share of each GPU (1000 = whole GPUs); ``gpu_spec`` lists allowed GPU
models separated by ``|``. A malformed row raises :class:`TraceError` naming file, line and
column.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from defrag.model.resources import Node, Pod
from defrag.model.units import GPU_MILLI

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL_COLUMNS = (
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
QOS_PRIORITY = {"LS": 3, "Guaranteed": 2, "Burstable": 1, "BE": 0}
"""Priority of the trace's QoS classes (higher first): LS > Guaranteed > Burstable > BE."""

NAMESPACE = "openb"
T = TypeVar("T")


class TraceError(ValueError):
    """A trace file that cannot be read: the message names the file, line and column."""


@dataclass(frozen=True, slots=True)
class TracePod:
    """One row of a pod list: the pod and the trace's times (seconds; None when absent)."""

    pod: Pod
    phase: str = ""
    """The phase the trace recorded (the simulator's pods always arrive Pending)."""
    creation_time: int | None = None
    deletion_time: int | None = None
    scheduled_time: int | None = None


@dataclass(frozen=True, slots=True)
class PodTrace:
    path: Path
    columns: tuple[str, ...]
    records: tuple[TracePod, ...]

    @property
    def pods(self) -> tuple[Pod, ...]:
        return tuple(r.pod for r in self.records)

    @property
    def has_times(self) -> bool:
        return "creation_time" in self.columns

    @property
    def gpu_demand_milli(self) -> int:
        return sum(r.pod.gpu_demand_milli for r in self.records)


class _Row:
    """One CSV row with typed accessors that raise TraceError naming file/line/column."""

    def __init__(self, path: Path, line: int, values: dict[str, str]) -> None:
        self.path, self.line, self.values = path, line, values

    def error(self, column: str, message: str) -> TraceError:
        return TraceError(f"{self.path}:{self.line}: column {column!r}: {message}")

    def text(self, column: str) -> str:
        value = self.values.get(column)
        if value is None:
            raise self.error(column, "missing value (row too short)")
        return value.strip()

    def integer(self, column: str, *, low: int = 0, high: int | None = None) -> int:
        raw = self.text(column)
        try:
            value = int(raw)
        except ValueError:
            raise self.error(column, f"expected an integer, got {raw!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise self.error(column, f"{value} is out of range ({bound})")
        return value

    def optional_int(self, column: str) -> int | None:
        if column not in self.values or not self.text(column):
            return None
        return self.integer(column)


def _read(
    path: Path, required: Sequence[str], parse: Callable[[_Row], T]
) -> tuple[list[T], tuple[str, ...]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open: {exc.strerror or exc}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = tuple(h.strip() for h in next(reader))
        except StopIteration:
            raise TraceError(f"{path}:1: empty file, expected a header row") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}:1: not a CSV file: {exc}") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                f"{path}:1: header lacks column(s) {', '.join(missing)} "
                f"(expected {', '.join(required)})"
            )
        out: list[T] = []
        try:
            for values in reader:
                if not values or all(not v.strip() for v in values):
                    continue
                line = reader.line_num
                if len(values) != len(header):
                    raise TraceError(
                        f"{path}:{line}: {len(values)} field(s), the header has {len(header)}"
                    )
                out.append(parse(_Row(path, line, dict(zip(header, values, strict=True)))))
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}:{reader.line_num}: not valid CSV: {exc}") from None
    return out, header


def load_nodes(path: str | Path) -> tuple[Node, ...]:
    """The nodes of a node list (``sn, cpu_milli, memory_mib, gpu, model``)."""
    path = Path(path)
    nodes, _ = _read(path, NODE_COLUMNS, _node)
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise TraceError(f"{path}: duplicate node name(s): {', '.join(dupes[:5])}")
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return tuple(nodes)


def _node(row: _Row) -> Node:
    name = row.text("sn")
    if not name:
        raise row.error("sn", "empty node name")
    gpus = row.integer("gpu", high=64)
    model = row.text("model")
    if gpus and not model:
        raise row.error("model", f"a node with {gpus} GPU(s) needs a GPU model")
    return Node(
        name=name,
        cpu_milli=row.integer("cpu_milli"),
        memory_mib=row.integer("memory_mib"),
        num_gpu=gpus,
        gpu_model=model if gpus else "",
    )


def load_pods(path: str | Path) -> PodTrace:
    """The pods of a pod list, in the 5-column or the 11-column shape."""
    path = Path(path)
    records, header = _read(path, POD_COLUMNS, _pod)
    names = set()
    for rec in records:
        if rec.pod.name in names:
            raise TraceError(f"{path}: duplicate pod name {rec.pod.name!r}")
        names.add(rec.pod.name)
    if not records:
        raise TraceError(f"{path}: no pods")
    return PodTrace(path, header, tuple(records))


def _pod(row: _Row) -> TracePod:
    name = row.text("name")
    if not name:
        raise row.error("name", "empty pod name")
    num_gpu = row.integer("num_gpu", high=64)
    gpu_milli = row.integer("gpu_milli", high=GPU_MILLI)
    if num_gpu and gpu_milli == 0:
        raise row.error("gpu_milli", f"0 for a pod asking {num_gpu} GPU(s)")
    if num_gpu > 1 and gpu_milli < GPU_MILLI:
        raise row.error("gpu_milli", f"{gpu_milli}: only a 1-GPU pod may share a GPU")
    spec = row.text("gpu_spec") if "gpu_spec" in row.values else ""
    models = frozenset(m.strip() for m in spec.split("|") if m.strip())
    qos = row.text("qos") if "qos" in row.values else ""
    if qos and qos not in QOS_PRIORITY:
        raise row.error("qos", f"unknown QoS class {qos!r} (known: {', '.join(QOS_PRIORITY)})")
    pod = Pod(
        name=name,
        namespace=NAMESPACE,
        num_gpu=num_gpu,
        gpu_milli=gpu_milli if num_gpu else GPU_MILLI,
        cpu_milli=row.integer("cpu_milli"),
        memory_mib=row.integer("memory_mib"),
        gpu_models=models if num_gpu else frozenset(),
        qos=qos,
        priority=QOS_PRIORITY.get(qos, 0),
    )
    return TracePod(
        pod,
        phase=row.text("pod_phase") if "pod_phase" in row.values else "",
        creation_time=row.optional_int("creation_time"),
        deletion_time=row.optional_int("deletion_time"),
        scheduled_time=row.optional_int("scheduled_time"),
    )
