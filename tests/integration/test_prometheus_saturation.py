"""A cache that filled to its limit, through a real Prometheus (issue 21 item 5): flat for 15 min,
it is no longer reported.

The range query answers 5-min medians, too few points in a 15-min tail for the stop test, which
judges raw samples; so the leak rule asks Prometheus for the raw samples of the GPUs it would
report (``recent_samples``: an instant query of a range selector answers them) and judges those
again. Before, the pure core saw the cache stop at 15 min and the rule through Prometheus did not
(it kept reporting it for 15–25 min more).

The histories are bench/leak_corpus.py's ``saturating`` family (seeded; AR(1) noise; the truth's
``flat_since`` is when growth stopped), written as dcgm-exporter series (``gpu``, ``UUID``,
``Hostname``, ``modelName``, the pod labels) and backfilled with promtool.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from bench.leak_corpus import (
    END,
    Case,
    Life,
    MovingCase,
    MovingTruth,
    correlated_corpus,
    write_moving,
)
from defrag.adapters.prometheus import PrometheusSource
from defrag.detection import run_detection
from defrag.detectors.leak import registration
from defrag.rules import RuleSet, load_rules
from defrag.scoring.profile import ScoringProfile
from tests.support.prometheus import prometheus_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ScoringProfile.default()
CACHES = [c for c in correlated_corpus(seed=11, n=12) if c.truth.family == "saturating"]


def moving(case: Case, i: int) -> MovingCase:
    """The single history as one pod's life on GPU 0 of its own node."""
    s = case.series
    node = f"sat-{i}"
    life = Life("0", s.pods[0], s.times, s.used_mib)
    return MovingCase(case.name, node, MovingTruth("saturating", False), (life,))


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("saturating") / "saturating.om"
    with path.open("w") as out:
        write_moving([moving(c, i) for i, c in enumerate(CACHES)], out)
    with prometheus_server(path) as server:
        yield server.url


def reported(url: str, at: float) -> set[str]:
    rules: RuleSet = load_rules([ROOT / "rules" / "leak.yaml"])
    source = PrometheusSource(url, retries=0, timeout_s=10)
    report = run_detection(rules, source, None, datetime.fromtimestamp(at, UTC), profile=PROFILE)
    assert report.failures == () and not report.skipped, (report.failures, report.skipped)
    return {f.labels["node"] for f in report.findings}


def flat_evaluations() -> list[tuple[float, set[str]]]:
    """Each 5-min evaluation up to the history's end, with the caches flat ≥ 15 min by then."""
    out = []
    for at in np.arange(END - 3600.0, END + 1.0, 300.0):
        flat = {
            f"sat-{i}"
            for i, c in enumerate(CACHES)
            if c.truth.flat_since is not None and at >= c.truth.flat_since + 900.0
        }
        if flat:
            out.append((float(at), flat))
    return out


def test_a_cache_flat_at_its_limit_for_15_min_is_not_reported(prom: str) -> None:
    evaluations = flat_evaluations()
    assert sum(len(flat) for _, flat in evaluations) >= 20  # enough (cache, time) pairs to judge
    late = [(at, sorted(reported(prom, at) & flat)) for at, flat in evaluations]
    assert [row for row in late if row[1]] == []


def test_without_the_raw_samples_some_are_still_reported(
    prom: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same evaluations with the raw-sample round answering nothing (the rule judges the
    5-min medians alone, as before): some stopped caches are reported, so the test above checks
    the round, not a corpus that was never reported."""
    monkeypatch.setattr(
        registration, "recent_samples", lambda rule, m, now, flagged: [None] * len(flagged)
    )
    late = [reported(prom, at) & flat for at, flat in flat_evaluations()]
    assert any(late)
