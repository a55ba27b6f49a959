"""GPU memory leak detection: steady growth of a GPU's used memory, heading for exhaustion.

Real ``DCGM_FI_DEV_FB_USED`` jitters by hundreds of MiB between scrapes (allocator caches,
activations), so nothing here is judged on raw samples. The series is reduced first:

1. **bins** — the median of each ``bin_s`` bin (5 min: ten 30 s scrapes); a short spike or a
   missed scrape does not move it; evaluation spikes that span whole bins (up to ``spike_s``)
   are dropped where they stand above the bins' lower envelope (a morphological opening);
2. **restart** — a fall to a tenth of the running peak (by more than ``cycle_noise`` × noise) is
   a job restarting or a new one: only what follows the last such fall is judged;
3. **floor** — when the bins fall back by more than ``cycle_noise`` × their noise (a cache freed),
   the minimum of every ``floor_window_s`` run of bins (1 h), averaged again over that window (a
   rolling minimum is a staircase): an allocator cache freed and refilled within the hour leaves
   it flat, while the floor of a leak rises with the leak.

A GPU (or MIG instance) is *leaking* when, over the lookback,

* the Theil–Sen slope of the judged series (bins, or floor) is at least ``min_slope_mib_per_h``
  and the lower end of its 95% confidence interval is above zero;
* the bins rise by Mann–Kendall's test (Kendall's τ of value against time, one-sided) with
  p-value at most ``max_trend_p``;
* the growth is steady: ``min_rising_fraction`` of ``segments`` equal slices rise at least
  max(half the minimum slope, ``min_persistence`` × the overall slope) — a warm-up that
  decelerates towards its plateau fails here, as does a single step;
* the judged series never falls back from its running peak by more than the larger of
  ``max_drawdown_fraction`` of the growth and ``drawdown_noise`` × the bins' noise (a robust
  standard deviation from successive differences; ``cycle_noise`` × on the bins);
* and the level line (the Theil–Sen slope through the bins' median) reaches the memory the
  workload can use (used + free) within ``horizon_s``.

The stop tests (growth that stopped below the GPU's memory) fit the growth from its onset, the
break of a flat-then-line hinge, so a flat stretch before a cache began to fill does not dilute
the slope it lost.

A leaking GPU held by exactly one pod is that pod's finding; so is a pod's own series where the
exporter gives one per pod on a time-sliced GPU (``per_pod``); a GPU shared by several pods
without such series, held by none that DCGM names, or labelled only with the exporter's own pod,
is reported as unattributable rather than guessed.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Annotated

import numpy as np
import numpy.typing as npt
from annotated_types import Ge, Gt, Le
from numpy.lib.stride_tricks import sliding_window_view

from defrag.detect.findings import Finding, Severity
from defrag.detect.series import (
    Binned,
    FloatArray,
    PrefixSlopes,
    Trend,
    bin_medians,
    median,
    median_pairwise_slope,
    robust_noise,
    rolling_floor,
    rolling_mean,
    sen_trend,
)
from defrag.detect.settings import INTERNAL, Action, Regex, RuleName, Seconds
from defrag.detectors.leak.hinge import best_break, line_sse
from defrag.detectors.leak.screen import cannot_leak

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class LeakParams:
    """The leak detector's settings (rule-file names and meaning: docs/rules.md)."""

    name: Annotated[str, INTERNAL] = "gpu-memory-leak"
    severity: Severity = "warning"
    action: Action = "alert"
    query: Annotated[str, INTERNAL] = ""
    """``queries.used`` of the rule (for the evidence)."""
    lookback_s: Annotated[Seconds, RuleName("lookback")] = 6 * HOUR_S
    bin_s: Annotated[Seconds, Gt(0), RuleName("step")] = 300.0
    floor_window_s: Annotated[Seconds, RuleName("floor_window")] = HOUR_S
    min_slope_mib_per_h: Annotated[float, Gt(0)] = 64.0
    """A noise guard only: what makes a leak worth a page is its time to exhaustion
    (``horizon``, ``critical_within``)."""
    short_min_slope_mib_per_h: Annotated[float, Gt(0)] = 256.0
    """The short window's minimum slope (2 h of a slower leak stand too little above noise)."""
    max_trend_p: Annotated[float, Gt(0), Le(1)] = 0.01
    horizon_s: Annotated[Seconds, RuleName("horizon")] = 48 * HOUR_S
    critical_within_s: Annotated[Seconds | None, RuleName("critical_within")] = None
    segments: Annotated[int, Ge(2), Le(12)] = 3
    min_rising_fraction: Annotated[float, Ge(0), Le(1)] = 1.0
    min_persistence: Annotated[float, Ge(0), Le(1)] = 0.5
    max_drawdown_fraction: Annotated[float, Ge(0)] = 0.1
    drawdown_noise: Annotated[float, Ge(0)] = 4.0
    cycle_noise: Annotated[float, Ge(0)] = 6.0
    min_coverage: Annotated[float, INTERNAL] = 0.5
    short_window_s: Annotated[Seconds, Ge(0), RuleName("short_window")] = 2 * HOUR_S
    """A leak is also judged over the last ``short_window`` (0: off), at ``min_slope``."""
    fast_window_s: Annotated[Seconds, Ge(0), RuleName("fast_window")] = HOUR_S
    """… and over the last ``fast_window`` (0: off), at ``fast_min_slope_mib_per_h``."""
    fast_min_slope_mib_per_h: Annotated[float, Gt(0)] = 1024.0
    short_max_trend_p: Annotated[float, Gt(0), Le(1)] = 0.001
    short_min_growth: Annotated[float, Ge(0)] = 3.0
    """The short window's growth must be at least this × the noise."""
    fast_min_growth: Annotated[float, Ge(0)] = 4.0
    """… and the fast window's (half as long: a fast leak's growth stands further clear)."""
    settle_s: Annotated[Seconds, RuleName("settle")] = HOUR_S
    """Short windows judge a job only this long after its memory was near nothing (a load)."""
    flat_for_s: Annotated[Seconds, Gt(0), RuleName("flat_for")] = 600.0
    """Growth flat for this long below the GPU's memory has stopped: not a leak."""
    recent_s: Annotated[Seconds, INTERNAL] = HOUR_S
    stop_tail_s: Annotated[Seconds, INTERNAL] = 900.0
    """Growth that stopped this recently (or less) is judged on raw samples, not bins."""
    stop_z: Annotated[float, INTERNAL] = 3.0
    stop_null_s: Annotated[Seconds, INTERNAL] = 6 * HOUR_S
    stop_blocks: Annotated[int, INTERNAL] = 4
    stop_min_samples: Annotated[int, INTERNAL] = 10
    """Fewer samples in the tail (5-min medians, not raw samples): the raw-sample test abstains."""
    slice_z: Annotated[float, INTERNAL] = 1.5
    short_persistence: Annotated[float, INTERNAL] = 0.7
    short_slice_z: Annotated[float, INTERNAL] = 1.5
    max_step_share: Annotated[float, INTERNAL] = 0.4
    spike_s: Annotated[Seconds, Ge(0), RuleName("spike")] = 600.0
    """Rises that fall back within this long (evaluation spikes) are dropped from the bins
    before judging: the lower envelope (a morphological opening) is what leaks."""
    min_lives: Annotated[int, Ge(2)] = 2
    """A workload whose pods died this many times at their GPU's memory within the lookback,
    each after growing steadily, is a leak across restarts."""


_PORT = re.compile(r":\d+$")
_EXPORTED = operator.methodcaller("startswith", "exported_")
"""Whether a label name is one Prometheus renamed (a call in C per name, not a generator's)."""


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    """``re.compile``, kept: asked once per series of a fleet's answer."""
    return re.compile(pattern)


