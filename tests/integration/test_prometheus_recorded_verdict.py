"""The prefilter's recorded verdict against the real Prometheus.

The shipped group (rules/prometheus/defrag.detection.rules.yaml) is backfilled as a running
Prometheus evaluates it: the rules over the raw series by ``promtool tsdb create-blocks-from
rules``, then the verdict and its witness, which read those recorded terms, at the group's own
evaluation times (tests/support/recorded_passes.py). Where the witness carries the rule's
settings at the judged time, the daemon reads the verdict instead of evaluating the
prefilter's joins; it must pass the very GPUs the prefilter over the terms and over the raw
series pass, and give the same findings. Where the witness is absent then (a one-pass
backfill, a verdict that stopped being recorded), the daemon asks the terms as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from defrag.detection import detect
from defrag.detectors.leak.recorded import verdict_settings
from defrag.detectors.leak.registration import (
    LeakRuleFields,
    _ask_leak_queries,
    _at,
    _gpu_labels,
    _prefilter,
    _prefilter_settings,
    judged_at,
    leak_series,
)
from defrag.ports import Sample
from defrag.rules import load_rules
from tests.integration.test_prometheus_detect import OneAtATime
from tests.integration.test_prometheus_recorded import (
    FLEET,
    PROFILE,
    RECORDING,
    leak_rules,
    rule_of,
    same_series,
    source,
)
from tests.support.prometheus import (
    END,
    HOUR,
    RuleBackfill,
    backfill_openmetrics,
    backfill_rules,
    serve_tsdb,
    write_openmetrics,
)
from tests.support.recorded_passes import backfill_second_pass, first_pass

pytestmark = pytest.mark.integration

MARKER = "cluster:DCGM_FI_DEV_FB_USED:count"


def _server(tmp: Path, *, second_until_s: float | None, one_pass: bool = False) -> Iterator[str]:
    """The raw history; the group's first pass over the last 6.5 h (the whole file in one pass
    with ``one_pass``); the second pass over the hour before ``END − second_until_s``."""
    data = tmp / "data"
    data.mkdir()
    history = tmp / "history.om"
    with history.open("w") as out:
        write_openmetrics(FLEET, out)
    backfill_openmetrics(history, data)
    end = END.timestamp()
    text = RECORDING if one_pass else first_pass(RECORDING)
    blocks = tmp / "recorded"
    with serve_tsdb(data, tmp) as server:
        backfill_rules(
            server.url, [RuleBackfill(text, end - 6.5 * HOUR, end)], tmp / "rules.yaml", blocks
        )
    for block in blocks.iterdir():
        block.rename(data / block.name)
    if second_until_s is not None:
        until = end - second_until_s
        assert backfill_second_pass(data, RECORDING, MARKER, until - HOUR, until, tmp) > 0
    with serve_tsdb(data, tmp) as server:
        yield server.url


@pytest.fixture(scope="module")
def verdict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _server(tmp_path_factory.mktemp("verdict"), second_until_s=0)


class Asked(OneAtATime):
    """The source's plain methods, every query kept."""

    def __init__(self, url: str) -> None:
        super().__init__(source(url))
        self.asked: list[str] = []

    def instant(self, query: str, at: datetime | None = None) -> list[Sample]:
        self.asked.append(query)
        return super().instant(query, at)

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Sample]:
        self.asked.append(query)
        return super().range(query, start, end, step_s)


def _gpus(rule: LeakRuleFields, samples: list[Sample]) -> set[tuple[str, ...]]:
    on = _gpu_labels(rule)
    return {tuple(s.labels.get(k, "") for k in on) for s in samples}


def test_the_verdict_is_read_where_recorded_with_the_rules_settings(
    verdict: str, tmp_path: Path
) -> None:
    rule = rule_of(leak_rules(tmp_path, "auto"))
    at, rec = judged_at(rule, source(verdict), END)
    assert rec is not None and END - timedelta(minutes=5) < at <= END
    assert rec.verdict_with == verdict_settings(*_prefilter_settings(rule))
    # another minimum slope: the recorded verdict is not its prefilter
    text = (Path(__file__).parents[2] / "rules" / "leak.yaml").read_text()
    other = tmp_path / "other.yaml"
    other.write_text(
        text.replace("min_slope_mib_per_h: 64", "min_slope_mib_per_h: 100").replace(
            "prefilter: true", "prefilter: true\n    recorded: auto"
        )
    )
    [loaded] = load_rules([other]).rules
    assert isinstance(loaded.rule, LeakRuleFields)
    _, rec_other = judged_at(loaded.rule, source(verdict), END)
    assert rec_other is not None and rec_other.verdict_with == ""


