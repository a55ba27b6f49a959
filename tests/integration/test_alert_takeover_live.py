"""Two replicas' sinks against the real Alertmanager: the new leader takes the alerts over.

What ``tests/test_alert_takeover.py`` shows against a scripted Alertmanager, here with the real
one (its own idea of which alerts are still active, and its notifications).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from defrag.adapters.alertmanager import AlertmanagerSink
from defrag.detect.findings import Finding
from tests.support.alertmanager import (
    AlertmanagerServer,
    Notification,
    WebhookReceiver,
    alertmanager_with_receiver,
)

pytestmark = pytest.mark.integration

OPEN = Finding("circuit-open", "cluster", "critical", "defrag execution stopped: stuck")


@pytest.fixture
def am() -> Iterator[tuple[AlertmanagerServer, WebhookReceiver]]:
    with alertmanager_with_receiver() as pair:
        yield pair


def replica(url: str) -> AlertmanagerSink:
    # a lifetime far longer than the test: a resolution seen here is a leader's, not a lapse
    return AlertmanagerSink([url], cluster="it", resend_interval_s=0.3, ttl_s=600)


def notified(status: str) -> object:
    def check(ns: list[Notification]) -> bool:
        return any(n.name == "DefragCircuitOpen" and n.status == status for n in ns)

    return check


def test_the_new_leader_resolves_an_alert_the_old_one_fired(
    am: tuple[AlertmanagerServer, WebhookReceiver],
) -> None:
    server, rx = am
    first, second = replica(server.url), replica(server.url)
    first.take_over()
    first.sync([], datetime.now(UTC))  # the first replica leads first
    second.take_over()
    second.sync([OPEN], datetime.now(UTC))  # then the second, whose circuit is open
    rx.wait_for(notified("firing"))  # Alertmanager notifies a resolution it notified firing
    first.take_over()
    first.sync([], datetime.now(UTC))  # the first leads again and finds no open circuit
    rx.wait_for(notified("resolved"))
    assert server.alerts(cluster="it") == []