@dataclass(frozen=True, slots=True)
class DcgmLabels:
    """DCGM exporter label names; each tuple lists the names to try, in order.

    Sources (NVIDIA/dcgm-exporter): ``internal/pkg/rendermetrics/render_metrics.go`` writes
    ``gpu``, ``UUID`` (``uuid`` with ``--use-old-namespace``), ``GPU_I_PROFILE``/``GPU_I_ID`` on
    MIG instances and the host label — ``Hostname``, renamed ``hostname`` by commit d5e5f51
    ("Rename Hostname label to hostname"), absent with ``--no-hostname``;
    ``internal/pkg/transformation/const.go`` names the pod labels ``pod``/``namespace``, or
    ``pod_name``/``pod_namespace`` with ``--use-old-namespace``. Behind the chart's ServiceMonitor
    (``honorLabels: false``) a clashing ``pod``/``namespace`` becomes ``exported_pod``/
    ``exported_namespace`` and the plain pair names the exporter's own pod; the GPU operator's
    values suggest relabelling the node name into ``instance`` (otherwise ``host:port``).
    """

    node: tuple[str, ...] = ("Hostname", "hostname", "node", "kubernetes_node", "instance")
    gpu: str = "gpu"
    uuid: tuple[str, ...] = ("UUID", "uuid")
    pod: tuple[str, ...] = ("exported_pod", "pod_name", "pod")
    namespace: tuple[str, ...] = ("exported_namespace", "pod_namespace", "namespace")
    uid: tuple[str, ...] = ("pod_uid", "exported_pod_uid")
    """The pod's UID: one incarnation of a pod (a pod re-created under its name has a new one).
    ``internal/pkg/transformation/const.go`` names it ``pod_uid``; it is on every per-pod series
    of ``--kubernetes-virtual-gpus`` (4.5.3+), elsewhere only with
    ``--kubernetes-enable-pod-uid``."""
    gpu_instance: str = "GPU_I_ID"
    gpu_profile: str = "GPU_I_PROFILE"
    exporter_pod: Regex = r"^(nvidia-)?dcgm-exporter(-.*)?$"
    """Pods whose name matches are the exporter itself (never a workload)."""

    def first(self, labels: Mapping[str, str], names: Sequence[str]) -> str:
        for name in names:  # a loop, not next() over a generator: asked per series
            value = labels.get(name)
            if value:
                return value
        return ""

    def node_of(self, labels: Mapping[str, str]) -> str:
        for name in self.node:
            value = labels.get(name, "")
            if value:
                return _PORT.sub("", value) if name == "instance" else value
        return ""

    def uuid_of(self, labels: Mapping[str, str]) -> str:
        return self.first(labels, self.uuid)

    def uid_of(self, labels: Mapping[str, str]) -> str:
        return self.first(labels, self.uid)

    def key(self, labels: Mapping[str, str]) -> tuple[str, ...] | None:
        """Which GPU (MIG instance) a series is about: its UUID when it has one, so GPUs of
        different nodes never merge; else (node, gpu). None when the labels name neither."""
        for name in self.uuid:  # uuid_of, unrolled: asked per series
            uuid = labels.get(name)
            if uuid:
                return ("uuid", uuid, labels.get(self.gpu_instance, ""))
        node, gpu = self.node_of(labels), labels.get(self.gpu, "")
        if node and gpu:
            return ("node", node, gpu, labels.get(self.gpu_instance, ""))
        return None

    def target_pods(self, series_labels: Iterable[Mapping[str, str]]) -> frozenset[str]:
        """``namespace/pod`` of the scrape targets: the plain pair on any series that also
        carries an ``exported_`` pair (Prometheus renamed the exporter's clashing labels)."""
        out = set()
        for labels in series_labels:
            if any(map(_EXPORTED, labels)) and labels.get("pod"):
                out.add(f"{labels.get('namespace', '')}/{labels['pod']}")
        return frozenset(out)

    def is_exporter(self, key: str, targets: frozenset[str] = frozenset()) -> bool:
        name = key.partition("/")[2]
        if key in targets:
            return True
        return bool(self.exporter_pod and _compiled(self.exporter_pod).match(name))

    def pod_key(
        self, labels: Mapping[str, str], targets: frozenset[str] = frozenset()
    ) -> str | None:
        """``namespace/pod`` of the workload the series is about; never the exporter's own.

        The pairs are tried in order (``exported_*``, then ``pod_name``/``pod_namespace``, then
        ``pod``/``namespace``) and the namespace comes from the same pair as the pod.
        """
        for pod_name, ns_name in zip(self.pod, self.namespace, strict=False):
            pod = labels.get(pod_name)
            if pod:
                key = f"{labels.get(ns_name, '')}/{pod}"
                if not self.is_exporter(key, targets):
                    return key
        return None


@dataclass(frozen=True, slots=True, eq=False)
class GpuMemorySeries:
    """One GPU's (or MIG instance's) used memory over time and the pods DCGM says hold it.

    ``total_mib`` is its memory (used + free + reserved); ``reserved_mib`` the part no workload
    can use, so memory runs out at ``total_mib − reserved_mib``.
    """

    node: str
    gpu: str
    times: FloatArray
    used_mib: FloatArray
    total_mib: float
    pods: tuple[str, ...] = ()
    uuid: str = ""
    instance: str = ""
    profile: str = ""
    reserved_mib: float = 0.0
    exporter_only: bool = False
    """DCGM named no workload, only the exporter's own pod (pod mapping off)."""
    stale_s: float = 0.0
    """How long the exporter has said nothing about this GPU at the evaluation time (its node's
    exporter silent): the GPU is judged on what it last said, and a finding says how old."""
    capacity_from: str = "used+free"
    """Where ``total_mib`` comes from: ``used+free`` (now), ``last used+free`` (the last values
    the exporter gave within the lookback), ``model`` (the GPU model's memory), or ``unknown``
    (``total_mib`` 0: no verdict about exhaustion can be given)."""
    raw: tuple[FloatArray, FloatArray] | None = None
    """The raw samples (times, MiB) of the recent past, when ``times``/``used_mib`` are coarser
    (through Prometheus each point is a step's median): the stop test (growth that stopped
    within ``stop_tail``) reads these; None: it reads ``times``/``used_mib``."""
    pod_uid: str = ""
    """The UID of the pod (its incarnation) when the exporter names it."""
    per_pod: bool = False
    """``used_mib`` is the pod's own memory on a GPU it shares (dcgm-exporter's per-process
    series), not the GPU's: ``total_mib`` is then the pod's memory plus the GPU's free."""

    @property
    def subject(self) -> str:
        base = f"gpu/{self.node}/{self.gpu}" if self.node and self.gpu else f"gpu/{self.uuid}"
        return f"{base}/mig-{self.instance}" if self.instance else base

    @property
    def usable_mib(self) -> float:
        return self.total_mib - self.reserved_mib

    @property
    def key(self) -> tuple[str, ...]:
        """The key :meth:`DcgmLabels.key` gives this GPU's samples (same form: UUID first)."""
        if self.uuid:
            return ("uuid", self.uuid, self.instance)
        return ("node", self.node, self.gpu, self.instance)


@dataclass(frozen=True, slots=True, eq=False)
class Occupancy:
    """The samples of one occupant of a GPU: a pod DCGM names (``pod`` ``namespace/name``) or
    none (``pod`` ''), merged over the series that carry it (shared scrape jobs, exporter
    restarts)."""

    pod: str
    times: FloatArray
    used_mib: FloatArray
    uid: str = ""
    """The pod's UID where exported, else ``@<first sample time>`` for an incarnation told
    apart by a hole in its series (see :func:`split_incarnations`), else ''."""

    @property
    def last(self) -> float:
        return float(self.times[-1]) if len(self.times) else -np.inf


def split_incarnations(life: Occupancy, others: FloatArray, hole_s: float) -> list[Occupancy]:
    """A pod's samples on one GPU cut into incarnations where the exporter gives no UID: a new
    incarnation begins after a hole of more than ``hole_s`` in the pod's series during which the
    GPU's other series (``others``: their sample times — the GPU without a pod, or another pod)
    went on. A hole the whole GPU shares is the exporter's silence, not a new pod. Each
    incarnation after the first is marked ``@<its first sample time>``."""
    t = life.times
    if life.uid or len(t) < 2 or not len(others):
        return [life]
    gaps = np.flatnonzero(np.diff(t) > hole_s)
    cuts = [0]
    for g in gaps:
        inside = (others > t[g]) & (others < t[g + 1])
        if bool(inside.any()):
            cuts.append(int(g) + 1)
    if len(cuts) == 1:
        return [life]
    cuts.append(len(t))
    out = []
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        uid = "" if k == 0 else f"@{t[a]:.0f}"
        out.append(Occupancy(life.pod, t[a:b], life.used_mib[a:b], uid))
    return out


