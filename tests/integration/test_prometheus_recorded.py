"""The leak rule over recorded series and over node shards, against the real Prometheus.

The recording rules are the shipped ones (rules/prometheus/defrag.detection.rules.yaml),
backfilled by ``promtool tsdb create-blocks-from rules`` from the raw DCGM history — Prometheus
itself evaluates them, at the group's own evaluation times (offset within the interval by a
hash of the group, so not on whole seconds). The rule judged from them at their last evaluation
must give exactly what it gives from the raw series at that time; sharding the medians by node
must give exactly the unsharded answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from defrag.adapters.prometheus import PrometheusSource
from defrag.detection import detect
from defrag.detectors.leak.core import GpuMemorySeries
from defrag.detectors.leak.registration import (
    LeakRuleFields,
    _ask_leak_queries,
    judged_at,
    leak_series,
)
from defrag.ports import MetricsSource
from defrag.rules import RuleSet, load_rules
from defrag.scoring.profile import ScoringProfile
from tests.integration.test_prometheus_detect import OneAtATime
from tests.support.prometheus import (
    END,
    HOUR,
    RuleBackfill,
    make_fleet,
    prometheus_server,
    write_openmetrics,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RECORDING = (ROOT / "rules" / "prometheus" / "defrag.detection.rules.yaml").read_text()
PROFILE = ScoringProfile.default()
# every shape of tests/support/prometheus.py, two nodes; GPUs 9 and 12 shared by two pods
SHAPES = ["leak", "plateau", "sawtooth", "step"] + ["flat"] * 8 + ["leak"]
FLEET = make_fleet(SHAPES, hours=7, step_s=30, shared=(9, 12))


def _server(tmp: Path, rules_from_h: float | None) -> Iterator[str]:
    path = tmp / "history.om"
    with path.open("w") as out:
        write_openmetrics(FLEET, out)
    end = END.timestamp()
    rules = (
        [] if rules_from_h is None else [RuleBackfill(RECORDING, end - rules_from_h * HOUR, end)]
    )
    with prometheus_server(path, rules=rules) as server:
        yield server.url


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The raw history and the recording rules evaluated over the last 6.5 h of it."""
    yield from _server(tmp_path_factory.mktemp("recorded"), 6.5)


def source(url: str, concurrency: int = 4) -> PrometheusSource:
    return PrometheusSource(url, retries=0, timeout_s=30, concurrency=concurrency)


def leak_rules(tmp: Path, recorded: str) -> RuleSet:
    text = (ROOT / "rules" / "leak.yaml").read_text()
    path = tmp / "leak.yaml"
    path.write_text(text.replace("prefilter: true", f"prefilter: true\n    recorded: {recorded}"))
    return load_rules([path])


def rule_of(rules: RuleSet) -> LeakRuleFields:
    rule = rules.rules[0].rule
    assert isinstance(rule, LeakRuleFields)
    return rule


def same_series(a: list[GpuMemorySeries], b: list[GpuMemorySeries]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for f in fields(GpuMemorySeries):
            u, v = getattr(x, f.name), getattr(y, f.name)
            if isinstance(u, np.ndarray):
                np.testing.assert_array_equal(u, v, err_msg=f"{x.subject} {f.name}")
            else:
                assert u == v, (x.subject, f.name)


def test_the_rule_is_judged_at_the_recording_rules_last_evaluation(
    recorded: str, tmp_path: Path
) -> None:
    at, series = judged_at(rule_of(leak_rules(tmp_path, "auto")), source(recorded), END)
    assert series is not None
    assert END - timedelta(minutes=5) < at <= END
    # never: the raw series, at the time asked
    assert judged_at(rule_of(leak_rules(tmp_path, "never")), source(recorded), END) == (END, None)


def test_recorded_series_give_the_raw_answers(recorded: str, tmp_path: Path) -> None:
    auto = leak_rules(tmp_path, "auto")
    rule = rule_of(auto)
    prom = source(recorded)
    at, rec = judged_at(rule, prom, END)
    assert rec is not None
    from_recorded = leak_series(rule, prom, at, recorded=rec)
    from_raw = leak_series(rule, prom, at)
    assert len(from_raw) == 4  # past the prefilter: the leaks, the plateau and the step
    same_series(from_recorded, from_raw)
    # the findings: the rule with recorded series at END is the raw rule at their evaluation
    found = detect(auto, prom, None, END, profile=PROFILE)
    raw = detect(leak_rules(tmp_path, "never"), prom, None, at, profile=PROFILE)
    assert found == raw
    assert {f.subject for f in found} == {"gpu/node-001/4", "pod/ml/leak-0"}


def test_recorded_values_are_prometheus_own_evaluation(recorded: str) -> None:
    """A few recorded values against the expressions evaluated over the raw samples then."""
    prom = source(recorded)
    at = prom.instant("max(timestamp(cluster:DCGM_FI_DEV_FB_USED:count))", END)[0].last
    assert at is not None
    for back in (0, 7, 40):
        t = datetime.fromtimestamp(round(at - back * 300, 3), END.tzinfo)
        for name, expr in (
            ("median5m", "quantile_over_time(0.5, DCGM_FI_DEV_FB_USED[5m])"),
            ("deriv6h", "deriv(DCGM_FI_DEV_FB_USED[6h])"),
            ("min_over_time6h", "min_over_time(DCGM_FI_DEV_FB_USED[6h])"),
        ):
            got = prom.instant(
                f"last_over_time(gpu:DCGM_FI_DEV_FB_USED:{name}[150s] offset -1s)", t
            )
            want = prom.instant(expr, t)
            assert len(got) == len(want) == len(SHAPES) + 2
            by_labels = {tuple(sorted(s.labels.items())): s.last for s in want}
            for s in got:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "__name__"))
                assert s.last == by_labels[labels], (name, back, labels)


@pytest.mark.parametrize("recorded_mode", ["auto", "never"])
def test_shards_by_node_give_the_unsharded_answer(
    recorded: str, tmp_path: Path, recorded_mode: str
) -> None:
    rule = rule_of(leak_rules(tmp_path, recorded_mode))
    at, rec = judged_at(rule, source(recorded), END)
    start = at - timedelta(hours=6)
    answers = []
    metrics: list[MetricsSource] = [source(recorded, n) for n in (1, 2, 8)]
    metrics.append(OneAtATime(source(recorded)))
    for prom in metrics:
        used, free, _, used_now = _ask_leak_queries(rule, prom, start, at, rec)
        answers.append((used, free, used_now))
    assert answers[0][0]  # GPUs passed the prefilter
    for other in answers[1:]:
        assert other == answers[0]


def test_without_the_whole_lookback_recorded_the_raw_series_are_read(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """Rules installed an hour ago: their series do not reach back over the lookback."""
    rule = rule_of(leak_rules(tmp_path, "auto"))
    for url in _server(tmp_path_factory.mktemp("partial"), 1.0):
        assert judged_at(rule, source(url), END) == (END, None)
