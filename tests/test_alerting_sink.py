"""AlertmanagerSink against a scripted HTTP session: schedule, retries, failures, auth.

The real Alertmanager runs in tests/integration/test_alertmanager.py; here every request and
answer is visible, so the resend schedule and the keep-and-retry rules can be checked exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from defrag.adapters.alertmanager import AlertmanagerSink, redact
from defrag.alerting import AlertSendError
from defrag.detect.findings import Finding

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
A = Finding("leak", "pod/ml/a", "warning", "a leaks")
B = Finding("fragmentation", "node/n1", "warning", "n1 fragmented")

Answer = int | Exception | list[dict[str, Any]]


class ScriptedSession(requests.Session):
    """Records requests; answers by URL from a script (an int status, an exception, or JSON)."""

    def __init__(self, answer: Callable[[str, str], Answer] | None = None) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []
        self.answer = answer or (lambda method, url: [] if method == "GET" else 200)

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.calls.append({"method": method, "url": url, **kwargs})
        answer = self.answer(method, url)
        if isinstance(answer, Exception):
            raise answer
        response = requests.Response()
        if isinstance(answer, list):
            response.status_code, response._content = 200, json.dumps(answer).encode()
        else:
            response.status_code, response._content = answer, b"boom"
        return response

    def posts(self, url_part: str = "") -> list[list[dict[str, Any]]]:
        return [c["json"] for c in self.calls if c["method"] == "POST" and url_part in c["url"]]


def sink(
    session: ScriptedSession, urls: tuple[str, ...] = ("http://am:9093",), **kw: Any
) -> AlertmanagerSink:
    kw.setdefault("resend_interval_s", 60)
    kw.setdefault("ttl_s", 300)
    kw.setdefault("retry_wait_s", 0)
    return AlertmanagerSink(list(urls), cluster="c1", session=session, **kw)


def states(batch: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(alertname, endsAt) of each alert in one POST body."""
    return [(a["labels"]["alertname"], a["endsAt"]) for a in batch]


def failures(url: str) -> float:
    return REGISTRY.get_sample_value("defrag_alert_send_failures_total", {"url": url}) or 0.0


def test_fire_refresh_on_interval_then_resolve() -> None:
    session = ScriptedSession()
    s = sink(session)
    s.sync([A], T0)  # fires: endsAt = T0 + ttl (300 s)
    s.sync([A], T0 + timedelta(seconds=59))  # not due: nothing sent
    s.sync([A], T0 + timedelta(seconds=60))  # due: re-sent, endsAt moves on
    s.sync([], T0 + timedelta(seconds=70))  # cleared: resolved, endsAt = now
    s.sync([], T0 + timedelta(seconds=80))  # nothing left to say
    assert [states(b) for b in session.posts()] == [
        [("GPUMemoryLeakSuspected", "2026-03-02T12:05:00.000Z")],
        [("GPUMemoryLeakSuspected", "2026-03-02T12:06:00.000Z")],
        [("GPUMemoryLeakSuspected", "2026-03-02T12:01:10.000Z")],
    ]
    # startsAt stays the first-seen time on every send, so Alertmanager sees one alert
    assert {b[0]["startsAt"] for b in session.posts()} == {"2026-03-02T12:00:00.000Z"}
    assert [c["url"] for c in session.calls if c["method"] == "POST"] == [
        "http://am:9093/api/v2/alerts"
    ] * 3


def test_failed_send_is_counted_kept_and_sent_next_cycle() -> None:
    down = {"on": False}
    session = ScriptedSession(lambda m, u: [] if m == "GET" else (503 if down["on"] else 200))
    s = sink(session, urls=("http://keep:9093",), retry_attempts=3)
    before = failures("http://keep:9093")
    s.sync([A, B], T0)
    down["on"] = True
    with pytest.raises(AlertSendError, match=r"http://keep:9093: HTTP 503"):
        s.sync([A], T0 + timedelta(seconds=1))  # B cleared while Alertmanager is down
    assert failures("http://keep:9093") == before + 1  # one failed send, after 3 attempts
    assert len(session.posts()) == 1 + 3
    down["on"] = False
    s.sync([A], T0 + timedelta(seconds=2))  # A not due by schedule, but the URL missed things
    last = session.posts()[-1]
    assert states(last) == [
        ("GPUMemoryLeakSuspected", "2026-03-02T12:05:02.000Z"),
        ("GPUNodeFragmented", "2026-03-02T12:00:01.000Z"),  # resolved when it cleared
    ]


