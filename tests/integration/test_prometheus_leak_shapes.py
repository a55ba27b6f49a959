"""The leak rule through a real Prometheus on the generated shapes of bench/leak_shapes.py
(time-sliced GPUs with dcgm-exporter's per-process series, pods re-created under their name with
and without ``pod_uid``, containers restarting in their pod after each OOM and workloads whose
every life is a new pod): the prefilter and the screen never change a finding, and a workload
that crash-loops is one finding."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.leak_shapes import ShapeCase, shape_moving_corpus, write_shapes
from defrag.adapters.prometheus import PrometheusSource
from defrag.detection import run_detection
from defrag.detectors.leak import core
from defrag.rules import load_rules
from defrag.scoring.profile import ScoringProfile
from tests.support.prometheus import prometheus_server

pytestmark = pytest.mark.integration

PROFILE = ScoringProfile.default()
CASES: list[ShapeCase] = [c for seed in (1, 2) for c in shape_moving_corpus(seed, 2)]
END = max(float(r.times[-1]) for c in CASES for r in c.runs)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("om") / "shapes.om"
    with path.open("w") as out:
        write_shapes(CASES, out)
    with prometheus_server(path) as server:
        yield server.url


def _rules(tmp: Path, prefilter: bool) -> Path:
    path = tmp / f"leak-{prefilter}.yaml"
    path.write_text(
        "rules:\n  - name: leak\n    detector: leak\n    queries:\n"
        "      used: DCGM_FI_DEV_FB_USED\n      free: DCGM_FI_DEV_FB_FREE\n"
        "      owner: kube_pod_owner\n"
        f"    prefilter: {str(prefilter).lower()}\n"
    )
    return path


def _findings(url: str, rules: Path, at: float) -> list[tuple[str, str, str]]:
    source = PrometheusSource(url, retries=0, timeout_s=30)
    when = datetime.fromtimestamp(at, UTC)
    report = run_detection(load_rules([rules]), source, None, when, profile=PROFILE)
    assert report.failures == ()
    return sorted((f.kind, f.subject, f.part) for f in report.findings)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(minutes=st.integers(0, 240))
def test_the_prefilter_and_the_screen_never_change_a_finding(
    prom: str, tmp_path: Path, minutes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = END - minutes * 60.0
    on = _findings(prom, _rules(tmp_path, True), at)
    assert on == _findings(prom, _rules(tmp_path, False), at)
    with monkeypatch.context() as patch:
        patch.setattr(core, "cannot_leak", lambda series, params, end: [False] * len(series))
        assert on == _findings(prom, _rules(tmp_path, True), at)


def test_each_class_is_found_at_the_end(prom: str, tmp_path: Path) -> None:
    found = _findings(prom, _rules(tmp_path, True), END)
    subjects = {subject for _, subject, _ in found}
    for case in CASES:
        if case.truth.leak:
            assert case.truth.subject in subjects, case.name
    # a crash loop is one finding about its workload: none about its pods
    for case in CASES:
        if case.truth.family.startswith("restart"):
            pods = {f"pod/{r.pod}" for r in case.runs}
            assert not pods & subjects, case.name
    # healthy re-created incarnations inherit nothing
    for case in CASES:
        if case.truth.family.startswith("recreated") and not case.truth.leak:
            assert f"pod/{case.runs[0].pod}" not in subjects, case.name
