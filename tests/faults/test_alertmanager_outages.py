"""A slow Alertmanager cannot wedge a cycle (issue 15, item 3: deadlines everywhere).

The trickling server is tests/support/broken_prometheus.py's: it answers any path, so it
stands in for an Alertmanager that sends one byte every half second.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from defrag.adapters.alertmanager import AlertmanagerSink
from defrag.alerting import AlertSendError
from defrag.detect.findings import Finding
from tests.support.broken_prometheus import Fault, broken_prometheus

LEAK = Finding("leak", "pod/ml/train-0", "critical", "GPU memory of ml/train-0 grows")


@pytest.mark.parametrize("kind", ["trickle", "trickle-headers", "hang"])
def test_a_slow_alertmanager_is_a_failed_send_not_a_hang(kind: str) -> None:
    """Before: the sink's 5 s timeout bounded each socket read, so an Alertmanager trickling
    its answer held ``sync`` (and the cycle) for as long as it trickled. Now each request has
    a wall-clock deadline; the send fails after the retries and the alert is kept. (The
    ``hang`` case is a guard: a silent server tripped the read timeout before too.)"""
    with broken_prometheus(Fault(kind, interval_s=0.5)) as am:
        sink = AlertmanagerSink(
            [am.url], cluster="it", timeout_s=1, retry_attempts=2, retry_wait_s=0.05
        )
        with pytest.raises(AlertSendError, match=r"timed out after 1s \(the whole request\)"):
            sink.sync([LEAK], datetime.now(UTC))
        assert am.requests >= 2  # the first POST and its retry (after the GET of the rebuild)
        assert not [t for t in threading.enumerate() if t.name == "request-deadline"]
        assert len(sink.state) == 1  # kept, sent again next cycle