def without_neighbours(
    times: FloatArray, values: FloatArray, changes: Sequence[float], width_s: float
) -> FloatArray:
    """The memory of a GPU's current occupants with the steps that other pods' arrivals and
    departures made removed: where the exporter copies the device's value onto each pod's series
    (no per-process data), a time-slice neighbour leaving takes its memory out of the GPU's
    total — a fall that is neither a restart nor a cache freed — and one arriving adds a step.
    At each change time, latest first, what came before is moved by the step (the median of the
    ``width_s`` after less the median of the ``width_s`` before), so the present level — the
    one that runs out — stays as measured; changes with fewer than three samples on either side
    are left alone."""
    out = values.astype(float, copy=True)
    for at in sorted(changes, reverse=True):
        before = (times > at - width_s) & (times <= at)
        after = (times > at) & (times <= at + width_s)
        if int(before.sum()) < 3 or int(after.sum()) < 3:
            continue
        out[times <= at] += median(out[after]) - median(out[before])
    return out


def per_pod_occupants(current: Sequence[Occupancy], min_common: int = 3) -> bool:
    """Whether the current occupants of a GPU are dcgm-exporter's per-process series
    (``--kubernetes-virtual-gpus``, 4.5.3+): the device-level series (no pod labels) goes on
    beside pod-labelled series, at the same scrapes (``min_common`` shared timestamps). Without
    per-process data the exporter copies the device's value onto each pod's series and drops the
    unlabelled one while pods hold the GPU (``internal/pkg/transformation/kubernetes.go``,
    ``Process``)."""
    device = [o for o in current if not o.pod]
    pods = [o for o in current if o.pod]
    if not device or not pods:
        return False
    shared = np.concatenate([d.times for d in device])
    return any(len(np.intersect1d(p.times, shared)) >= min_common for p in pods)


def split_occupancy(
    lives: Sequence[Occupancy], width_s: float
) -> tuple[tuple[Occupancy, ...], tuple[Occupancy, ...]]:
    """(current, ended): the current occupants are those whose last sample is within
    ``width_s`` of the GPU's last sample (several when DCGM names several pods on a shared
    GPU); every other occupant has ended (its pod is gone, or the GPU went to another pod or to
    none) and is never judged as the GPU's present. Ended ones come oldest first."""
    if not lives:
        return (), ()
    last = max(life.last for life in lives)
    current = tuple(life for life in lives if life.last >= last - width_s)
    ended = tuple(sorted((life for life in lives if life.last < last - width_s), key=_end))
    return current, ended


def _end(life: Occupancy) -> float:
    return life.last


_MODEL_GB = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


def memory_of_model(model: str) -> float | None:
    """The memory (MiB) a GPU model name states (``NVIDIA H100 80GB HBM3`` → 80 × 1024), or None.

    An upper bound (the driver reserves a little: an H100 80GB shows 81,559 MiB, not 81,920),
    used only when the exporter gave no free-memory reading within the lookback."""
    match = _MODEL_GB.search(model)
    return float(match.group(1)) * 1024.0 if match else None


@dataclass(frozen=True, slots=True)
class LeakAssessment:
    """Whether one GPU leaks, with the numbers and the reasons it does not."""

    series: GpuMemorySeries
    leaking: bool
    reasons: tuple[str, ...]
    slope_mib_per_h: float = 0.0
    exhaust_at: float | None = None
    evidence: dict[str, object] = field(default_factory=dict, hash=False)


def assess_leak(
    series: GpuMemorySeries, params: LeakParams, now: datetime, seen: StopsSeen | None = None
) -> LeakAssessment:
    """Judge one GPU's memory over ``[now − lookback, now]``: the whole lookback first, then
    the short windows (a fast leak is found before the lookback fills). ``seen``: the stop
    tests' answers on bins judged before (kept there for the next judging)."""
    end = now.timestamp()
    start = end - params.lookback_s
    t, y = series.times, series.used_mib
    keep = (t > start) & (t <= end) & np.isfinite(y)
    t, y = t[keep], y[keep]
    rt, ry = (t, y) if series.raw is None else series.raw
    # raw samples from before the series' first point are another incarnation's
    first = float(t[0]) - params.bin_s if len(t) else start
    keep = (rt > max(start, first)) & (rt <= end) & np.isfinite(ry)
    rt, ry = rt[keep], ry[keep]
    if series.stale_s > 0 and len(t) > 3:
        # the exporter fell silent inside the last step: its last point (through Prometheus,
        # the median of that step's first samples, stamped at the step's end) lies up to a
        # step early, which reads as growth that slowed; judged without it
        t, y = t[:-1], y[:-1]
    if len(t) < 3:
        return LeakAssessment(series, False, ("too little history (0.0 h)",))
    bins = _without_spikes(bin_medians(t, y, params.bin_s, end), params)
    noise = robust_noise(bins.values)
    restart = _last_restart(bins, noise * params.cycle_noise, series.usable_mib)
    restarted = restart is not None
    regrow_to: float | None = None
    # the noise of the bins every window reads (their ``all_bins``), computed once: unless the
    # job restarted (then the bins are drawn again from what followed)
    bins_noise = noise if restart is None else None
    since = 0.0
    if restart is not None:
        # memory fell to near nothing: the job restarted (or a new one began); what came before
        # is another job's history, so only what follows is judged
        since = bins.times[restart] + params.bin_s / 2
        # the level the job held before it restarted, unless that was the GPU's memory (an OOM
        # kill: regrowing towards it is the leak again)
        held = median(bins.values[max(restart - 3, 0) : restart]) if restart > 0 else 0.0
        if series.usable_mib <= 0 or held < 0.9 * series.usable_mib:
            regrow_to = held
        keep = t >= since
        t, y = t[keep], y[keep]
        keep = rt >= since
        rt, ry = rt[keep], ry[keep]
        if len(t) < 3:
            return LeakAssessment(series, False, ("too little history since the job restarted",))
        bins = _without_spikes(bin_medians(t, y, params.bin_s, end), params)
    span_h = (t[-1] - t[0]) / HOUR_S
    raw = (t, y) if series.raw is None else (rt, ry)
    verdict: LeakAssessment | None = None
    loaded = _loaded_at(bins, params)
    if loaded is not None and end - loaded < params.min_coverage * params.lookback_s:
        # the job loaded from nothing inside the lookback: what came before is not its growth
        why = f"too little history since the job loaded ({(end - loaded) / HOUR_S:.1f} h)"
        verdict = LeakAssessment(series, False, (why,))
    elif (t[-1] - t[0]) >= params.min_coverage * params.lookback_s:
        judged = bins if loaded is None else _after(bins, loaded)
        verdict = _judge(
            series,
            judged,
            params,
            end,
            params.lookback_s,
            short=False,
            raw=raw,
            noise=bins_noise if judged is bins else None,
            seen=seen,
        )
        if verdict.leaking:
            return verdict
    for window, min_slope, min_growth, climb in _short_windows(params):
        if window <= 0 or window >= params.lookback_s or (t[-1] - t[0]) < 0.9 * window:
            continue
        if not _settled(bins, params, end, window, since if restart is not None else None):
            continue  # the workload is still loading: a short window would call a warm-up
        short = _judge(
            series,
            bins,
            params,
            end,
            window,
            short=True,
            min_slope=min_slope,
            min_growth=min_growth,
            climb=climb,
            raw=raw,
            noise=bins_noise,
            seen=seen,
            regrow_to=regrow_to,
        )
        if short.leaking:
            return short
    if verdict is not None:
        return verdict
    where = " since the job restarted" if restarted else ""
    return LeakAssessment(series, False, (f"too little history{where} ({span_h:.1f} h)",))


def _short_windows(params: LeakParams) -> tuple[tuple[float, float, float, bool], ...]:
    """(window, minimum slope, minimum growth in noises, must climb past the level before): the
    short window at the rule's minimum slope, the fast window at its own (a fast leak is visible
    in less time; in one hour, noise that lingers can look like one unless it must climb)."""
    return (
        (params.short_window_s, params.short_min_slope_mib_per_h, params.short_min_growth, False),
        (params.fast_window_s, params.fast_min_slope_mib_per_h, params.fast_min_growth, True),
    )


def _loaded_at(bins: Binned, params: LeakParams) -> float | None:
    """``settle`` after the last bin below a tenth of the latest level (the job loaded from
    nothing there: a warm-up follows), or None when memory never was that low."""
    level = median(bins.values[-3:])
    low = np.flatnonzero(bins.values <= 0.1 * level)
    if len(low) == 0 or level <= 0:
        return None
    return float(bins.times[low[-1]] + bins.width / 2 + params.settle_s)


