"""A toy detector, added as one module with one registration, reaches the real Alertmanager.

tests/support/toy_detector.py is the whole detector; here its rule is read from a rules file,
evaluated against a real Prometheus (a backfilled ``DCGM_FI_DEV_GPU_TEMP``) through the same
``run_detection`` the daemon runs, and its finding is sent by the same sink to a real
Alertmanager, whose webhook notification is awaited. Outside the ``registered`` block the
toy is gone: its rules file is an unknown detector again and its kind has no alert.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from defrag.adapters.alertmanager import AlertmanagerSink
from defrag.adapters.prometheus import PrometheusSource
from defrag.alerting import ALERTS
from defrag.detection import run_detection
from defrag.detectors import registry
from defrag.rules import RulesError, load_rules
from defrag.scoring.profile import ScoringProfile
from tests.support.alertmanager import (
    AlertmanagerServer,
    Notification,
    WebhookReceiver,
    alertmanager_with_receiver,
)
from tests.support.prometheus import END, gauge_family, prometheus_server
from tests.support.toy_detector import ALERT, KIND, TOY, HotGpuParams

pytestmark = pytest.mark.integration

RULES = """\
rules:
  - name: gpu-too-hot
    detector: hot-gpu
    severity: critical
    max_celsius: 85
    lookback: 10m
"""


def temperatures() -> str:
    """Three GPUs over the 20 minutes before END at 30 s (dcgm-exporter's labels): n1/0 hot
    throughout, n1/1 cool, n2/0 hot only for the last 5 minutes (not the whole lookback)."""
    times = END.timestamp() - np.arange(40, -1, -1) * 30.0
    recent = times > END.timestamp() - 300
    series = [
        ({"gpu": "0", "UUID": "GPU-a0", "Hostname": "n1"}, times, np.full(len(times), 91.0)),
        ({"gpu": "1", "UUID": "GPU-a1", "Hostname": "n1"}, times, np.full(len(times), 60.0)),
        ({"gpu": "0", "UUID": "GPU-b0", "Hostname": "n2"}, times, np.where(recent, 92.0, 70.0)),
    ]
    return gauge_family("DCGM_FI_DEV_GPU_TEMP", series) + "# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("temp") / "temp.om"
    path.write_text(temperatures())
    with prometheus_server(path) as server:
        yield server.url


@pytest.fixture
def am() -> Iterator[tuple[AlertmanagerServer, WebhookReceiver]]:
    with alertmanager_with_receiver() as pair:
        yield pair


def firing(name: str) -> Callable[[list[Notification]], bool]:
    def check(ns: list[Notification]) -> bool:
        return any(n.name == name and n.status == "firing" for n in ns)

    return check


def test_toy_detector_from_rules_file_to_alertmanager(
    prom: str, am: tuple[AlertmanagerServer, WebhookReceiver], tmp_path: Path
) -> None:
    server, rx = am
    file = tmp_path / "toy.yaml"
    file.write_text(RULES)
    with registry.registered(TOY):
        rules = load_rules([file])
        [loaded] = rules.rules
        # the settings from the file, the rest from the dataclass's defaults
        assert loaded.rule.params() == HotGpuParams(
            name="gpu-too-hot", severity="critical", max_celsius=85.0, lookback_s=600.0
        )
        report = run_detection(
            rules, PrometheusSource(prom, retries=0), None, END, profile=ScoringProfile.default()
        )
        assert report.failures == () and dict(report.skipped) == {}
        assert [f.subject for f in report.findings] == ["gpu/n1/0"]  # n2/0: hot 5 of 10 min
        sink = AlertmanagerSink([server.url], cluster="it", ttl_s=120, retry_wait_s=0.05)
        sink.sync(report.findings, datetime.now(UTC))
        [note] = [n for n in rx.wait_for(firing(ALERT)) if n.name == ALERT]
        assert {k: note.labels[k] for k in ("severity", "node", "gpu", "detector")} == {
            "severity": "critical",
            "node": "n1",
            "gpu": "0",
            "detector": KIND,
        }
        [held] = [a for a in server.alerts(cluster="it") if a["labels"]["alertname"] == ALERT]
        # the registration's summary template over the finding's evidence
        assert held["annotations"]["summary"] == "GPU 0 of n1 above 85 C (lowest 91.0 C)"
        assert held["annotations"]["runbook_url"].endswith("#toygputoohot")
    # unregistered: the kind has no alert, the rules file names an unknown detector
    assert KIND not in ALERTS.kinds() and "hot-gpu" not in registry.names()
    with pytest.raises(RulesError) as caught:
        load_rules([file])
    [issue] = caught.value.issues
    assert (issue.file, issue.line, issue.field) == (str(file), 3, "rules[0].detector")
    assert "'hot-gpu'" in issue.message