def test_the_verdict_passes_what_the_prefilter_passes_at_every_evaluation(
    verdict: str, tmp_path: Path
) -> None:
    """At each evaluation of the second pass: the verdict's GPUs are those of the prefilter
    over the recorded terms (both shards) and over the raw series."""
    rule = rule_of(leak_rules(tmp_path, "auto"))
    prom = source(verdict)
    at, rec = judged_at(rule, prom, END)
    assert rec is not None and rec.verdict_with
    sel = rule.queries.used.strip()
    passed_somewhere = False
    for back in range(12):
        t = datetime.fromtimestamp(round(at.timestamp() - back * 300, 3), UTC)
        read = rec.read(rec.verdict_selector(rec.verdict, rec.verdict_with))
        from_verdict = _gpus(rule, prom.instant(read, t))
        shards = [f'{sel}{{gpu=~"[0-3]"}}', f'{sel}{{gpu!~"[0-3]"}}']
        from_terms = _gpus(
            rule, [s for q in shards for s in prom.instant(_prefilter(rule, q, _at(t), rec), t)]
        )
        from_raw = _gpus(rule, prom.instant(_prefilter(rule, sel, _at(t)), t))
        assert from_verdict == from_terms == from_raw, back
        passed_somewhere |= bool(from_verdict)
    assert passed_somewhere


def test_the_verdict_gives_the_terms_and_the_raw_answers(verdict: str, tmp_path: Path) -> None:
    auto = leak_rules(tmp_path, "auto")
    rule = rule_of(auto)
    asked = Asked(verdict)
    at, rec = judged_at(rule, asked, END)
    assert rec is not None and rec.verdict_with
    start = at - timedelta(hours=6)
    asked.asked.clear()
    by_verdict = _ask_leak_queries(rule, asked, start, at, rec)
    assert sum("prefilter6h" in q for q in asked.asked) == 1  # one read, no terms' joins
    assert not any("deriv6h" in q for q in asked.asked)
    terms = replace(rec, verdict_with="")
    for prom in (source(verdict), source(verdict, 1), OneAtATime(source(verdict))):
        assert _ask_leak_queries(rule, prom, start, at, terms) == by_verdict
    assert by_verdict[0]  # GPUs passed
    same_series(leak_series(rule, asked, at, recorded=rec), leak_series(rule, asked, at))
    found = detect(auto, source(verdict), None, END, profile=PROFILE)
    raw = detect(leak_rules(tmp_path, "never"), source(verdict), None, at, profile=PROFILE)
    assert found == raw
    assert {f.subject for f in found} == {"gpu/node-001/4", "pod/ml/leak-0"}


def test_a_one_pass_backfill_reads_the_terms(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """promtool evaluates the verdict and its witness over the raw series alone: no witness,
    so the terms are asked, and the findings are the raw ones."""
    rule = rule_of(leak_rules(tmp_path, "auto"))
    for url in _server(tmp_path_factory.mktemp("one-pass"), second_until_s=None, one_pass=True):
        at, rec = judged_at(rule, source(url), END)
        assert rec is not None and rec.verdict_with == ""
        found = detect(leak_rules(tmp_path, "auto"), source(url), None, END, profile=PROFILE)
        raw = detect(leak_rules(tmp_path, "never"), source(url), None, at, profile=PROFILE)
        assert found == raw and found


def test_a_verdict_not_recorded_at_the_judged_time_is_not_read(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """The verdict recorded until 10 minutes before the group's last evaluation (the group
    itself evaluated throughout): the terms are asked."""
    rule = rule_of(leak_rules(tmp_path, "auto"))
    for url in _server(tmp_path_factory.mktemp("stopped"), second_until_s=600):
        at, rec = judged_at(rule, source(url), END)
        assert rec is not None and rec.verdict_with == ""
        assert END - timedelta(minutes=5) < at