def _after(bins: Binned, since: float) -> Binned:
    keep = bins.times >= since
    return Binned(bins.times[keep], bins.values[keep], bins.width)


def _settled(
    bins: Binned, params: LeakParams, end: float, window: float, restarted: float | None
) -> bool:
    """Whether the workload had finished loading before ``window``: it did not restart, and no
    bin lies below a tenth of the latest level, in the window or in the ``settle`` before it (a
    job that starts from nothing loads its model first: 0.5–2 h of fast, decelerating
    growth)."""
    horizon = end - window - params.settle_s
    if restarted is not None and restarted > horizon:
        return False
    level = median(bins.values[-3:])
    return bool(np.all(bins.values[bins.times > horizon] > 0.1 * level))


def _judge(
    series: GpuMemorySeries,
    all_bins: Binned,
    params: LeakParams,
    end: float,
    window: float,
    *,
    short: bool,
    min_slope: float | None = None,
    min_growth: float | None = None,
    climb: bool = False,
    regrow_to: float | None = None,
    raw: tuple[FloatArray, FloatArray] | None = None,
    noise: float | None = None,
    seen: StopsSeen | None = None,
) -> LeakAssessment:
    """The tests of one window (docs/rules.md, "leak"). ``short``: a window shorter than the
    lookback, with its own false-positive guard (no cache drop in it or in the floor window
    before it; growth of at least ``short_min_growth`` × the noise; a stricter trend p-value;
    two halves that both rise). ``noise``: ``robust_noise(all_bins.values)`` when the caller
    has it already."""
    min_slope = params.min_slope_mib_per_h if min_slope is None else min_slope
    inside = all_bins.times > end - window
    bins = Binned(all_bins.times[inside], all_bins.values[inside], all_bins.width)
    if short and len(bins.times) >= 2:  # most GPUs do not grow: say so before anything else
        quick = median_pairwise_slope((bins.times - bins.times[0]) / HOUR_S, bins.values)
        if quick < min_slope:
            return LeakAssessment(series, False, (f"slope {quick:.0f} MiB/h below {min_slope:g}",))
    noise = robust_noise(all_bins.values) if noise is None else noise
    segments = 2 if short else params.segments
    if len(bins.times) < 3 * segments:
        return LeakAssessment(series, False, (f"too few bins ({len(bins.times)})",))
    if short:
        near = all_bins.values[all_bins.times > end - window - params.floor_window_s]
        cycles = False
        # a freed cache stays down for a while; one stray bin (a 5 min median hit by a burst of
        # noise) does not: the fall is judged on the running median of three bins
        if _drawdown(_median3(near)) > params.cycle_noise * noise:
            why = "a cache freed within the short window (judged on the lookback only)"
            return LeakAssessment(series, False, (why,))
        judged = bins
    else:
        floor = rolling_floor(bins, params.floor_window_s)
        if len(floor.times) < 3 * params.segments:
            return LeakAssessment(series, False, (f"too few bins ({len(bins.times)})",))
        # Falls beyond the noise (a cache freed, a restart) call for the floor; without them
        # the bins themselves are the least noisy series to judge.
        cycles = _drawdown(bins.values) > params.cycle_noise * noise
        judged = rolling_mean(floor, params.floor_window_s) if cycles else bins
    t0 = bins.times[0]
    fh = (judged.times - t0) / HOUR_S
    slope = median_pairwise_slope(fh, judged.values)
    evidence: dict[str, object] = {
        "query": params.query,
        "node": series.node,
        "gpu": series.gpu,
        "uuid": series.uuid,
        "used_mib": round(float(all_bins.values[-1]), 1),
        "total_mib": round(series.total_mib, 1),
        "slope_mib_per_h": round(slope, 1),
        "noise_mib": round(float(noise), 1),
        "judged_on": "floor" if cycles else "bins",
        "lookback_s": params.lookback_s,
        "window_s": window,
        "bins": len(bins.times),
    }
    if series.instance:
        evidence |= {"gpu_instance": series.instance, "mig_profile": series.profile}
    if series.reserved_mib:
        evidence["reserved_mib"] = round(series.reserved_mib, 1)
    reasons: list[str] = []
    if slope < min_slope:
        reasons.append(f"slope {slope:.0f} MiB/h below {min_slope:g}")
        return LeakAssessment(series, False, tuple(reasons), slope, None, evidence)
    fit = sen_trend(fh, judged.values)
    residual = judged.values - fit.slope * fh
    if fit.variance_ratio > 1.0 and float(np.ptp(residual)) <= 1e-6 * max(abs(fit.slope), 1.0):
        # an exact line has no noise to correlate: the ranks of its rounding errors mean nothing
        fit = sen_trend(fh, judged.values, variance_ratio=1.0)
    slope, low, high = fit.slope, fit.low, fit.high
    spread = max(float(noise), _mad(residual))
    if short:
        # the level's own wander before the window (noise that lingers moves the level by more
        # than bin-to-bin noise shows): a short window's growth must stand clear of it too
        spread = max(spread, _wander(all_bins, end - window, params))
    evidence |= {
        "slope_mib_per_h": round(slope, 1),
        "slope_ci_mib_per_h": [round(low, 1), round(high, 1)],
        "variance_ratio": round(fit.variance_ratio, 2),
    }
    floor_slope = min_slope / 2 if short else 0.0
    if low <= floor_slope:
        reasons.append(f"slope's 95% interval reaches {low:.0f} MiB/h (not above {floor_slope:g})")
    trend = fit if judged is bins else sen_trend((bins.times - t0) / HOUR_S, bins.values)
    max_p = params.short_max_trend_p if short else params.max_trend_p
    evidence |= {"trend_p": float(f"{trend.p_rising:.3g}"), "kendall_tau": round(trend.tau, 3)}
    if trend.p_rising > max_p:
        reasons.append(f"trend p-value {trend.p_rising:.2g} above {max_p:g}")
    # a short window's halves must both rise by their own slopes, by more than the lookback's
    # slices (a warm-up still rising decelerates); the lookback's slices rise unless shown not to
    persistence = params.short_persistence if short else params.min_persistence
    need = max(min_slope / 2, persistence * slope)
    slices = _slice_highs(
        fh,
        judged.values,
        segments,
        params.short_slice_z if short else params.slice_z,
        fit.variance_ratio,
        need,
        strict_last=not short,  # a short window's deceleration has its own test (below)
    )
    rising = float(np.mean(slices >= need))
    evidence |= {
        "slice_slopes_mib_per_h": [round(float(s), 1) for s in slices],
        "rising_fraction": round(rising, 3),
    }
    if short:
        first, second = _halves(fh, judged.values, params.short_slice_z, fit.variance_ratio)
        evidence["second_half_high_mib_per_h"] = round(second, 1)
        if second < params.short_persistence * first:
            reasons.append(
                f"the window's second half rises {second:.0f} MiB/h at most, less than "
                f"{params.short_persistence:g} × its first half's {first:.0f} (decelerating: "
                "a warm-up)"
            )
    if rising < params.min_rising_fraction:
        reasons.append(
            f"rises in {rising:.0%} of slices at {need:.0f} MiB/h or more, not steadily "
            "(a warm-up, a step or a restart)"
        )
    growth = max(slope * (fh[-1] - fh[0]), 0.0)
    # the first ``settle`` of the lookback may be a job's load (it may have begun there), not a
    # step; a step there leaves the later slices flat, which the slices reject. A short window
    # is judged only when no load came within ``settle`` before it: every rise in it counts
    exempt = 0.0 if short else params.settle_s
    rises = np.diff(bins.values)[bins.times[1:] > bins.times[0] + exempt]
    jump = float(rises.max()) if len(rises) else 0.0
    evidence["largest_rise_mib"] = round(jump, 1)
    if jump > params.cycle_noise * noise and jump > params.max_step_share * growth:
        reasons.append(
            f"one rise of {jump:.0f} MiB between two bins is {jump / max(growth, 1.0):.0%} of "
            "the growth: a step (a larger batch, a second model), not a leak"
        )
    min_growth = params.short_min_growth if min_growth is None else min_growth
    if short and growth < min_growth * spread:
        reasons.append(
            f"grows {growth:.0f} MiB in the {window / HOUR_S:g} h window, less than "
            f"{min_growth:g} × the noise ({spread:.0f} MiB)"
        )
    if climb and regrow_to is not None and median(all_bins.values[-3:]) <= regrow_to:
        # after a restart a job reloads towards where it was; the fast window's hour of growth
        # is a leak only once it climbs past that (the 2 h window's steadiness tests judge a
        # reload's deceleration themselves)
        reasons.append(
            f"regrowing to the {regrow_to:.0f} MiB it held before it restarted (a reload)"
        )
    if climb:
        # a new leak climbs past anything the job held before the window; noise that lingers
        # wanders back up to levels it has held before
        over = _over_before(all_bins, end - window, params)
        if not np.isfinite(over):
            reasons.append("no settled history before the window to climb past (a warm-up?)")
        elif over <= 0:
            reasons.append(
                f"ends {-over:.0f} MiB below the highest level it held before the window "
                "(a wandering level, not a climb)"
            )
        else:
            evidence["over_before_mib"] = round(over, 1)
    # on the bins, no fall exceeds ``cycle_noise`` × noise (else the floor is judged); the
    # floor may fall back by noise or a small share of the growth, not by a restart
    drawdown = _drawdown(_median3(judged.values) if short else judged.values)
    allowed = max(
        params.max_drawdown_fraction * growth,
        (params.drawdown_noise if cycles else params.cycle_noise) * (noise if cycles else spread),
    )
    evidence |= {
        "drawdown_mib": round(drawdown, 1),
        "drawdown_allowed_mib": round(float(allowed), 1),
    }
    if drawdown > allowed:
        reasons.append(f"falls back {drawdown:.0f} MiB (more than {allowed:.0f} allowed)")
    # the level line: the floor's slope through the bins' median level
    bh = (bins.times - t0) / HOUR_S
    level0 = median(bins.values - slope * bh)
    stalled: float | None = None
    if not reasons:
        # only a would-be leak needs the saturation tests (they refit the growth per tail
        # length). A short window's own line bends towards a tail that stopped, and a leak that
        # began inside it looks like one that stopped: the growth that would go on is the line
        # through all the history since the job settled
        settled = bins
        if short:
            loaded = _loaded_at(all_bins, params)
            settled = _after(all_bins, loaded) if loaded is not None else all_bins
        onset, stalled = _stops_on_bins(
            settled, slope, float(noise), fit.variance_ratio, params, seen
        )
        if onset is not None:
            settled = _after(settled, onset)
            evidence["onset"] = _iso(onset)
        if stalled is None and raw is not None:
            stalled = _stopped_on_samples(settled, *raw, params, flat_before=onset is not None)
    if stalled is not None:
        evidence["flat_since"] = _iso(stalled)
        reasons.append(
            f"growth has stopped: flat for {(end - stalled) / 60:.0f} min below the GPU's "
            "memory (a cache at its limit)"
        )
    now_h = (end - t0) / HOUR_S
    exhaust_at: float | None = None
    evidence["capacity_from"] = series.capacity_from
    if series.stale_s > 0:
        evidence["stale_s"] = round(series.stale_s)
    if series.usable_mib > 0 and slope > 0:
        exhaust_at = t0 + ((series.usable_mib - level0) / slope) * HOUR_S
        recent = _recent(all_bins, end, params, fit.variance_ratio)
        exhaust_at = _no_sooner_than_recent(
            all_bins, recent, series.usable_mib, end, exhaust_at, params.recent_s
        )
        evidence["recent_slope_mib_per_h"] = round(recent.slope, 1)
        # its upper end is the rate the ETA may fall back on: shown, so an ETA later than the
        # level line's can be traced to it (None: an end the last hour's bins cannot bound)
        evidence["recent_slope_ci_mib_per_h"] = [
            round(bound, 1) if np.isfinite(bound) else None for bound in (recent.low, recent.high)
        ]
    if series.usable_mib <= 0:
        # never "no leak" for want of a capacity: a steady grower is reported, its exhaustion
        # time unknown (the summary says why)
        evidence["capacity_from"] = "unknown"
    elif exhaust_at is None or not np.isfinite(exhaust_at):
        exhaust_at = None
        reasons.append("never reaches the GPU's memory (the last hour does not grow)")
    else:
        evidence["exhaust_at"] = _iso(exhaust_at)
        evidence["hours_to_exhaust"] = round(float(max(exhaust_at - end, 0.0)) / HOUR_S, 2)
        evidence["level_mib"] = round(float(level0 + slope * now_h), 1)
        if exhaust_at - end > params.horizon_s:
            reasons.append(
                f"exhaustion in {(exhaust_at - end) / HOUR_S:.1f} h, beyond the "
                f"{params.horizon_s / HOUR_S:g} h horizon"
            )
    return LeakAssessment(series, not reasons, tuple(reasons), slope, exhaust_at, evidence)


