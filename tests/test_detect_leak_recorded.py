"""The leak rule's recorded names and node chunks (no Prometheus; the answers' identity with
the raw series is tests/integration/test_prometheus_recorded.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from defrag.detectors.leak.core import DcgmLabels, LeakParams
from defrag.detectors.leak.recorded import (
    VERDICT_LABEL,
    duration,
    recorded_series,
    verdict_recorded,
    verdict_settings,
)
from defrag.detectors.leak.registration import (
    NARROW_AT_MOST,
    LeakRuleFields,
    _ask_leak_queries,
    _node_chunks,
    _prefilter_settings,
    judged_at,
)
from defrag.ports import Sample
from defrag.rules import load_rules

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
    assert rec.verdict in shipped and rec.verdict_count in shipped
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


def _leak_rule(tmp: Path, *edits: tuple[str, str]) -> LeakRuleFields:
    """The shipped leak rule with ``recorded: auto`` and each (old, new) text edit."""
    text = (ROOT / "rules" / "leak.yaml").read_text()
    text = text.replace("prefilter: true", "prefilter: true\n    recorded: auto", 1)
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp / "leak.yaml"
    path.write_text(text)
    rule = load_rules([path]).rules[0].rule
    assert isinstance(rule, LeakRuleFields)
    return rule


def _group() -> tuple[list[str], dict[str, dict[str, object]]]:
    doc = yaml.safe_load((ROOT / "rules/prometheus/defrag.detection.rules.yaml").read_text())
    rules = doc["groups"][0]["rules"]
    return [r["record"] for r in rules], {r["record"]: r for r in rules}


def test_the_shipped_verdict_is_the_daemons_prefilter_with_its_settings(tmp_path: Path) -> None:
    """The recorded verdict's expression is, token for token, the prefilter the daemon would
    ask over the recorded terms at the shipped rule's settings; its witness counts the verdict
    with those settings, and both state them; each is evaluated after what it reads and
    before the marker (so a marker at t says they were evaluated at t)."""
    rule = _leak_rule(tmp_path)
    rec = recorded_series(rule.queries.used, LeakParams())
    assert rec is not None
    order, shipped = _group()
    threshold, fewer = _prefilter_settings(rule)
    expr = shipped[rec.verdict]["expr"]
    assert isinstance(expr, str)
    assert " ".join(expr.split()) == rec.verdict_expr(threshold, fewer)
    settings = verdict_settings(threshold, fewer)
    assert settings == "deriv*3600>32,count<0.979167*max,min<0.5*max"
    witness = shipped[rec.verdict_count]["expr"]
    assert isinstance(witness, str)
    assert witness.strip() == rec.witness_expr(settings)
    for name in (rec.verdict, rec.verdict_count):
        assert shipped[name]["labels"] == {VERDICT_LABEL: settings}
    terms = [order.index(n) for n in rec.names]
    assert max(terms) < order.index(rec.verdict) < order.index(rec.verdict_count)
    assert order.index(rec.verdict_count) < order.index(rec.marker)
    # another minimum slope states other settings
    other = _leak_rule(tmp_path, ("min_slope_mib_per_h: 64", "min_slope_mib_per_h: 100"))
    assert verdict_settings(*_prefilter_settings(other)) != settings


END = datetime(2026, 1, 1, 12, tzinfo=UTC)
AT = END - timedelta(seconds=100.25)
GPUS = [{"UUID": f"GPU-{i}", "Hostname": f"n{i // 8}", "gpu": str(i % 8)} for i in range(4)]


class Recorded:
    """Answers as a Prometheus with the recording group evaluated every step until ``AT``:
    the marker, the verdict's witness (with ``settings``, None: not recorded), the verdict (GPUs
    0 and 2 pass) and the terms' prefilter (GPUs 0 and 2 again, split by the shards); the medians
    of whatever is asked, the instants of every GPU. Keeps every query asked."""

    def __init__(self, settings: str | None) -> None:
        self.settings = settings
        self.asked: list[str] = []

    def instant(self, query: str, at: datetime | None = None) -> list[Sample]:
        self.asked.append(query)
        if query.startswith("max(timestamp("):
            return [Sample({}, ((AT.timestamp(), AT.timestamp()),))]
        if query.startswith("last_over_time(cluster:"):
            if self.settings is None or f'"{self.settings}"' not in query:
                return []
            return [Sample({VERDICT_LABEL: self.settings}, ((AT.timestamp(), 4.0),))]
        if query.startswith("last_over_time(gpu:DCGM_FI_DEV_FB_USED:prefilter6h"):
            name = {"__name__": "gpu:DCGM_FI_DEV_FB_USED:prefilter6h"}
            own = {VERDICT_LABEL: self.settings or ""}
            return [Sample({**name, **GPUS[i], **own}, ((AT.timestamp(), 1.0),)) for i in (0, 2)]
        if " * 3600 > " in query:  # one shard of the prefilter over the terms
            low = 'gpu=~"[0-3]"' in query
            return [Sample(GPUS[i], ((AT.timestamp(), 40.0),)) for i in (0, 2) if low]
        return [Sample({**g, "pod": "p"}, ((AT.timestamp(), 100.0),)) for g in GPUS]

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Sample]:
        self.asked.append(query)
        if query.startswith("max(timestamp("):
            times = [AT.timestamp() - k * step_s for k in range(72, -1, -1)]
            return [Sample({}, tuple((t, t) for t in times))]
        return [
            Sample({"__name__": "gpu:DCGM_FI_DEV_FB_USED:median5m", **g, "pod": "p"},
                   ((end.timestamp(), 100.0),))
            for g in GPUS
            if g["UUID"] in query
        ]  # fmt: skip


def test_the_verdict_stands_in_only_when_recorded_with_the_rules_settings(tmp_path: Path) -> None:
    rule = _leak_rule(tmp_path)
    settings = verdict_settings(*_prefilter_settings(rule))
    at, rec = judged_at(rule, Recorded(settings), END)
    assert at == AT and rec is not None and rec.verdict_with == settings
    # recorded with other settings, or not at all (an older rule file, a one-pass backfill):
    # the terms, as before
    for other in ("deriv*3600>50,count<0.979167*max,min<0.5*max", None):
        at, rec = judged_at(rule, Recorded(other), END)
        assert at == AT and rec is not None and rec.verdict_with == ""
    # no prefilter: no verdict asked
    source = Recorded(settings)
    at, rec = judged_at(_leak_rule(tmp_path, ("prefilter: true", "prefilter: false")), source, END)
    assert rec is not None and rec.verdict_with == ""
    assert not any("prefilter6h" in q for q in source.asked)
    # the rule's own matchers: the fleet's fullest series is counted over those alone
    matched = recorded_series('DCGM_FI_DEV_FB_USED{namespace="ml"}', LeakParams())
    assert matched is not None
    assert not verdict_recorded(matched, Recorded(settings), AT, settings)


def test_the_verdict_is_one_read_and_passes_what_the_terms_pass(tmp_path: Path) -> None:
    rule = _leak_rule(tmp_path)
    settings = verdict_settings(*_prefilter_settings(rule))
    start = AT - timedelta(hours=6)
    answers = []
    for recorded_with in (settings, None):
        source = Recorded(recorded_with)
        _, rec = judged_at(rule, source, END)
        assert rec is not None
        source.asked.clear()
        used, free, _, used_now = _ask_leak_queries(rule, source, start, AT, rec)
        prefilters = [q for q in source.asked if "prefilter6h" in q or " * 3600 > " in q]
        if recorded_with:
            assert prefilters == [
                "last_over_time(gpu:DCGM_FI_DEV_FB_USED:prefilter6h"
                f'{{{VERDICT_LABEL}="{settings}"}}[150s] offset -1s)'
            ]
        else:
            assert len(prefilters) == 2  # the two shards over the terms
        answers.append((used, free, used_now))
    assert answers[0] == answers[1]
    assert {s.labels["UUID"] for s in answers[0][0]} == {"GPU-0", "GPU-2"}
