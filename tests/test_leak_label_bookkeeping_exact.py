"""The per-series bookkeeping of a leak detection, made cheaper, answers as its plain definition
does (kept here as the oracle): the decoding of Prometheus's result into samples — values and
errors alike, malformed answers included —, a series' points as an array, the merge of a GPU's
series, its occupants, and the GPU key and scrape targets of DCGM labels."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.adapters.prometheus import _to_samples
from defrag.detectors.leak.core import DcgmLabels, Occupancy, split_incarnations
from defrag.detectors.leak.registration import _merge_points, _occupancies, _points_array
from defrag.ports import Sample

# --- the plain definitions ---------------------------------------------------------------------


def to_samples_plain(data: Any) -> list[Sample]:
    if isinstance(data, list) and len(data) == 2 and not isinstance(data[0], dict):
        return [Sample({}, ((float(data[0]), float(data[1])),))]
    if not isinstance(data, list):
        raise TypeError(f"result is a JSON {type(data).__name__}, not a list")
    out = []
    for item in data:
        if not isinstance(item, dict):
            raise TypeError(f"a result item is a JSON {type(item).__name__}, not an object")
        metric = item.get("metric", {})
        if not isinstance(metric, dict):
            raise TypeError("a result item's metric is not an object")
        labels = {str(k): str(v) for k, v in metric.items()}
        if "values" in item:
            points = tuple((float(t), float(v)) for t, v in item["values"])
        else:
            t, v = item["value"]
            points = ((float(t), float(v)),)
        out.append(Sample(labels, points))
    return out


def merge_points_plain(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray]:
    points = np.concatenate([np.asarray(s.points, dtype=float).reshape(-1, 2) for s in samples])
    if len(samples) == 1 or len(points) == 0:
        return points[:, 0], points[:, 1]
    times, inverse, counts = np.unique(points[:, 0], return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=points[:, 1], minlength=len(times))
    return times, sums / counts


def occupancies_plain(
    samples: list[Sample], names: DcgmLabels, targets: frozenset[str], bin_s: float
) -> tuple[list[Occupancy], dict[Occupancy, Mapping[str, str]]]:
    by_pod: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        pod = names.pod_key(s.labels, targets) or ""
        by_pod.setdefault((pod, names.uid_of(s.labels) if pod else ""), []).append(s)
    merged = {ident: merge_points_plain(group) for ident, group in by_pod.items()}
    out: list[Occupancy] = []
    labels_of: dict[Occupancy, Mapping[str, str]] = {}
    for (pod, uid), group in by_pod.items():
        whole = Occupancy(pod, *merged[(pod, uid)], uid)
        others = [t for ident, (t, _) in merged.items() if ident[0] != pod]
        other_times = np.concatenate(others) if others else np.empty(0)
        latest = max(group, key=lambda s: s.points[-1][0] if s.points else 0.0).labels
        parts = split_incarnations(whole, other_times, 1.5 * bin_s) if pod else [whole]
        for part in parts:
            out.append(part)
            labels_of[part] = latest
    return out, labels_of


def key_plain(names: DcgmLabels, labels: Mapping[str, str]) -> tuple[str, ...] | None:
    instance = labels.get(names.gpu_instance, "")
    uuid = names.first(labels, names.uuid)
    if uuid:
        return ("uuid", uuid, instance)
    node, gpu = names.node_of(labels), labels.get(names.gpu, "")
    if node and gpu:
        return ("node", node, gpu, instance)
    return None


def target_pods_plain(series_labels: Iterable[Mapping[str, str]]) -> frozenset[str]:
    out = set()
    for labels in series_labels:
        if any(k.startswith("exported_") for k in labels) and labels.get("pod"):
            out.add(f"{labels.get('namespace', '')}/{labels['pod']}")
    return frozenset(out)


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "value", call()
    except Exception as exc:  # the error itself is what is compared
        return "error", (type(exc), str(exc))


def same_arrays(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# --- decoding ----------------------------------------------------------------------------------

NAMES = ["UUID", "uuid", "Hostname", "instance", "gpu", "GPU_I_ID", "pod", "namespace"]
NAMES += ["exported_pod", "exported_namespace", "pod_name", "pod_namespace", "pod_uid"]
text = st.sampled_from(["", "0", "1", "GPU-a", "node-1", "node-1:9400", "ml", "dcgm-exporter-x"])
json_scalar = st.one_of(
    text, st.integers(-3, 3), st.floats(allow_nan=False), st.booleans(), st.none()
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=2)),
    max_leaves=4,
)
number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**12), 10**12),
    st.sampled_from(["1.5", "NaN", "+Inf", "-Inf", "x", "1e3"]),
)
point = st.one_of(st.tuples(number, number).map(list), st.lists(number, max_size=3), json_value)
metric = st.one_of(
    st.dictionaries(st.sampled_from(NAMES), text, max_size=6),  # as Prometheus answers
    st.dictionaries(st.sampled_from(NAMES), json_value, max_size=4),  # anything else
    json_value,
)
item = st.one_of(
    st.fixed_dictionaries({"metric": metric, "values": st.lists(point, max_size=4)}),
    st.fixed_dictionaries({"metric": metric, "value": point}),
    st.fixed_dictionaries({"values": st.lists(point, max_size=3)}),
    st.fixed_dictionaries({"metric": metric}),
    json_value,
)
result = st.one_of(st.lists(item, max_size=4), st.tuples(number, number).map(list), json_value)


@settings(max_examples=600, deadline=None)
@given(result)
def test_decoding_gives_the_plain_samples_or_the_same_error(data: Any) -> None:
    got, want = outcome(lambda: _to_samples(data)), outcome(lambda: to_samples_plain(data))
    assert repr(got) == repr(want)  # repr: NaN as NaN, -0.0 apart from 0.0
    if got[0] == "value":
        for one in got[1]:
            assert all(type(k) is str and type(v) is str for k, v in one.labels.items())


def test_decoding_prometheus_labels_keeps_them_and_points_as_floats() -> None:
    data = [{"metric": {"pod": "p", "gpu": "0"}, "values": [[1, "2.5"], [2.0, "NaN"]]}]
    (one,) = _to_samples(data)
    assert one.labels == {"pod": "p", "gpu": "0"}
    assert one.points[0] == (1.0, 2.5) and type(one.points[0][0]) is float
    assert one.points[1][1] != one.points[1][1]  # NaN


# --- points, merges, occupants -----------------------------------------------------------------

value = st.floats(allow_nan=True, allow_infinity=True, width=64)
points = st.lists(st.tuples(value, value), max_size=6).map(tuple)


@settings(max_examples=300, deadline=None)
@given(points)
def test_points_array_is_asarray(pts: tuple[tuple[float, float], ...]) -> None:
    plain = np.asarray(pts, dtype=float).reshape(-1, 2)
    assert same_arrays(_points_array(pts), plain)


times = st.lists(st.sampled_from([0.0, 300.0, 600.0, 900.0, 1800.0, 2100.0]), unique=True)
series_points = times.flatmap(
    lambda ts: st.lists(st.floats(0, 8e4), min_size=len(ts), max_size=len(ts)).map(
        lambda vs: tuple(zip(sorted(ts), vs, strict=True))
    )
)
labels = st.fixed_dictionaries(
    {"UUID": st.just("GPU-a")},
    optional={
        "pod": st.sampled_from(["a", "b", "dcgm-exporter-1"]),
        "namespace": st.sampled_from(["ml", "gpu-operator"]),
        "exported_pod": st.sampled_from(["a", "c"]),
        "pod_uid": st.sampled_from(["u1", "u2"]),
        "instance": st.sampled_from(["e1:9400", "e2:9400"]),
    },
)
samples = st.lists(st.builds(Sample, labels, series_points), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(samples)
def test_merged_points_are_the_plain_merge(group: list[Sample]) -> None:
    got, want = _merge_points(group), merge_points_plain(group)
    assert all(same_arrays(g, w) for g, w in zip(got, want, strict=True))


@settings(max_examples=400, deadline=None)
@given(samples, st.sampled_from([100.0, 300.0]))
def test_occupants_are_the_plain_ones(group: list[Sample], bin_s: float) -> None:
    names = DcgmLabels()
    targets = target_pods_plain(s.labels for s in group)
    got, got_labels = _occupancies(group, names, targets, bin_s)
    want, want_labels = occupancies_plain(group, names, targets, bin_s)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.pod, g.uid) == (w.pod, w.uid)
        assert same_arrays(g.times, w.times) and same_arrays(g.used_mib, w.used_mib)
        assert got_labels[g] is want_labels[w]


# --- DCGM labels -------------------------------------------------------------------------------

dcgm = st.dictionaries(st.sampled_from([*NAMES, "x", "exported_x"]), text, max_size=7)


@settings(max_examples=500, deadline=None)
@given(dcgm, st.sampled_from([DcgmLabels(), DcgmLabels(uuid=(), node=("instance",))]))
def test_key_is_the_plain_key(labels: dict[str, str], names: DcgmLabels) -> None:
    assert names.key(labels) == key_plain(names, labels)


@settings(max_examples=300, deadline=None)
@given(st.lists(dcgm, max_size=5))
def test_scrape_targets_are_the_plain_ones(series: list[dict[str, str]]) -> None:
    assert DcgmLabels().target_pods(series) == target_pods_plain(series)