StopsSeen = dict[tuple[LeakParams, bytes], tuple[float | None, float | None]]
"""The stop tests' answers on the bins (:func:`_stops_on_bins`) by their inputs, to the bit:
the leaks are judged again with their raw samples, on the same bins."""


def _stops_on_bins(
    settled: Binned,
    slope: float,
    noise: float,
    ratio: float,
    params: LeakParams,
    seen: StopsSeen | None = None,
) -> tuple[float | None, float | None]:
    """(onset, stalled): when growth began after the bins' start, and when it stopped on the
    bins (:func:`_onset`, :func:`_stalled_since` from the onset), or what ``seen`` holds for
    the same bins, figures and settings."""
    key = (
        params,
        b"".join(
            (
                settled.times.tobytes(),
                settled.values.tobytes(),
                np.array([settled.width, slope, noise, ratio, len(settled.times)]).tobytes(),
            )
        ),
    )
    if seen is not None and key in seen:
        return seen[key]
    # the stop tests fit the growth from its onset: a flat stretch before a cache began to
    # fill would dilute the slope it lost (the line through few bins has its own error)
    onset = _onset(settled, need=2 * max(int(np.ceil(params.flat_for_s / settled.width)), 2))
    since = _after(settled, onset) if onset is not None else settled
    stalled = _stalled_since(since, slope, noise, ratio, params, line_error=onset is not None)
    if seen is not None:
        seen[key] = (onset, stalled)
    return onset, stalled