def test_ha_pair_each_url_gets_everything_and_one_failure_does_not_raise() -> None:
    down = {"http://am-1:9093": True}
    session = ScriptedSession(
        lambda m, u: [] if m == "GET" else (500 if down.get(u.rsplit("/api", 1)[0]) else 200)
    )
    s = sink(session, urls=("http://am-0:9093", "http://am-1:9093"), retry_attempts=1)
    s.sync([A], T0)  # am-1 fails, am-0 takes it: no exception
    assert s.last_report is not None
    assert s.last_report.failures == {"http://am-1:9093": "HTTP 500: boom"}
    down.clear()
    s.sync([A], T0 + timedelta(seconds=5))  # am-0 not due; am-1 catches up
    assert [len(b) for b in session.posts("am-0")] == [1]
    assert [len(b) for b in session.posts("am-1")] == [1, 1]


@pytest.mark.parametrize(
    ("answer", "attempts"),
    [
        (503, 3),  # retried
        (429, 3),  # retried
        (requests.ConnectionError("refused"), 3),
        (requests.Timeout("slow"), 3),
        (400, 1),  # a rejected body is not retried
        (401, 1),
    ],
)
def test_retries_only_what_can_succeed(answer: Answer, attempts: int) -> None:
    session = ScriptedSession(lambda m, u: [] if m == "GET" else answer)
    s = sink(session, retry_attempts=3)
    with pytest.raises(AlertSendError):
        s.sync([A], T0)
    assert len(session.posts()) == attempts


def test_no_error_when_nothing_to_send_and_am_reachable() -> None:
    session = ScriptedSession()
    sink(session).sync([], T0)
    assert session.posts() == []


def test_unreachable_on_first_cycle_with_nothing_to_send_still_fails() -> None:
    """A one-shot against a dead Alertmanager must exit non-zero even with no findings:
    it could not learn which earlier alerts to resolve."""
    session = ScriptedSession(lambda m, u: requests.ConnectionError("refused"))
    with pytest.raises(AlertSendError, match="reading active alerts"):
        sink(session, retry_attempts=1).sync([], T0)


def test_first_cycle_adopts_own_alerts_resolves_cleared_ignores_foreign() -> None:
    own = "http://defrag.invalid/findings"
    held = [
        {  # still found: kept, with its old start; not re-sent before the interval
            "labels": {
                "alertname": "GPUMemoryLeakSuspected",
                "cluster": "c1",
                "severity": "warning",
                "namespace": "ml",
                "pod": "a",
                "detector": "leak",
            },
            "startsAt": "2026-03-02T11:00:00.123456789Z",
            "generatorURL": f"{own}/x",
        },
        {  # cleared while the daemon was down: resolved now
            "labels": {
                "alertname": "GPUNodeFragmented",
                "cluster": "c1",
                "severity": "warning",
                "node": "gone",
                "detector": "fragmentation",
            },
            "startsAt": "2026-03-02T11:00:00Z",
            "generatorURL": f"{own}/y",
        },
        {  # a Prometheus rule's alert of the same name: not ours, never touched
            "labels": {"alertname": "GPUNodeFragmented", "cluster": "c1", "node": "p"},
            "startsAt": "2026-03-02T11:00:00Z",
            "generatorURL": "http://prometheus:9090/graph",
        },
    ]
    session = ScriptedSession(lambda m, u: held if m == "GET" else 200)
    s = sink(session)
    s.sync([A], T0)
    gets = [c for c in session.calls if c["method"] == "GET"]
    assert [g["params"] for g in gets] == [{"filter": 'cluster="c1"'}]
    (batch,) = session.posts()
    assert [
        (a["labels"]["alertname"], a["labels"].get("node"), a["startsAt"], a["endsAt"])
        for a in batch
    ] == [
        # refreshed at once (its endsAt in Alertmanager is unknown), with its old start
        ("GPUMemoryLeakSuspected", None, "2026-03-02T11:00:00.123Z", "2026-03-02T12:05:00.000Z"),
        ("GPUNodeFragmented", "gone", "2026-03-02T11:00:00.000Z", "2026-03-02T12:00:00.000Z"),
    ]
    assert s.last_report is not None and s.last_report.transition.fired == ()
    s.sync([A], T0 + timedelta(seconds=60))
    assert session.posts()[-1][0]["startsAt"] == "2026-03-02T11:00:00.123Z"
    assert len([c for c in session.calls if c["method"] == "GET"]) == 1  # only the first cycle


