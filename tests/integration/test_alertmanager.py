"""The sink against the real Alertmanager and a webhook receiver (issue 7's done-when list).

Alertmanager judges ``endsAt`` by its own clock, so every cycle here passes the real time. The
timings are short (tests/support/alertmanager.py): a firing alert is notified ~0.2 s after it
arrives; the sink refreshes every 0.3 s and gives alerts a 2 s lifetime.

"No notification arrived" cannot be waited for; those tests send a second, unrelated alert as a
barrier in the same cycle and wait for *its* notification: both pass the same group_wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from typer.testing import CliRunner

from defrag.adapters.alertmanager import AlertmanagerSink
from defrag.alerting import AlertSendError, parse_rfc3339
from defrag.cli import app
from defrag.detect.findings import Finding
from tests.support.alertmanager import (
    AlertmanagerServer,
    Notification,
    WebhookReceiver,
    alertmanager_with_receiver,
)

pytestmark = pytest.mark.integration

LEAK = Finding("leak", "pod/ml/train-0", "critical", "GPU memory of ml/train-0 grows")
NODE = Finding("fragmentation", "node/gpu-3", "warning", "gpu-3 strands 3 GPUs")
STARVED = Finding("starvation", "pod/ml/big", "warning", "ml/big pending 2 h")
CLUSTER = Finding("fragmentation", "cluster", "warning", "no whole free node")


@pytest.fixture
def am() -> Iterator[tuple[AlertmanagerServer, WebhookReceiver]]:
    with alertmanager_with_receiver() as pair:
        yield pair


def make_sink(*urls: str, resend_interval_s: float = 0.3, ttl_s: float = 2.0) -> AlertmanagerSink:
    return AlertmanagerSink(
        list(urls),
        cluster="it",
        resend_interval_s=resend_interval_s,
        ttl_s=ttl_s,
        retry_wait_s=0.05,
    )


def now() -> datetime:
    return datetime.now(UTC)


def count(rx: WebhookReceiver, name: str, status: str) -> int:
    return len(rx.matching(name, status))


def has(name: str, status: str, n: int = 1) -> object:
    def check(ns: list[Notification]) -> bool:
        return sum(1 for x in ns if x.name == name and x.status == status) >= n

    return check


def active_names(server: AlertmanagerServer) -> set[str]:
    return {a["labels"]["alertname"] for a in server.alerts(cluster="it")}


def fire_leak_and_node(server: AlertmanagerServer, rx: WebhookReceiver) -> AlertmanagerSink:
    """A sink (30 s alert lifetime) that has sent LEAK and NODE, both notified as firing."""
    sink = make_sink(server.url, ttl_s=30)
    sink.sync([LEAK, NODE], now())
    rx.wait_for(has("GPUNodeFragmented", "firing"))
    rx.wait_for(has("GPUMemoryLeakSuspected", "firing"))
    return sink


def test_fires_once_stays_active_past_endsat_and_resolves(
    am: tuple[AlertmanagerServer, WebhookReceiver],
) -> None:
    server, rx = am
    sink = make_sink(server.url)
    sink.sync([LEAK], now())
    rx.wait_for(has("GPUMemoryLeakSuspected", "firing"))
    (first,) = server.alerts(alertname="GPUMemoryLeakSuspected")
    first_ends = parse_rfc3339(first["endsAt"])
    # cycles every 0.2 s until past the first endsAt (2 s after the first send)
    while now() < first_ends + timedelta(seconds=0.5):
        sink.sync([LEAK], now())
        time.sleep(0.2)
    sink.sync([LEAK, NODE], now())  # NODE is the barrier
    rx.wait_for(has("GPUNodeFragmented", "firing"))
    (still,) = server.alerts(alertname="GPUMemoryLeakSuspected")
    assert still["status"]["state"] == "active"
    assert parse_rfc3339(still["endsAt"]) > first_ends  # refreshed, never lapsed
    assert still["startsAt"] == first["startsAt"]
    assert count(rx, "GPUMemoryLeakSuspected", "firing") == 1  # no duplicate
    assert count(rx, "GPUMemoryLeakSuspected", "resolved") == 0

    sink.sync([NODE], now())  # the leak clears
    rx.wait_for(has("GPUMemoryLeakSuspected", "resolved"))
    assert active_names(server) == {"GPUNodeFragmented"}
    (resolved,) = rx.matching("GPUMemoryLeakSuspected", "resolved")
    assert resolved.labels == {
        "alertname": "GPUMemoryLeakSuspected",
        "severity": "critical",
        "cluster": "it",
        "namespace": "ml",
        "pod": "train-0",
        "detector": "leak",
    }


def test_alertmanager_restarted_mid_run_holds_the_alert_after_next_cycle(
    am: tuple[AlertmanagerServer, WebhookReceiver],
) -> None:
    server, rx = am
    # resend interval 0: the daemon's cycle is at least its resend interval, so every cycle
    # refreshes; the restart below takes longer than one cycle would anyway.
    sink = make_sink(server.url, resend_interval_s=0, ttl_s=30)
    sink.sync([LEAK], now())
    rx.wait_for(has("GPUMemoryLeakSuspected", "firing"))
    # Alertmanager logs a notification only once the webhook has answered; give it that
    # moment, or the restart below would forget the page was sent and page again.
    time.sleep(1.0)
    server.restart()  # alerts live in memory: gone; the notification log is on disk
    assert active_names(server) == set()
    sink.sync([LEAK, CLUSTER], now())  # CLUSTER is the barrier
    assert active_names(server) == {"GPUMemoryLeakSuspected", "GPUClusterFragmented"}
    rx.wait_for(has("GPUClusterFragmented", "firing"))
    assert count(rx, "GPUMemoryLeakSuspected", "firing") == 1  # the restart did not re-page


def test_restarted_sender_neither_refires_nor_forgets(
    am: tuple[AlertmanagerServer, WebhookReceiver],
) -> None:
    server, rx = am
    fire_leak_and_node(server, rx)
    (leak,) = server.alerts(alertname="GPUMemoryLeakSuspected")

    after = make_sink(server.url, ttl_s=30)  # a new process: empty state
    after.sync([LEAK], now())  # NODE cleared while it was down
    rx.wait_for(has("GPUNodeFragmented", "resolved"))
    assert after.last_report is not None and after.last_report.transition.fired == ()
    (again,) = server.alerts(alertname="GPUMemoryLeakSuspected")
    assert again["startsAt"] == leak["startsAt"]
    after.sync([LEAK, STARVED], now())  # STARVED is the barrier
    rx.wait_for(has("GPUJobStarved", "firing"))
    assert count(rx, "GPUMemoryLeakSuspected", "firing") == 1


def test_silence_created_through_the_api_suppresses_the_notification(
    am: tuple[AlertmanagerServer, WebhookReceiver],
) -> None:
    server, rx = am
    silence = server.silence({"alertname": "GPUJobStarved", "cluster": "it"})
    make_sink(server.url).sync([STARVED, CLUSTER], now())  # CLUSTER is the barrier
    rx.wait_for(has("GPUClusterFragmented", "firing"))
    (starved,) = server.alerts(alertname="GPUJobStarved")
    assert starved["status"]["state"] == "suppressed"
    assert starved["status"]["silencedBy"] == [silence]
    assert rx.matching("GPUJobStarved") == []


def failures(url: str) -> float:
    return REGISTRY.get_sample_value("defrag_alert_send_failures_total", {"url": url}) or 0.0


def test_unreachable_alertmanager_fails_loudly_then_nothing_is_lost(
    am: tuple[AlertmanagerServer, WebhookReceiver],
) -> None:
    server, rx = am
    sink = fire_leak_and_node(server, rx)
    time.sleep(1.0)  # let Alertmanager log the notifications (see the restart test)

    server.stop()
    before = failures(server.url)
    with pytest.raises(AlertSendError, match="cannot connect"):
        sink.sync([LEAK, STARVED], now())  # NODE cleared, STARVED new: both must arrive
    assert failures(server.url) == before + 1

    server.start()  # same port and storage: it remembers what it notified
    sink.sync([LEAK, STARVED], now())
    rx.wait_for(has("GPUJobStarved", "firing"))
    rx.wait_for(has("GPUNodeFragmented", "resolved"))
    assert active_names(server) == {"GPUMemoryLeakSuspected", "GPUJobStarved"}


def test_ha_pair_both_get_every_alert() -> None:
    rx = WebhookReceiver()
    pair = [AlertmanagerServer(rx.url), AlertmanagerServer(rx.url)]
    try:
        for server in pair:
            server.start()
        sink = make_sink(*(s.url for s in pair))
        sink.sync([LEAK], now())
        rx.wait_for(has("GPUMemoryLeakSuspected", "firing", n=2))
        senders = {n.receiver_url for n in rx.matching("GPUMemoryLeakSuspected", "firing")}
        assert senders == {s.url for s in pair}

        pair[1].stop()  # one down: no exception, the other still takes the resolve
        sink.sync([], now())
        assert sink.last_report is not None
        assert list(sink.last_report.failures) == [pair[1].url]
        rx.wait_for(has("GPUMemoryLeakSuspected", "resolved"))
    finally:
        for server in pair:
            server.close()
        rx.close()


def test_cli_test_alert_fires_then_resolves(
    am: tuple[AlertmanagerServer, WebhookReceiver],
) -> None:
    server, rx = am
    result = CliRunner().invoke(
        app,
        [
            "alerts",
            "test",
            "--alertmanager",
            server.url,
            "--cluster-label",
            "it",
            "--hold",
            "0.6",
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    rx.wait_for(has("DefragTestAlert", "firing"))
    rx.wait_for(has("DefragTestAlert", "resolved"))
    assert '"resolved": true' in result.output


def test_the_new_leader_resolves_an_alert_the_old_one_fired(
    am: tuple[AlertmanagerServer, WebhookReceiver],
) -> None:
    """Two replicas' sinks: a new leader takes the alerts over from Alertmanager's own idea of
    which are still active (``tests/test_alert_takeover.py`` shows it against a scripted one)."""
    server, rx = am
    opened = Finding("circuit-open", "cluster", "critical", "defrag execution stopped: stuck")
    # a lifetime far longer than the test: a resolution seen here is a leader's, not a lapse
    first, second = make_sink(server.url, ttl_s=600), make_sink(server.url, ttl_s=600)
    first.take_over()
    first.sync([], now())  # the first replica leads first
    second.take_over()
    second.sync([opened], now())  # then the second, whose circuit is open
    rx.wait_for(has("DefragCircuitOpen", "firing"))  # a resolution is notified only after it
    first.take_over()
    first.sync([], now())  # the first leads again and finds no open circuit
    rx.wait_for(has("DefragCircuitOpen", "resolved"))
    assert server.alerts(cluster="it") == []