def _stopped_on_samples(
    bins: Binned, t: FloatArray, y: FloatArray, params: LeakParams, flat_before: bool = False
) -> float | None:
    """When growth stopped, judged on the raw samples of a short tail (``flat_for`` to
    ``stop_tail`` long, in bin steps), where bins are too few to tell: the line through the bins
    before the tail (Sen's slope, their median level) and the growth the tail misses,
    b = Σ u·gap / Σ u² (u: time since the tail began; gap: the line minus the samples) — the
    least-squares estimate of the slope lost at the tail's start. Growth stopped when b is at
    least half the slope before (the tail grows at half its rate or less) and more than
    ``stop_z`` × b's own spread where nothing stopped: the same statistic on every tail-long
    block of the samples before, about the same line (noise that lingers moves whole blocks,
    and so widens that spread). None when growth goes on."""
    need = max(int(np.ceil(params.flat_for_s / bins.width)), 2)
    most = int(np.ceil(params.stop_tail_s / bins.width))
    n = len(bins.times)
    # the blocks before may reach past the window, up to ``stop_null`` before the tail
    keep = (t <= bins.times[-1] + bins.width / 2) & (
        t > bins.times[-1] - params.stop_tail_s - params.stop_null_s
    )
    t, y = t[keep], y[keep]
    hours = (bins.times - bins.times[0]) / HOUR_S
    t_h = (t - bins.times[0]) / HOUR_S
    # growth began at the bins' start (``flat_before``): before it the line is flat
    line_h = np.maximum(t_h, -bins.width / 2 / HOUR_S) if flat_before else t_h
    last_h = float(t_h[-1]) if len(t_h) else -np.inf
    found: float | None = None
    heads = PrefixSlopes(hours, bins.values)
    for size in range(need, min(most, n // 4) + 1):
        before = heads.median(n - size)
        if before <= 0:
            continue
        base = median(bins.values[:-size] - before * hours[:-size])
        start_h = hours[-size] - bins.width / 2 / HOUR_S
        if last_h - start_h < (params.flat_for_s - bins.width / 2) / HOUR_S:
            continue  # the samples stop well short of ``flat_for`` (the exporter silent since)
        gap = base + before * line_h - y
        tail = t_h > start_h
        if int(tail.sum()) < params.stop_min_samples:
            continue  # already medians (Prometheus's 5-min points): the bins' test has judged
        lost = _lost_slope(t_h[tail] - start_h, gap[tail])
        if lost < before / 2:
            continue
        length = size * bins.width / HOUR_S
        # the blocks where nothing stopped are read as the tail is: up to as far into the
        # block as the tail's samples reach, when a silent exporter cut the tail short by more
        # than a tenth (its statistic is noisier, and so must its null be)
        reach = last_h - start_h if last_h - start_h < 0.9 * length else np.inf
        head = t_h <= start_h
        block = np.floor((start_h - t_h[head]) / length)  # 0: the block just before the tail
        null = []
        for k in range(int(block.max()) if block.size else 0):  # whole blocks only
            u = t_h[head][block == k] - (start_h - (k + 1) * length)
            inside = u <= reach
            null.append(_lost_slope(u[inside], gap[head][block == k][inside]))
        if len(null) < params.stop_blocks:
            continue
        spread = float(np.sqrt(np.mean(np.square(null))))
        # shown to have lost growth, and flat rather than falling: the slope lost is the slope
        # before, within the same noise (a tail that plunges is noise or a drop, not a limit)
        if params.stop_z * spread < lost <= before + params.stop_z * spread:
            found = float(bins.times[0] + start_h * HOUR_S)
    return found


def _without_spikes(bins: Binned, params: LeakParams) -> Binned:
    """The bins without evaluation spikes: bins more than ``cycle_noise`` × the noise above the
    lower envelope — the morphological opening (a running minimum, then a running maximum)
    over ``spike_s`` plus a bin — are dropped. A rise that falls back within ``spike_s`` leaves
    the envelope; a leak, a step that stays, a warm-up do not (the opening of a series that
    never falls back within the window is the series). Judged only where the bins fall back
    by more than ``cycle_noise`` × noise at all (else nothing is a spike)."""
    width = int(np.ceil(params.spike_s / bins.width)) + 1
    v = bins.values
    if params.spike_s <= 0 or len(v) < 2 * width:
        return bins
    noise = robust_noise(v)
    if _drawdown(v) <= params.cycle_noise * noise:
        return bins
    opened = _opening(v, width)
    spike = v - opened > params.cycle_noise * noise
    # a rise in the last ``spike_s`` has had no time to fall back: a jump there larger than
    # any rise between two bins before it is held back until it shows whether it stays
    tail = len(v) - width + 1
    kept = np.flatnonzero(~spike[:tail])
    usual = float(np.diff(v[kept]).max()) if len(kept) > 1 else np.inf
    for i in range(max(tail, 1), len(v)):
        if v[i] - v[i - 1] > max(params.cycle_noise * noise, 2 * usual):
            spike[i:] = True
            break
    if not bool(spike.any()):
        return bins
    return Binned(bins.times[~spike], v[~spike], bins.width)


def _opening(v: FloatArray, width: int) -> FloatArray:
    """Grey opening with a flat window of ``width`` (edges padded with the nearest value)."""
    pad = np.concatenate((np.full(width - 1, v[0]), v, np.full(width - 1, v[-1])))
    low = sliding_window_view(pad, width).min(axis=1)  # low[i]: min of pad[i : i + width]
    high = sliding_window_view(low, width).max(axis=1)
    return high[: len(v)]


ONSET_SSE_SHARE = 0.8
"""A break is an onset when the hinge leaves at most this share of one line's squared
residuals …"""
ONSET_FLAT_SHARE = 0.25
"""… and the stretch before it rises at most this share of the growth after it."""


def _onset(bins: Binned, need: int) -> float | None:
    """When the growth began, if it began after the bins' start: the break of the best
    least-squares hinge (flat, then a line) whose rising part has at least ``need`` bins and
    whose flat part has at least three; None when no break fits better than one line or the
    hinge does not rise."""
    n = len(bins.times)
    if n < need + 3:
        return None
    h = (bins.times - bins.times[0]) / HOUR_S
    v = bins.values
    best_k, best_sse = best_break(h, v, 3, n - need + 1)
    # a break that explains little of what one line leaves (AR(1) noise bends a steady leak
    # this way and that) is no onset; nor one whose flat part itself rises
    if best_k == 0 or best_sse > ONSET_SSE_SHARE * line_sse(h, v):
        return None
    x = np.maximum(h - h[best_k], 0.0)
    rise = float(np.polyfit(x, v, 1)[0])
    if rise <= 0 or median_pairwise_slope(h[:best_k], v[:best_k]) > ONSET_FLAT_SHARE * rise:
        return None
    return float(bins.times[best_k] - bins.width / 2)


def _lost_slope(u: FloatArray, gap: FloatArray) -> float:
    """Σ u·gap / Σ u²: the slope of a line through the origin fitted to ``gap`` against ``u``."""
    weight = float(u @ u)
    return float(u @ gap) / weight if weight > 0 else 0.0


def _stalled_since(
    bins: Binned,
    slope: float,
    noise: float,
    ratio: float,
    params: LeakParams,
    line_error: bool = False,
) -> float | None:
    """When growth stopped, if it did at least ``flat_for`` ago: the longest tail of bins (at
    least ``flat_for``, at most half the window) whose own slope is less than
    ``min_persistence`` × the slope of the bins before it, and which — as a whole and in its
    last ``flat_for`` — lies below the line fitted to those bins by more than 3 standard
    errors (their residuals' spread, inflated by the variance ratio). None when growth goes
    on. The tails are tried longest first (the first that passes is the answer); the slopes
    of the bins before each come from one table of the series' pairwise slopes."""
    need = max(int(np.ceil(params.flat_for_s / bins.width)), 2)
    n = len(bins.times)
    if n < 2 * need or slope <= 0:
        return None
    hours = (bins.times - bins.times[0]) / HOUR_S
    heads = PrefixSlopes(hours, bins.values)
    # each gap is compared with the larger of two bounds: one that is cheap (half the gap of
    # growth that stopped) and one that is not (the noise's, from the spread and the line's
    # error). A gap within the cheap one fails whatever the other is, so long as that one is a
    # number (a NaN bound would let it through): it is for ordinary figures — a positive
    # finite variance ratio, a noise, times apart and not astronomical
    steps = np.diff(hours)
    ordinary = (
        0.0 < ratio < 1e50
        and not math.isnan(noise)
        and bool((steps > 1e-50).all())
        and float(hours[-1]) < 1e50
    )
    for size in range(n // 2, need - 1, -1):
        head_h, head_v = hours[:-size], bins.values[:-size]
        before = heads.median(n - size)
        if before <= 0:
            continue
        residual = head_v - before * head_h
        base = median(residual)
        gap = base + before * hours[-size:] - bins.values[-size:]
        # had growth stopped at the tail's start, the gap would grow like this; half of it at
        # least must be missing, beside the noise test (a noiseless leak has no spread)
        stopped = before * (hours[-size:] - hours[-size] + bins.width / 2 / HOUR_S)
        mean_gap, half_stopped = _mean(gap), _mean(stopped) / 2
        if ordinary and mean_gap <= half_stopped:
            continue
        spread = max(noise, 1.4826 * median(np.abs(residual - base)))
        # ``line_error``: the line before the tail is fitted on few bins (growth since its
        # onset), so its own error, carried to the tail, widens what a gap must exceed
        whole = _line_se(head_h, hours[-size:], spread, ratio) if line_error else 0.0
        if mean_gap <= max(
            3.5 * math.sqrt(spread * spread * ratio / size + whole * whole), half_stopped
        ):
            continue
        last, half_last = _mean(gap[-need:]), _mean(stopped[-need:]) / 2
        if ordinary and last <= half_last:
            continue
        end_se = _line_se(head_h, hours[-need:], spread, ratio) if line_error else 0.0
        if last <= max(
            3.5 * math.sqrt(spread * spread * ratio / need + end_se * end_se), half_last
        ):
            continue
        # a tail of a few bins has too noisy a slope of its own: its two gaps decide
        own = median_pairwise_slope(hours[-size:], bins.values[-size:]) if size >= 6 else 0.0
        if own < params.min_persistence * before:
            return float(bins.times[-size] - bins.width / 2)
    return None


def _line_se(head_h: FloatArray, at_h: FloatArray, spread: float, ratio: float) -> float:
    """The standard error of a least-squares line through ``head_h`` at the mean of ``at_h``,
    for residuals of ``spread`` (variance inflated by ``ratio``)."""
    m = len(head_h)
    centre = float(head_h.mean())
    sxx = float(np.sum((head_h - centre) ** 2))
    if m < 2 or sxx <= 0:
        return np.inf
    far = float(at_h.mean()) - centre
    return spread * math.sqrt(ratio * (1.0 / m + far * far / sxx))


def _mean(values: FloatArray) -> float:
    """``float(np.mean(values))`` of a non-empty 1-D float64 array, to the bit, without its
    per-call overhead: the same sum (``np.add.reduce``), divided by the count."""
    return float(np.add.reduce(values)) / len(values)


def _median3(values: FloatArray) -> FloatArray:
    """The running median of three (the ends kept): a lone outlying value is dropped."""
    if len(values) < 3:
        return values
    middle = np.median(np.stack([values[:-2], values[1:-1], values[2:]]), axis=0)
    return np.concatenate((values[:1], middle, values[-1:]))


def _mad(values: FloatArray) -> float:
    """The median absolute deviation, scaled to a normal standard deviation."""
    return 1.4826 * median(np.abs(values - median(values))) if len(values) else 0.0


def _wander(all_bins: Binned, start: float, params: LeakParams) -> float:
    """How far the level wanders about its own line in the bins before ``start`` (after the
    job's load has settled): 0 when fewer than 6 bins."""
    loaded = _loaded_at(all_bins, params)
    keep = (all_bins.times <= start) & (all_bins.times >= (loaded or -np.inf))
    if int(keep.sum()) < 6:
        return 0.0
    t_h = (all_bins.times[keep] - start) / HOUR_S
    values = all_bins.values[keep]
    return _mad(values - median_pairwise_slope(t_h, values) * t_h)


def _over_before(all_bins: Binned, start: float, params: LeakParams) -> float:
    """How far the level now (the median of the last three bins) lies above the highest level
    held before ``start`` since the job settled (on the running median of three bins: one
    stray bin is no level); −inf when fewer than three bins came before (a job that settled
    less than 15 min before the window, still warming up maybe, has nothing to climb past)."""
    loaded = _loaded_at(all_bins, params)
    keep = (all_bins.times <= start) & (all_bins.times >= (loaded or -np.inf))
    if int(keep.sum()) < 3:
        return -np.inf
    now = median(all_bins.values[-3:])
    return now - float(_median3(all_bins.values[keep]).max())


def _halves(t_h: FloatArray, values: FloatArray, z: float, ratio: float) -> tuple[float, float]:
    """A short window's first half's Sen slope and the upper end of its second half's interval
    at normal quantile ``z``: the window decelerates when even that end lies well below the
    first half's slope (a warm-up levelling off), not when noise makes one half look slower."""
    mid = (t_h[0] + t_h[-1]) / 2
    a, b = t_h <= mid, t_h > mid
    if int(a.sum()) < 3 or int(b.sum()) < 3:
        return 0.0, np.inf
    first = median_pairwise_slope(t_h[a], values[a])
    return first, sen_trend(t_h[b], values[b], z, ratio).high


def _recent(all_bins: Binned, end: float, params: LeakParams, ratio: float) -> Trend:
    """Sen's slope of the last ``recent`` (1 h) of bins, its interval widened by the window's
    variance ratio (12 points cannot estimate their own autocorrelation)."""
    inside = all_bins.times > end - params.recent_s
    t = all_bins.times[inside]
    return sen_trend(
        (t - t[0]) / HOUR_S if len(t) else t, all_bins.values[inside], variance_ratio=ratio
    )


def _no_sooner_than_recent(
    all_bins: Binned, recent: Trend, usable: float, end: float, exhaust_at: float, window: float
) -> float:
    """The exhaustion time, never sooner than the last ``recent`` (1 h) supports: memory now
    (the recent line's level at ``end``) growing at the upper end of the recent slope's 95%
    interval; infinite when the recent hour does not grow at all."""
    if not np.isfinite(recent.high):
        return exhaust_at
    if recent.high <= 0:
        return np.inf
    inside = all_bins.times > end - window
    t_h = (all_bins.times[inside] - end) / HOUR_S  # hours before end (≤ 0)
    level = median(all_bins.values[inside] - recent.slope * t_h)
    return max(exhaust_at, end + max(usable - level, 0.0) / recent.high * HOUR_S)


def _last_restart(bins: Binned, min_fall: float, usable: float = 0.0) -> int | None:
    """The bin where memory last fell to a tenth of its running peak or less, by more than
    ``min_fall`` (a restart or a new job), or — an OOM kill — from 90% of the usable memory or
    more to half its peak or less: the first bin of the last such low run; None when it never
    did."""
    starts = _restarts(bins.values, min_fall, usable)
    return int(starts[-1]) if len(starts) else None


def _restarts(v: FloatArray, min_fall: float, usable: float = 0.0) -> npt.NDArray[np.intp]:
    if len(v) < 2:
        return np.empty(0, dtype=np.intp)
    high = v.max()
    if high <= 0 or v.min() > 0.5 * high:
        # most series: no running peak above zero (none can fall from one), or every value
        # above half the highest, so above a tenth and half of every running peak (NaN: below)
        return np.empty(0, dtype=np.intp)
    peak = np.maximum.accumulate(v)
    oom = (peak >= 0.9 * usable) & (v <= 0.5 * peak) if usable > 0 else np.zeros(len(v), bool)
    fell = ((v <= 0.1 * peak) | oom) & (peak - v > max(min_fall, 0.0)) & (peak > 0)
    return np.flatnonzero(fell & ~np.concatenate(([False], fell[:-1])))


def _drawdown(values: FloatArray) -> float:
    """The largest fall from a running peak to a later value."""
    return float((np.maximum.accumulate(values) - values).max()) if len(values) else 0.0


def _slice_highs(
    t_h: FloatArray,
    values: FloatArray,
    segments: int,
    z: float,
    ratio: float,
    need: float,
    strict_last: bool = True,
) -> FloatArray:
    """Of each of ``segments`` equal time slices, what is compared with ``need``: the upper end
    of its Sen slope's interval at normal quantile ``z`` (its slope alone when ``z`` is 0; −inf
    where < 3 points) — a slice fails to rise when its slope is *shown* to be low, not when
    noise that lingers (serially correlated) hides it. The last slice, where a warm-up levels
    off, gets its interval only when its slope itself is at least half of ``need`` (when
    ``strict_last``)."""
    edges = np.linspace(t_h[0], t_h[-1], segments + 1)
    which = np.clip(np.searchsorted(edges, t_h, side="right") - 1, 0, segments - 1)
    out = np.full(segments, -np.inf)
    for i in range(segments):
        mask = which == i
        if int(mask.sum()) >= 3:
            out[i] = median_pairwise_slope(t_h[mask], values[mask])
            last = i == segments - 1 and strict_last
            if z > 0 and out[i] < need and (not last or out[i] >= need / 2):
                out[i] = max(out[i], sen_trend(t_h[mask], values[mask], z, ratio).high)
    return out


# --- leaks across restarts: a workload whose pods each grow to the GPU's memory and die ------


@dataclass(frozen=True, slots=True, eq=False)
class Life:
    """One life of a workload on a GPU: a pod's occupancy, cut at each restart (memory falling
    to a tenth of its peak, or an OOM kill), with the memory the GPU had."""

    owner: str
    """``<namespace>/<kind>/<name>`` (``kube_pod_owner``), ``<namespace>/Pod/<name>`` without."""
    pod: str
    gpu_subject: str
    node: str
    times: FloatArray
    used_mib: FloatArray
    usable_mib: float
    ended: bool
    """Over: a later run, a later pod or no pod holds the GPU (or the exporter forgot it)."""


def split_lives(
    owner: str,
    pod: str,
    gpu_subject: str,
    node: str,
    times: FloatArray,
    values: FloatArray,
    usable_mib: float,
    current: bool,
) -> list[Life]:
    """A pod's samples on one GPU cut into its container's runs: a new run begins where memory
    falls to a tenth of its running peak, or from 90% of ``usable_mib`` to half of it. Every run
    but the last has ended; the last has when the pod is not the GPU's ``current`` occupant."""
    cuts = [0, *(int(i) for i in _restarts(values, 0.0, usable_mib)), len(values)]
    runs = list(itertools.pairwise(cuts))
    out = []
    for k, (a, b) in enumerate(runs):
        ended = k < len(runs) - 1 or not current
        if b - a >= 3:
            out.append(
                Life(owner, pod, gpu_subject, node, times[a:b], values[a:b], usable_mib, ended)
            )
    return out


@dataclass(frozen=True, slots=True)
class LifeVerdict:
    life: Life
    grew: bool
    slope_mib_per_h: float
    peak_mib: float


def _life_grew(life: Life, params: LeakParams) -> LifeVerdict:
    """A life that grew steadily (Sen's slope ≥ the minimum, a rising trend at ``max_trend_p``)
    and, when it ended, ended at 90% of its GPU's usable memory or more."""
    t_h = (life.times - life.times[0]) / HOUR_S
    bins = bin_medians(life.times, life.used_mib, params.bin_s, float(life.times[-1]))
    peak = float(bins.values.max()) if len(bins.values) else 0.0
    if len(bins.times) < 6:
        return LifeVerdict(life, False, 0.0, peak)
    fit = sen_trend((bins.times - bins.times[0]) / HOUR_S, bins.values)
    full = life.usable_mib > 0 and peak >= 0.9 * life.usable_mib
    grew = (
        fit.slope >= params.min_slope_mib_per_h
        and fit.p_rising <= params.max_trend_p
        and (full or not life.ended)
        and t_h[-1] > 0
    )
    return LifeVerdict(life, grew, fit.slope, peak)


def detect_workload_leaks(
    lives: Sequence[Life], params: LeakParams, now: datetime
) -> list[Finding]:
    """Findings for every workload of which at least ``min_lives`` lives that ended each grew
    steadily to their GPU's memory within the lookback — the crash loop a leak causes, a new
    pod (or container run) each life."""
    end = now.timestamp()
    by_owner: dict[str, list[Life]] = {}
    for life in lives:
        if len(life.times) and life.times[-1] > end - params.lookback_s:
            by_owner.setdefault(life.owner, []).append(life)
    out = []
    for owner, group in sorted(by_owner.items()):
        group.sort(key=lambda life: float(life.times[0]))
        verdicts = [_life_grew(life, params) for life in group]
        died = [v for v in verdicts if v.grew and v.life.ended]
        if len(died) < params.min_lives:
            continue
        out.append(_workload_finding(owner, verdicts, died, params, now))
    return out


def _workload_finding(
    owner: str,
    verdicts: list[LifeVerdict],
    died: list[LifeVerdict],
    params: LeakParams,
    now: datetime,
) -> Finding:
    namespace, kind, name = ([*owner.split("/", 2), "", ""])[:3]
    slopes = [round(v.slope_mib_per_h, 1) for v in died]
    lives = [
        {
            "pod": v.life.pod,
            "gpu": v.life.gpu_subject,
            "start": _iso(float(v.life.times[0])),
            "end": _iso(float(v.life.times[-1])),
            "slope_mib_per_h": round(v.slope_mib_per_h, 1),
            "peak_mib": round(v.peak_mib, 1),
            "usable_mib": round(v.life.usable_mib, 1),
            "grew_to_memory": v in died,
        }
        for v in verdicts
    ]
    hours = [float(v.life.times[-1] - v.life.times[0]) / HOUR_S for v in died]
    evidence: dict[str, object] = {
        "query": params.query,
        "owner_kind": kind,
        "owner_name": name,
        "restarts": len(died),
        "lives": lives,
        "slopes_mib_per_h": slopes,
        "median_life_h": round(float(np.median(hours)), 2),
    }
    return Finding(
        kind="leak-restarts",
        subject=f"workload/{owner}",
        severity="critical",
        summary=(
            f"{kind} {namespace}/{name}: {len(died)} lives grew to their GPU's memory and "
            f"died (GPU memory growing {min(slopes):g}–{max(slopes):g} MiB/h, a life every "
            f"{np.median(hours):.1f} h): a leak that crash-loops the workload"
        ),
        evidence=evidence,
        since=datetime.fromtimestamp(float(died[0].life.times[0]), UTC),
        labels={
            "namespace": namespace,
            "owner_kind": kind,
            "owner_name": name,
            "detector": "leak",
            "rule": params.name,
        },
        action=params.action,
    )


RecentSamples = Callable[
    [Sequence[GpuMemorySeries]], Sequence[tuple[FloatArray, FloatArray] | None]
]
"""The raw samples of the recent past of each series (None where there are none)."""


def detect_leaks(
    series: Sequence[GpuMemorySeries],
    params: LeakParams,
    now: datetime,
    recent: RecentSamples | None = None,
) -> list[Finding]:
    """Findings for every leaking GPU: per pod when one pod holds it, else unattributable.

    ``recent``, when given, is asked for the raw samples of the series that would be reported
    on their points alone (through Prometheus each point is a step's median, too coarse to see
    growth that stopped minutes ago), and those are judged again with them: a cache that filled
    to its limit is not reported once flat for ``flat_for``."""
    cleared = cannot_leak(series, params, now.timestamp())  # the fleet's quiet GPUs, at once
    seen: StopsSeen = {}  # the leaks' bins are judged again below, with their raw samples
    verdicts = [
        v
        for v in (
            assess_leak(one, params, now, seen)
            for one, out in zip(series, cleared, strict=True)
            if not out
        )
        if v.leaking
    ]
    if recent is not None and verdicts:
        samples = recent([v.series for v in verdicts])
        verdicts = [
            v if raw is None else assess_leak(replace(v.series, raw=raw), params, now, seen)
            for v, raw in zip(verdicts, samples, strict=True)
        ]
    findings = [_finding(v, params, now) for v in verdicts if v.leaking]
    return sorted(findings, key=lambda f: f.subject)


def _finding(verdict: LeakAssessment, params: LeakParams, now: datetime) -> Finding:
    s = verdict.series
    ev = dict(verdict.evidence)
    hours = ev.get("hours_to_exhaust", 0.0)
    severity = params.severity
    end = now.timestamp()
    if (
        params.critical_within_s is not None
        and verdict.exhaust_at is not None
        and verdict.exhaust_at - end <= params.critical_within_s
    ):
        severity = "critical"
    since = datetime.fromtimestamp(float(s.times[0]), UTC) if len(s.times) else None
    since = max(since, datetime.fromtimestamp(end - params.lookback_s, UTC)) if since else None
    labels = {"node": s.node, "detector": "leak", "rule": params.name, "gpu": s.gpu}
    if s.instance:
        labels["gpu_instance"] = s.instance
    if not s.gpu and s.uuid:
        labels["uuid"] = s.uuid  # no node/index label: the UUID tells the pod's GPUs apart
    rate = ev["slope_mib_per_h"]
    ci = verdict.evidence.get("slope_ci_mib_per_h", ["?", "?"])
    lo, hi = ci if isinstance(ci, list) else ("?", "?")
    eta = (
        f"exhausted in {hours} h"
        if "hours_to_exhaust" in ev
        else "exhaustion time unknown (no capacity: no free-memory reading, no GPU model)"
    )
    if s.stale_s > 0:
        eta += (
            f"; the exporter has been silent {s.stale_s / 60:.0f} min: judged on what it last said"
        )
    if len(s.pods) == 1:
        namespace, _, pod = s.pods[0].partition("/")
        labels |= {"namespace": namespace, "pod": pod}
        if s.pod_uid:
            ev["pod_uid"] = s.pod_uid
        whose = f"GPU memory of pod {s.pods[0]} on {s.subject}"
        if s.per_pod:
            # the exporter's per-process series: the pod's own memory on a GPU it may share
            whose = f"pod {s.pods[0]}'s own GPU memory on {s.subject} (shared)"
            ev["memory_of"] = "pod"
        return Finding(
            kind="leak",
            subject=f"pod/{s.pods[0]}",
            severity=severity,
            summary=f"{whose} grows {rate} MiB/h (95% CI {lo}–{hi}); {eta}",
            evidence=ev | {"pods": list(s.pods), "gpu_subject": s.subject},
            since=since,
            labels=labels,
            action=params.action,
            part=s.subject,  # one finding per (pod, GPU or MIG instance)
        )
    if s.pods:
        holders = ", ".join(s.pods)
    elif s.exporter_only:
        holders = "no pod: DCGM names only the exporter's own pod (pod mapping off?)"
    else:
        holders = "no pod DCGM names"
    return Finding(
        kind="leak",
        subject=s.subject,
        severity=severity,
        summary=(
            f"GPU memory on {s.subject} grows {rate} MiB/h (95% CI {lo}–{hi}), {eta}; "
            f"unattributable: held by {holders}"
        ),
        evidence=ev | {"pods": list(s.pods), "attributable": False},
        since=since,
        labels=labels,
        action=params.action,
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()