def test_bearer_token_file_is_read_on_every_request(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    session = ScriptedSession()
    s = sink(session, bearer_token_file=token, resend_interval_s=0)
    s.sync([A], T0)
    token.write_text("two")
    s.sync([A], T0 + timedelta(seconds=1))
    assert [c["headers"]["Authorization"] for c in session.calls] == [
        "Bearer one",  # GET
        "Bearer one",
        "Bearer two",
    ]


def test_basic_auth_and_ca_file_go_on_the_session(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    session = ScriptedSession()
    sink(session, basic_auth=("u", "p"), ca_file=ca)
    assert session.auth == ("u", "p")
    assert session.verify == str(ca)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"urls": []}, "at least one Alertmanager URL"),
        ({"urls": ["am:9093"]}, "not an Alertmanager URL"),
        ({"resend_interval_s": 300, "ttl_s": 300}, "resend_interval_s < ttl_s"),
        ({"bearer_token": "t", "basic_auth": ("u", "p")}, "choose one of"),
        ({"ca_file": "/nonexistent/ca.pem"}, "CA file not found"),
        ({"retry_attempts": 0}, "retry_attempts"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, Any], message: str) -> None:
    kwargs.setdefault("urls", ["http://am:9093"])
    with pytest.raises(ValueError, match=message):
        AlertmanagerSink(**kwargs)


def test_credentials_never_reach_logs_or_metric_labels() -> None:
    assert redact("http://user:secret@am:9093/prefix") == "http://am:9093/prefix"
    session = ScriptedSession(lambda m, u: [] if m == "GET" else 500)
    s = sink(session, urls=("http://user:secret@am-x:9093",), retry_attempts=1)
    assert s.urls == ("http://am-x:9093",)
    with pytest.raises(AlertSendError) as info:
        s.sync([A], T0)
    assert "secret" not in str(info.value)
    assert failures("http://am-x:9093") >= 1


class ModelAlertmanager(ScriptedSession):
    """Keeps what was posted, by label set, as Alertmanager does; can be taken down."""

    def __init__(self) -> None:
        super().__init__(self._answer)
        self.up = True
        self.held: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}

    def _answer(self, method: str, url: str) -> Answer:
        if not self.up:
            return requests.ConnectionError("refused")
        if method == "POST":
            for alert in self.calls[-1]["json"]:
                self.held[tuple(sorted(alert["labels"].items()))] = alert
            return 200
        return []

    def active_pods(self, at: datetime) -> set[str]:
        return {
            a["labels"]["pod"]
            for a in self.held.values()
            if datetime.fromisoformat(a["endsAt"].replace("Z", "+00:00")) > at
        }


PODS = [Finding("leak", f"pod/ml/p{i}", "warning", f"p{i} leaks") for i in range(4)]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sets(st.integers(0, 3)),
            st.sampled_from(["up", "unreachable", "restarted"]),
            st.integers(1, 200),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_after_any_outages_the_next_good_cycle_leaves_nothing_lost(
    cycles: list[tuple[set[int], str, int]],
) -> None:
    """Whatever the findings and outages (unreachable: Alertmanager keeps what it held;
    restarted: it lost the alerts it held in memory), once it is up again, the cycle a resend
    interval later makes what it holds active equal to the findings: no firing alert missing,
    no cleared one left firing."""
    am = ModelAlertmanager()
    s = sink(am, retry_attempts=1, resend_interval_s=60, ttl_s=900)
    at = T0
    for found, state, step_s in cycles:
        at += timedelta(seconds=step_s)
        am.up = state == "up"
        if state == "restarted":
            am.held.clear()
        try:
            s.sync([PODS[i] for i in sorted(found)], at)
        except AlertSendError:
            assert state != "up"
    am.up = True
    final = cycles[-1][0]
    at += timedelta(seconds=60)  # the resend interval
    s.sync([PODS[i] for i in sorted(final)], at)
    assert am.active_pods(at) == {f"p{i}" for i in final}


def test_a_clock_far_from_the_wall_clock_is_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    """A simulated clock makes alerts Alertmanager sees as long over: say so, once."""
    s = sink(ScriptedSession())
    wall = datetime.now(UTC)
    with caplog.at_level("WARNING", logger="defrag.adapters.alertmanager"):
        s.sync([A], wall)
        assert caplog.records == []
        s.sync([A], wall - timedelta(days=30))
        s.sync([A], wall - timedelta(days=30))
    (record,) = caplog.records
    assert "behind this machine's clock" in record.getMessage()
    assert "already ended" in record.getMessage()
