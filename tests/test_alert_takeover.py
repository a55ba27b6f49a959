"""A replica that becomes the leader takes the alerts over from Alertmanager.

Only the leader sends alerts, and each replica keeps its own record of what it sent. With two
replicas, the one that followed for a while has a stale record: an alert the other fired is
unknown to it (so never resolved when its finding is gone: it lapses by its ``endsAt``, up to
``ttl_s`` later) and an alert it knew from before keeps its old start although the other
resolved it. The two-replica memory soak saw both at once: ``DefragCircuitOpen`` fired by one
replica lapsed 120 s later under the other's leadership, then came back when the first led
again and its breaker tripped anew (counted as a re-fired alert).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import requests

from defrag.adapters.alertmanager import AlertmanagerSink
from defrag.alerting import parse_rfc3339
from defrag.execute.circuit import CircuitState
from tests.test_cycle import RecordingSink
from tests.test_daemon import Toggle, sim_daemon

T0 = datetime(2026, 12, 4, 20, 26, 18, tzinfo=UTC)
TTL_S = 120


class SharedAlertmanager(requests.Session):
    """One Alertmanager both replicas talk to: keeps each alert's last state by its labels and
    answers ``GET /api/v2/alerts`` with those not ended by ``now`` (as Alertmanager does)."""

    def __init__(self) -> None:
        super().__init__()
        self.alerts: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        self.now = T0

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        response = requests.Response()
        response.status_code = 200
        if method == "POST":
            for alert in kwargs["json"]:
                self.alerts[tuple(sorted(alert["labels"].items()))] = alert
            response._content = b""
        else:
            held = [a for a in self.alerts.values() if parse_rfc3339(a["endsAt"]) > self.now]
            response._content = json.dumps(held).encode()
        return response

    def one(self) -> dict[str, Any]:
        (alert,) = self.alerts.values()
        return alert


def replica(am: SharedAlertmanager) -> AlertmanagerSink:
    return AlertmanagerSink(
        ["http://am:9093"], cluster="c1", session=am, resend_interval_s=5, ttl_s=TTL_S
    )


def circuit_open(since: datetime) -> Any:
    return CircuitState(True, "replacements stuck Pending", since, ("soak/ReplicaSet/w",)).finding()


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def lead(sink: AlertmanagerSink, am: SharedAlertmanager, seconds: float, *findings: Any) -> None:
    """``sink``'s replica becomes the leader and runs one cycle at T0 + ``seconds``."""
    am.now = at(seconds)
    sink.take_over()
    sink.sync(list(findings), at(seconds))


def test_the_new_leader_resolves_what_the_old_one_fired_and_it_does_not_find() -> None:
    am = SharedAlertmanager()
    first, second = replica(am), replica(am)
    lead(first, am, 0)  # the first replica leads, nothing to say
    lead(second, am, 1, circuit_open(at(0)))  # the second leads; its breaker is open
    assert parse_rfc3339(am.one()["endsAt"]) == at(1 + TTL_S)
    lead(first, am, 20)  # the first leads again; the breaker was the second's, none here
    assert parse_rfc3339(am.one()["endsAt"]) == at(20)  # resolved now, not lapsed at 121 s


def test_an_alert_both_replicas_find_stays_one_alert_across_the_handover() -> None:
    am = SharedAlertmanager()
    first, second = replica(am), replica(am)
    lead(first, am, 0)
    lead(second, am, 1, circuit_open(at(0)))
    lead(first, am, 20, circuit_open(at(15)))  # the same alert, seen later here
    alert = am.one()
    assert parse_rfc3339(alert["startsAt"]) == at(0)  # adopted: the earlier start is kept
    assert parse_rfc3339(alert["endsAt"]) == at(20 + TTL_S)  # still firing, refreshed


def test_a_second_opening_after_the_other_leader_resolved_it_is_a_new_alert() -> None:
    am = SharedAlertmanager()
    first, second = replica(am), replica(am)
    lead(first, am, 0)
    lead(second, am, 1, circuit_open(at(0)))
    lead(first, am, 20)  # resolved by the first
    lead(second, am, 40, circuit_open(at(35)))  # the second's breaker trips again
    alert = am.one()
    assert parse_rfc3339(alert["startsAt"]) == at(35)  # not the stale start of the first one
    assert parse_rfc3339(alert["endsAt"]) == at(40 + TTL_S)


def test_the_daemon_hands_the_alerts_over_each_time_it_becomes_the_leader() -> None:
    toggle = Toggle()
    _, daemon = sim_daemon(elector=toggle)
    sink = RecordingSink()
    daemon.ports = dataclasses.replace(daemon.ports, alerts=sink)
    seen = []
    for leading in (False, True, True, False, True, True):
        toggle.leader = leading
        daemon.run_once()
        seen.append((sink.take_overs, len(sink.calls)))
    # a take-over on each follower → leader edge, before that cycle's sync; none while leading
    assert seen == [(0, 0), (1, 1), (1, 2), (1, 2), (2, 3), (2, 4)]
