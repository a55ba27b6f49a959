"""The leak rule's recorded names and node chunks (no Prometheus; the answers' identity with
the raw series is tests/integration/test_prometheus_recorded.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from defrag.detectors.leak.core import DcgmLabels, LeakParams
from defrag.detectors.leak.recorded import duration, recorded_series
from defrag.detectors.leak.registration import NARROW_AT_MOST, _node_chunks

ROOT = Path(__file__).resolve().parents[1]


def test_durations_as_prometheus_writes_them() -> None:
    assert [duration(s) for s in (300, 21600, 90, 86400, 5400)] == ["5m", "6h", "90s", "1d", "90m"]


def test_the_names_are_the_shipped_recording_rules() -> None:
    """Every name the rule reads at its default settings is recorded by the shipped group,
    with the expression over the raw series it stands for."""
    doc = yaml.safe_load((ROOT / "rules/prometheus/defrag.detection.rules.yaml").read_text())
    shipped = {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"]}
    rec = recorded_series("DCGM_FI_DEV_FB_USED", LeakParams())
    assert rec is not None
    assert shipped[rec.median] == "quantile_over_time(0.5, DCGM_FI_DEV_FB_USED[5m])"
    for op in ("deriv", "count_over_time", "min_over_time", "max_over_time"):
        assert shipped[rec.over_lookback(op)] == f"{op}(DCGM_FI_DEV_FB_USED[6h])"
    assert rec.marker in shipped
    assert [r["record"] for r in doc["groups"][0]["rules"]][-1] == rec.marker  # written last
    assert doc["groups"][0]["interval"] == "5m"


def test_a_selector_keeps_its_matchers_and_anything_else_reads_raw() -> None:
    rec = recorded_series('DCGM_FI_DEV_FB_USED{namespace="ml"}', LeakParams())
    assert rec is not None
    assert rec.selector(rec.median) == 'gpu:DCGM_FI_DEV_FB_USED:median5m{namespace="ml"}'
    assert recorded_series("sum by (gpu) (DCGM_FI_DEV_FB_USED)", LeakParams()) is None
    assert recorded_series("gpu:DCGM_FI_DEV_FB_USED:median5m", LeakParams()) is None


def test_node_chunks_partition_the_gpus_by_node() -> None:
    names = DcgmLabels()
    on = ["UUID", "Hostname", "gpu"]
    wanted = {(f"GPU-{n}-{g}", f"node-{n}", str(g)) for n in range(10) for g in range(8)}
    chunks = _node_chunks(on, names, wanted, 4)
    assert len(chunks) == 4
    assert set().union(*chunks) == wanted
    assert sum(len(c) for c in chunks) == len(wanted)  # disjoint
    for chunk in chunks:  # a node's GPUs stay together
        nodes = {w[1] for w in chunk}
        assert chunk == {w for w in wanted if w[1] in nodes}
    assert len(_node_chunks(on, names, wanted, 1)) == 1
    assert len(_node_chunks(on, names, wanted, 64)) == 10  # no more chunks than nodes


def test_node_chunks_stay_nameable() -> None:
    names = DcgmLabels()
    on = ["UUID", "Hostname", "gpu"]
    n_nodes = NARROW_AT_MOST // 8 * 3
    wanted = {(f"GPU-{n}-{g}", f"node-{n}", str(g)) for n in range(n_nodes) for g in range(8)}
    chunks = _node_chunks(on, names, wanted, 2)
    assert len(chunks) == 3
    assert max(len(c) for c in chunks) <= NARROW_AT_MOST
